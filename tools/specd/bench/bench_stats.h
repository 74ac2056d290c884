// The arithmetic of `specd bench`: latency percentiles, acceptance statistics from the servers'
// Usage counters, per-step times from Usage.timings, and the two speed-up predictions that
// `--compare` sets against the measured one. Pure functions over plain numbers (no gRPC), so the
// tests can check them against independent references.
#ifndef SPECD_TOOLS_SPECD_BENCH_BENCH_STATS_H_
#define SPECD_TOOLS_SPECD_BENCH_BENCH_STATS_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace specd::bench {

// The q-th percentile (q in [0, 100]) by linear interpolation between the two nearest ranks:
// with the values sorted as x_0 <= ... <= x_{n-1}, h = (n - 1) * q / 100 and the result is
// x_floor(h) + (h - floor(h)) * (x_floor(h)+1 - x_floor(h)). This is numpy.percentile's default
// ("linear", Hyndman & Fan type 7), which vLLM's benchmark_serving also uses. Empty input gives
// nullopt.
std::optional<double> Percentile(std::span<const double> values, double q);

// The median of `values` (the 50th percentile above); nullopt when empty.
std::optional<double> Median(std::span<const double> values);

// Count, mean and p50/p90/p99 of a sample; all statistics are nullopt when it is empty.
struct Distribution {
  int64_t count = 0;
  std::optional<double> mean, p50, p90, p99;
};
Distribution Summarize(std::span<const double> values);

// Usage counters summed over a run's requests (each request's final Usage message).
struct AcceptanceTotals {
  int64_t rounds = 0;           // every round, including those without a draft
  int64_t drafting_rounds = 0;  // rounds with K > 0
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  std::vector<int64_t> accepted_per_position;  // [k]: rounds whose draft k+1 was accepted

  void Add(int64_t rounds, int64_t drafting_rounds, int64_t draft_tokens, int64_t accepted_tokens,
           std::span<const int64_t> accepted_per_position);
};

struct AcceptanceStats {
  // accepted_tokens / draft_tokens: vLLM's "draft acceptance rate" (the servers'
  // Usage.acceptance_rate). nullopt when nothing was drafted (a K = 0 run).
  std::optional<double> acceptance_rate;
  // α, the probability that a draft token is accepted given that every earlier draft of its
  // round was: accepted_tokens / draft positions the target actually judged. Position k (0-based)
  // is judged in every round whose drafts 1..k were all accepted, so the positions judged are
  // drafting_rounds + Σ_{k≥1} accepted_per_position[k-1] over the positions a round drafted. This
  // is the α of Leviathan et al. (2023): for i.i.d. acceptance with probability a it estimates a,
  // while acceptance_rate estimates a(1 - a^K) / (K(1 - a)), which is lower. Exact for a fixed K;
  // when K varies between rounds (adaptive K) it counts a fully accepted short round as judged
  // one position further, which biases α down a little. nullopt when nothing was drafted.
  std::optional<double> alpha;
  // Tokens committed per round, the bonus or correction token included:
  // (accepted_tokens + rounds) / rounds. nullopt without rounds.
  std::optional<double> mean_accepted_length;
  // accepted_per_position[k] / drafting_rounds: how often draft k+1 was accepted (vLLM's
  // per-position acceptance). Empty when nothing was drafted.
  std::vector<double> per_position;
};
AcceptanceStats ComputeAcceptance(const AcceptanceTotals& totals);

// Usage.timings summed over a run's requests.
struct TimingTotals {
  int64_t rounds = 0;
  int64_t draft_steps = 0;
  int64_t draft_forward_ns = 0;
  int64_t verify_forward_ns = 0;
  int64_t round_ns = 0;

  void Add(int64_t rounds, int64_t draft_steps, int64_t draft_forward_ns, int64_t verify_forward_ns,
           int64_t round_ns);
};

// Per-step times of one run, in milliseconds. With several concurrent streams these are times of
// whole batches (every request of the batch reports the same round), averaged over the rounds the
// requests took part in.
struct StepTimes {
  // verify_forward_ns / rounds: T_t (one plain target decode step) in a K = 0 run, T_v(K) (one
  // (K+1)-token verification) in a K run.
  std::optional<double> verify_ms;
  // draft_forward_ns / draft_steps: T_d, one draft forward pass.
  std::optional<double> draft_step_ms;
  // draft_steps / rounds: the K a round really drafted (the requested K under a fixed policy).
  std::optional<double> mean_k;
  // Coordinator overhead, the round time spent outside the workers' forward passes (RPC,
  // accept/reject, scheduling): Σ(round_ns - draft_forward_ns - verify_forward_ns) / rounds
  // per round, and the same sum / Σ round_ns as a fraction of round time.
  std::optional<double> overhead_ms;
  std::optional<double> overhead_fraction;
  // round_ns / rounds.
  std::optional<double> round_ms;
};
StepTimes ComputeStepTimes(const TimingTotals& totals);

// E[tokens per round] = Σ_{i=0..K} α^i = (1 - α^(K+1)) / (1 - α): the accepted drafts plus the
// bonus or correction token, for i.i.d. acceptance with probability α (Leviathan et al. 2023,
// eq. 1). K may be fractional (a mean K). α = 1 gives K + 1.
double ExpectedTokensPerRound(double alpha, double k);

// Leviathan et al. (2023), Theorem 3.8: the walltime improvement of speculative decoding with K
// drafts when a draft step costs c = T_d / T_t of a target step and a (K+1)-token verification
// costs the same as one target step: (1 - α^(K+1)) / ((1 - α)(K·c + 1)).
double IdealSpeedup(double alpha, double k, double draft_to_target_cost);

// The speed-up this engine allows: E[tokens]·T_t / (K·T_d + T_v(K)), i.e. the ideal one with the
// measured verification cost T_v(K) in place of T_t. Every time in the same unit.
double EngineLimitedSpeedup(double alpha, double k, double target_step, double draft_step,
                            double verify_step);

}  // namespace specd::bench

#endif  // SPECD_TOOLS_SPECD_BENCH_BENCH_STATS_H_
