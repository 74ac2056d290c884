// Inverse-CDF sampling in token-id order (DESIGN.md, "Randomness"): with C_i the fp64 sum of
// row_0..row_i in ascending id order, pick the smallest i with u * C_last < C_i. Scaling u by
// the row's own total means a row whose fp32 entries sum short of 1 is still sampled in full,
// and a zero-probability token is never picked (its C_i equals its predecessor's).
#ifndef SPECD_BASE_INVERSE_CDF_H_
#define SPECD_BASE_INVERSE_CDF_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specd {

// `probs` is a dense row (entry i is token i). INVALID_ARGUMENT when u is not in [0, 1), an
// entry is negative, NaN or infinite, or the row has no positive entry.
absl::StatusOr<int32_t> SampleInverseCdf(std::span<const float> probs, double u);

// The same draw from a row given by its support: `ids` strictly ascending and >= 0, `probs` the
// matching entries. Every token missing from `ids` has probability 0, and adding 0 to an fp64 sum
// is exact, so this returns exactly what SampleInverseCdf returns on the dense row.
absl::StatusOr<int32_t> SampleInverseCdfSparse(std::span<const int32_t> ids,
                                               std::span<const float> probs, double u);

// A probability row, the one form rows take outside a back end's memory: dense (`ids` empty,
// `probs` has V entries, entry i is token i) or by its support (`ids` strictly ascending,
// `probs` aligned; every other token has probability 0).
struct ProbRow {
  std::vector<int32_t> ids;
  std::vector<float> probs;
  bool dense() const { return ids.empty(); }
  bool operator==(const ProbRow&) const = default;
};

// The support of a dense row: ids with a positive probability, ascending.
ProbRow ExtractSupport(std::span<const float> probs);

// The smaller of the two forms on the wire (a support entry costs two numbers): the support, or
// the dense row when the support holds more than half the vocabulary.
ProbRow CompactRow(std::span<const float> probs);

// `row` as V dense entries. INVALID_ARGUMENT, naming `what`, for a dense row of another size, ids
// and probs of different lengths, or an id outside [0, vocab).
absl::StatusOr<std::vector<float>> DensifyRow(const ProbRow& row, int64_t vocab,
                                              std::string_view what);

}  // namespace specd

#endif  // SPECD_BASE_INVERSE_CDF_H_
