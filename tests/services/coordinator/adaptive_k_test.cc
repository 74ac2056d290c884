// Adaptive K against synthetic rounds from known cost models. The simulator below produces what
// the scheduler would report (forward times, catch-up sizes, accepted drafts drawn with a known
// per-token α), and the best K is found here by brute force over the goodput formula,
// written independently of adaptive_k.cc.
#include "services/coordinator/adaptive_k.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

constexpr double kMs = 1e-3;

// Known costs. Forward times follow a roofline: flat while memory-bound, linear beyond the knee.
struct Costs {
  double target_s = 20 * kMs;  // one target pass of up to `target_knee` tokens
  double target_knee = 64;
  double draft_s = 2 * kMs;  // one draft step of up to `draft_knee` tokens
  double draft_knee = 64;
  double overhead_spec_s = 1 * kMs;  // RPCs, accept/reject and Truncates of a drafting round
  double overhead_spec_per_seq_s = 0.05 * kMs;
  double overhead_plain_s = 0.5 * kMs;

  double Target(double n) const { return target_s * std::max(1.0, n / target_knee); }
  double Draft(double n) const { return draft_s * std::max(1.0, n / draft_knee); }
  double OverheadSpec(int b) const { return overhead_spec_s + overhead_spec_per_seq_s * b; }
};

// Tokens per second of b sequences at K = k: b · Σ_{i=0..k} α^i over the round's time.
double TrueGoodput(const Costs& c, double alpha, int b, int k) {
  double tokens = 0;
  double alpha_i = 1;
  for (int i = 0; i <= k; ++i) {
    tokens += alpha_i;
    alpha_i *= alpha;
  }
  const double seconds = k == 0 ? c.Target(b) + c.overhead_plain_s
                                : k * c.Draft(b) + c.Target(b * (k + 1.0)) + c.OverheadSpec(b);
  return b * tokens / seconds;
}

int BestK(const Costs& c, double alpha, int b, int requested) {
  int best = 0;
  for (int k = 1; k <= requested; ++k) {
    if (TrueGoodput(c, alpha, b, k) > TrueGoodput(c, alpha, b, best)) best = k;
  }
  return best;
}

// Rounds as the scheduler reports them. Every time is scaled by a factor uniform in
// [1 - jitter, 1 + jitter]; each draft is accepted with probability α until the first rejection.
class Simulator {
 public:
  Simulator(const Costs& costs, double alpha, double jitter, uint32_t seed)
      : costs_(costs), alpha_(alpha), jitter_(jitter), rng_(seed) {}

  void set_costs(const Costs& costs) { costs_ = costs; }
  void set_alpha(double alpha) { alpha_ = alpha; }

  // A decode round of b sequences at K = k. `prompt_tokens` > 0 makes it the sequences' first
  // round, which carries their prompts as catch-up.
  RoundObservation Round(int b, int k, int prompt_tokens = 0) {
    RoundObservation r;
    r.batch_size = b;
    for (int s = 0; s < b && k > 0; ++s) {
      int n = 0;
      while (n < k && Uniform() < alpha_) ++n;
      r.accepted_tokens += n;
      if (n < k) ++r.rejections;
    }
    r.drafted_tokens = static_cast<int64_t>(b) * k;
    // The target's catch-up is the last committed token (or the prompt); then the drafts.
    const int64_t verify_catch_up = prompt_tokens > 0 ? int64_t{b} * prompt_tokens : b;
    r.verify_tokens = verify_catch_up + r.drafted_tokens;
    const double verify = Jitter(costs_.Target(static_cast<double>(r.verify_tokens)));
    double draft = 0;
    if (k > 0) {
      r.drafting_sequences = b;
      r.draft_steps = k;
      // The first step feeds what the draft has not seen: one token per round since it last
      // drafted (at least the last committed one), or the prompt.
      r.draft_catch_up_tokens =
          prompt_tokens > 0 ? verify_catch_up : int64_t{b} * (1 + rounds_without_draft_);
      draft = Jitter(costs_.Draft(static_cast<double>(r.draft_catch_up_tokens))) +
              (k - 1) * Jitter(costs_.Draft(b));
      rounds_without_draft_ = 0;
    } else {
      ++rounds_without_draft_;
    }
    const double overhead = Jitter(k > 0 ? costs_.OverheadSpec(b) : costs_.overhead_plain_s);
    r.verify_forward = absl::Seconds(verify);
    r.draft_forward = absl::Seconds(draft);
    r.round = absl::Seconds(verify + draft + overhead);
    return r;
  }

