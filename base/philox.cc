#include "base/philox.h"

namespace specd {
namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85;
constexpr int kPhiloxRounds = 10;

struct HiLo {
  uint32_t hi;
  uint32_t lo;
};

inline HiLo MulHiLo(uint32_t a, uint32_t b) {
  const uint64_t product = uint64_t{a} * uint64_t{b};
  return {static_cast<uint32_t>(product >> 32), static_cast<uint32_t>(product)};
}

}  // namespace

std::array<uint32_t, 4> Philox4x32_10(const PhiloxCounter& ctr, const PhiloxKey& key) {
  std::array<uint32_t, 4> x = ctr;
  PhiloxKey k = key;
  for (int round = 0; round < kPhiloxRounds; ++round) {
    // Random123 bumps the key before every round but the first.
    if (round > 0) {
      k[0] += kPhiloxW0;
      k[1] += kPhiloxW1;
    }
    const HiLo p0 = MulHiLo(kPhiloxM0, x[0]);
    const HiLo p1 = MulHiLo(kPhiloxM1, x[2]);
    x = {p1.hi ^ x[1] ^ k[0], p1.lo, p0.hi ^ x[3] ^ k[1], p0.lo};
  }
  return x;
}

PhiloxKey PhiloxKeyFromSeed(uint64_t seed) {
  return {static_cast<uint32_t>(seed & 0xffffffffu), static_cast<uint32_t>(seed >> 32)};
}

double UniformFromWords(uint32_t x0, uint32_t x1) {
  const uint64_t bits53 = (uint64_t{x0} << 21) | (uint64_t{x1} >> 11);
  // Exact: a 53-bit integer times a power of two.
  return static_cast<double>(bits53) * 0x1.0p-53;
}

double StreamUniform(uint64_t seed, uint32_t position, Purpose purpose, uint32_t index,
                     uint32_t sample) {
  const std::array<uint32_t, 4> x = Philox4x32_10(
      {position, static_cast<uint32_t>(purpose), index, sample}, PhiloxKeyFromSeed(seed));
  return UniformFromWords(x[0], x[1]);
}

}  // namespace specd
