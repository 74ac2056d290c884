// WorkerRuntime::Draft: chains of K sampled drafts, draft trees (one level per step), and EGAG's
// entropy stop.
#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/philox.h"
#include "base/status_macros.h"
#include "common/worker/worker_runtime.h"
#include "common/worker/worker_runtime_internal.h"

namespace specd {
namespace {

using worker_internal::CheckUnique;
using worker_internal::RowError;

// One sequence's drafting within a Draft call.
struct Drafting {
  int32_t last = 0;  // a chain's t_{k-1}
  int32_t drafted = 0;
  bool stopped = false;  // EGAG ended the chain early
  // A tree: its nodes so far in BFS order, their parents and attention masks, and the slot of
  // node 0 (the committed length).
  std::vector<int32_t> nodes;
  std::vector<int32_t> parents;
  std::vector<uint64_t> masks;
  std::vector<TreeLevel> levels;
  int64_t tree_start = 0;
  // This step's feed when it is not a single token.
  std::vector<int32_t> positions;
  std::vector<int32_t> rows;  // sampler row of each fed node (a tree level), or of the chain
};

absl::Status CheckDraftRequest(const DraftSequenceRequest& req) {
  if (req.num_speculative_tokens < 1 || req.num_speculative_tokens > kMaxSpeculativeTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", req.seq, ": num_speculative_tokens must be in [1, ",
                     kMaxSpeculativeTokens, "], got ", req.num_speculative_tokens));
  }
  if (req.tree.is_tree()) {
    absl::Status st = ValidateTreeShape(req.tree, req.num_speculative_tokens, "tree");
    if (!st.ok())
      return absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq, ": ", st.message()));
  }
  if (req.tree.is_tree() && req.companion.has_value()) {
    // A tree's nodes would need the companion fed the same tree, masks and compaction.
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence ", req.seq, ": a guided sequence (with a companion) cannot draft a tree"));
  }
  const EntropyStop& e = req.entropy_stop;
  if (e.enabled && (e.min_tokens < 1 || !(e.threshold >= 0.0f && e.threshold <= 1.0f))) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", req.seq,
                     ": entropy_stop needs min_tokens >= 1 and a threshold in [0, 1], got ",
                     e.min_tokens, " and ", e.threshold));
  }
  return absl::OkStatus();
}

// The tokens from a tree's root down to `node`.
std::vector<int32_t> PathTo(const Drafting& d, int32_t node) {
  std::vector<int32_t> path;
  for (int32_t n = node; n >= 0; n = d.parents[static_cast<size_t>(n)]) {
    path.push_back(d.nodes[static_cast<size_t>(n)]);
  }
  std::reverse(path.begin(), path.end());
  return path;
}

}  // namespace