 private:
  // From the raw Mersenne Twister output, whose sequence the standard fixes (distributions are
  // implementation-defined).
  double Uniform() { return static_cast<double>(rng_() >> 8) * 0x1p-24; }
  double Jitter(double seconds) { return seconds * (1 + jitter_ * (2 * Uniform() - 1)); }

  Costs costs_;
  double alpha_;
  double jitter_;
  std::mt19937 rng_;
  int64_t rounds_without_draft_ = 0;
};

// What a run chose, and what each round really cost and committed.
struct Trace {
  std::vector<KChoice> choices;
  std::vector<double> seconds;
  std::vector<int64_t> tokens;

  // Committed tokens per second over rounds [from, end).
  double Throughput(size_t from) const {
    double t = 0;
    double n = 0;
    for (size_t i = from; i < seconds.size(); ++i) {
      t += seconds[i];
      n += static_cast<double>(tokens[i]);
    }
    return n / t;
  }
  std::vector<int> ModelKs(size_t from = 0) const {
    std::vector<int> ks;
    for (size_t i = from; i < choices.size(); ++i) {
      if (choices[i].reason == KChoiceReason::kModel) ks.push_back(choices[i].k);
    }
    return ks;
  }
  int Count(KChoiceReason reason) const {
    return static_cast<int>(std::count_if(choices.begin(), choices.end(),
                                          [&](const KChoice& c) { return c.reason == reason; }));
  }
};

// The scheduler's loop in miniature: choose, run the round at that K, report it.
Trace RunRounds(AdaptiveK& ak, Simulator& sim, int b, int requested, int rounds,
                int prompt_tokens = 0) {
  Trace trace;
  for (int i = 0; i < rounds; ++i) {
    const KChoice c = ak.Choose(b, requested);
    const RoundObservation r = sim.Round(b, c.k, i == 0 ? prompt_tokens : 0);
    trace.choices.push_back(c);
    trace.seconds.push_back(absl::ToDoubleSeconds(r.round));
    trace.tokens.push_back(r.accepted_tokens + b);  // accepted drafts + one token per sequence
    const absl::Status st = ak.Observe(r);
    EXPECT_TRUE(st.ok()) << st;
  }
  return trace;
}

// The first `count` choices from `from`, as "4warmup 0probe 3model ...", for failure messages.
std::string Describe(const Trace& trace, size_t from, size_t count) {
  std::string out;
  for (size_t i = from; i < std::min(trace.choices.size(), from + count); ++i) {
    out += std::to_string(trace.choices[i].k) +
           std::string(KChoiceReasonName(trace.choices[i].reason)) + " ";
  }
  return out;
}

// Forward times of a pass whose knee is `knee` tokens; everything else as in Costs.
Costs Roofline(double knee) {
  Costs c;
  c.target_knee = knee;
  return c;
}

// --- CostCurve --------------------------------------------------------------------------------

TEST(CostCurveTest, ReproducesARooflineWhereMeasuredAndBetween) {
  const Costs truth;  // flat 20 ms up to 64 tokens, then linear
  CostCurve curve;
  EXPECT_FALSE(curve.Estimate(16).has_value());
  int64_t now = 0;
  for (int rep = 0; rep < 5; ++rep) {
    for (const double n : {4.0, 16.0, 64.0, 128.0, 512.0}) curve.Add(n, truth.Target(n), ++now);
  }
  for (const double n : {4.0, 16.0, 64.0, 128.0, 512.0}) {
    EXPECT_NEAR(*curve.Estimate(n), truth.Target(n), 1e-12) << "n=" << n;
  }
  // Between points on the same linear piece, and beyond the last with its slope.
  for (const double n : {8.0, 40.0, 100.0, 300.0, 1024.0, 4096.0}) {
    EXPECT_NEAR(*curve.Estimate(n), truth.Target(n), 1e-12) << "n=" << n;
  }
  // Below the first point the first segment is flat, as the roofline is.
  EXPECT_NEAR(*curve.Estimate(1), truth.Target(1), 1e-12);
  EXPECT_EQ(curve.Measurements(18), 5);  // 16's quarter octave, [16, 19.03)
  EXPECT_EQ(curve.Measurements(20), 0);  // the next one was never measured
  EXPECT_FALSE(curve.Estimate(0.5).has_value());
}

