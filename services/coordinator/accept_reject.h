// The accept/reject step of speculative sampling (Leviathan et al. 2023, "Fast Inference from
// Transformers via Speculative Decoding", Algorithm 1 and Appendix A.1; Chen et al. 2023), in the
// form DESIGN.md ("One speculation round", step 3) specifies so that no probability row crosses the
// wire in the common case:
//
//  * accept draft t_i while u_i · q_i(t_i) < p_i(t_i), u_i from (seed, pos_i, ACCEPT);
//  * at the first rejection r, the correction comes from norm(max(0, p_r − q_r)) by rejection
//    sampling with proposal p_r: candidate y_j ~ p_r (drawn by the target worker) is taken when
//    w_j · p_r(y_j) < p_r(y_j) − min(p_r(y_j), q_r(y_j)), w_j from (seed, pos_r,
//    CANDIDATE_ACCEPT, j). Each candidate is accepted with probability max(0, 1 − q/p), which is
//    exactly rejection sampling of the residual from p;
//  * if none of the M candidates passes, sample the residual directly from both rows with
//    (seed, pos_r, RESIDUAL_FALLBACK); if it sums to 0 in fp32, sample p_r.
//  * if all K drafts are accepted, the target's pre-drawn bonus b ~ p_{K+1} follows.
//
// Every uniform at position j is read only for the decision at j, which is what keeps the output
// distribution the target's (DESIGN.md, "Randomness").
#ifndef SPECD_SERVICES_COORDINATOR_ACCEPT_REJECT_H_
#define SPECD_SERVICES_COORDINATOR_ACCEPT_REJECT_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "base/inverse_cdf.h"

namespace specd {

// What the draft and target workers returned for one sequence's round.
struct RoundEvidence {
  uint64_t seed = 0;
  uint32_t sample = 0;                 // the completion number (Philox counter's `sample`)
  uint32_t position = 0;               // absolute position of t_1 in x
  std::vector<int32_t> draft_tokens;   // t_1..t_K
  std::vector<float> q_draft;          // q_i(t_i)
  std::vector<float> p_draft;          // p_i(t_i)
  std::vector<int32_t> target_argmax;  // argmax p_i, i = 1..K+1 (greedy)
  int32_t bonus_token = 0;             // b ~ p_{K+1}
};

// How many drafts are accepted (0..K). Greedy compares with the target's argmax.
int32_t CountAccepted(const RoundEvidence& round, bool greedy);

// Candidate-based correction at rejection step r (1-based, r = n + 1): the first candidate y_j
// with w_j · p(y_j) < p(y_j) − min(p(y_j), q(y_j)), or nullopt if none passes.
std::optional<int32_t> ChooseCandidate(uint64_t seed, uint32_t sample, uint32_t position_r,
                                       std::span<const int32_t> candidates,
                                       std::span<const float> p_candidates,
                                       std::span<const float> q_candidates);

// The exact fallback: sample norm(max(0, p − q)) in token-id order with the RESIDUAL_FALLBACK
// uniform at `position_r`; if that residual sums to 0 in fp32, sample p. Residual entries are fp32
// `p − min(p, q)`, summed in fp64 (DESIGN.md, "Randomness").
absl::StatusOr<int32_t> SampleResidual(uint64_t seed, uint32_t sample, uint32_t position_r,
                                       const ProbRow& p, const ProbRow& q, int64_t vocab_size);

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_ACCEPT_REJECT_H_
