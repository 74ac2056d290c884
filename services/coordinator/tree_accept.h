// Verification of deterministic proposals: a prompt-lookup chain (ngram_proposer.h) or a draft
// tree whose children are the draft's top-b tokens (common/protocol/draft_tree.h). This is the
// multi-draft speculative sampling of SpecInfer (Miao et al. 2024, Sec. 4.2) for the case where
// every proposal is a point mass, which needs only scalars from the target, never a row:
//
//  * at a node whose target distribution is p, try its children x_1, x_2, ... in order. Child x_c
//    is accepted with probability p'(x_c) = p(x_c) / (1 − Σ_{j<c} p(x_j)): p with the children
//    already rejected removed and renormalised. The uniform is (seed, pos, CHILD_ACCEPT, c,
//    sample);
//  * an accepted child becomes the node, and the walk repeats;
//  * if every child is rejected, the token is drawn from p with every child removed: the first
//    of the target's pre-drawn candidates y_j ~ p that is not a child (rejection sampling from
//    p), or, if none of the M is, the row itself (ReadRows) with the RESIDUAL_FALLBACK uniform;
//  * at a leaf, the target's pre-drawn bonus b ~ p_leaf follows.
//
// Child x_c is then emitted with probability Π_{j<c}(1 − p'(x_j)) · p'(x_c) = p(x_c), and a
// non-child y with probability (1 − Σ_j p(x_j)) · p(y) / (1 − Σ_j p(x_j)) = p(y): the output is
// exactly p at every node. A chain is the tree with one child per node, where the rule reads
// "accept t with probability p(t); otherwise draw from p with t removed". SpecInfer's rule for
// sampled children, p <- norm(max(p − q, 0)), is not needed: with one-hot proposals it reduces to
// the removal above. Greedy requests follow the child equal to the target's argmax.
#ifndef SPECD_SERVICES_COORDINATOR_TREE_ACCEPT_H_
#define SPECD_SERVICES_COORDINATOR_TREE_ACCEPT_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "base/inverse_cdf.h"

namespace specd {

// What the target returned about one sequence's deterministic proposal.
struct ProposalEvidence {
  uint64_t seed = 0;
  uint32_t sample = 0;               // the completion number (Philox counter's `sample`)
  uint32_t position = 0;             // absolute position decided by row 0
  std::span<const int32_t> tokens;   // the N proposed nodes (a chain: t_1..t_N)
  std::span<const int32_t> parents;  // parent of each node, -1 for row 0; empty: a chain
  std::span<const float> p_node;     // each node's probability in its parent's row
  std::span<const int32_t> argmax;   // per row, N + 1 rows (greedy)
};

struct TreeWalk {
  std::vector<int32_t> path;      // accepted nodes, from the root down
  int32_t row = 0;                // where the walk stopped: 0, or node i's row i + 1
  std::vector<int32_t> children;  // the stopping row's children (all rejected); empty at a leaf
  int32_t later_children_accepted = 0;  // accepted children that were not the first tried
};

// Walks the proposal; greedy follows the target's argmax.
TreeWalk WalkProposal(const ProposalEvidence& evidence, bool greedy);

// The first candidate that is not in `excluded`, or nullopt.
std::optional<int32_t> FirstCandidateOutside(std::span<const int32_t> candidates,
                                             std::span<const int32_t> excluded);

// The exact fallback when no candidate qualifies: p with `excluded` removed, renormalised,
// sampled in token-id order with the RESIDUAL_FALLBACK uniform at `position`; p itself if that
// leaves nothing in fp32.
absl::StatusOr<int32_t> SampleExcluding(uint64_t seed, uint32_t sample, uint32_t position,
                                        const ProbRow& p, std::span<const int32_t> excluded,
                                        int64_t vocab_size);

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_TREE_ACCEPT_H_