TEST(CostCurveTest, ExtrapolatesWithinTheRooflineLimits) {
  CostCurve one;
  one.Add(80, 40 * kMs, 1);
  // One size only: flat both ways.
  EXPECT_DOUBLE_EQ(*one.Estimate(16), 40 * kMs);
  EXPECT_DOUBLE_EQ(*one.Estimate(1000), 40 * kMs);

  // A noisy pair whose slope (1.875 ms/token) is steeper than proportional: extrapolation grows
  // at most proportionally, 40 ms · 160 / 80 = 80 ms; downwards it falls at most to proportional,
  // 10 ms · 16 / 40 = 4 ms.
  CostCurve steep;
  steep.Add(40, 10 * kMs, 1);
  steep.Add(80, 40 * kMs, 1);
  EXPECT_NEAR(*steep.Estimate(160), 80 * kMs, 1e-12);
  EXPECT_NEAR(*steep.Estimate(16), 4 * kMs, 1e-12);

  // A pair that decreases (noise): never below the last point going up, or above the first going
  // down.
  CostCurve falling;
  falling.Add(16, 30 * kMs, 1);
  falling.Add(32, 20 * kMs, 1);
  EXPECT_DOUBLE_EQ(*falling.Estimate(64), 20 * kMs);
  EXPECT_DOUBLE_EQ(*falling.Estimate(8), 30 * kMs);
}

TEST(CostCurveTest, OneOutlierDoesNotSwingABucketButAStaleBucketIsReplaced) {
  CostCurve curve(0.1);
  for (int64_t now = 1; now <= 10; ++now) curve.Add(16, 10 * kMs, now);
  curve.Add(16, 1000 * kMs, 11);  // a 100× hiccup counts as at most 3×
  EXPECT_LE(*curve.Estimate(16), 10 * kMs * (1 + 0.1 * 2) + 1e-12);

  CostCurve stale(0.1);
  for (int64_t now = 1; now <= 10; ++now) stale.Add(16, 10 * kMs, now);
  stale.Add(16, 40 * kMs, 300);  // 290 rounds later: the old value keeps weight 0.9^290
  EXPECT_NEAR(*stale.Estimate(16), 40 * kMs, 1e-6);
}

TEST(CostCurveTest, IgnoresMeaninglessMeasurements) {
  CostCurve curve;
  curve.Add(0, 1.0, 1);
  curve.Add(16, 0, 2);
  curve.Add(16, -1, 3);
  curve.Add(std::numeric_limits<double>::quiet_NaN(), 1.0, 4);
  curve.Add(16, std::numeric_limits<double>::infinity(), 5);
  EXPECT_TRUE(curve.empty());
}

// --- AdaptiveK --------------------------------------------------------------------------------

TEST(AdaptiveKTest, ReturnsTheRequestedKBeforeData) {
  AdaptiveK ak;
  for (const int b : {1, 16, 64}) {
    const KChoice c = ak.Choose(b, 4);
    EXPECT_EQ(c.k, 4);
    EXPECT_EQ(c.reason, KChoiceReason::kWarmup);
  }
  EXPECT_FALSE(ak.PredictGoodput(16, 0).has_value());
  EXPECT_FALSE(ak.Estimates().ready);
  EXPECT_DOUBLE_EQ(ak.alpha(), AdaptiveKOptions().alpha_prior);

  // Strongly compute-bound costs and poor acceptance, but fewer steady rounds than the model
  // needs (the first round is a prefill): still 4.
  Simulator sim(Roofline(1), 0.1, 0, 1);
  const Trace trace =
      RunRounds(ak, sim, 16, 4, AdaptiveKOptions().min_steady_rounds, /*prompt_tokens=*/32);
  for (const KChoice& c : trace.choices) EXPECT_EQ(c.k, 4);
  EXPECT_EQ(ak.Choose(16, 0).k, 0);  // K = 0 asked for is K = 0
  EXPECT_EQ(ak.Choose(16, 0).reason, KChoiceReason::kRequested);
}

