// The shape of a draft tree (SpecInfer, Miao et al. 2024, "SpecInfer: Accelerating Large Language
// Model Serving with Tree-based Speculative Inference and Verification"): the draft's top-b tokens
// at each of the first d levels, then the argmax continuation of every level-d node to depth K.
// Nodes are numbered in BFS order, level by level, and within a level by parent and then by the
// child's rank, so a node's parent always comes first. The draft worker, the target worker and
// the coordinator all derive the same tree from (b, d, K); only tokens cross the wire.
#ifndef SPECD_COMMON_PROTOCOL_DRAFT_TREE_H_
#define SPECD_COMMON_PROTOCOL_DRAFT_TREE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace specd {

// One 64-bit attention mask word per node (kernels/backend.h, AttentionArgs).
inline constexpr int32_t kMaxTreeNodes = 64;
inline constexpr int32_t kMaxTreeBranching = 8;

struct TreeShape {
  int32_t branching = 0;  // b >= 2; 0 = no tree (one chain of K drafts)
  int32_t depth = 0;      // d in [1, K]: levels that branch
  bool is_tree() const { return branching > 0; }
  bool operator==(const TreeShape&) const = default;
};

// The nodes of one level, [begin, begin + count) in BFS order.
struct TreeLevel {
  int32_t begin = 0;
  int32_t count = 0;
};

// Levels 1..K of the tree of `shape` and depth `k` (shape.depth is capped at k).
std::vector<TreeLevel> TreeLevels(const TreeShape& shape, int32_t k);
// Nodes at depths 1..K.
int32_t TreeNodeCount(const TreeShape& shape, int32_t k);
// The parent of each node (-1 for level 1: children of the last committed token).
std::vector<int32_t> TreeParents(const TreeShape& shape, int32_t k);
// Depth of each node (1-based) given parents as above.
std::vector<int32_t> TreeDepths(const std::vector<int32_t>& parents);
// Which of a Verify's rows 0..N have a child (row 0 is the last committed token's, row i + 1 node
// i's), for `n` drafts whose parents are `tree_parents` as above, or that form one chain when it is
// empty. The target draws candidates from these rows and a bonus from every other (a leaf).
std::vector<bool> RowsWithChildren(size_t n, const std::vector<int32_t>& tree_parents);

// OK, or INVALID_ARGUMENT naming `field` when b is outside [2, kMaxTreeBranching], d outside
// [1, k] or the tree has more than kMaxTreeNodes nodes.
absl::Status ValidateTreeShape(const TreeShape& shape, int32_t k, const char* field);

// OK, or INVALID_ARGUMENT when `parents` is not a forest in BFS-compatible order: every parent
// is -1 or an earlier node, and there are at most kMaxTreeNodes nodes.
absl::Status ValidateTreeParents(const std::vector<int32_t>& parents);

}  // namespace specd

#endif  // SPECD_COMMON_PROTOCOL_DRAFT_TREE_H_
