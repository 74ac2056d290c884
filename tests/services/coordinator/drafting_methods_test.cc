// The coordinator's parts of issue 17 on their own: prompt lookup's proposals, the walk that
// verifies deterministic proposals (with a chi-square check of its first decision and a broken
// variant that forgets p' and must fail it), and EGAG's draft length and average.
#include <cmath>
#include <vector>

#include "base/philox.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/egag.h"
#include "services/coordinator/ngram_proposer.h"
#include "services/coordinator/tree_accept.h"
#include "tests/base/chi_square.h"

namespace specd {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(NgramProposerTest, LongestSuffixFirstAndItsLatestOccurrence) {
  // "7 8 9" occurs at 1 and at 6; the suffix "8 9" (n = 2) last occurred at 7..8 -> continue
  // with what followed it there.
  const std::vector<int32_t> text = {1, 7, 8, 9, 4, 2, 7, 8, 9, 5, 3, 8, 9};
  EXPECT_THAT(ProposeNgram(text, 3, {1, 4}), ElementsAre(5, 3, 8));
  // With n = 3 the suffix "3 8 9" never occurred before; n = 2 wins.
  EXPECT_THAT(ProposeNgram(text, 2, {2, 3}), ElementsAre(5, 3));
  // Only 1-grams: the latest earlier "9" is at 8.
  EXPECT_THAT(ProposeNgram(text, 4, {1, 1}), ElementsAre(5, 3, 8, 9));
}

TEST(NgramProposerTest, ContinuationMayRunIntoTheSuffixAndStopsAtTheEnd) {
  const std::vector<int32_t> text = {5, 6, 5, 6, 5, 6};
  // Latest earlier "5 6" before the suffix starts at 2: its continuation is "5 6" (the suffix).
  EXPECT_THAT(ProposeNgram(text, 8, {2, 2}), ElementsAre(5, 6));
}

TEST(NgramProposerTest, NothingMatchesNothingProposed) {
  EXPECT_THAT(ProposeNgram(std::vector<int32_t>{1, 2, 3, 4}, 4, {1, 3}), IsEmpty());
  EXPECT_THAT(ProposeNgram(std::vector<int32_t>{4}, 4, {1, 3}), IsEmpty());
  EXPECT_THAT(ProposeNgram(std::vector<int32_t>{4, 4, 4}, 0, {1, 3}), IsEmpty());
  EXPECT_FALSE(ValidateNgramOptions({0, 2}).ok());
  EXPECT_FALSE(ValidateNgramOptions({3, 2}).ok());
  EXPECT_TRUE(ValidateNgramOptions({2, 2}).ok());
}

TEST(PredictionProposerTest, FollowsThePredictionFromItsStartAndAcrossAnEdit) {
  const std::vector<int32_t> prediction = {10, 11, 12, 13, 14, 15, 16, 17};
  // Nothing generated yet: the prediction's first tokens.
  EXPECT_THAT(ProposeFromPrediction({}, prediction, 3, {1, 3}), ElementsAre(10, 11, 12));
  // On track: the tokens after the matching suffix.
  EXPECT_THAT(ProposeFromPrediction(std::vector<int32_t>{10, 11, 12}, prediction, 2, {1, 3}),
              ElementsAre(13, 14));
  // The output replaced 12 by 99 and went on: the suffix "13" still finds its place.
  EXPECT_THAT(ProposeFromPrediction(std::vector<int32_t>{10, 11, 99, 13}, prediction, 8, {1, 3}),
              ElementsAre(14, 15, 16, 17));
  // Nothing after the prediction's end, and nothing for an unknown suffix or k = 0.
  EXPECT_THAT(ProposeFromPrediction(std::vector<int32_t>{16, 17}, prediction, 3, {1, 3}),
              IsEmpty());
  EXPECT_THAT(ProposeFromPrediction(std::vector<int32_t>{42}, prediction, 3, {1, 3}), IsEmpty());
  EXPECT_THAT(ProposeFromPrediction({}, prediction, 0, {1, 3}), IsEmpty());
  EXPECT_THAT(ProposeFromPrediction(std::vector<int32_t>{10}, {}, 3, {1, 3}), IsEmpty());
}

TEST(PredictionProposerTest, ARepeatedLineContinuesFromTheCopyNearestTheOutputsEnd) {
  // "5 6 7" three times, each copy followed by its own token: the output has reached the second
  // copy, so the lookup continues there, not at the first (or the last).
  const std::vector<int32_t> prediction = {5, 6, 7, 1, 5, 6, 7, 2, 5, 6, 7, 3};
  EXPECT_THAT(
      ProposeFromPrediction(std::vector<int32_t>{5, 6, 7, 1, 5, 6, 7}, prediction, 2, {1, 3}),
      ElementsAre(2, 5));
  // Longer suffixes win over nearer short ones: "1 5 6 7" occurs once.
  EXPECT_THAT(ProposeFromPrediction(std::vector<int32_t>{9, 9, 9, 9, 9, 9, 9, 9, 9, 1, 5, 6, 7},
                                    prediction, 1, {1, 4}),
              ElementsAre(2));
}

// One node with three deterministic children holding most of p's mass: over many seeds the walk
// must accept child c with probability p(c) and reject them all with 1 - sum p. A walk that
// forgets to renormalise (accepts x_c with p(x_c) instead of p'(x_c)) must fail the same test.
TEST(TreeWalkTest, FirstDecisionFollowsTheTargetAndTheBrokenRuleIsCaught) {
  const std::vector<int32_t> tokens = {11, 12, 13};
  const std::vector<int32_t> parents = {-1, -1, -1};
  const std::vector<float> p = {0.45f, 0.3f, 0.15f};
  const std::vector<int32_t> argmax = {11, 0, 0, 0};
  constexpr int kSeeds = 20000;
  std::vector<int64_t> counts(4, 0);
  std::vector<int64_t> broken(4, 0);
  for (int seed = 0; seed < kSeeds; ++seed) {
    ProposalEvidence ev;
    ev.seed = 1000 + static_cast<uint64_t>(seed);
    ev.position = 40;
    ev.tokens = tokens;
    ev.parents = parents;
    ev.p_node = p;
    ev.argmax = argmax;
    const TreeWalk walk = WalkProposal(ev, /*greedy=*/false);
    ++counts[walk.path.empty() ? 3 : static_cast<size_t>(walk.path[0])];
    // The broken rule, by hand: u_c < p(x_c).
    size_t outcome = 3;
    for (size_t c = 0; c < 3 && outcome == 3; ++c) {
      if (StreamUniform(ev.seed, 40, Purpose::kChildAccept, static_cast<uint32_t>(c)) < p[c]) {
        outcome = c;
      }
    }
    ++broken[outcome];
  }
  const std::vector<double> expected = {0.45 * kSeeds, 0.3 * kSeeds, 0.15 * kSeeds, 0.1 * kSeeds};
  const double pv = testing::PearsonChiSquare(counts, expected).p_value;
  const double broken_pv = testing::PearsonChiSquare(broken, expected).p_value;
  std::printf("tree walk p-value %.4f, broken %.3g\n", pv, broken_pv);
  EXPECT_GT(pv, 1e-4);
  EXPECT_LT(broken_pv, 1e-4);
}

TEST(TreeWalkTest, WalksDownAcceptedChildrenAndStopsAtALeafOrARejection) {
  // n0 -> n2 -> n4, n1 -> n3 -> n5: a 2-wide first level, then chains.
  const std::vector<int32_t> tokens = {5, 6, 7, 8, 9, 10};
  const std::vector<int32_t> parents = {-1, -1, 0, 1, 2, 3};
  const std::vector<float> certain = {1, 0, 1, 1, 1, 1};
  ProposalEvidence ev;
  ev.seed = 7;
  ev.tokens = tokens;
  ev.parents = parents;
  ev.p_node = certain;
  const std::vector<int32_t> argmax = {6, 0, 8, 0, 10, 0, 0};  // rows 0, n1 (2), n3 (4)
  ev.argmax = argmax;
  const TreeWalk sampled = WalkProposal(ev, false);
  EXPECT_THAT(sampled.path, ElementsAre(0, 2, 4));
  EXPECT_EQ(sampled.row, 5);
  EXPECT_THAT(sampled.children, IsEmpty());
  // Greedy follows the argmax: n1 (6), then n3 (8), then n5 (10), to the leaf.
  const TreeWalk greedy = WalkProposal(ev, true);
  EXPECT_THAT(greedy.path, ElementsAre(1, 3, 5));
  EXPECT_EQ(greedy.later_children_accepted, 1);
  // A certain rejection at n2's child: the walk stops at n2's row with its child named.
  const std::vector<float> reject = {1, 0, 1, 1, 0, 1};
  ev.p_node = reject;
  const TreeWalk stopped = WalkProposal(ev, false);
  EXPECT_THAT(stopped.path, ElementsAre(0, 2));
  EXPECT_EQ(stopped.row, 3);
  EXPECT_THAT(stopped.children, ElementsAre(4));
}

TEST(TreeWalkTest, ResidualSkipsChildrenAndFallsBackToTheRowWithoutThem) {
  EXPECT_EQ(FirstCandidateOutside(std::vector<int32_t>{3, 3, 8, 2}, std::vector<int32_t>{3, 2}), 8);
  EXPECT_EQ(FirstCandidateOutside(std::vector<int32_t>{3, 2}, std::vector<int32_t>{3, 2}),
            std::nullopt);
  ProbRow p;
  p.probs = {0.5f, 0.25f, 0.25f, 0.0f};
  // With 0 and 1 removed only 2 is left, whatever the uniform.
  for (uint64_t seed = 0; seed < 50; ++seed) {
    absl::StatusOr<int32_t> t = SampleExcluding(seed, 0, 3, p, std::vector<int32_t>{0, 1}, 4);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(*t, 2);
  }
}

TEST(EgagTest, DraftLengthFollowsTheAverageEntropy) {
  EgagState s;
  s.options = {0.5, 0.6, 1};
  EXPECT_EQ(s.DraftLength(8), 8);  // disabled: K as given
  s.enabled = true;
  EXPECT_EQ(s.DraftLength(8), 8);  // h = 0: sure of itself
  s.h = 1.0;
  EXPECT_EQ(s.DraftLength(8), 1);  // lost: gamma_min
  s.h = 0.5;
  EXPECT_EQ(s.DraftLength(8), 5);  // round(8 - 7 * 0.5) = round(4.5) = 5
  EXPECT_EQ(s.DraftLength(1), 1);
  EXPECT_EQ(s.DraftLength(0), 0);
  s.options.min_tokens = 3;
  EXPECT_EQ(s.DraftLength(2), 2);  // K below gamma_min is kept
  s.h = 0.0;
  s.Observe(std::vector<float>{1.0f, 0.0f});
  EXPECT_DOUBLE_EQ(s.h, 0.25);  // 0.5 * (0.5 * 0 + 0.5 * 1) + 0.5 * 0
  EXPECT_FALSE(ValidateEgagOptions({1.0, 0.5, 1}).ok());
  EXPECT_FALSE(ValidateEgagOptions({0.5, 1.5, 1}).ok());
  EXPECT_FALSE(ValidateEgagOptions({0.5, 0.5, 0}).ok());
  EXPECT_FALSE(ValidateEgagOptions({std::nan(""), 0.5, 1}).ok());
}

}  // namespace
}  // namespace specd
