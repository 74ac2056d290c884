#include "common/chat/js_text.h"

#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/utf8.h"

namespace specd::chat {
namespace {

constexpr char32_t kReplacement = 0xFFFD;

std::u16string ToUtf16(std::string_view text) {
  std::u16string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const CodePoint cp = DecodeUtf8(text, i);
    i += cp.size;
    if (cp.value >= 0x10000) {
      const char32_t v = cp.value - 0x10000;
      out.push_back(static_cast<char16_t>(0xD800 + (v >> 10)));
      out.push_back(static_cast<char16_t>(0xDC00 + (v & 0x3FF)));
    } else {
      out.push_back(static_cast<char16_t>(cp.value));
    }
  }
  return out;
}

// Code points whose toUpperCase/toLowerCase is themselves; ASCII is handled separately. The
// ranges are deliberately conservative (scripts without case, symbols, CJK, emoji).
bool IsCaseless(char32_t c) {
  static constexpr std::array<std::pair<char32_t, char32_t>, 16> kRanges = {{
      {0x80, 0xB4},       // C1 controls, Latin-1 punctuation (U+00B5 MICRO SIGN has case)
      {0xB6, 0xBF},       //
      {0xD7, 0xD7},       // multiplication sign
      {0xF7, 0xF7},       // division sign
      {0x0590, 0x08FF},   // Hebrew, Arabic, Syriac, Thaana, N'Ko...
      {0x0900, 0x0FFF},   // Indic scripts, Thai, Lao, Tibetan
      {0x2000, 0x20FF},   // punctuation, super/subscripts, currency
      {0x2190, 0x24B5},   // arrows, math, technical, enclosed digits
      {0x24EA, 0x2BFF},   // box drawing, shapes, dingbats
      {0x3000, 0x9FFF},   // CJK punctuation, kana, CJK ideographs
      {0xAC00, 0xD7FF},   // Hangul
      {0xE000, 0xF8FF},   // private use
      {0xFE00, 0xFF20},   // variation selectors, CJK compatibility forms, fullwidth digits
      {0xFF3B, 0xFF40},   //
      {0xFF5B, 0xFFFF},   // halfwidth forms, specials
      {0x1F000, 0x3FFFF}  // emoji, symbols, CJK extensions
  }};
  for (const auto& [lo, hi] : kRanges) {
    if (c >= lo && c <= hi) return true;
  }
  return false;
}

absl::StatusOr<std::string> MapAsciiCase(std::string_view text, bool upper) {
  std::string out(text);
  for (size_t i = 0; i < out.size();) {
    const auto byte = static_cast<unsigned char>(out[i]);
    if (byte < 0x80) {
      if (upper && byte >= 'a' && byte <= 'z') out[i] = static_cast<char>(byte - 32);
      if (!upper && byte >= 'A' && byte <= 'Z') out[i] = static_cast<char>(byte + 32);
      ++i;
      continue;
    }
    const CodePoint cp = DecodeUtf8(text, i);
    if (!IsCaseless(cp.value)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s() of text with the letter U+%04X is not supported (only ASCII case mapping is)",
          upper ? "upper" : "lower", static_cast<uint32_t>(cp.value)));
    }
    i += cp.size;
  }
  return out;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Length of the longest prefix of `s` that is a StrUnsignedDecimalLiteral without "Infinity":
// digits [. digits] [exponent] or . digits [exponent]. 0 when there is none.
size_t DecimalPrefix(std::string_view s) {
  size_t i = 0;
  size_t int_digits = 0;
  while (i < s.size() && IsDigit(s[i])) ++i, ++int_digits;
  size_t frac_digits = 0;
  if (i < s.size() && s[i] == '.') {
    size_t j = i + 1;
    while (j < s.size() && IsDigit(s[j])) ++j, ++frac_digits;
    if (int_digits > 0 || frac_digits > 0) i = j;
  }
  if (int_digits == 0 && frac_digits == 0) return 0;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    const size_t digits_start = j;
    while (j < s.size() && IsDigit(s[j])) ++j;
    if (j > digits_start) i = j;
  }
  return i;
}

