// The accept/reject step on its own: hand-checkable cases, and the distribution of the committed
// token measured against the target row p with a chi-square test. The simulated workers below are
// written here from DESIGN.md, independently of the worker runtime.
#include "services/coordinator/accept_reject.h"

#include <cmath>
#include <vector>

#include "base/inverse_cdf.h"
#include "base/philox.h"
#include "gtest/gtest.h"
#include "tests/base/chi_square.h"

namespace specd {
namespace {

TEST(AcceptRejectTest, GreedyAcceptsWhileDraftEqualsArgmax) {
  RoundEvidence r;
  r.draft_tokens = {5, 7, 9};
  r.target_argmax = {5, 7, 8, 2};
  EXPECT_EQ(CountAccepted(r, /*greedy=*/true), 2);
  r.target_argmax = {5, 7, 9, 2};
  EXPECT_EQ(CountAccepted(r, true), 3);
  r.target_argmax = {4, 7, 9, 2};
  EXPECT_EQ(CountAccepted(r, true), 0);
}

TEST(AcceptRejectTest, ProbabilisticAcceptanceFollowsTheRatio) {
  RoundEvidence r;
  r.seed = 11;
  r.position = 40;
  r.draft_tokens = {1, 2};
  // p >= q: always accepted, whatever the uniform.
  r.q_draft = {0.5f, 0.25f};
  r.p_draft = {0.5f, 0.75f};
  EXPECT_EQ(CountAccepted(r, false), 2);
  // p = 0: never accepted.
  r.p_draft = {0.0f, 0.75f};
  EXPECT_EQ(CountAccepted(r, false), 0);
  // In between: accepted exactly when u < p / q for the ACCEPT uniform at that position.
  r.p_draft = {0.3f, 0.1f};
  const double u0 = StreamUniform(11, 40, Purpose::kAccept);
  const double u1 = StreamUniform(11, 41, Purpose::kAccept);
  const int expected = !(u0 * 0.5 < double{0.3f}) ? 0 : (!(u1 * 0.25 < double{0.1f}) ? 1 : 2);
  EXPECT_EQ(CountAccepted(r, false), expected);
}

TEST(AcceptRejectTest, CandidateIsTakenWithProbabilityOfTheResidualRatio) {
  // q >= p: the residual is 0 there, never taken.
  const std::vector<int32_t> ys = {3, 4};
  EXPECT_EQ(
      ChooseCandidate(1, 0, 9, ys, std::vector<float>{0.2f, 0.2f}, std::vector<float>{0.5f, 0.2f}),
      std::nullopt);
  // q = 0: the residual equals p, always taken (the first one).
  EXPECT_EQ(
      ChooseCandidate(1, 0, 9, ys, std::vector<float>{0.2f, 0.3f}, std::vector<float>{0.0f, 0.0f}),
      std::optional<int32_t>(3));
}

TEST(AcceptRejectTest, ResidualSamplingIsExactOnAHandRow) {
  // p - min(p, q) = {0, 0.25, 0, 0.25}: the two survivors, each half of the time.
  const ProbRow p{{}, {0.25f, 0.5f, 0.0f, 0.25f}};
  const ProbRow q{{0, 1, 2}, {0.5f, 0.25f, 0.25f}};
  int counts[4] = {0, 0, 0, 0};
  for (uint32_t pos = 0; pos < 4000; ++pos) {
    absl::StatusOr<int32_t> t = SampleResidual(5, 0, pos, p, q, 4);
    ASSERT_TRUE(t.ok()) << t.status();
    ++counts[*t];
  }
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[2], 0);
  EXPECT_NEAR(counts[1], 2000, 200);
  EXPECT_NEAR(counts[3], 2000, 200);
  // Equal rows leave no residual: sample p.
  absl::StatusOr<int32_t> t = SampleResidual(5, 0, 1, p, p, 4);
  ASSERT_TRUE(t.ok());
  EXPECT_NE(*t, 2);
  // Malformed rows are errors, not crashes.
  EXPECT_FALSE(SampleResidual(5, 0, 1, ProbRow{{}, {1.0f}}, q, 4).ok());
  EXPECT_FALSE(SampleResidual(5, 0, 1, p, ProbRow{{9}, {1.0f}}, 4).ok());
}

// One K = 1 round at `position` as the two workers and the coordinator would play it, with the
// correction drawn either correctly or (for the power check) from p instead of the residual.
int32_t PlayRound(uint64_t seed, uint32_t position, const std::vector<float>& p,
                  const std::vector<float>& q, int num_candidates, bool broken_residual) {
  const int32_t t = *SampleInverseCdf(q, StreamUniform(seed, position, Purpose::kDraftSample));
  RoundEvidence r;
  r.seed = seed;
  r.position = position;
  r.draft_tokens = {t};
  r.q_draft = {q[static_cast<size_t>(t)]};
  r.p_draft = {p[static_cast<size_t>(t)]};
  if (CountAccepted(r, false) == 1) return t;
  std::vector<int32_t> ys;
  std::vector<float> py, qy;
  for (int j = 0; j < num_candidates; ++j) {
    const int32_t y = *SampleInverseCdf(
        p, StreamUniform(seed, position, Purpose::kCandidate, static_cast<uint32_t>(j)));
    ys.push_back(y);
    py.push_back(p[static_cast<size_t>(y)]);
    qy.push_back(q[static_cast<size_t>(y)]);
  }
  if (broken_residual) return ys[0];  // the classic bug: correction ~ p, not norm(max(0, p - q))
  if (std::optional<int32_t> c = ChooseCandidate(seed, 0, position, ys, py, qy)) return *c;
  return *SampleResidual(seed, 0, position, ProbRow{{}, p}, ProbRow{{}, q},
                         static_cast<int64_t>(p.size()));
}

double PValueOfRounds(int num_candidates, bool broken) {
  const std::vector<float> p = {0.30f, 0.05f, 0.20f, 0.0f, 0.15f, 0.25f, 0.05f};
  const std::vector<float> q = {0.10f, 0.30f, 0.20f, 0.10f, 0.25f, 0.0f, 0.05f};
  constexpr int kRounds = 40000;
  std::vector<int64_t> observed(p.size(), 0);
  for (int i = 0; i < kRounds; ++i) {
    // A new seed per round and a varying position: rounds are independent requests.
    ++observed[static_cast<size_t>(PlayRound(1000 + static_cast<uint64_t>(i),
                                             static_cast<uint32_t>(i % 97), p, q, num_candidates,
                                             broken))];
  }
  EXPECT_EQ(observed[3], 0) << "a token with p = 0 was committed";
  std::vector<double> expected;
  for (const float v : p) expected.push_back(kRounds * static_cast<double>(v));
  return testing::PearsonChiSquare(observed, expected).p_value;
}

// Threshold: reject exactness at p < 1e-4 (fixed seeds, so the outcome is deterministic).
constexpr double kAlpha = 1e-4;

TEST(AcceptRejectTest, CommittedTokenHasTheTargetDistribution) {
  for (const int m : {0, 1, 4}) {  // M = 0 always takes the ReadRows fallback
    const double pv = PValueOfRounds(m, false);
    std::printf("M = %d: chi-square p-value %.4f\n", m, pv);
    EXPECT_GT(pv, kAlpha) << "M = " << m;
  }
}

TEST(AcceptRejectTest, TheTestHasPowerAgainstABrokenResidual) {
  const double pv = PValueOfRounds(2, true);
  std::printf("broken residual: chi-square p-value %.3g\n", pv);
  EXPECT_LT(pv, kAlpha);
}

}  // namespace
}  // namespace specd
