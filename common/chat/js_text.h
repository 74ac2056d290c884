// JavaScript string and number semantics over UTF-8 text. The reference renderer,
// @huggingface/jinja, runs on JavaScript strings (UTF-16) and numbers (doubles); these helpers
// reproduce exactly what it does, so that specd's output is byte-identical to it.
#ifndef SPECD_COMMON_CHAT_JS_TEXT_H_
#define SPECD_COMMON_CHAT_JS_TEXT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specd::chat {

// One code point decoded from UTF-8. Invalid bytes decode as U+FFFD, one byte at a time.
struct CodePoint {
  char32_t value = 0;
  size_t size = 0;  // bytes consumed
};
CodePoint DecodeUtf8(std::string_view text, size_t pos);
void AppendUtf8(char32_t c, std::string& out);
std::vector<std::string_view> SplitCodePoints(std::string_view text);

// JavaScript's WhiteSpace and LineTerminator set (`/\s/`, String.prototype.trim).
bool IsJsWhitespace(char32_t c);
std::string_view JsTrim(std::string_view text);
std::string_view JsTrimStart(std::string_view text);
std::string_view JsTrimEnd(std::string_view text);

// String.prototype.length: UTF-16 code units.
int64_t Utf16Length(std::string_view text);

// `text.at(index)` for one UTF-16 code unit (negative counts from the end); nullopt when out of
// range. A unit that is half of a surrogate pair cannot be written as UTF-8: an error.
absl::StatusOr<std::optional<std::string>> Utf16At(std::string_view text, int64_t index);

// Comparison by UTF-16 code units, as JavaScript's `<` on strings: -1, 0 or 1.
int CompareUtf16(std::string_view a, std::string_view b);

// toUpperCase/toLowerCase. Only ASCII letters are mapped; text with other letters is an error
// rather than a silently different result (Unicode case tables are not carried here).
absl::StatusOr<std::string> JsToUpper(std::string_view text);
absl::StatusOr<std::string> JsToLower(std::string_view text);

// Number.prototype.toString() (shortest round trip, "1e+21", "1.5e-7", "NaN", "Infinity").
std::string JsNumberToString(double value);
// Python-like float display used by @huggingface/jinja: integral values get ".0", -0 is "-0.0".
std::string JsFloatDisplay(double value);
// ToNumber(string): NaN for text that is not a numeric literal.
double JsStringToNumber(std::string_view text);
// parseInt(text, 10) and parseFloat(text): nullopt for NaN.
std::optional<double> JsParseInt(std::string_view text);
std::optional<double> JsParseFloat(std::string_view text);

// JSON.stringify(string), optionally escaping every UTF-16 unit >= 0x7f as \uXXXX.
std::string JsonQuote(std::string_view text, bool ensure_ascii);

}  // namespace specd::chat

#endif  // SPECD_COMMON_CHAT_JS_TEXT_H_