double ParseDecimal(std::string_view s) {
  double value = 0;
  // from_chars rejects a leading '.', which JavaScript allows.
  std::string text(s);
  if (!text.empty() && text[0] == '.') text.insert(text.begin(), '0');
  const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  if (result.ec == std::errc::result_out_of_range) {
    // Overflow is Infinity and underflow 0, as in JavaScript.
    const size_t e = text.find_first_of("eE");
    const bool negative_exponent =
        e != std::string::npos && e + 1 < text.size() && text[e + 1] == '-';
    return negative_exponent ? 0.0 : HUGE_VAL;
  }
  return value;
}

// Sign, then "Infinity" or a decimal literal; returns the prefix length (0 for none) and value.
size_t SignedDecimalPrefix(std::string_view s, double& value) {
  size_t i = 0;
  double sign = 1;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    sign = s[i] == '-' ? -1 : 1;
    ++i;
  }
  constexpr std::string_view kInfinity = "Infinity";
  if (s.substr(i, kInfinity.size()) == kInfinity) {
    value = sign * HUGE_VAL;
    return i + kInfinity.size();
  }
  const size_t n = DecimalPrefix(s.substr(i));
  if (n == 0) return 0;
  value = sign * ParseDecimal(s.substr(i, n));
  return i + n;
}

}  // namespace

CodePoint DecodeUtf8(std::string_view text, size_t pos) {
  const size_t size = ValidUtf8SequenceLength(text, pos);
  if (size == 0) return {kReplacement, 1};
  size_t next = pos;
  return {::specd::DecodeUtf8(text, &next), size};
}

void AppendUtf8(char32_t c, std::string& out) { ::specd::AppendUtf8(c, &out); }

std::vector<std::string_view> SplitCodePoints(std::string_view text) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < text.size();) {
    const size_t n = DecodeUtf8(text, i).size;
    out.push_back(text.substr(i, n));
    i += n;
  }
  return out;
}

bool IsJsWhitespace(char32_t c) {
  switch (c) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

std::string_view JsTrimStart(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const CodePoint cp = DecodeUtf8(text, i);
    if (!IsJsWhitespace(cp.value)) break;
    i += cp.size;
  }
  return text.substr(i);
}

std::string_view JsTrimEnd(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    // Step back to the start of the last code point.
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80 &&
           end - start < 4) {
      --start;
    }
    const CodePoint cp = DecodeUtf8(text, start);
    if (start + cp.size != end || !IsJsWhitespace(cp.value)) break;
    end = start;
  }
  return text.substr(0, end);
}

std::string_view JsTrim(std::string_view text) { return JsTrimEnd(JsTrimStart(text)); }

int64_t Utf16Length(std::string_view text) {
  int64_t n = 0;
  for (size_t i = 0; i < text.size();) {
    const CodePoint cp = DecodeUtf8(text, i);
    n += cp.value >= 0x10000 ? 2 : 1;
    i += cp.size;
  }
  return n;
}

absl::StatusOr<std::optional<std::string>> Utf16At(std::string_view text, int64_t index) {
  const int64_t length = Utf16Length(text);
  if (index < 0) index += length;
  if (index < 0 || index >= length) return std::nullopt;
  int64_t unit = 0;
  for (size_t i = 0; i < text.size();) {
    const CodePoint cp = DecodeUtf8(text, i);
    const int64_t width = cp.value >= 0x10000 ? 2 : 1;
    if (index < unit + width) {
      if (width == 2) {
        return absl::InvalidArgumentError(
            "indexing a string inside a character outside the Basic Multilingual Plane is not "
            "supported (the result would be half of a UTF-16 surrogate pair)");
      }
      return std::string(text.substr(i, cp.size));
    }
    unit += width;
    i += cp.size;
  }
  return std::nullopt;
}

int CompareUtf16(std::string_view a, std::string_view b) {
  const std::u16string ua = ToUtf16(a);
  const std::u16string ub = ToUtf16(b);
  return ua < ub ? -1 : (ub < ua ? 1 : 0);
}

absl::StatusOr<std::string> JsToUpper(std::string_view text) { return MapAsciiCase(text, true); }
absl::StatusOr<std::string> JsToLower(std::string_view text) { return MapAsciiCase(text, false); }

