// UTF-8 for every layer: well-formedness (Unicode Table 3-7, so overlong forms, surrogates and
// values past U+10FFFF are rejected), decoding, encoding, and the lossy conversion Rust's
// String::from_utf8_lossy performs (which Hugging Face decoders use). The one validator of the
// project: the tokenizer, the chat templates and the request checks all use it.
#ifndef SPECD_BASE_UTF8_H_
#define SPECD_BASE_UTF8_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace specd {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 sequence starting at `s[pos]`, or 0 when it is not one.
size_t ValidUtf8SequenceLength(std::string_view s, size_t pos);

// Byte offset of the first byte that does not start a well-formed sequence, if any.
std::optional<size_t> FindInvalidUtf8(std::string_view s);

// INVALID_ARGUMENT "<what> is not valid UTF-8 at byte N (byte 0xXX)" for malformed text.
absl::Status ValidateUtf8(std::string_view s, std::string_view what);

// Decodes the code point at `*pos` of valid UTF-8 and advances `*pos` past it.
char32_t DecodeUtf8(std::string_view s, size_t* pos);

void AppendUtf8(char32_t cp, std::string* out);

// Replaces every maximal invalid subsequence with one U+FFFD, exactly as Rust's
// String::from_utf8_lossy (and the Unicode "substitution of maximal subparts" practice).
std::string Utf8Lossy(std::string_view bytes);

}  // namespace specd

#endif  // SPECD_BASE_UTF8_H_
