// Adaptive K (issue 7): lowers the number of speculative tokens when the measured costs say that
// speculation would not pay at the current load.
//
// Speculation pays while the target's forward pass is memory-bound: verifying K + 1 tokens costs
// barely more than decoding one. With many streams the batch becomes compute-bound, verifying
// B·(K + 1) tokens costs about (K + 1)× one decode step, and the drafts are wasted work. Like
// SmartSpec (Liu et al. 2024, "Optimizing Speculative Decoding for Serving Large Language Models
// Using Goodput") the controller picks, every round, the K' ≤ K that maximises the predicted
// goodput (committed tokens per second)
//
//   G(K') = B · E[tokens](α, K') / (K' · T_d(B) + T_v(B · (K' + 1)) + overhead_spec(B)),
//   G(0)  = B / (T_v(B) + overhead_plain(B)),     E[tokens] = (1 − α^(K'+1)) / (1 − α),
//
// from a cost model fitted online to the workers' own forward-pass timings. Changing K never
// changes the output distribution (DESIGN.md, "Randomness"): only the K schedule adapts.
//
// Thread model: one instance per scheduler, used only from the scheduler thread (no locks).
#ifndef SPECD_SERVICES_COORDINATOR_ADAPTIVE_K_H_
#define SPECD_SERVICES_COORDINATOR_ADAPTIVE_K_H_

#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace specd {

// Forward time as a function of the work size n (tokens in one pass, or sequences in one draft
// step). Real costs follow a roofline: flat while memory-bound, then linear once compute-bound,
// so one global line fits neither end. Each quarter-octave bucket of n keeps an EMA of
// (n, seconds). Between two observed buckets a and b the estimate is the pure roofline through
// them, max(t_a, t_b · n / n_b): flat from the left, proportional into the right. It is exact for
// a roofline and optimistic for a smoother curve (a chord would be pessimistic), which is what
// makes the controller try an unmeasured K and so measure it instead of never trying it. (It is
// capped by the chord, which only matters when noise makes t_b < t_a.) Beyond the observed range
// the estimate follows the nearest segment's slope, clamped to [0, t/n] so that it neither falls
// as n grows nor grows faster than proportionally. With one observed bucket it is flat.
//
// The EMA runs in time, not in samples: a bucket last updated `age` rounds ago keeps weight
// (1 − w)^age, so the first measurement after a long gap (an exploration round) mostly replaces
// a stale value instead of nudging it.
class CostCurve {
 public:
  static constexpr int kBucketsPerOctave = 4;
  static constexpr int kNumBuckets = 40 * kBucketsPerOctave;

  // `ema_weight`: weight of a new measurement in a bucket updated the round before.
  explicit CostCurve(double ema_weight = 0.1) : ema_weight_(ema_weight) {}

  // Adds one measurement taken in round `now` (a counter that never decreases); ignored unless
  // n >= 1 and seconds > 0 (both finite).
  void Add(double n, double seconds, int64_t now);

  // Seconds for size n; nullopt before any measurement or for n < 1.
  std::optional<double> Estimate(double n) const;

  // How many measurements n's own bucket has had (0: the estimate there is modelled).
  int64_t Measurements(double n) const;
  bool empty() const { return num_buckets_ == 0; }

  // "n=t,..." with t in ms per observed bucket, for logs.
  std::string DebugString() const;

 private:
  struct Bucket {
    double n = 0;        // EMA of the sizes seen in this bucket
    double seconds = 0;  // EMA of their times
    int64_t count = 0;
    int64_t updated = 0;  // round of the latest measurement
  };
  static int BucketOf(double n);

  double ema_weight_;
  int num_buckets_ = 0;
  std::array<Bucket, kNumBuckets> buckets_{};
};

struct AdaptiveKOptions {
  // Per-token acceptance before any data, and how many pseudo-attempts it weighs. The prior
  // starts in the decayed sums, so it fades as data comes in.
  double alpha_prior = 0.6;
  double alpha_prior_weight = 16;
  // An observation's weight halves after this many later attempts (accepted drafts +
  // rejections) and, separately, after this many later rounds: at K' = 0 no attempts come in,
  // and the next exploration round should not have to outvote a stale estimate. Decay scales
  // both sums alike, so α itself does not drift while no data comes in.
  double alpha_half_life_attempts = 512;
  double alpha_half_life_rounds = 64;
  // Weight of a new timing in its bucket's EMA per round (the first few are averaged evenly).
  double cost_ema_weight = 0.1;
  // A new K' replaces the current one only if its predicted goodput is higher by this fraction.
  double hysteresis = 0.03;
  // Data needed before the model may lower K: steady speculative rounds and acceptance attempts.
  int32_t min_steady_rounds = 4;
  int32_t min_alpha_attempts = 32;
  // After a stretch at K' = 0, run `explore_rounds` at the requested K so that α and the draft
  // and verification costs stay current. Two, because the first one's draft step carries the
  // catch-up of every round without drafts and so does not time a steady step. Exploring is
  // expensive exactly where K' = 0 wins (a compute-bound verification of B·(K+1) tokens, and the
  // draft prefilling everything it missed), so it waits for at least `explore_interval` rounds
  // at K' = 0 and until the wall time spent there since the last exploration, times
  // `explore_budget`, covers what that exploration cost beyond K' = 0 rounds. Exploration then
  // costs at most about `explore_budget` of the time: issue 7 allows 5% in all.
  int32_t explore_interval = 32;
  int32_t explore_rounds = 2;
  double explore_budget = 0.02;
  // When the plan is K' > 0 but the K' = 0 cost at this batch size, T_v(B), has fewer than
  // `probe_rounds` measurements, that many rounds run at K' = 0 to measure it (one alone is at
  // the mercy of noise, and is never refreshed while K' > 0); at most once per
  // `probe_interval` rounds.
  int32_t probe_rounds = 3;
  int32_t probe_interval = 64;
};