TEST(AdaptiveKTest, KeepsFourAtBatchOneWhenMemoryBound) {
  const Costs costs;  // knee at 64 tokens: a 5-token verification costs one decode step
  ASSERT_EQ(BestK(costs, 0.7, 1, 4), 4);
  AdaptiveK ak;
  Simulator sim(costs, 0.7, 0, 2);
  const Trace trace = RunRounds(ak, sim, 1, 4, 400, /*prompt_tokens=*/32);
  // A few probe rounds measure the K = 0 cost once; every other decision keeps K = 4.
  EXPECT_LE(trace.Count(KChoiceReason::kProbe), AdaptiveKOptions().probe_rounds);
  const std::vector<int> ks = trace.ModelKs();
  ASSERT_GT(ks.size(), 300u);
  for (const int k : ks) ASSERT_EQ(k, 4) << Describe(trace, 0, 40);
  EXPECT_EQ(ak.Estimates().chosen_k_by_batch.at(1), 4);
}

TEST(AdaptiveKTest, DropsToZeroWhenSixteenStreamsAreComputeBound) {
  // Knee at 8 tokens: verifying 16 × 5 tokens costs 5× one pass over 16.
  const Costs costs = Roofline(8);
  ASSERT_NEAR(costs.Target(80) / costs.Target(16), 5.0, 1e-12);
  ASSERT_EQ(BestK(costs, 0.7, 16, 4), 0);
  AdaptiveK ak;
  Simulator sim(costs, 0.7, 0, 3);
  const Trace trace = RunRounds(ak, sim, 16, 4, 300, /*prompt_tokens=*/32);
  const std::vector<int> ks = trace.ModelKs();
  ASSERT_GT(ks.size(), 250u);
  for (const int k : ks) ASSERT_EQ(k, 0) << Describe(trace, 0, 40);
  EXPECT_EQ(ak.Estimates().chosen_k_by_batch.at(16), 0);
}

TEST(AdaptiveKTest, SixteenComputeBoundStreamsLoseAtMostFivePercentToPlainDecoding) {
  // Issue 7, with ±20% noise on every time, over 3000 rounds that include the warm-up at the
  // requested K, the probes and the explorations.
  const Costs costs = Roofline(8);
  for (const double alpha : {0.4, 0.7, 0.9}) {
    AdaptiveK ak;
    Simulator sim(costs, alpha, 0.2, 13);
    const Trace trace = RunRounds(ak, sim, 16, 4, 3000, /*prompt_tokens=*/32);
    const double plain = TrueGoodput(costs, alpha, 16, 0);
    EXPECT_GE(trace.Throughput(1), 0.95 * plain)
        << "alpha=" << alpha << ": " << trace.Throughput(1) << " vs " << plain << " tokens/s";
  }
}

TEST(AdaptiveKTest, FindsTheBruteForceOptimumBetweenTheExtremes) {
  // Knee at 32 tokens: at 16 streams one draft is free to verify, more are not.
  const Costs costs = Roofline(32);
  const int best = BestK(costs, 0.7, 16, 4);
  ASSERT_EQ(best, 1);
  // The optimum is clear: the runner-up is more than 10% behind.
  for (int k = 0; k <= 4; ++k) {
    if (k != best) {
      ASSERT_LT(TrueGoodput(costs, 0.7, 16, k), 0.9 * TrueGoodput(costs, 0.7, 16, best));
    }
  }
  AdaptiveK ak;
  Simulator sim(costs, 0.7, 0, 4);
  const Trace trace = RunRounds(ak, sim, 16, 4, 300, /*prompt_tokens=*/32);
  const std::vector<int> ks = trace.ModelKs(50);
  ASSERT_GT(ks.size(), 200u);
  for (const int k : ks) ASSERT_EQ(k, best) << Describe(trace, 0, 60);
}

TEST(AdaptiveKTest, LowAcceptanceLowersKEvenAtBatchOne) {
  const Costs costs;
  const double alpha = 0.1;
  const int best = BestK(costs, alpha, 1, 4);
  ASSERT_LT(best, 4);
  AdaptiveK ak;
  Simulator sim(costs, alpha, 0, 5);
  const Trace trace = RunRounds(ak, sim, 1, 4, 600, /*prompt_tokens=*/32);
  // Few drafts are tried at K' < 4, so the estimate is rough, but far from the prior's 0.6.
  EXPECT_LT(ak.alpha(), 0.25);
  const std::vector<int> ks = trace.ModelKs(300);
  ASSERT_GT(ks.size(), 200u);
  for (const int k : ks) {
    ASSERT_LT(k, 4);
    // Within the hysteresis band of the optimum (here K = 0 and 1 are 2% apart).
    ASSERT_GE(TrueGoodput(costs, alpha, 1, k), 0.95 * TrueGoodput(costs, alpha, 1, best))
        << "k=" << k;
  }
}

