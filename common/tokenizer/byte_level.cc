#include "common/tokenizer/byte_level.h"

#include <array>

#include "common/tokenizer/utf8.h"

namespace specd::tokenizer {
namespace {

// Every mapped code point is below 256 + 68.
constexpr char32_t kMappedLimit = 256 + 68;

struct ByteLevelTables {
  std::array<std::string, 256> byte_to_char;
  std::array<int16_t, kMappedLimit> cp_to_byte;  // -1: not a byte-level character
};

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes keep their code point, the other 68 bytes
// take 256, 257, ... in byte order.
const ByteLevelTables& Tables() {
  static const ByteLevelTables* tables = [] {
    auto* t = new ByteLevelTables();
    t->cp_to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
      t->cp_to_byte[cp] = static_cast<int16_t>(b);
      AppendUtf8(cp, &t->byte_to_char[b]);
    }
    return t;
  }();
  return *tables;
}

}  // namespace

std::string_view ByteLevelChar(uint8_t byte) { return Tables().byte_to_char[byte]; }

std::optional<uint8_t> ByteLevelByte(char32_t cp) {
  if (cp >= kMappedLimit) return std::nullopt;
  const int16_t b = Tables().cp_to_byte[cp];
  if (b < 0) return std::nullopt;
  return static_cast<uint8_t>(b);
}

std::string ByteLevelEncode(std::string_view bytes) {
  const auto& table = Tables().byte_to_char;
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) out.append(table[static_cast<uint8_t>(c)]);
  return out;
}

std::optional<std::string> ByteLevelDecode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const std::optional<uint8_t> b = ByteLevelByte(DecodeUtf8(text, &pos));
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
  }
  return out;
}

}  // namespace specd::tokenizer
