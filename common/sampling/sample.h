// Inverse-CDF sampling in token-id order (DESIGN.md, "Randomness"): with C_i the fp64 sum of
// row_0..row_i in ascending id order, pick the smallest i with u * C_last < C_i. Scaling u by
// the row's own total means a row whose fp32 entries sum short of 1 is still sampled in full,
// and a zero-probability token is never picked (its C_i equals its predecessor's).
#ifndef SPECD_COMMON_SAMPLING_SAMPLE_H_
#define SPECD_COMMON_SAMPLING_SAMPLE_H_

#include <cstdint>
#include <span>
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

// A row's support: ids with a positive probability, ascending, and their probabilities.
struct SparseRow {
  std::vector<int32_t> ids;
  std::vector<float> probs;
};

// The support of a dense row, e.g. to answer ReadRows without sending V floats.
SparseRow ExtractSupport(std::span<const float> probs);

}  // namespace specd

#endif  // SPECD_COMMON_SAMPLING_SAMPLE_H_
