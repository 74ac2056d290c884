// The arithmetic of `specd bench`: percentiles and the speed-up predictions against numpy and an
// independent Python enumeration, the acceptance estimators against a simulation with a known α,
// and the latency definitions against hand-worked request timelines.
#include "tools/specd/bench/bench_stats.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"
#include "tools/specd/bench/bench_report.h"
#include "tools/specd/bench/load_generator.h"

namespace specd::bench {
namespace {

using testing::ScopedTempDir;

// The reference: numpy.percentile for the samples, and for each (alpha, K, c, T_t, T_d, T_v) the
// expected tokens per round by summing over the distribution of the number of accepted drafts
// (n < K with probability alpha^n (1 - alpha), n = K with alpha^K), not by the closed form.
constexpr char kReferencePy[] = R"py(
import json, sys
import numpy as np
cases = json.load(open(sys.argv[1]))
out = {"percentiles": [], "predictions": []}
for xs in cases["samples"]:
    out["percentiles"].append([float(v) for v in np.percentile(np.array(xs, dtype=np.float64),
                                                               [0, 50, 90, 99, 100])])
for a, k, c, tt, td, tv in cases["predictions"]:
    k = int(k)
    e = sum((n + 1) * a**n * (1 - a) for n in range(k)) + (k + 1) * a**k
    out["predictions"].append([e, e / (k * c + 1), e * tt / (k * td + tv)])
json.dump(out, open(sys.argv[2], "w"))
)py";

class BenchStatsReferenceTest : public ::testing::Test {
 protected:
  // Runs the reference script over `cases`; null (and a failure) without numpy.
  nlohmann::json RunReference(const nlohmann::json& cases) {
    if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) {
      ADD_FAILURE() << "/usr/bin/python3 with numpy (python3-numpy) is needed for this test";
      return nullptr;
    }
    const std::filesystem::path script = tmp_.path() / "reference.py";
    const std::filesystem::path in = tmp_.path() / "cases.json";
    const std::filesystem::path out = tmp_.path() / "reference.json";
    std::ofstream(script) << kReferencePy;
    std::ofstream(in) << cases.dump();
    const std::string cmd =
        absl::StrCat(testing::Python(), " ", script.string(), " ", in.string(), " ", out.string());
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream f(out);
    std::stringstream text;
    text << f.rdbuf();
    return nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  }

  ScopedTempDir tmp_;
};

TEST_F(BenchStatsReferenceTest, PercentilesMatchNumpy) {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> latency(2.0, 0.8);
  std::vector<std::vector<double>> samples = {
      {42.0}, {1, 2}, {3, 1, 2}, {5, 5, 5, 1, 9}, {0.25, -3, 8, 8, 8, 2.5, 100}};
  for (const int n : {10, 99, 100, 101, 1000}) {
    std::vector<double> xs;
    for (int i = 0; i < n; ++i) xs.push_back(latency(rng));
    samples.push_back(xs);
  }
  const nlohmann::json ref =
      RunReference({{"samples", samples}, {"predictions", nlohmann::json::array()}});
  ASSERT_FALSE(ref.is_discarded() || ref.is_null());
  for (size_t i = 0; i < samples.size(); ++i) {
    const std::vector<double> expected = ref["percentiles"][i].get<std::vector<double>>();
    const double qs[] = {0, 50, 90, 99, 100};
    for (size_t j = 0; j < 5; ++j) {
      const std::optional<double> got = Percentile(samples[i], qs[j]);
      ASSERT_TRUE(got.has_value());
      EXPECT_NEAR(*got, expected[j], 1e-12 * (1 + std::abs(expected[j])))
          << "sample " << i << ", q = " << qs[j];
    }
    const Distribution d = Summarize(samples[i]);
    EXPECT_EQ(d.count, static_cast<int64_t>(samples[i].size()));
    EXPECT_NEAR(*d.p90, expected[2], 1e-12 * (1 + std::abs(expected[2])));
  }
}

