// UTF-8 helpers shared by the tokenizer: validation with byte offsets, code point iteration and the
// lossy conversion Rust's String::from_utf8_lossy performs (which Hugging Face decoders use).
#ifndef SPECD_COMMON_TOKENIZER_UTF8_H_
#define SPECD_COMMON_TOKENIZER_UTF8_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace specd::tokenizer {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 sequence starting at `s[pos]`, or 0 when it is not one.
size_t ValidUtf8SequenceLength(std::string_view s, size_t pos);

// Byte offset of the first byte that does not start a well-formed sequence, if any.
std::optional<size_t> FindInvalidUtf8(std::string_view s);

// INVALID_ARGUMENT "<what> is not valid UTF-8 at byte N" for malformed text.
absl::Status ValidateUtf8(std::string_view s, std::string_view what);

// Decodes the code point at `*pos` of valid UTF-8 and advances `*pos` past it.
char32_t DecodeUtf8(std::string_view s, size_t* pos);

// Decodes the code point that ends at `end` (exclusive) of valid UTF-8; sets `*start` to its first
// byte.
char32_t DecodeUtf8Backward(std::string_view s, size_t end, size_t* start);

void AppendUtf8(char32_t cp, std::string* out);

// Replaces every maximal invalid subsequence with one U+FFFD, exactly as Rust's
// String::from_utf8_lossy (and the Unicode "substitution of maximal subparts" practice).
std::string Utf8Lossy(std::string_view bytes);

// Unicode White_Space, the meaning of \s in Rust's regex crate and in Oniguruma.
bool IsUnicodeWhiteSpace(char32_t cp);

}  // namespace specd::tokenizer

#endif  // SPECD_COMMON_TOKENIZER_UTF8_H_