std::string JsNumberToString(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  if (value == 0) return "0";
  std::string out;
  if (value < 0) {
    out = "-";
    value = -value;
  }
  // Shortest round-trip digits, as ECMAScript's Number::toString requires.
  std::array<char, 64> buf;
  const auto result =
      std::to_chars(buf.data(), buf.data() + buf.size(), value, std::chars_format::scientific);
  const std::string_view sci(buf.data(), result.ptr - buf.data());
  const size_t e = sci.find('e');
  std::string digits;
  for (const char c : sci.substr(0, e)) {
    if (c != '.') digits.push_back(c);
  }
  int exponent = 0;
  std::from_chars(sci.data() + e + (sci[e + 1] == '+' ? 2 : 1), sci.data() + sci.size(), exponent);
  const int k = static_cast<int>(digits.size());
  const int n = exponent + 1;  // value = 0.digits * 10^n
  if (k <= n && n <= 21) {
    out += digits + std::string(n - k, '0');
  } else if (0 < n && n <= 21) {
    out += digits.substr(0, n) + "." + digits.substr(n);
  } else if (-6 < n && n <= 0) {
    out += "0." + std::string(-n, '0') + digits;
  } else {
    const int shown = n - 1;
    out += digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    out += absl::StrCat("e", shown < 0 ? "-" : "+", std::abs(shown));
  }
  return out;
}

std::string JsFloatDisplay(double value) {
  if (value == 0 && std::signbit(value)) return "-0.0";
  if (std::isfinite(value) && std::fmod(value, 1.0) == 0) {
    // toFixed(1) writes the exact decimal value below 1e21 and falls back to toString above.
    if (std::fabs(value) < 1e21) return absl::StrFormat("%.1f", value);
    return JsNumberToString(value);
  }
  return JsNumberToString(value);
}

double JsStringToNumber(std::string_view text) {
  const std::string_view s = JsTrim(text);
  if (s.empty()) return 0;
  if (s.size() > 2 && s[0] == '0') {
    int base = 0;
    if (s[1] == 'x' || s[1] == 'X') base = 16;
    if (s[1] == 'o' || s[1] == 'O') base = 8;
    if (s[1] == 'b' || s[1] == 'B') base = 2;
    if (base != 0) {
      double value = 0;
      for (const char c : s.substr(2)) {
        int digit = -1;
        if (IsDigit(c)) digit = c - '0';
        if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
        if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
        if (digit < 0 || digit >= base) return NAN;
        value = value * base + digit;
      }
      return value;
    }
  }
  double value = 0;
  return SignedDecimalPrefix(s, value) == s.size() ? value : NAN;
}

std::optional<double> JsParseInt(std::string_view text) {
  std::string_view s = JsTrimStart(text);
  double sign = 1;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    sign = s[0] == '-' ? -1 : 1;
    s.remove_prefix(1);
  }
  size_t n = 0;
  while (n < s.size() && IsDigit(s[n])) ++n;
  if (n == 0) return std::nullopt;
  return sign * ParseDecimal(s.substr(0, n));
}

std::optional<double> JsParseFloat(std::string_view text) {
  double value = 0;
  if (SignedDecimalPrefix(JsTrimStart(text), value) == 0) return std::nullopt;
  return value;
}

std::string JsonQuote(std::string_view text, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size();) {
    const CodePoint cp = DecodeUtf8(text, i);
    const char32_t c = cp.value;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<uint32_t>(c));
        } else if (ensure_ascii && c >= 0x7F) {
          if (c >= 0x10000) {
            const char32_t v = c - 0x10000;
            out += absl::StrFormat("\\u%04x\\u%04x", static_cast<uint32_t>(0xD800 + (v >> 10)),
                                   static_cast<uint32_t>(0xDC00 + (v & 0x3FF)));
          } else {
            out += absl::StrFormat("\\u%04x", static_cast<uint32_t>(c));
          }
        } else {
          out.append(text.substr(i, cp.size));
        }
    }
    i += cp.size;
  }
  out += "\"";
  return out;
}

}  // namespace specd::chat
