#include "services/coordinator/tree_accept.h"

#include <algorithm>

#include "base/philox.h"

namespace specd {
namespace {

// The nodes whose parent is `row - 1` (row 0: the roots), in node order.
std::vector<int32_t> ChildrenOf(const ProposalEvidence& ev, int32_t row) {
  std::vector<int32_t> children;
  const int32_t n = static_cast<int32_t>(ev.tokens.size());
  if (ev.parents.empty()) {
    if (row < n) children.push_back(row);  // a chain: node `row` follows row `row`
    return children;
  }
  for (int32_t i = 0; i < n; ++i) {
    if (ev.parents[static_cast<size_t>(i)] == row - 1) children.push_back(i);
  }
  return children;
}

}  // namespace

TreeWalk WalkProposal(const ProposalEvidence& ev, bool greedy) {
  TreeWalk walk;
  int32_t row = 0;
  uint32_t depth = 0;
  while (true) {
    const std::vector<int32_t> children = ChildrenOf(ev, row);
    std::optional<int32_t> accepted;
    // Mass of the children rejected so far at this node, in fp64.
    double rejected = 0.0;
    for (size_t c = 0; c < children.size() && !accepted; ++c) {
      const size_t node = static_cast<size_t>(children[c]);
      if (greedy) {
        if (ev.tokens[node] == ev.argmax[static_cast<size_t>(row)]) {
          accepted = children[c];
          if (c > 0) ++walk.later_children_accepted;
        }
        continue;
      }
      const double p = static_cast<double>(ev.p_node[node]);
      const double u = StreamUniform(ev.seed, ev.position + depth, Purpose::kChildAccept,
                                     static_cast<uint32_t>(c), ev.sample);
      // u < p / (1 - rejected), without the division; rounding can leave 1 - rejected <= p,
      // and then the child is certain.
      if (u * (1.0 - rejected) < p) {
        accepted = children[c];
        if (c > 0) ++walk.later_children_accepted;
      } else {
        rejected += p;
      }
    }
    if (!accepted) {
      walk.row = row;
      walk.children = children;
      return walk;
    }
    walk.path.push_back(*accepted);
    row = *accepted + 1;
    ++depth;
  }
}

std::optional<int32_t> FirstCandidateOutside(std::span<const int32_t> candidates,
                                             std::span<const int32_t> excluded) {
  for (const int32_t y : candidates) {
    if (std::find(excluded.begin(), excluded.end(), y) == excluded.end()) return y;
  }
  return std::nullopt;
}

absl::StatusOr<int32_t> SampleExcluding(uint64_t seed, uint32_t sample, uint32_t position,
                                        const ProbRow& p, std::span<const int32_t> excluded,
                                        int64_t vocab_size) {
  absl::StatusOr<std::vector<float>> dense = DensifyRow(p, vocab_size, "target");
  if (!dense.ok()) return dense.status();
  std::vector<float> residual = *dense;
  for (const int32_t x : excluded) {
    if (x >= 0 && x < vocab_size) residual[static_cast<size_t>(x)] = 0.0f;
  }
  float total = 0.0f;
  for (const float v : residual) total += v;
  const double u = StreamUniform(seed, position, Purpose::kResidualFallback, 0, sample);
  // Every child rejected while the others hold no mass can only come from rounding in p'.
  return SampleInverseCdf(total > 0.0f ? residual : *dense, u);
}

}  // namespace specd
