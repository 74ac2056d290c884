#include "common/protocol/draft_tree.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace specd {

std::vector<TreeLevel> TreeLevels(const TreeShape& shape, int32_t k) {
  std::vector<TreeLevel> levels;
  const int32_t branching_levels = std::min(shape.depth, k);
  int32_t begin = 0;
  int32_t count = 1;
  for (int32_t level = 1; level <= k; ++level) {
    if (level <= branching_levels) count *= shape.branching;
    levels.push_back({begin, count});
    begin += count;
  }
  return levels;
}

int32_t TreeNodeCount(const TreeShape& shape, int32_t k) {
  int64_t total = 0;
  int64_t count = 1;
  for (int32_t level = 1; level <= k; ++level) {
    if (level <= std::min(shape.depth, k)) count *= shape.branching;
    total += count;
    if (total > (int64_t{1} << 30)) break;  // far over any limit; callers reject it
  }
  return static_cast<int32_t>(std::min<int64_t>(total, int64_t{1} << 30));
}

std::vector<int32_t> TreeParents(const TreeShape& shape, int32_t k) {
  std::vector<int32_t> parents;
  const std::vector<TreeLevel> levels = TreeLevels(shape, k);
  for (size_t l = 0; l < levels.size(); ++l) {
    const int32_t children =
        l < static_cast<size_t>(std::min(shape.depth, k)) ? shape.branching : 1;
    for (int32_t i = 0; i < levels[l].count; ++i) {
      parents.push_back(l == 0 ? -1 : levels[l - 1].begin + i / children);
    }
  }
  return parents;
}

std::vector<int32_t> TreeDepths(const std::vector<int32_t>& parents) {
  std::vector<int32_t> depths(parents.size(), 1);
  for (size_t i = 0; i < parents.size(); ++i) {
    if (parents[i] >= 0) depths[i] = depths[static_cast<size_t>(parents[i])] + 1;
  }
  return depths;
}

std::vector<bool> RowsWithChildren(size_t n, const std::vector<int32_t>& tree_parents) {
  if (tree_parents.empty()) {
    std::vector<bool> rows(n + 1, true);
    rows[n] = false;
    return rows;
  }
  std::vector<bool> rows(n + 1, false);
  for (const int32_t parent : tree_parents) rows[static_cast<size_t>(parent + 1)] = true;
  return rows;
}

absl::Status ValidateTreeShape(const TreeShape& shape, int32_t k, const char* field) {
  if (shape.branching < 2 || shape.branching > kMaxTreeBranching) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".branching must be in [2, ",
                                                   kMaxTreeBranching, "], got ", shape.branching));
  }
  if (shape.depth < 1 || shape.depth > k) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".depth must be in [1, K = ", k, "], got ", shape.depth));
  }
  const int32_t nodes = TreeNodeCount(shape, k);
  if (nodes > kMaxTreeNodes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " (branching ", shape.branching, ", depth ", shape.depth, ", K ", k,
                     ") has ", nodes, " nodes, at most ", kMaxTreeNodes, " are allowed"));
  }
  return absl::OkStatus();
}

absl::Status ValidateTreeParents(const std::vector<int32_t>& parents) {
  if (parents.size() > static_cast<size_t>(kMaxTreeNodes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a draft tree of ", parents.size(), " nodes; at most ", kMaxTreeNodes, " are allowed"));
  }
  for (size_t i = 0; i < parents.size(); ++i) {
    if (parents[i] < -1 || parents[i] >= static_cast<int32_t>(i)) {
      return absl::InvalidArgumentError(absl::StrCat("tree node ", i, " has parent ", parents[i],
                                                     "; a parent must be -1 or an earlier node"));
    }
  }
  return absl::OkStatus();
}

}  // namespace specd