TEST(AdaptiveKTest, EstimatesAlphaPerTokenNotPerDraft) {
  // At α = 0.7 and K = 4, accepted / drafted is (0.7 + 0.49 + 0.343 + 0.24) / 4 = 0.44.
  AdaptiveK ak;
  Simulator sim(Costs(), 0.7, 0, 6);
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(ak.Observe(sim.Round(16, 4)).ok());
  EXPECT_NEAR(ak.alpha(), 0.7, 0.05);
}

TEST(AdaptiveKTest, NeverRaisesKAboveTheRequestedK) {
  const Costs costs;  // memory-bound, and α high: the model would like more drafts
  AdaptiveK ak;
  Simulator sim(costs, 0.95, 0.2, 7);
  std::mt19937 rng(8);
  ASSERT_TRUE(ak.Observe(sim.Round(4, 8, 32)).ok());
  for (int i = 0; i < 2000; ++i) {
    const int b = 1 + static_cast<int>(rng() % 32);
    const int requested = static_cast<int>(rng() % 9);
    const KChoice c = ak.Choose(b, requested);
    ASSERT_GE(c.k, 0);
    ASSERT_LE(c.k, requested) << "b=" << b << " reason=" << KChoiceReasonName(c.reason);
    ASSERT_TRUE(ak.Observe(sim.Round(b, c.k)).ok());
  }
  EXPECT_TRUE(ak.Estimates().ready);
}

TEST(AdaptiveKTest, ExploresAtTheRequestedKAfterAStretchAtZeroWithinItsBudget) {
  const AdaptiveKOptions options;
  const Costs costs = Roofline(8);
  AdaptiveK ak;
  Simulator sim(costs, 0.7, 0, 9);
  const Trace trace = RunRounds(ak, sim, 16, 4, 4000, /*prompt_tokens=*/32);
  // Exploration comes in runs of `explore_rounds` at the requested K, each after at least
  // `explore_interval` model rounds at 0 (whose last one it replaces).
  int episodes = 0;
  int zeros_since = 0;
  double explore_extra_s = 0;
  const double plain_round_s = costs.Target(16) + costs.overhead_plain_s;
  for (size_t i = 1; i < trace.choices.size(); ++i) {
    const KChoice& c = trace.choices[i];
    if (c.reason == KChoiceReason::kExplore) {
      EXPECT_EQ(c.k, 4);
      explore_extra_s += trace.seconds[i] - plain_round_s;
      if (trace.choices[i - 1].reason != KChoiceReason::kExplore) {
        ++episodes;
        EXPECT_GE(zeros_since, options.explore_interval - 1) << i;
        int run = 0;
        while (i + run < trace.choices.size() &&
               trace.choices[i + run].reason == KChoiceReason::kExplore) {
          ++run;
        }
        EXPECT_EQ(run, options.explore_rounds) << i;
      }
      zeros_since = 0;
    } else if (c.reason == KChoiceReason::kModel) {
      EXPECT_EQ(c.k, 0) << i;
      ++zeros_since;
    }
  }
  EXPECT_GE(episodes, 3);
  // What exploring cost beyond plain rounds, as a share of all the time: about the budget.
  double total_s = 0;
  for (const double s : trace.seconds) total_s += s;
  EXPECT_LE(explore_extra_s / total_s, 1.5 * options.explore_budget)
      << episodes << " explorations cost " << explore_extra_s << " s of " << total_s << " s";
}

TEST(AdaptiveKTest, ExplorationNoticesThatSpeculationPaysAgain) {
  // Compute-bound at first (another tenant on the accelerator), then memory-bound: only
  // exploration rounds can see it, because at K' = 0 nothing verifies 80 tokens.
  AdaptiveK ak;
  Simulator sim(Roofline(8), 0.7, 0, 10);
  Trace before = RunRounds(ak, sim, 16, 4, 300, /*prompt_tokens=*/32);
  ASSERT_EQ(before.ModelKs().back(), 0);
  const Costs freed = Roofline(128);
  const int best = BestK(freed, 0.7, 16, 4);
  ASSERT_EQ(best, 4);
  sim.set_costs(freed);
  Trace after = RunRounds(ak, sim, 16, 4, 1500);
  std::vector<int> ks = after.ModelKs(1300);
  ASSERT_FALSE(ks.empty());
  for (const int k : ks) ASSERT_EQ(k, best) << Describe(after, 0, 200);

  // Likewise when the acceptance rate rises while K' = 0 (new traffic the draft predicts well).
  AdaptiveK ak2;
  Simulator sim2(Costs(), 0.1, 0, 11);
  before = RunRounds(ak2, sim2, 1, 4, 400, /*prompt_tokens=*/32);
  ASSERT_LT(before.ModelKs().back(), 4);
  sim2.set_alpha(0.8);
  ASSERT_EQ(BestK(Costs(), 0.8, 1, 4), 4);
  after = RunRounds(ak2, sim2, 1, 4, 1500);
  ks = after.ModelKs(1300);
  ASSERT_FALSE(ks.empty());
  for (const int k : ks) ASSERT_EQ(k, 4) << Describe(after, 0, 200);
}

