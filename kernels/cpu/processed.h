// The processed distribution: logits -> sampling probabilities (DESIGN.md, "The processed
// distribution"), the CPU back end's ProcessRows and the reference every other back end is
// tested against. The target must produce bit-identical rows in Verify, in K = 0 decoding and in
// ReadRows, so every rounding step is fixed here. A separately
// written numpy reference (tests/common/sampling/processed_reference.py) follows this list:
//
//  0. Logits are fp32. A NaN logit is INVALID_ARGUMENT; -inf bans a token, +inf is allowed.
//     Then the request's logit_bias, before anything else as in vLLM: w = w + b for each listed
//     token, one fp32 add (listed tokens only, even for b = 0).
//  1. Penalties, vLLM/HF semantics, each an fp32 operation rounded once (the tree builds with
//     -ffp-contract=off, so nothing is fused):
//       repetition r, once per distinct token of prompt + output:  w = w > 0 ? w / r : w * r;
//       then, per distinct token of output occurring c times:
//         w = w - fl32(frequency * float(c));  then  w = w - presence.
//     A penalty at its neutral value (r = 1, 0) is skipped, which is bit-identical.
//  2. Temperature: w = w / T in fp32 (skipped at T = 1, again bit-identical).
//  3. Top-k when 0 < k < V: keep the first k tokens ordered by (w desc, id asc); -0 and +0 tie.
//  4. Softmax over the kept tokens: m = max w. If m is +inf, e = 1 for tokens at +inf and 0 for
//     the rest (the limit, instead of NaN). Otherwise e = ExpForSoftmax(w - m) in fp32, which is
//     0 when w - m < kExpFlushBelow (-87: exp(-87) = 1.6e-38, the bottom of the normal floats).
//     S = sum of e in fp64 in ascending id order; p = fl32(double(e) / S). If every kept w is
//     -inf there is no distribution: INVALID_ARGUMENT. A p that is 0 here (flushed, or
//     underflowed in the division) is out of the support from here on.
//  5. Top-p when top_p < 1: order the tokens with p > 0 by (p desc, id asc), accumulate the fp32
//     p in fp64 along that order, and keep the shortest prefix whose sum >= double(top_p); if
//     rounding keeps the sum below top_p, keep them all.
//  6. Min-p when min_p > 0: keep p >= fl32(min_p * p_max) (an fp32 product), p_max the largest p
//     of step 4 (top-p always keeps it).
//  7. Renormalise, when top-p or min-p is enabled (otherwise step 4's row is the result):
//     S' = sum of the kept p in fp64 in ascending id order; out = fl32(double(p) / S').
// Removed tokens get exactly 0. Everything is deterministic and depends only on this row's
// inputs. Temperature 0 (greedy) gives the one-hot row of GreedyToken.
#ifndef SPECD_KERNELS_CPU_PROCESSED_H_
#define SPECD_KERNELS_CPU_PROCESSED_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/sampling_params.h"

namespace specd::kernels::cpu {

// What a row's processing reads besides its logits: the tokens the penalties look at (this
// round's earlier drafts belong in `output`) and the request's logit bias (ascending tokens).
struct TokenHistory {
  TokenHistory() = default;
  TokenHistory(std::span<const int32_t> prompt, std::span<const int32_t> output,
               std::span<const TokenBias> bias = {})
      : prompt(prompt), output(output), bias(bias) {}

  std::span<const int32_t> prompt;
  std::span<const int32_t> output;
  std::span<const TokenBias> bias;
};

// Tokens more than this far below the maximum logit (after temperature) get probability 0.
inline constexpr float kExpFlushBelow = -87.0f;

// exp(x) for x <= 0 as used in step 4: a fixed polynomial (Cephes' expf) of IEEE adds and
// multiplies only, so it vectorises and gives the same bits on every machine and libm; within
// 1 ulp of exp on [kExpFlushBelow, 0], and 0 below kExpFlushBelow.
float ExpForSoftmax(float x);

// Holds scratch buffers so a worker can process many rows without allocating; buffers grow to
// the largest vocabulary seen. Not thread-safe: use one per thread.
class LogitsProcessor {
 public:
  LogitsProcessor() = default;

  // Steps 1-7 above for `logits` (V entries) into `probs_out` (V entries; may be the same memory
  // as `logits`). INVALID_ARGUMENT for bad params, mismatched sizes, a NaN logit, a history id
  // outside [0, V) (checked only when a penalty reads that history), or no finite logit left;
  // after an error `probs_out` holds no meaningful row.
  absl::Status ProcessedDistribution(std::span<const float> logits, const SamplingParams& params,
                                     const TokenHistory& history, std::span<float> probs_out);

  // Step 1, then the argmax with the lowest id on ties. Temperature and the filters cannot change
  // the argmax, so they are not applied. Same errors as ProcessedDistribution, except that an
  // all -inf row is well defined here (token 0).
  absl::StatusOr<int32_t> GreedyToken(std::span<const float> logits, const SamplingParams& params,
                                      const TokenHistory& history);

  // Steps 0 and 1 alone: `logits` with the bias and the penalties applied, into `out` (V entries;
  // may be the same memory). ProcessedDistribution of the result with neutral penalties is
  // bit-identical to ProcessedDistribution of `logits`. Same errors as GreedyToken.
  absl::Status Penalize(std::span<const float> logits, const SamplingParams& params,
                        const TokenHistory& history, std::span<float> out);

 private:
  // Step 0 and 1: copies `logits` to `work` with the bias and the penalties applied.
  absl::Status LoadPenalized(std::span<const float> logits, const SamplingParams& params,
                             const TokenHistory& history, std::span<float> work);
  // Step 3: fills support_ with the kept ids, ascending, and values_ with their logits.
  void SelectTopK(std::span<const float> work, int64_t k);
  // Step 5 over the active tokens; zeroes the removed ones in `probs`.
  void ApplyTopP(std::span<float> probs, float top_p);
  // Calls fn(id, probs[id]) for every token still in play, in ascending id order: all of them,
  // or the top-k set.
  template <typename Fn>
  void ForEachActive(std::span<float> probs, Fn&& fn) const;

  std::vector<uint32_t> seen_stamp_;  // seen_stamp_[id] == stamp_: id already penalised
  uint32_t stamp_ = 0;
  std::vector<int32_t> output_counts_;  // all zero between calls
  std::vector<int32_t> touched_;        // ids with a non-zero output_counts_ entry
  bool dense_ = true;                   // no top-k: every token is active
  std::vector<float> values_;           // top-k: logits, then probabilities, of support_
  std::vector<int32_t> support_;        // top-k: the kept ids, ascending
  std::vector<int32_t> order_;
  std::vector<double> bucket_mass_;
};

// The lowest id among the maxima of a NaN-free row (0 for an empty one).
int32_t ArgMaxLowestId(std::span<const float> row);

// One-shot forms that allocate their scratch; prefer a LogitsProcessor for many rows.
absl::Status ProcessedDistribution(std::span<const float> logits, const SamplingParams& params,
                                   const TokenHistory& history, std::span<float> probs_out);
absl::StatusOr<int32_t> GreedyToken(std::span<const float> logits, const SamplingParams& params,
                                    const TokenHistory& history);

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_PROCESSED_H_