TEST_F(BenchStatsReferenceTest, PredictionsMatchAnEnumerationOfAcceptedLengths) {
  // (alpha, K, T_d/T_t, T_t, T_d, T_v)
  std::vector<std::vector<double>> cases;
  for (const double a : {0.0, 0.1, 0.38, 0.5, 0.73, 0.9, 0.999}) {
    for (const int k : {1, 2, 4, 6, 8}) {
      const double tt = 10.0, td = 1.3, tv = 10.0 + 0.7 * k;
      cases.push_back({a, static_cast<double>(k), td / tt, tt, td, tv});
    }
  }
  const nlohmann::json ref =
      RunReference({{"samples", std::vector<std::vector<double>>{}}, {"predictions", cases}});
  ASSERT_FALSE(ref.is_discarded() || ref.is_null());
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const std::vector<double> e = ref["predictions"][i].get<std::vector<double>>();
    const std::string where = absl::StrCat("alpha ", c[0], ", K ", c[1]);
    EXPECT_NEAR(ExpectedTokensPerRound(c[0], c[1]), e[0], 1e-12 * e[0]) << where;
    EXPECT_NEAR(IdealSpeedup(c[0], c[1], c[2]), e[1], 1e-12 * e[1]) << where;
    EXPECT_NEAR(EngineLimitedSpeedup(c[0], c[1], c[3], c[4], c[5]), e[2], 1e-12 * e[2]) << where;
  }
}

TEST(BenchStatsTest, PercentileEdgeCases) {
  EXPECT_FALSE(Percentile({}, 50).has_value());
  EXPECT_FALSE(Summarize({}).mean.has_value());
  const std::vector<double> four = {4, 1, 3, 2};
  // h = 3 q / 100: p50 halfway between 2 and 3, p90 at 3 + 0.7 (4 - 3).
  EXPECT_DOUBLE_EQ(*Percentile(four, 50), 2.5);
  EXPECT_DOUBLE_EQ(*Percentile(four, 90), 3.7);
  EXPECT_DOUBLE_EQ(*Percentile(four, 0), 1);
  EXPECT_DOUBLE_EQ(*Percentile(four, 100), 4);
  EXPECT_DOUBLE_EQ(*Median(std::vector<double>{7}), 7);
  EXPECT_DOUBLE_EQ(*Summarize(four).mean, 2.5);
}

TEST(BenchStatsTest, PredictionLimits) {
  // Nothing accepted: one token per round, and speculation only costs the drafts.
  EXPECT_DOUBLE_EQ(ExpectedTokensPerRound(0, 4), 1);
  EXPECT_DOUBLE_EQ(IdealSpeedup(0, 4, 0.25), 1 / 2.0);
  // Everything accepted: K + 1 tokens per round.
  EXPECT_DOUBLE_EQ(ExpectedTokensPerRound(1, 4), 5);
  EXPECT_NEAR(ExpectedTokensPerRound(1 - 1e-12, 4), 5, 1e-9);
  EXPECT_DOUBLE_EQ(IdealSpeedup(1, 4, 0), 5);
  // Free drafts and a verification as cheap as a decode step: both predictions are E[tokens].
  EXPECT_DOUBLE_EQ(EngineLimitedSpeedup(0.6, 3, 2.0, 0.0, 2.0), ExpectedTokensPerRound(0.6, 3));
  // K = 0 is plain decoding.
  EXPECT_DOUBLE_EQ(ExpectedTokensPerRound(0.7, 0), 1);
  // A fractional (mean) K lies between its neighbours.
  EXPECT_GT(ExpectedTokensPerRound(0.7, 2.5), ExpectedTokensPerRound(0.7, 2));
  EXPECT_LT(ExpectedTokensPerRound(0.7, 2.5), ExpectedTokensPerRound(0.7, 3));
}

// Rounds of K drafts, each accepted independently with probability `alpha` until the first
// rejection: what the coordinator's Usage counters would say.
AcceptanceTotals Simulate(double alpha, int k, int rounds, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution accept(alpha);
  AcceptanceTotals t;
  std::vector<int64_t> per_position(static_cast<size_t>(k), 0);
  int64_t accepted = 0;
  for (int r = 0; r < rounds; ++r) {
    int n = 0;
    while (n < k && accept(rng)) ++per_position[static_cast<size_t>(n++)];
    accepted += n;
  }
  t.Add(rounds, rounds, static_cast<int64_t>(rounds) * k, accepted, per_position);
  return t;
}