// One round as the scheduler saw it. Times are the workers' own forward-pass times; `round` is the
// coordinator's wall time for the whole round, so the rest (RPCs, accept/reject, Truncate) is
// modelled as overhead.
struct RoundObservation {
  int32_t batch_size = 0;             // sequences verified this round (B)
  int32_t drafting_sequences = 0;     // sequences that drafted (K > 0)
  int64_t draft_catch_up_tokens = 0;  // Σ catch-up tokens fed in the first draft step
  int32_t draft_steps = 0;            // draft forward passes (max K)
  absl::Duration draft_forward;       // their total time
  int64_t verify_tokens = 0;          // tokens in the target's pass: Σ (catch-up + K)
  absl::Duration verify_forward;      // the target's verification pass
  int64_t drafted_tokens = 0;         // Σ K
  int64_t accepted_tokens = 0;        // Σ n
  int32_t rejections = 0;             // sequences whose round ended in a rejected draft (n < K)
  absl::Duration round;               // wall time of the whole round
};

enum class KChoiceReason {
  kRequested,  // nothing to decide: K = 0 asked for
  kWarmup,     // not enough data yet: the requested K
  kModel,      // the cost model's choice
  kExplore,    // the requested K, to refresh estimates after a stretch at K' = 0
  kProbe,      // K' = 0 for a few rounds, to measure T_v(B)
};
absl::string_view KChoiceReasonName(KChoiceReason reason);

struct KChoice {
  int32_t k = 0;
  KChoiceReason reason = KChoiceReason::kRequested;
};

// What the controller currently believes, for metrics and logs.
struct AdaptiveKEstimates {
  double alpha = 0;                              // per-token acceptance
  double alpha_weight = 0;                       // decayed attempts behind it, prior included
  int64_t steady_rounds = 0;                     // rounds whose timings entered the cost model
  bool ready = false;                            // enough data for the model to lower K
  std::map<int32_t, int32_t> chosen_k_by_batch;  // latest model choice per batch size
};

class AdaptiveK {
 public:
  // Default options.
  AdaptiveK();
  // INVALID_ARGUMENT naming the option when one is out of range.
  static absl::StatusOr<AdaptiveK> Create(const AdaptiveKOptions& options);

  // Records one finished round: the one the latest Choose planned, which is how exploration
  // rounds are told apart and costed. INVALID_ARGUMENT naming the field, with nothing recorded,
  // when the counts contradict each other. Rounds that fed long catch-ups (prefill, preemption
  // replay) update α but not the cost model: their forward times include untimed prefill chunks
  // and prompt tokens without logits, so they are not verification costs.
  absl::Status Observe(const RoundObservation& round);

  // The K to use this round for a batch of `batch_size` sequences that asked for `requested_k`:
  // never above it. Call once per round, before the round: exploration and probes count rounds.
  KChoice Choose(int32_t batch_size, int32_t requested_k);

  // Predicted goodput in tokens per second for `batch_size` sequences at K = k; nullopt while a
  // cost it needs has no data.
  std::optional<double> PredictGoodput(int32_t batch_size, int32_t k) const;

  AdaptiveKEstimates Estimates() const;
  double alpha() const;
  // One line: α, readiness and the cost curves.
  std::string DebugString() const;

 private:
  explicit AdaptiveK(const AdaptiveKOptions& options);
  bool Ready() const;
  // Choose without the bookkeeping of which round comes next.
  KChoice Plan(int32_t batch_size, int32_t requested_k);
  // Predicted wall time of one round (forward passes and overhead).
  std::optional<double> PredictRoundSeconds(int32_t batch_size, int32_t k) const;

  AdaptiveKOptions options_;
  double alpha_decay_per_attempt_;
  double alpha_decay_per_round_;
  int64_t observed_rounds_ = 0;  // the clock of the cost curves

  // Decayed sums behind α = accepted_ / attempts_: accepted drafts, and attempts = accepted +
  // rejections, both starting with the prior's pseudo-counts.
  double accepted_;
  double attempts_;
  int64_t total_attempts_ = 0;  // undecayed, for readiness

  CostCurve verify_;          // target pass vs tokens in it
  CostCurve draft_step_;      // one draft step vs sequences in it
  CostCurve overhead_spec_;   // non-forward time of a drafting round vs B
  CostCurve overhead_plain_;  // same for a round without drafts
  int64_t steady_rounds_ = 0;

  int32_t current_k_ = -1;  // the model's latest choice (-1: none yet)
  int32_t zero_streak_ = 0;
  int32_t explore_left_ = 0;
  int32_t probe_left_ = 0;
  double zero_seconds_ = 0;  // wall time at K' = 0 since the latest exploration
  // What the latest exploration cost beyond K' = 0 rounds; before the first, the prediction.
  std::optional<double> explore_cost_;
  // The latest Choose and its batch size, until its round is observed.
  struct Planned {
    KChoice choice;
    int32_t batch_size = 0;
  };
  std::optional<Planned> planned_;
  int64_t rounds_since_probe_ = std::numeric_limits<int64_t>::max() / 2;
  std::map<int32_t, int32_t> chosen_k_by_batch_;
};

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_ADAPTIVE_K_H_
