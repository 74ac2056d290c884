// The draft-tree shape every process derives from (b, d, K): BFS numbering, parents, levels and
// the limits, checked against trees written out by hand.
#include "common/protocol/draft_tree.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(DraftTreeTest, TwoByTwoToDepthFour) {
  // Level 1: n0 n1; level 2: n2 n3 (of n0) n4 n5 (of n1); levels 3 and 4: one argmax child each.
  const TreeShape shape{2, 2};
  EXPECT_EQ(TreeNodeCount(shape, 4), 2 + 4 + 4 + 4);
  EXPECT_THAT(TreeParents(shape, 4), ElementsAre(-1, -1, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  EXPECT_THAT(TreeDepths(TreeParents(shape, 4)),
              ElementsAre(1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4));
  const std::vector<TreeLevel> levels = TreeLevels(shape, 4);
  ASSERT_EQ(levels.size(), 4u);
  EXPECT_EQ(levels[1].begin, 2);
  EXPECT_EQ(levels[1].count, 4);
  EXPECT_EQ(levels[3].begin, 10);
  EXPECT_EQ(levels[3].count, 4);
}

TEST(DraftTreeTest, ThreeWideOneLevelAndDepthCappedAtK) {
  EXPECT_THAT(TreeParents({3, 1}, 2), ElementsAre(-1, -1, -1, 0, 1, 2));
  // A depth beyond K branches only K levels (a round near max_seq_len shrinks K).
  EXPECT_EQ(TreeNodeCount({2, 3}, 2), 2 + 4);
  EXPECT_THAT(TreeParents({2, 3}, 2), ElementsAre(-1, -1, 0, 0, 1, 1));
}

TEST(DraftTreeTest, RowsWithChildrenOfChainsAndTrees) {
  // A chain: every row but the last has its next draft; K = 0 is one leaf row.
  EXPECT_THAT(RowsWithChildren(3, {}), ElementsAre(true, true, true, false));
  EXPECT_THAT(RowsWithChildren(0, {}), ElementsAre(false));
  // (3, 1) to depth 2: row 0 has n0..n2; rows of n0..n2 have n3..n5; n3..n5 are leaves.
  EXPECT_THAT(RowsWithChildren(6, {-1, -1, -1, 0, 1, 2}),
              ElementsAre(true, true, true, true, false, false, false));
  // Any forest the protocol allows: n1 is a leaf before n2, which has a child.
  EXPECT_THAT(RowsWithChildren(3, {-1, -1, 1}), ElementsAre(true, false, true, false));
}

TEST(DraftTreeTest, ShapesOutsideTheLimitsAreRejectedNamingTheField) {
  EXPECT_TRUE(ValidateTreeShape({2, 2}, 4, "t").ok());
  EXPECT_THAT(ValidateTreeShape({1, 2}, 4, "speculation.tree").message(),
              HasSubstr("speculation.tree.branching must be in [2, 8], got 1"));
  EXPECT_THAT(ValidateTreeShape({9, 1}, 4, "t").message(), HasSubstr("t.branching"));
  EXPECT_THAT(ValidateTreeShape({2, 0}, 4, "t").message(),
              HasSubstr("t.depth must be in [1, K = 4]"));
  EXPECT_THAT(ValidateTreeShape({2, 5}, 4, "t").message(), HasSubstr("got 5"));
  // 4 + 16 + 64 nodes.
  EXPECT_THAT(ValidateTreeShape({4, 3}, 3, "t").message(), HasSubstr("has 84 nodes, at most 64"));
  EXPECT_TRUE(ValidateTreeShape({4, 2}, 4, "t").ok());  // 4 + 16 + 16 + 16 = 52
}

TEST(DraftTreeTest, ParentsMustComeFirst) {
  EXPECT_TRUE(ValidateTreeParents({-1, -1, 0, 1}).ok());
  EXPECT_FALSE(ValidateTreeParents({-1, 1}).ok());
  EXPECT_FALSE(ValidateTreeParents({-2}).ok());
  EXPECT_FALSE(ValidateTreeParents(std::vector<int32_t>(65, -1)).ok());
}

}  // namespace
}  // namespace specd
