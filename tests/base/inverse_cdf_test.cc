#include "base/inverse_cdf.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "base/philox.h"
#include "kernels/cpu/processed.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/base/chi_square.h"

namespace specd {
namespace {

using ::testing::HasSubstr;

// Reject the fit at p < kRejectP. Seeds are fixed, so the outcome is deterministic.
constexpr double kRejectP = 1e-4;
// The largest uniform StreamUniform can return.
constexpr double kLastU = 1.0 - 0x1.0p-53;

int32_t Sample(const std::vector<float>& probs, double u) {
  const absl::StatusOr<int32_t> id = SampleInverseCdf(probs, u);
  EXPECT_TRUE(id.ok()) << id.status();
  return id.ok() ? *id : -1;
}

TEST(SampleInverseCdfTest, EndsOfTheUnitInterval) {
  const std::vector<float> probs = {0.0f, 0.0f, 0.25f, 0.75f, 0.0f};
  // u = 0 picks the first token with positive mass, never a leading zero.
  EXPECT_EQ(Sample(probs, 0.0), 2);
  // u just below 1 picks the last token with positive mass, never a trailing zero.
  EXPECT_EQ(Sample(probs, kLastU), 3);
}

TEST(SampleInverseCdfTest, BoundariesAreHalfOpen) {
  // C = (0.5, 1): u * 1 < 0.5 picks 0, u = 0.5 exactly picks 1.
  const std::vector<float> halves = {0.5f, 0.5f};
  EXPECT_EQ(Sample(halves, std::nextafter(0.5, 0.0)), 0);
  EXPECT_EQ(Sample(halves, 0.5), 1);
  // C = (0.25, 0.25, 0.5, 1): at u = 0.25 the zero-mass token 1 shares the boundary with
  // token 0 and must be skipped; at u = 0.5 token 2 is done too.
  const std::vector<float> with_zero = {0.25f, 0.0f, 0.25f, 0.5f};
  EXPECT_EQ(Sample(with_zero, std::nextafter(0.25, 0.0)), 0);
  EXPECT_EQ(Sample(with_zero, 0.25), 2);
  EXPECT_EQ(Sample(with_zero, std::nextafter(0.5, 0.0)), 2);
  EXPECT_EQ(Sample(with_zero, 0.5), 3);
}

TEST(SampleInverseCdfTest, ZeroProbabilityTokensAreNeverPickedNearTheirBoundaries) {
  // Zeros everywhere around tokens with mass; probe u on both sides of every cumulative step.
  const std::vector<float> probs = {0.0f, 0.125f, 0.0f, 0.0f, 0.375f, 0.0f, 0.5f, 0.0f};
  double cumulative = 0.0;
  for (const float p : probs) {
    cumulative += p;
    for (const double u :
         {std::nextafter(cumulative, 0.0), cumulative, std::nextafter(cumulative, 1.0)}) {
      if (!(u >= 0.0 && u < 1.0)) continue;
      const int32_t id = Sample(probs, u);
      ASSERT_GE(id, 0);
      EXPECT_GT(probs[id], 0.0f) << "u=" << u << " picked zero-probability token " << id;
    }
  }
}

TEST(SampleInverseCdfTest, RowWhoseSumIsShortOfOneIsSampledInFull) {
  // 25 x fl32(0.04) = 25 x 0.03999999910593033 sums to 0.99999997764825820 in fp64, short of 1.
  // Scaling u by the row total keeps every u < 1 inside the row, on its last token.
  const std::vector<float> probs(25, 0.04f);
  double total = 0.0;
  for (const float p : probs) total += p;
  ASSERT_LT(total, 1.0);
  EXPECT_EQ(Sample(probs, kLastU), 24);
  EXPECT_EQ(Sample(probs, 0.99999999), 24);  // above the row's total, below 1
  EXPECT_EQ(Sample(probs, 0.5), 12);         // 0.5 * total lies inside token 12's interval
  // A row far from normalised (as a residual max(0, p - q) is) works the same way.
  const std::vector<float> residual = {0.0f, 0.01f, 0.0f, 0.03f};
  EXPECT_EQ(Sample(residual, 0.2), 1);  // 0.2 * 0.04 = 0.008 < 0.01
  EXPECT_EQ(Sample(residual, 0.3), 3);  // 0.012 >= 0.01
  EXPECT_EQ(Sample(residual, kLastU), 3);
}

TEST(SampleInverseCdfTest, EvenlySpacedUniformsReproduceTheRowExactly) {
  // With u_n = (n + 1/2) / N, token i is hit once for every u_n in [C_{i-1}, C_i), so its count
  // is N * p_i to within one.
  const std::vector<float> probs = {0.1f, 0.0f, 0.2f, 0.3f, 0.0f, 0.4f};
  constexpr int kN = 100000;
  std::vector<int64_t> counts(probs.size(), 0);
  for (int n = 0; n < kN; ++n) ++counts[Sample(probs, (n + 0.5) / kN)];
  double total = 0.0;
  for (const float p : probs) total += p;
  for (size_t i = 0; i < probs.size(); ++i) {
    EXPECT_NEAR(static_cast<double>(counts[i]), kN * probs[i] / total, 1.0) << "token " << i;
  }
}

TEST(SampleInverseCdfTest, ChiSquareFitAgainstAProcessedRow) {
  // A row with a filtered tail (top-k, top-p): samples drawn with the request stream's own
  // uniforms must follow it, and must never land on a removed token.
  constexpr int kVocab = 64;
  std::vector<float> logits(kVocab);
  for (int i = 0; i < kVocab; ++i) logits[i] = 2.0f * std::cos(0.7f * i) + 0.01f * i;
  SamplingParams params;
  params.temperature = 0.9f;
  params.top_k = 40;
  params.top_p = 0.97f;
  std::vector<float> probs(kVocab);
  ASSERT_TRUE(kernels::cpu::ProcessedDistribution(logits, params, {}, probs).ok());

  constexpr int kDraws = 200000;
  std::vector<int64_t> observed(kVocab, 0);
  for (uint32_t pos = 0; pos < kDraws; ++pos) {
    ++observed[Sample(probs, StreamUniform(0xfeedface, pos, Purpose::kTargetSample))];
  }
  double total = 0.0;
  for (const float p : probs) total += p;
  std::vector<int64_t> obs_support;
  std::vector<double> exp_support;
  for (int i = 0; i < kVocab; ++i) {
    if (probs[i] == 0.0f) {
      EXPECT_EQ(observed[i], 0) << "removed token " << i << " was sampled";
    } else {
      obs_support.push_back(observed[i]);
      exp_support.push_back(kDraws * probs[i] / total);
    }
  }
  ASSERT_GT(obs_support.size(), 5u);
  ASSERT_LT(obs_support.size(), 40u);
  const testing::ChiSquareResult r = testing::PearsonChiSquare(obs_support, exp_support);
  EXPECT_GE(r.p_value, kRejectP) << "chi2=" << r.statistic << " df=" << r.df;
}

TEST(SampleInverseCdfTest, ChiSquareFitWithTinyProbabilities) {
  // Heavy tail: most tokens are rare, so the test also covers the pooled cells.
  constexpr int kVocab = 500;
  std::vector<float> probs(kVocab);
  for (int i = 0; i < kVocab; ++i) probs[i] = 1.0f / static_cast<float>((i + 1) * (i + 1));
  constexpr int kDraws = 100000;
  std::vector<int64_t> observed(kVocab, 0);
  for (uint32_t pos = 0; pos < kDraws; ++pos) {
    ++observed[Sample(probs, StreamUniform(12345, pos, Purpose::kResidualFallback, 2))];
  }
  double total = 0.0;
  for (const float p : probs) total += p;
  std::vector<double> expected(kVocab);
  for (int i = 0; i < kVocab; ++i) expected[i] = kDraws * probs[i] / total;
  const testing::ChiSquareResult r = testing::PearsonChiSquare(observed, expected);
  EXPECT_GE(r.p_value, kRejectP) << "chi2=" << r.statistic << " df=" << r.df;
}

TEST(SampleInverseCdfTest, SparseFormMatchesDenseForm) {
  std::vector<float> dense(300, 0.0f);
  for (size_t i = 0; i < dense.size(); i += 7) dense[i] = 1.0f + static_cast<float>(i % 5);
  dense[299] = 0.5f;
  const ProbRow row = ExtractSupport(dense);
  ASSERT_EQ(row.ids.size(), row.probs.size());
  for (size_t j = 0; j < row.ids.size(); ++j) {
    EXPECT_GT(row.probs[j], 0.0f);
    EXPECT_EQ(row.probs[j], dense[row.ids[j]]);
    if (j > 0) {
      EXPECT_GT(row.ids[j], row.ids[j - 1]);
    }
  }
  EXPECT_EQ(row.ids.size(), 44u);  // 43 multiples of 7 below 300, plus 299
  for (uint32_t n = 0; n < 5000; ++n) {
    const double u = StreamUniform(77, n, Purpose::kCandidate);
    const absl::StatusOr<int32_t> sparse = SampleInverseCdfSparse(row.ids, row.probs, u);
    ASSERT_TRUE(sparse.ok()) << sparse.status();
    ASSERT_EQ(*sparse, Sample(dense, u)) << "u=" << u;
  }
  EXPECT_EQ(*SampleInverseCdfSparse(row.ids, row.probs, 0.0), 0);
  EXPECT_EQ(*SampleInverseCdfSparse(row.ids, row.probs, kLastU), 299);
}

TEST(SampleInverseCdfTest, RejectsBadRowsAndUniforms) {
  const std::vector<float> ok = {0.5f, 0.5f};
  for (const double u : {1.0, -1e-300, 2.0, std::nan("")}) {
    const absl::Status status = SampleInverseCdf(ok, u).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << u;
    EXPECT_THAT(status.message(), HasSubstr("uniform u must be in [0, 1)"));
  }
  EXPECT_THAT(SampleInverseCdf(std::vector<float>{0.5f, -0.1f}, 0.3).status().message(),
              HasSubstr("probs[1] = -0.1 is not a probability"));
  EXPECT_THAT(SampleInverseCdf(std::vector<float>{std::nanf(""), 1.0f}, 0.3).status().message(),
              HasSubstr("probs[0] = nan"));
  EXPECT_THAT(
      SampleInverseCdf(std::vector<float>{1.0f, std::numeric_limits<float>::infinity()}, 0.3)
          .status()
          .message(),
      HasSubstr("probs[1] = inf"));
  EXPECT_THAT(SampleInverseCdf(std::vector<float>{0.0f, 0.0f}, 0.3).status().message(),
              HasSubstr("no positive entry"));
  EXPECT_THAT(SampleInverseCdf(std::vector<float>{}, 0.3).status().message(),
              HasSubstr("no positive entry"));

  const std::vector<float> two = {0.5f, 0.5f};
  EXPECT_THAT(SampleInverseCdfSparse(std::vector<int32_t>{3, 3}, two, 0.1).status().message(),
              HasSubstr("strictly ascending; ids[1] = 3 follows 3"));
  EXPECT_THAT(SampleInverseCdfSparse(std::vector<int32_t>{5, 2}, two, 0.1).status().message(),
              HasSubstr("ids[1] = 2 follows 5"));
  EXPECT_THAT(SampleInverseCdfSparse(std::vector<int32_t>{-1, 2}, two, 0.1).status().message(),
              HasSubstr("ids[0] = -1"));
  EXPECT_THAT(SampleInverseCdfSparse(std::vector<int32_t>{1}, two, 0.1).status().message(),
              HasSubstr("1 ids but 2 probabilities"));
}

}  // namespace
}  // namespace specd
