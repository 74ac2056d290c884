#include "common/tokenizer/utf8.h"

#include <cstdint>

namespace specd::tokenizer {

char32_t DecodeUtf8Backward(std::string_view s, size_t end, size_t* start) {
  size_t begin = end - 1;
  while (begin > 0 && (static_cast<uint8_t>(s[begin]) & 0xC0) == 0x80) --begin;
  *start = begin;
  size_t pos = begin;
  return DecodeUtf8(s, &pos);
}

bool IsUnicodeWhiteSpace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

}  // namespace specd::tokenizer
