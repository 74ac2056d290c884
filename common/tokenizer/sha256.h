// SHA-256 (FIPS 180-4), used for the tokenizer fingerprint: stable across processes, builds and
// machines, which std::hash and absl::Hash are not.
#ifndef SPECD_COMMON_TOKENIZER_SHA256_H_
#define SPECD_COMMON_TOKENIZER_SHA256_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace specd::tokenizer {

class Sha256 {
 public:
  Sha256();
  void Update(std::string_view data);
  // Lowercase hex of the digest; the object must not be updated afterwards.
  std::string HexDigest();

 private:
  void Compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_;
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace specd::tokenizer

#endif  // SPECD_COMMON_TOKENIZER_SHA256_H_
