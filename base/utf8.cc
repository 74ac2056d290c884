#include "base/utf8.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/absl_string.h"

namespace specd {
namespace {

// Number of bytes a prefix of `s[pos..]` has that can still belong to a well-formed sequence
// (Unicode Table 3-7), and the sequence's full length.
struct Utf8Prefix {
  size_t valid_prefix;
  size_t needed;
};

Utf8Prefix ScanUtf8(std::string_view s, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) return {1, 1};
  size_t needed = 0;
  uint8_t lo = 0x80;
  uint8_t hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    needed = 2;
  } else if (b0 == 0xE0) {
    needed = 3;
    lo = 0xA0;
  } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
    needed = 3;
  } else if (b0 == 0xED) {
    needed = 3;
    hi = 0x9F;
  } else if (b0 == 0xF0) {
    needed = 4;
    lo = 0x90;
  } else if (b0 >= 0xF1 && b0 <= 0xF3) {
    needed = 4;
  } else if (b0 == 0xF4) {
    needed = 4;
    hi = 0x8F;
  } else {
    return {0, 1};
  }
  size_t n = 1;
  for (; n < needed && pos + n < s.size(); ++n) {
    const uint8_t b = byte(pos + n);
    const uint8_t min = n == 1 ? lo : 0x80;
    const uint8_t max = n == 1 ? hi : 0xBF;
    if (b < min || b > max) break;
  }
  return {n, needed};
}

}  // namespace

size_t ValidUtf8SequenceLength(std::string_view s, size_t pos) {
  const Utf8Prefix p = ScanUtf8(s, pos);
  return p.valid_prefix == p.needed ? p.needed : 0;
}

std::optional<size_t> FindInvalidUtf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    // ASCII fast path: most text is ASCII.
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t n = ValidUtf8SequenceLength(s, pos);
    if (n == 0) return pos;
    pos += n;
  }
  return std::nullopt;
}

absl::Status ValidateUtf8(std::string_view s, std::string_view what) {
  if (const std::optional<size_t> bad = FindInvalidUtf8(s)) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(what), " is not valid UTF-8 at byte ", *bad, " (byte 0x",
                     absl::Hex(static_cast<uint8_t>(s[*bad]), absl::kZeroPad2), ")"));
  }
  return absl::OkStatus();
}

char32_t DecodeUtf8(std::string_view s, size_t* pos) {
  const auto byte = [&](size_t i) { return static_cast<char32_t>(static_cast<uint8_t>(s[i])); };
  const char32_t b0 = byte(*pos);
  if (b0 < 0x80) {
    *pos += 1;
    return b0;
  }
  if (b0 < 0xE0) {
    const char32_t cp = ((b0 & 0x1F) << 6) | (byte(*pos + 1) & 0x3F);
    *pos += 2;
    return cp;
  }
  if (b0 < 0xF0) {
    const char32_t cp =
        ((b0 & 0x0F) << 12) | ((byte(*pos + 1) & 0x3F) << 6) | (byte(*pos + 2) & 0x3F);
    *pos += 3;
    return cp;
  }
  const char32_t cp = ((b0 & 0x07) << 18) | ((byte(*pos + 1) & 0x3F) << 12) |
                      ((byte(*pos + 2) & 0x3F) << 6) | (byte(*pos + 3) & 0x3F);
  *pos += 4;
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const Utf8Prefix p = ScanUtf8(bytes, pos);
    if (p.valid_prefix == p.needed) {
      out.append(bytes.substr(pos, p.needed));
      pos += p.needed;
    } else {
      // A lone invalid byte (valid_prefix 0) or a truncated sequence is one maximal subpart.
      out.append(kReplacementChar);
      pos += p.valid_prefix == 0 ? 1 : p.valid_prefix;
    }
  }
  return out;
}

}  // namespace specd