TEST(BenchStatsTest, AlphaRecoversThePerTokenAcceptanceProbability) {
  for (const double alpha : {0.3, 0.7, 0.9}) {
    for (const int k : {1, 4, 8}) {
      const AcceptanceStats s = ComputeAcceptance(Simulate(alpha, k, 200000, 11));
      ASSERT_TRUE(s.alpha.has_value());
      EXPECT_NEAR(*s.alpha, alpha, 0.006) << "alpha " << alpha << ", K " << k;
      // The per-drafted-token rate is alpha (1 - alpha^K) / (K (1 - alpha)) instead.
      const double rate = alpha * (1 - std::pow(alpha, k)) / (k * (1 - alpha));
      EXPECT_NEAR(*s.acceptance_rate, rate, 0.006) << "alpha " << alpha << ", K " << k;
      // And tokens per round follow E[tokens].
      EXPECT_NEAR(*s.mean_accepted_length, ExpectedTokensPerRound(alpha, k), 0.02);
      // Draft j is accepted in alpha^j of the rounds.
      for (int j = 0; j < k; ++j) {
        EXPECT_NEAR(s.per_position[static_cast<size_t>(j)], std::pow(alpha, j + 1), 0.006);
      }
    }
  }
}

TEST(BenchStatsTest, AcceptanceFromHandCountedRounds) {
  // K = 2 over 4 rounds accepting 0, 1, 2 and 2 drafts, reported by two requests: draft 1 was
  // accepted in 3 rounds and draft 2 in 2; positions judged 1 + 2 + 2 + 2 = 7; 5 accepted.
  AcceptanceTotals t;
  t.Add(2, 2, 4, 1, std::vector<int64_t>{1, 0});
  t.Add(2, 2, 4, 4, std::vector<int64_t>{2, 2});
  const AcceptanceStats s = ComputeAcceptance(t);
  EXPECT_DOUBLE_EQ(*s.acceptance_rate, 5.0 / 8);
  EXPECT_DOUBLE_EQ(*s.alpha, 5.0 / 7);
  EXPECT_DOUBLE_EQ(*s.mean_accepted_length, (5.0 + 4) / 4);
  ASSERT_EQ(s.per_position.size(), 2u);
  EXPECT_DOUBLE_EQ(s.per_position[0], 3.0 / 4);
  EXPECT_DOUBLE_EQ(s.per_position[1], 2.0 / 4);

  // Plain decoding drafts nothing: no rates, one token per round.
  AcceptanceTotals plain;
  plain.Add(16, 0, 0, 0, {});
  const AcceptanceStats p = ComputeAcceptance(plain);
  EXPECT_FALSE(p.acceptance_rate.has_value());
  EXPECT_FALSE(p.alpha.has_value());
  EXPECT_TRUE(p.per_position.empty());
  EXPECT_DOUBLE_EQ(*p.mean_accepted_length, 1);
}

TEST(BenchStatsTest, StepTimesAndOverhead) {
  TimingTotals t;
  // Two requests: 10 rounds of K = 4 each; draft steps 2 ms, verification 12 ms, rounds 23 ms.
  for (int i = 0; i < 2; ++i) t.Add(10, 40, 40 * 2'000'000, 10 * 12'000'000, 10 * 23'000'000);
  const StepTimes s = ComputeStepTimes(t);
  EXPECT_DOUBLE_EQ(*s.verify_ms, 12);
  EXPECT_DOUBLE_EQ(*s.draft_step_ms, 2);
  EXPECT_DOUBLE_EQ(*s.mean_k, 4);
  EXPECT_DOUBLE_EQ(*s.round_ms, 23);
  EXPECT_DOUBLE_EQ(*s.overhead_ms, 23 - 8 - 12);
  EXPECT_DOUBLE_EQ(*s.overhead_fraction, 3.0 / 23);
  // K = 0 has no draft step; no timed rounds (timings not filled in) give nothing.
  TimingTotals plain;
  plain.Add(5, 0, 0, 5 * 7'000'000, 5 * 7'500'000);
  EXPECT_FALSE(ComputeStepTimes(plain).draft_step_ms.has_value());
  EXPECT_DOUBLE_EQ(*ComputeStepTimes(plain).verify_ms, 7);
  EXPECT_FALSE(ComputeStepTimes(TimingTotals()).verify_ms.has_value());
}

