// GPT-2's byte-to-unicode table (ByteLevel pre-tokenizer and decoder): every byte maps to one
// printable code point, so byte strings can be written as text in vocab.json.
#ifndef SPECD_COMMON_TOKENIZER_BYTE_LEVEL_H_
#define SPECD_COMMON_TOKENIZER_BYTE_LEVEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace specd::tokenizer {

// The UTF-8 encoding of the code point that stands for `byte`.
std::string_view ByteLevelChar(uint8_t byte);

// The byte a code point stands for, if it is one of the 256.
std::optional<uint8_t> ByteLevelByte(char32_t cp);

// Maps every byte of `bytes` to its character.
std::string ByteLevelEncode(std::string_view bytes);

// Maps a valid UTF-8 string made only of byte-level characters back to bytes; nullopt when any
// character is outside the table.
std::optional<std::string> ByteLevelDecode(std::string_view text);

}  // namespace specd::tokenizer

#endif  // SPECD_COMMON_TOKENIZER_BYTE_LEVEL_H_