TEST(AdaptiveKTest, JitterDoesNotMakeItFlap) {
  // ±20% on every time, near a crossover: at 24 streams with the knee at 64 tokens, K = 2 and
  // K = 3 are 9% apart.
  const Costs costs;
  const int b = 24;
  const double alpha = 0.7;
  const int best = BestK(costs, alpha, b, 4);
  AdaptiveK ak;
  Simulator sim(costs, alpha, 0.2, 12);
  const int rounds = 2000;
  const Trace trace = RunRounds(ak, sim, b, 4, rounds, /*prompt_tokens=*/32);
  const std::vector<int> ks = trace.ModelKs();
  int changes = 0;
  for (size_t i = 1; i < ks.size(); ++i) changes += ks[i] != ks[i - 1];
  EXPECT_LE(changes, 10) << "K changed " << changes << " times in " << rounds << " rounds";
  // And what it settles on is near the optimum: within the hysteresis plus the noise left in
  // estimates of buckets it rarely revisits.
  for (size_t i = ks.size() / 2; i < ks.size(); ++i) {
    ASSERT_GE(TrueGoodput(costs, alpha, b, ks[i]), 0.9 * TrueGoodput(costs, alpha, b, best))
        << "k=" << ks[i] << " best=" << best;
  }
}

TEST(AdaptiveKTest, CrossoverFollowsTheBruteForceOptimumAcrossBatchSizes) {
  // The memory-bound model with α = 0.7: K falls as the batch grows and reaches 0 once verifying
  // B·(K + 1) tokens is compute-bound for every K > 0.
  const Costs costs;
  const double alpha = 0.7;
  int crossover = -1;
  for (const int b : {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128}) {
    const int best = BestK(costs, alpha, b, 4);
    AdaptiveK ak;
    Simulator sim(costs, alpha, 0, 100 + static_cast<uint32_t>(b));
    const Trace trace = RunRounds(ak, sim, b, 4, 300, /*prompt_tokens=*/32);
    const int k = trace.ModelKs().back();
    EXPECT_GE(TrueGoodput(costs, alpha, b, k), 0.95 * TrueGoodput(costs, alpha, b, best))
        << "b=" << b << " k=" << k << " best=" << best;
    // Issue 7, warm-up and probes included.
    EXPECT_GE(trace.Throughput(1), 0.95 * TrueGoodput(costs, alpha, b, 0)) << "b=" << b;
    if (k == 0 && crossover < 0) crossover = b;
    std::printf("B=%3d  chosen K=%d  brute-force K=%d\n", b, k, best);
  }
  EXPECT_EQ(crossover, 48);  // G(1) < G(0) from B = 41 on
}

