// Counter-based randomness: one Philox4x32-10 stream per request (DESIGN.md, "Randomness").
//
// Workers and the coordinator draw the same uniforms independently from (seed, position, purpose,
// index, sample), so nothing random crosses the wire and a decision at position j can be replayed
// in any later round. Philox is Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"
// (SC 2011), as implemented by Random123 (github.com/DEShawResearch/random123).
#ifndef SPECD_BASE_PHILOX_H_
#define SPECD_BASE_PHILOX_H_

#include <array>
#include <cstdint>

namespace specd {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// Random123's philox4x32 with 10 rounds: multipliers 0xD2511F53 and 0xCD9E8D57, key schedule
// (Weyl) constants 0x9E3779B9 and 0xBB67AE85. Bit-identical to Random123's philox4x32_R(10, ...).
std::array<uint32_t, 4> Philox4x32_10(const PhiloxCounter& ctr, const PhiloxKey& key);

// The counter's second word. The numbering is part of the wire-free protocol between processes:
// never renumber, only append.
enum class Purpose : uint32_t {
  kDraftSample = 0,
  kAccept = 1,
  kBonus = 2,
  kCandidate = 3,
  kCandidateAccept = 4,
  kResidualFallback = 5,
  kTargetSample = 6,
  // Accepting child `index` (0-based, in the order tried) of a node of a deterministic proposal:
  // a draft tree or a prompt-lookup chain (services/coordinator/tree_accept.h).
  kChildAccept = 7,
};

// key = (seed & 0xffffffff, seed >> 32).
PhiloxKey PhiloxKeyFromSeed(uint64_t seed);

// u = ((x0 << 21) | (x1 >> 11)) * 2^-53: the top 32 bits of x0 and 21 bits of x1 form a 53-bit
// integer, so u is an exact multiple of 2^-53 in [0, 1 - 2^-53].
double UniformFromWords(uint32_t x0, uint32_t x1);

// The uniform of one decision: Philox4x32_10 with the seed's key and the counter
// (position, purpose, index, sample), turned into a double by UniformFromWords(x[0], x[1]).
// `position` is the absolute 0-based index of the token being decided, `index` the candidate
// number and `sample` the completion number of a request that asks for several.
double StreamUniform(uint64_t seed, uint32_t position, Purpose purpose, uint32_t index = 0,
                     uint32_t sample = 0);

}  // namespace specd

#endif  // SPECD_BASE_PHILOX_H_
