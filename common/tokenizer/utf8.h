// The tokenizer's UTF-8 helpers: base/utf8.h (validation, decoding, the lossy conversion) under
// the tokenizer's namespace, plus backward decoding and Unicode White_Space.
#ifndef SPECD_COMMON_TOKENIZER_UTF8_H_
#define SPECD_COMMON_TOKENIZER_UTF8_H_

#include <cstddef>
#include <string_view>

#include "base/utf8.h"

namespace specd::tokenizer {

using ::specd::AppendUtf8;
using ::specd::DecodeUtf8;
using ::specd::FindInvalidUtf8;
using ::specd::kReplacementChar;
using ::specd::Utf8Lossy;
using ::specd::ValidateUtf8;
using ::specd::ValidUtf8SequenceLength;

// Decodes the code point that ends at `end` (exclusive) of valid UTF-8; sets `*start` to its first
// byte.
char32_t DecodeUtf8Backward(std::string_view s, size_t end, size_t* start);

// Unicode White_Space, the meaning of \s in Rust's regex crate and in Oniguruma.
bool IsUnicodeWhiteSpace(char32_t cp);

}  // namespace specd::tokenizer

#endif  // SPECD_COMMON_TOKENIZER_UTF8_H_