TEST(AdaptiveKTest, RejectsContradictoryObservationsAndRecordsNothing) {
  AdaptiveK ak;
  RoundObservation good;
  good.batch_size = 2;
  good.drafting_sequences = 2;
  good.draft_catch_up_tokens = 2;
  good.draft_steps = 4;
  good.draft_forward = absl::Milliseconds(8);
  good.verify_tokens = 10;
  good.verify_forward = absl::Milliseconds(20);
  good.drafted_tokens = 8;
  good.accepted_tokens = 5;
  good.rejections = 1;
  good.round = absl::Milliseconds(30);
  struct Case {
    std::string field;
    RoundObservation r;
  };
  std::vector<Case> cases;
  auto add = [&](const std::string& field, auto mutate) {
    RoundObservation r = good;
    mutate(r);
    cases.push_back({field, r});
  };
  add("batch_size", [](RoundObservation& r) { r.batch_size = -1; });
  add("drafting_sequences", [](RoundObservation& r) { r.drafting_sequences = 3; });
  add("draft_catch_up_tokens", [](RoundObservation& r) { r.draft_catch_up_tokens = -2; });
  add("draft_steps", [](RoundObservation& r) { r.draft_steps = -1; });
  add("drafted_tokens", [](RoundObservation& r) { r.drafted_tokens = 11; });
  add("accepted_tokens", [](RoundObservation& r) { r.accepted_tokens = 9; });
  add("rejections", [](RoundObservation& r) { r.rejections = 3; });
  add("rejections", [](RoundObservation& r) {
    r.accepted_tokens = 8;
    r.rejections = 1;
  });
  add("draft_forward", [](RoundObservation& r) { r.draft_forward = absl::Milliseconds(-1); });
  add("verify_forward", [](RoundObservation& r) { r.verify_forward = absl::InfiniteDuration(); });
  add("round", [](RoundObservation& r) { r.round = -absl::InfiniteDuration(); });
  for (const Case& c : cases) {
    const absl::Status st = ak.Observe(c.r);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(st.message().find("RoundObservation." + c.field), absl::string_view::npos)
        << c.field << ": " << st.message();
  }
  const AdaptiveKOptions defaults;
  AdaptiveKEstimates e = ak.Estimates();
  EXPECT_DOUBLE_EQ(e.alpha, defaults.alpha_prior);
  EXPECT_DOUBLE_EQ(e.alpha_weight, defaults.alpha_prior_weight);
  EXPECT_EQ(e.steady_rounds, 0);
  EXPECT_EQ(ak.DebugString().find("ms"), std::string::npos) << ak.DebugString();
  EXPECT_TRUE(ak.Observe(good).ok());
  e = ak.Estimates();
  // 5 accepted of 6 attempts on top of the decayed prior.
  EXPECT_GT(e.alpha_weight, 6);
  EXPECT_GT(e.alpha, defaults.alpha_prior);
  EXPECT_EQ(e.steady_rounds, 1);
}

TEST(AdaptiveKTest, CreateRejectsOptionsOutOfRange) {
  struct Case {
    std::string field;
    AdaptiveKOptions o;
  };
  std::vector<Case> cases;
  auto add = [&](const std::string& field, auto mutate) {
    AdaptiveKOptions o;
    mutate(o);
    cases.push_back({field, o});
  };
  add("alpha_prior", [](AdaptiveKOptions& o) { o.alpha_prior = 1; });
  add("alpha_prior", [](AdaptiveKOptions& o) { o.alpha_prior = std::nan(""); });
  add("alpha_prior_weight", [](AdaptiveKOptions& o) { o.alpha_prior_weight = 0; });
  add("alpha_half_life_attempts", [](AdaptiveKOptions& o) { o.alpha_half_life_attempts = -1; });
  add("alpha_half_life_rounds", [](AdaptiveKOptions& o) { o.alpha_half_life_rounds = 0; });
  add("cost_ema_weight", [](AdaptiveKOptions& o) { o.cost_ema_weight = 1.5; });
  add("hysteresis", [](AdaptiveKOptions& o) { o.hysteresis = -0.1; });
  add("min_steady_rounds", [](AdaptiveKOptions& o) { o.min_steady_rounds = 0; });
  add("min_alpha_attempts", [](AdaptiveKOptions& o) { o.min_alpha_attempts = -1; });
  add("explore_interval", [](AdaptiveKOptions& o) { o.explore_interval = 0; });
  add("explore_rounds", [](AdaptiveKOptions& o) { o.explore_rounds = 0; });
  add("explore_budget", [](AdaptiveKOptions& o) { o.explore_budget = 0; });
  add("probe_rounds", [](AdaptiveKOptions& o) { o.probe_rounds = 0; });
  add("probe_interval", [](AdaptiveKOptions& o) { o.probe_interval = 0; });
  for (const Case& c : cases) {
    const absl::StatusOr<AdaptiveK> ak = AdaptiveK::Create(c.o);
    ASSERT_FALSE(ak.ok()) << c.field;
    EXPECT_EQ(ak.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(ak.status().message().find("AdaptiveKOptions." + c.field), absl::string_view::npos)
        << ak.status().message();
  }
  EXPECT_TRUE(AdaptiveK::Create(AdaptiveKOptions()).ok());
}

}  // namespace
}  // namespace specd
