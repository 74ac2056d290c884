// Entropy-guided adaptive draft length (EGAG): the draft length γ of a request follows the
// draft's own uncertainty. After each draft step the draft worker reports the normalized entropy
// H = H(s) / log V of s = softmax(draft logits) at temperature 1 (whatever the request's
// sampling, so a greedy draft is judged by the same measure). Per request:
//
//   h <- β·h + (1 − β)·H                          (an EMA, h = 0 before any step)
//   γ  = clamp(round(γ_max − (γ_max − γ_min)·h), γ_min, γ_max)
//
// where γ_max is the K the request may use this round (the adaptive-K policy's choice, or the
// request's own), and within a round the worker stops after step k >= γ_min once H > τ.
//
// Exactness: a round's K is then a stopping time of the drafting alone, decided before any
// acceptance uniform of the round is read (docs/architecture.md, "Randomness"). One refinement
// keeps it so across rounds: h takes H only from steps whose context was committed (the first
// n + 1 steps of a round that accepted n drafts). A step after a rejected draft saw that draft,
// which the DRAFT_SAMPLE uniforms of later positions chose; folding it into h would let those
// uniforms decide whether the same positions are drafted in the next round, when the draft reads
// them again.
#ifndef SPECD_SERVICES_COORDINATOR_EGAG_H_
#define SPECD_SERVICES_COORDINATOR_EGAG_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace specd {

struct EgagOptions {
  double ema_beta = 0.5;   // β in [0, 1)
  double threshold = 0.6;  // τ in [0, 1]: stop drafting once H exceeds it
  int32_t min_tokens = 1;  // γ_min >= 1
};

// INVALID_ARGUMENT naming the flag for an out-of-range option.
absl::Status ValidateEgagOptions(const EgagOptions& options);

// One request's EGAG state. Never shared between requests, so a seeded request's drafts do not
// depend on the load.
struct EgagState {
  bool enabled = false;
  EgagOptions options;
  double h = 0.0;

  // γ for a round whose largest allowed K is `k_max` (k_max itself when disabled).
  int32_t DraftLength(int32_t k_max) const;
  // Folds in the entropies of one round's steps whose context was committed, in step order.
  void Observe(std::span<const float> committed_entropies);
};

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_EGAG_H_
