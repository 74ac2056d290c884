#include "tools/specd/bench/bench_stats.h"

#include <algorithm>
#include <cmath>

namespace specd::bench {

std::optional<double> Percentile(std::span<const double> values, double q) {
  if (values.empty()) return std::nullopt;
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  const double h = static_cast<double>(sorted.size() - 1) * std::clamp(q, 0.0, 100.0) / 100.0;
  const size_t lo = static_cast<size_t>(std::floor(h));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (h - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

std::optional<double> Median(std::span<const double> values) { return Percentile(values, 50); }

Distribution Summarize(std::span<const double> values) {
  Distribution d;
  d.count = static_cast<int64_t>(values.size());
  if (values.empty()) return d;
  double sum = 0;
  for (const double v : values) sum += v;
  d.mean = sum / static_cast<double>(values.size());
  d.p50 = Percentile(values, 50);
  d.p90 = Percentile(values, 90);
  d.p99 = Percentile(values, 99);
  return d;
}

void AcceptanceTotals::Add(int64_t rounds_in, int64_t drafting_rounds_in, int64_t draft_tokens_in,
                           int64_t accepted_tokens_in, std::span<const int64_t> per_position) {
  rounds += rounds_in;
  drafting_rounds += drafting_rounds_in;
  draft_tokens += draft_tokens_in;
  accepted_tokens += accepted_tokens_in;
  if (accepted_per_position.size() < per_position.size()) {
    accepted_per_position.resize(per_position.size(), 0);
  }
  for (size_t k = 0; k < per_position.size(); ++k) accepted_per_position[k] += per_position[k];
}

AcceptanceStats ComputeAcceptance(const AcceptanceTotals& t) {
  AcceptanceStats s;
  if (t.rounds > 0) {
    s.mean_accepted_length =
        static_cast<double>(t.accepted_tokens + t.rounds) / static_cast<double>(t.rounds);
  }
  if (t.draft_tokens <= 0) return s;
  s.acceptance_rate = static_cast<double>(t.accepted_tokens) / static_cast<double>(t.draft_tokens);
  // Positions judged: the first draft of every drafting round, and position k + 1 of every round
  // that accepted draft k (the last position drafted has no successor).
  int64_t judged = t.drafting_rounds;
  for (size_t k = 0; k + 1 < t.accepted_per_position.size(); ++k) {
    judged += t.accepted_per_position[k];
  }
  if (judged > 0) {
    s.alpha = static_cast<double>(t.accepted_tokens) / static_cast<double>(judged);
  }
  if (t.drafting_rounds > 0) {
    for (const int64_t n : t.accepted_per_position) {
      s.per_position.push_back(static_cast<double>(n) / static_cast<double>(t.drafting_rounds));
    }
  }
  return s;
}

void TimingTotals::Add(int64_t rounds_in, int64_t draft_steps_in, int64_t draft_forward_ns_in,
                       int64_t verify_forward_ns_in, int64_t round_ns_in) {
  rounds += rounds_in;
  draft_steps += draft_steps_in;
  draft_forward_ns += draft_forward_ns_in;
  verify_forward_ns += verify_forward_ns_in;
  round_ns += round_ns_in;
}

StepTimes ComputeStepTimes(const TimingTotals& t) {
  StepTimes s;
  constexpr double kNsPerMs = 1e6;
  if (t.rounds > 0) {
    const double rounds = static_cast<double>(t.rounds);
    s.verify_ms = static_cast<double>(t.verify_forward_ns) / kNsPerMs / rounds;
    s.mean_k = static_cast<double>(t.draft_steps) / rounds;
    s.round_ms = static_cast<double>(t.round_ns) / kNsPerMs / rounds;
    const double outside =
        static_cast<double>(t.round_ns - t.draft_forward_ns - t.verify_forward_ns);
    s.overhead_ms = outside / kNsPerMs / rounds;
    if (t.round_ns > 0) s.overhead_fraction = outside / static_cast<double>(t.round_ns);
  }
  if (t.draft_steps > 0) {
    s.draft_step_ms =
        static_cast<double>(t.draft_forward_ns) / kNsPerMs / static_cast<double>(t.draft_steps);
  }
  return s;
}

double ExpectedTokensPerRound(double alpha, double k) {
  alpha = std::clamp(alpha, 0.0, 1.0);
  if (alpha >= 1.0) return k + 1.0;
  if (alpha <= 0.0) return 1.0;
  // 1 - α^(K+1) = -expm1((K+1)·ln α) keeps its digits when α is close to 1.
  return -std::expm1((k + 1.0) * std::log(alpha)) / (1.0 - alpha);
}

double IdealSpeedup(double alpha, double k, double draft_to_target_cost) {
  return ExpectedTokensPerRound(alpha, k) / (k * draft_to_target_cost + 1.0);
}

double EngineLimitedSpeedup(double alpha, double k, double target_step, double draft_step,
                            double verify_step) {
  return ExpectedTokensPerRound(alpha, k) * target_step / (k * draft_step + verify_step);
}

}  // namespace specd::bench