std::vector<SequenceOutcome> WorkerRuntime::Draft(
    std::span<const DraftSequenceRequest> batch,
    const std::function<void(const DraftStep&)>& on_step) {
  std::vector<SequenceOutcome> outcomes(batch.size());
  std::vector<SequenceOutcome> failed;  // not yet reported to on_step
  auto fail = [&](size_t i, absl::Status st) {
    outcomes[i].status = std::move(st);
    failed.push_back({batch[i].seq, outcomes[i].status, LengthOrZero(batch[i].seq)});
  };

  std::vector<size_t> active;   // still drafting
  std::vector<size_t> chunked;  // only feeding a prefill chunk
  std::vector<Feed> plan(batch.size());
  absl::flat_hash_set<SeqId> seen;
  int64_t reserved = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const DraftSequenceRequest& req = batch[i];
    outcomes[i].seq = req.seq;
    absl::Status st = CheckUnique(req, &seen);
    if (st.ok()) st = CheckDraftRequest(req);
    if (st.ok()) {
      // The last level (a chain's last token) is drafted but never fed.
      const int32_t k = req.num_speculative_tokens;
      const int64_t fed = req.tree.is_tree()
                              ? TreeNodeCount(req.tree, k) - TreeLevels(req.tree, k).back().count
                              : k - 1;
      absl::StatusOr<Feed> f = Admit(req, fed, &reserved);
      if (f.ok()) {
        plan[i] = *f;
      } else {
        st = f.status();
      }
    }
    if (!st.ok()) {
      fail(i, std::move(st));
    } else if (plan[i].complete) {
      active.push_back(i);
    } else {
      outcomes[i].prefilling = true;
      if (plan[i].feed + plan[i].companion_feed > 0) chunked.push_back(i);
    }
  }
  auto fail_active = [&](const absl::Status& st) {
    for (const size_t i : active) fail(i, st);
    active.clear();
  };
  auto fail_chunked = [&](const absl::Status& st) {
    for (const size_t i : chunked) {
      outcomes[i].prefilling = false;
      fail(i, st);
    }
    chunked.clear();
  };
  // Prefill chunks ride in the first pass, after the drafting sequences (which own its logits).
  std::vector<SequenceInput> chunk_inputs;
  for (const size_t i : chunked) AddChunkInputs(batch[i], plan[i], &chunk_inputs);
  int64_t forward_ns = 0;
  if (active.empty() && !chunk_inputs.empty()) {
    const absl::Time start = absl::Now();
    if (absl::Status st = FeedOnly(chunk_inputs); st.ok()) {
      ChunksFed(chunk_inputs);
      forward_ns = absl::ToInt64Nanoseconds(absl::Now() - start);
    } else {
      RollBack(chunk_inputs);
      fail_chunked(st);
    }
  }

  std::vector<Drafting> drafting(batch.size());
  for (const size_t i : active) {
    if (batch[i].tree.is_tree()) {
      drafting[i].levels = TreeLevels(batch[i].tree, batch[i].num_speculative_tokens);
    }
  }
  std::vector<DraftToken> step_tokens;
  int32_t k = 0;
  while (!active.empty()) {
    ++k;
    step_tokens.clear();
    // Every active sequence drafts step k: the k-th token of a chain, or level k of a tree.
    std::vector<SequenceInput> inputs;
    for (const size_t i : active) {
      const DraftSequenceRequest& req = batch[i];
      const Sequence& s = seqs_[req.seq];
      Drafting& d = drafting[i];
      SequenceInput in;
      in.seq = req.seq;
      in.start_pos = static_cast<int64_t>(s.tokens.size());
      if (k == 1) {
        in.tokens =
            std::span<const int32_t>(req.catch_up).subspan(static_cast<size_t>(plan[i].cached));
        in.logit_indices = {static_cast<int32_t>(in.tokens.size() - 1)};
      } else if (!req.tree.is_tree()) {
        in.tokens = std::span<const int32_t>(&d.last, 1);
        in.logit_indices = {0};
      } else {
        // Level k - 1, each node at its depth's position and seeing only its ancestors.
        const TreeLevel& level = d.levels[static_cast<size_t>(k - 2)];
        in.tokens = std::span<const int32_t>(d.nodes).subspan(static_cast<size_t>(level.begin),
                                                              static_cast<size_t>(level.count));
        d.positions.assign(static_cast<size_t>(level.count),
                           static_cast<int32_t>(d.tree_start + k - 2));
        in.positions = d.positions;
        in.tree_first_node = level.begin;
        in.tree_mask = std::span<const uint64_t>(d.masks).subspan(static_cast<size_t>(level.begin),
                                                                  static_cast<size_t>(level.count));
        for (int32_t j = 0; j < level.count; ++j) in.logit_indices.push_back(j);
      }
      inputs.push_back(in);
    }
    const size_t drafting_inputs = inputs.size();  // inputs[b] is active[b]'s
    if (k == 1) inputs.insert(inputs.end(), chunk_inputs.begin(), chunk_inputs.end());
    // The companions of guided sequences (chains only), fed the same tokens in the same pass;
    // their logit rows come after every drafting row (chunks have none).
    std::vector<int32_t> companion_input(drafting_inputs, -1);
    for (size_t b = 0; b < drafting_inputs; ++b) {
      const size_t i = active[b];
      const DraftSequenceRequest& req = batch[i];
      if (!req.companion.has_value()) continue;
      SequenceInput in;
      in.seq = req.companion->seq;
      in.start_pos = LengthOrZero(in.seq);
      if (k == 1) {
        in.tokens = std::span<const int32_t>(req.companion->catch_up)
                        .subspan(static_cast<size_t>(plan[i].companion_cached));
      } else {
        in.tokens = std::span<const int32_t>(&drafting[i].last, 1);
      }
      in.logit_indices = {static_cast<int32_t>(in.tokens.size() - 1)};
      companion_input[b] = static_cast<int32_t>(inputs.size());
      inputs.push_back(in);
    }
    std::vector<int32_t> draw_of(drafting_inputs, -1);
    std::vector<int32_t> temp_slots;  // tree rows: needed only within this pass
    const absl::Status pass = ForwardAndSample(
        ForwardKind::kDraftStep, inputs,
        [&]() -> absl::Status {
          int64_t rows = 0;
          for (size_t b = 0; b < drafting_inputs; ++b) {
            rows += static_cast<int64_t>(inputs[b].logit_indices.size());
          }
          SPECD_ASSIGN_OR_RETURN(const std::vector<int32_t> slots, pool_.Acquire(rows));
          size_t next_slot = 0;
          int32_t companion_row = static_cast<int32_t>(rows);
          for (size_t b = 0; b < drafting_inputs; ++b) {
            const DraftSequenceRequest& req = batch[active[b]];
            Sequence& s = seqs_[req.seq];
            Drafting& d = drafting[active[b]];
            s.tokens.insert(s.tokens.end(), inputs[b].tokens.begin(), inputs[b].tokens.end());
            if (req.entropy_stop.enabled) sampler_.RequestEntropy();
            d.rows.clear();
            if (req.tree.is_tree()) {
              // Deterministic children: the top-b (or the argmax) of each penalised row. No row
              // is kept: one-hot proposals need no q(y) and no ReadRows.
              if (k == 1) d.tree_start = static_cast<int64_t>(s.tokens.size());
              if (k <= req.tree.depth) sampler_.RequestTopTokens(req.tree.branching);
              const std::span<const int32_t> x(s.tokens.data(), static_cast<size_t>(d.tree_start));
              for (size_t j = 0; j < inputs[b].logit_indices.size(); ++j) {
                // A node's history is x and its path: only a penalty reads it.
                std::vector<int32_t> history;
                if (req.sampling.penalizes()) history.assign(x.begin(), x.end());
                if (req.sampling.penalizes() && k > 1) {
                  const std::vector<int32_t> path = PathTo(
                      d, d.levels[static_cast<size_t>(k - 2)].begin + static_cast<int32_t>(j));
                  history.insert(history.end(), path.begin(), path.end());
                }
                temp_slots.push_back(slots[next_slot]);
                d.rows.push_back(
                    AddRow(s, history, req, kernels::RowMode::kGreedy, slots[next_slot++]));
              }
              continue;
            }
            // A greedy request's q is its argmax; a greedy draft of a sampled request takes the
            // processed row's argmax. A point mass is exact as long as the same row samples t,
            // reports q(t) and answers q(y) (DESIGN.md, "The processed distribution").
            const kernels::RowMode mode = req.sampling.greedy() ? kernels::RowMode::kGreedy
                                          : req.draft_sampling == DraftSampling::kGreedy
                                              ? kernels::RowMode::kArgmaxOfProcessed
                                              : kernels::RowMode::kSample;
            d.rows.push_back(AddKeptRow(s, s.tokens.size(), req, mode, slots[next_slot++]));
            if (companion_input[b] >= 0) {
              const SequenceInput& in = inputs[static_cast<size_t>(companion_input[b])];
              std::vector<int32_t>& u = seqs_[in.seq].tokens;
              u.insert(u.end(), in.tokens.begin(), in.tokens.end());
              sampler_.AddGuidance(d.rows.back(), companion_row++, req.companion->scale);
            }
            if (mode != kernels::RowMode::kSample) continue;
            // t_k sits at position len(x) + k - 1, which is what the cache now holds.
            kernels::Draw draw;
            draw.prob_slot = s.rows.back();
            draw.seed = req.seed;
            draw.position = static_cast<uint32_t>(s.tokens.size());
            draw.purpose = Purpose::kDraftSample;
            draw.sample = req.sample;
            draw_of[b] = sampler_.AddDraw(draw);
          }
          return absl::OkStatus();
        },
        &forward_ns);
    pool_.Release(temp_slots);
    if (!pass.ok()) {
      RollBack(inputs);
      fail_active(pass);
      if (k == 1) fail_chunked(pass);
      break;
    }
    if (k == 1) {
      // x (and u) are all in the cache now; the drafts (or tree nodes) that follow are not
      // committed.
      for (const size_t i : active) CacheCommittedPair(batch[i], 0);
      ChunksFed(chunk_inputs);
    }
    for (size_t b = 0; b < drafting_inputs; ++b) {
      const size_t i = active[b];
      const DraftSequenceRequest& req = batch[i];
      Sequence& s = seqs_[req.seq];
      Drafting& d = drafting[i];
      int32_t error = kernels::kRowOk;
      for (const int32_t row : d.rows) {
        if (error == kernels::kRowOk) error = sampler_.row_error(row);
      }
      if (error == kernels::kRowOk && draw_of[b] >= 0) error = sampler_.draw_error(draw_of[b]);
      if (error != kernels::kRowOk) {
        ReleaseRows(s);  // no half-filled rows for Truncate queries or ReadRows
        fail(i, RowError(req.seq, error));
        continue;
      }
      ++d.drafted;
      if (req.tree.is_tree()) {
        // Level k: each fed node's children in rank order, which is BFS order.
        const bool branching = k <= req.tree.depth;
        const int32_t first_parent = k == 1 ? -1 : d.levels[static_cast<size_t>(k - 2)].begin;
        for (size_t j = 0; j < d.rows.size(); ++j) {
          const int32_t parent = k == 1 ? -1 : first_parent + static_cast<int32_t>(j);
          const int32_t children = branching ? req.tree.branching : 1;
          for (int32_t c = 0; c < children; ++c) {
            const int32_t index =
                branching ? sampler_.top_token(d.rows[j], c) : sampler_.argmax(d.rows[j]);
            const int32_t token = vocab_.ToId(index);
            const uint64_t own = uint64_t{1} << d.nodes.size();
            d.masks.push_back(own | (parent < 0 ? 0 : d.masks[static_cast<size_t>(parent)]));
            d.nodes.push_back(token);
            d.parents.push_back(parent);
            step_tokens.push_back({req.seq, token, 1.0f, 0.0f});
          }
        }
        continue;
      }
      const int32_t row = d.rows.front();
      const int32_t draw = draw_of[b];
      const int32_t token = vocab_.ToId(draw >= 0 ? sampler_.token(draw) : sampler_.argmax(row));
      d.last = token;
      const float entropy = req.entropy_stop.enabled ? sampler_.entropy(row) : 0.0f;
      step_tokens.push_back(
          {req.seq, token, draw >= 0 ? sampler_.token_prob(draw) : 1.0f, entropy});
      // EGAG: the draft is unsure here, so the steps after this one would likely be wasted.
      d.stopped = req.entropy_stop.enabled && d.drafted >= req.entropy_stop.min_tokens &&
                  entropy > req.entropy_stop.threshold;
    }
    active.erase(std::remove_if(active.begin(), active.end(),
                                [&](size_t i) {
                                  return !outcomes[i].status.ok() || drafting[i].stopped ||
                                         drafting[i].drafted == batch[i].num_speculative_tokens;
                                }),
                 active.end());
    if (active.empty()) break;  // the final report below carries this step
    if (on_step) {
      DraftStep step;
      step.step = k;
      step.tokens = step_tokens;
      step.failed = failed;
      step.forward_ns = forward_ns;
      on_step(step);
    }
    failed.clear();
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    outcomes[i].cached_len = LengthOrZero(batch[i].seq);
    outcomes[i].companion_cached_len = CompanionLengthOrZero(batch[i]);
  }
  if (on_step) {
    DraftStep step;
    step.step = k;
    step.tokens = step_tokens;
    step.failed = failed;
    step.last = true;
    step.outcomes = outcomes;
    step.forward_ns = forward_ns;
    on_step(step);
  }
  return outcomes;
}

}  // namespace specd