TEST(BenchStatsTest, ArrivalOffsets) {
  const std::vector<double> closed = ArrivalOffsets(5, 0, Arrival::kPoisson, 1);
  EXPECT_EQ(closed, std::vector<double>(5, 0.0));
  const std::vector<double> fixed = ArrivalOffsets(5, 4, Arrival::kFixedInterval, 1);
  ASSERT_EQ(fixed.size(), 5u);
  for (size_t i = 0; i < fixed.size(); ++i) EXPECT_DOUBLE_EQ(fixed[i], 0.25 * i);
  // Poisson: exponential gaps with mean 1/rate (and coefficient of variation 1); the same seed
  // gives the same schedule.
  const int n = 40000;
  const std::vector<double> poisson = ArrivalOffsets(n, 8, Arrival::kPoisson, 3);
  EXPECT_EQ(poisson, ArrivalOffsets(n, 8, Arrival::kPoisson, 3));
  double sum = 0, sum2 = 0;
  for (int i = 1; i < n; ++i) {
    const double gap = poisson[i] - poisson[i - 1];
    ASSERT_GE(gap, 0);
    sum += gap;
    sum2 += gap * gap;
  }
  const double mean = sum / (n - 1);
  const double sd = std::sqrt(sum2 / (n - 1) - mean * mean);
  EXPECT_NEAR(mean, 1.0 / 8, 0.004);
  EXPECT_NEAR(sd / mean, 1.0, 0.03);
  EXPECT_FALSE(ParseArrival("bursty").ok());
}

RequestOutcome Outcome(double start, std::vector<double> messages, std::vector<int32_t> tokens,
                       double end) {
  RequestOutcome o;
  o.start_s = start;
  o.end_s = end;
  o.message_s = std::move(messages);
  o.message_tokens = std::move(tokens);
  for (const int32_t t : o.message_tokens) o.output_tokens += t;
  o.finish_reason = v1::FINISH_REASON_LENGTH;
  return o;
}

TEST(BenchReportTest, LatenciesFollowVllmDefinitions) {
  LoadRun run;
  // Sent at 0, messages of 3, 1 and 4 tokens at 0.1, 0.3 and 0.6 s, stream ends at 0.7 s:
  // TTFT 100 ms; ITL 200 and 300 ms; TPOT (700 - 100) / (8 - 1) ms.
  run.outcomes.push_back(Outcome(0, {0.1, 0.3, 0.6}, {3, 1, 4}, 0.7));
  // Sent at 0.05, one message of 1 token at 0.25, ends at 0.25: no ITL, no TPOT.
  run.outcomes.push_back(Outcome(0.05, {0.25}, {1}, 0.25));
  RequestOutcome failed;
  failed.status = absl::UnavailableError("request 2: gone");
  run.outcomes.push_back(failed);
  run.wall_s = 0.9;
  const ArmSummary s = SummarizeArm({4, false}, std::vector<LoadRun>{run});
  EXPECT_EQ(s.requests, 3);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.first_error, "request 2: gone");
  EXPECT_EQ(s.output_tokens, 9);
  EXPECT_DOUBLE_EQ(*s.output_tokens_per_s, 9 / 0.9);
  EXPECT_DOUBLE_EQ(*s.requests_per_s, 2 / 0.9);
  EXPECT_EQ(s.ttft_ms.count, 2);
  EXPECT_NEAR(*s.ttft_ms.mean, (100 + 200) / 2.0, 1e-9);
  EXPECT_EQ(s.itl_ms.count, 2);
  EXPECT_NEAR(*s.itl_ms.p50, 250, 1e-9);
  EXPECT_EQ(s.tpot_ms.count, 1);
  EXPECT_NEAR(*s.tpot_ms.p50, 600.0 / 7, 1e-9);
  EXPECT_NEAR(*s.e2e_ms.p50, (700 + 200) / 2.0, 1e-9);
  EXPECT_EQ(s.finish_reasons.at("FINISH_REASON_LENGTH"), 2);
}

TEST(BenchReportTest, CompareUsesTheMediansAndTheWorkersTimes) {
  // Three repeats per arm: medians 100 and 150 tok/s.
  auto arm = [](int32_t k, std::vector<double> tokens_per_s, TimingTotals timings,
                AcceptanceTotals acceptance) {
    std::vector<LoadRun> runs;
    for (const double v : tokens_per_s) {
      LoadRun run;
      run.outcomes.push_back(Outcome(0, {0.5}, {static_cast<int32_t>(v)}, 1.0));
      run.wall_s = 1.0;
      runs.push_back(run);
    }
    ArmSummary s = SummarizeArm({k, false}, runs);
    s.timing_totals = timings;
    s.steps = ComputeStepTimes(timings);
    s.acceptance_totals = acceptance;
    s.acceptance = ComputeAcceptance(acceptance);
    return s;
  };
  TimingTotals plain_t;
  plain_t.Add(100, 0, 0, 100 * 10'000'000, 100 * 10'500'000);  // T_t = 10 ms
  TimingTotals spec_t;
  spec_t.Add(100, 400, 400 * 1'000'000, 100 * 12'000'000, 100 * 17'000'000);  // T_d 1, T_v 12
  AcceptanceTotals plain_a;
  plain_a.Add(100, 0, 0, 0, {});
  // Half the first drafts accepted, none after: alpha = 50 / (100 + 50) = 1/3.
  AcceptanceTotals spec_a;
  spec_a.Add(100, 100, 400, 50, std::vector<int64_t>{50, 0, 0, 0});
  const ArmSummary base = arm(0, {90, 100, 120}, plain_t, plain_a);
  const ArmSummary k4 = arm(4, {200, 150, 140}, spec_t, spec_a);
  const CompareRow r = CompareArm(base, k4);
  EXPECT_DOUBLE_EQ(*r.measured, 1.5);
  EXPECT_DOUBLE_EQ(*r.alpha, 1.0 / 3);
  EXPECT_DOUBLE_EQ(*r.target_step_ms, 10);
  EXPECT_DOUBLE_EQ(*r.draft_step_ms, 1);
  EXPECT_DOUBLE_EQ(*r.verify_step_ms, 12);
  EXPECT_DOUBLE_EQ(*r.verify_to_target, 1.2);
  // E = 1 + 1/3 + 1/9 + 1/27 + 1/81 = 121/81.
  EXPECT_NEAR(*r.expected_tokens, 121.0 / 81, 1e-12);
  EXPECT_NEAR(*r.ideal, 121.0 / 81 / (4 * 0.1 + 1), 1e-12);
  EXPECT_NEAR(*r.engine_limited, 121.0 / 81 * 10 / (4 * 1 + 12), 1e-12);
  EXPECT_NEAR(*r.efficiency, 1.5 / (121.0 / 81 * 10 / 16), 1e-12);

  // The report names every arm and the JSON carries the same numbers.
  const std::vector<ArmSummary> arms = {base, k4};
  const std::vector<CompareRow> rows = {r};
  const std::string text = FormatReport(arms, rows, 3);
  EXPECT_NE(text.find("K=0"), std::string::npos);
  EXPECT_NE(text.find("K=4"), std::string::npos);
  EXPECT_NE(text.find("1.500"), std::string::npos);
  const nlohmann::ordered_json j = CompareToJson(r);
  EXPECT_DOUBLE_EQ(j["measured_speedup"].get<double>(), 1.5);
  EXPECT_TRUE(ArmToJson(base)["alpha"].is_null());
}

}  // namespace
}  // namespace specd::bench
