// WorkerRuntime::Verify: one forward pass over each sequence's catch-up and drafts, a chain or a
// draft tree, and the scalars the coordinator's accept/reject step needs.
#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/philox.h"
#include "base/status_macros.h"
#include "common/protocol/draft_tree.h"
#include "common/worker/worker_runtime.h"
#include "common/worker/worker_runtime_internal.h"

namespace specd {
namespace {

using worker_internal::CheckUnique;
using worker_internal::RowError;

absl::Status CheckVerifyRequest(const VerifySequenceRequest& req, int64_t vocab) {
  if (req.num_candidates < 0 || req.num_candidates > kMaxCandidates) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq,
                                                   ": num_candidates must be in [0, ",
                                                   kMaxCandidates, "], got ", req.num_candidates));
  }
  if (req.logprobs.top_n < 0 || req.logprobs.top_n > kMaxLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq,
                                                   ": logprobs top_n must be in [0, ", kMaxLogprobs,
                                                   "], got ", req.logprobs.top_n));
  }
  const size_t limit =
      static_cast<size_t>(req.tree_parents.empty() ? kMaxSpeculativeTokens : kMaxTreeNodes);
  if (req.drafts.size() > limit) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq, ": ", req.drafts.size(),
                                                   " draft tokens, at most ", limit, " allowed"));
  }
  if (!req.tree_parents.empty()) {
    if (req.companion.has_value()) {
      // A tree's nodes would need the companion fed the same tree, masks and compaction.
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", req.seq, ": a guided sequence (with a companion) cannot verify a tree"));
    }
    if (req.tree_parents.size() != req.drafts.size()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq, ": ",
                                                     req.tree_parents.size(), " tree parents for ",
                                                     req.drafts.size(), " draft tokens"));
    }
    absl::Status st = ValidateTreeParents(req.tree_parents);
    if (!st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq, ": ", st.message()));
    }
  }
  for (size_t k = 0; k < req.drafts.size(); ++k) {
    if (req.drafts[k] < 0 || req.drafts[k] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq, ": draft token ",
                                                     req.drafts[k], " at step ", k + 1,
                                                     " is outside [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

// A sequence's drafts as a tree: the parent of each (a chain: the one before), each node's depth
// and attention mask, and which rows have children (row 0 is the last committed token's).
struct DraftShape {
  std::vector<int32_t> parents;
  std::vector<int32_t> depths;
  std::vector<uint64_t> masks;
  std::vector<bool> row_has_child;
  bool tree = false;

  DraftShape() = default;
  // `req` must have passed CheckVerifyRequest: its parents are not checked here.
  explicit DraftShape(const VerifySequenceRequest& req) : tree(!req.tree_parents.empty()) {
    const size_t n = req.drafts.size();
    parents = req.tree_parents;
    if (!tree) {
      for (size_t i = 0; i < n; ++i) parents.push_back(static_cast<int32_t>(i) - 1);
    }
    depths = TreeDepths(parents);
    row_has_child = RowsWithChildren(n, req.tree_parents);
    if (tree) {
      for (size_t i = 0; i < n; ++i) {
        const int32_t p = parents[i];
        masks.push_back((uint64_t{1} << i) | (p < 0 ? 0 : masks[static_cast<size_t>(p)]));
      }
    }
  }
  // Tokens from the root down to node `i` (i = -1: none).
  std::vector<int32_t> Path(const std::vector<int32_t>& drafts, int32_t i) const {
    std::vector<int32_t> path;
    for (int32_t n = i; n >= 0; n = parents[static_cast<size_t>(n)]) {
      path.push_back(drafts[static_cast<size_t>(n)]);
    }
    std::reverse(path.begin(), path.end());
    return path;
  }
};

}  // namespace

std::vector<VerifySequenceResult> WorkerRuntime::Verify(
    std::span<const VerifySequenceRequest> batch,
    const std::function<void(const VerifySequenceResult&)>& on_result) {
  const int64_t vocab = engine_->config().vocab_size;
  std::vector<VerifySequenceResult> results(batch.size());
  auto finish = [&](size_t i) {
    results[i].cached_len = LengthOrZero(batch[i].seq);
    results[i].companion_cached_len = CompanionLengthOrZero(batch[i]);
    if (on_result) on_result(results[i]);
  };

  std::vector<size_t> active;   // verifying
  std::vector<size_t> chunked;  // only feeding a prefill chunk (or nothing, when prefill_only)
  std::vector<Feed> feed_plan(batch.size());
  absl::flat_hash_set<SeqId> seen;
  int64_t reserved = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const VerifySequenceRequest& req = batch[i];
    results[i].seq = req.seq;
    absl::Status st = CheckUnique(req, &seen);
    if (st.ok() && !vocab_.full()) {
      st = absl::FailedPreconditionError(absl::StrCat(
          "this worker's classifier keeps ", vocab_.width(), " of ", vocab,
          " tokens (a draft's reduced head): it can draft, but verifying needs every token"));
    }
    if (st.ok()) st = CheckVerifyRequest(req, vocab);
    if (st.ok()) {
      absl::StatusOr<Feed> f = Admit(req, static_cast<int64_t>(req.drafts.size()), &reserved);
      if (f.ok()) {
        feed_plan[i] = *f;
      } else {
        st = f.status();
      }
    }
    if (!st.ok()) {
      results[i].status = std::move(st);
      finish(i);
    } else if (feed_plan[i].complete) {
      active.push_back(i);
    } else {
      chunked.push_back(i);
    }
  }
  if (active.empty() && chunked.empty()) return results;

  // One pass: each verifying sequence feeds the rest of its catch-up plus the drafts, with logits
  // at the last catch-up token and at every draft (a tree's nodes sit at their depth's position
  // and see only their ancestors); then the prefill chunks, without logits; then the companions
  // of guided sequences (chains only), fed their own catch-up and the same drafts, whose logit
  // rows thus come after every row that is processed.
  std::vector<std::vector<int32_t>> feeds(batch.size());
  std::vector<std::vector<int32_t>> companion_feeds(batch.size());
  std::vector<std::vector<int32_t>> positions(batch.size());
  // Verifying sequences only: a refused request's tree may be malformed.
  std::vector<DraftShape> shapes(batch.size());
  for (const size_t i : active) shapes[i] = DraftShape(batch[i]);
  std::vector<SequenceInput> inputs;
  for (const size_t i : active) {
    const VerifySequenceRequest& req = batch[i];
    const Sequence& s = seqs_[req.seq];
    feeds[i].assign(req.catch_up.begin() + feed_plan[i].cached, req.catch_up.end());
    const int32_t rest = static_cast<int32_t>(feeds[i].size());
    feeds[i].insert(feeds[i].end(), req.drafts.begin(), req.drafts.end());
    SequenceInput in;
    in.seq = req.seq;
    in.tokens = feeds[i];
    in.start_pos = static_cast<int64_t>(s.tokens.size());
    const int32_t n = static_cast<int32_t>(feeds[i].size());
    for (int32_t j = rest - 1; j < n; ++j) in.logit_indices.push_back(j);
    if (shapes[i].tree) {
      const int64_t x_len = in.start_pos + rest;
      for (int32_t j = 0; j < rest; ++j)
        positions[i].push_back(static_cast<int32_t>(in.start_pos + j));
      for (const int32_t d : shapes[i].depths) {
        positions[i].push_back(static_cast<int32_t>(x_len + d - 1));
      }
      in.positions = positions[i];
      in.tree_begin = rest;
      in.tree_mask = shapes[i].masks;
    }
    inputs.push_back(in);
  }
  std::vector<SequenceInput> chunk_inputs;
  for (const size_t i : chunked) AddChunkInputs(batch[i], feed_plan[i], &chunk_inputs);
  inputs.insert(inputs.end(), chunk_inputs.begin(), chunk_inputs.end());
  for (const size_t i : active) {
    const VerifySequenceRequest& req = batch[i];
    if (!req.companion.has_value()) continue;
    const std::vector<int32_t>& catch_up = req.companion->catch_up;
    companion_feeds[i].assign(catch_up.begin() + feed_plan[i].companion_cached, catch_up.end());
    companion_feeds[i].insert(companion_feeds[i].end(), req.drafts.begin(), req.drafts.end());
    inputs.push_back(VerifyInput(req.companion->seq, companion_feeds[i], req.drafts.size()));
  }
  // Per active sequence: where its rows, lookups and draws sit in the sampler.
  struct Planned {
    int32_t first_row = 0;
    int32_t first_lookup = 0;
    std::vector<int32_t> bonus_draws;      // leaf rows, in row order
    std::vector<int32_t> candidate_draws;  // rows with a child, in row order: M draws each
  };
  std::vector<Planned> plan(batch.size());
  int64_t forward_ns = 0;
  absl::Status st;
  if (active.empty()) {
    const absl::Time start = absl::Now();
    if (!inputs.empty()) st = FeedOnly(inputs);
    forward_ns = absl::ToInt64Nanoseconds(absl::Now() - start);
  } else {
    st = ForwardAndSample(
        ForwardKind::kVerify, inputs,
        [&]() -> absl::Status {
          for (const size_t i : active) {
            if (batch[i].logprobs.mode != LogprobsMode::kOff) sampler_.KeepPenalized();
          }
          int64_t rows = 0;
          for (const size_t i : active) rows += static_cast<int64_t>(batch[i].drafts.size()) + 1;
          SPECD_ASSIGN_OR_RETURN(const std::vector<int32_t> slots, pool_.Acquire(rows));
          size_t next_slot = 0;
          int32_t companion_row = static_cast<int32_t>(rows);
          for (const size_t i : active) {
            const VerifySequenceRequest& req = batch[i];
            const DraftShape& shape = shapes[i];
            Sequence& s = seqs_[req.seq];
            s.tokens.insert(s.tokens.end(), feeds[i].begin(), feeds[i].end());
            const size_t n = req.drafts.size();
            const size_t x_len = s.tokens.size() - n;  // len(x): committed tokens
            const kernels::RowMode mode =
                req.sampling.greedy() ? kernels::RowMode::kGreedy : kernels::RowMode::kSample;
            Planned& p = plan[i];
            for (size_t r = 0; r <= n; ++r) {
              // Row r conditions on x and the path to draft r - 1, which count as output for
              // the penalties. A chain's path is the drafts before it, already in place.
              int32_t row = 0;
              if (!shape.tree) {
                row = AddKeptRow(s, x_len + r, req, mode, slots[next_slot++]);
              } else {
                std::vector<int32_t> history;
                if (req.sampling.penalizes()) {
                  history.assign(s.tokens.begin(),
                                 s.tokens.begin() + static_cast<std::ptrdiff_t>(x_len));
                  const std::vector<int32_t> path =
                      shape.Path(req.drafts, static_cast<int32_t>(r) - 1);
                  history.insert(history.end(), path.begin(), path.end());
                }
                s.rows.push_back(slots[next_slot]);
                row = AddRow(s, history, req, mode, slots[next_slot++]);
              }
              if (r == 0) p.first_row = row;
            }
            if (req.companion.has_value()) {
              // A chain's rows are consecutive, and so are its companion's.
              std::vector<int32_t>& u = seqs_[req.companion->seq].tokens;
              u.insert(u.end(), companion_feeds[i].begin(), companion_feeds[i].end());
              for (size_t r = 0; r <= n; ++r) {
                sampler_.AddGuidance(p.first_row + static_cast<int32_t>(r), companion_row++,
                                     req.companion->scale);
              }
            }
            for (size_t j = 0; j < n; ++j) {
              const size_t parent_row = static_cast<size_t>(shape.parents[j] + 1);
              const int32_t lookup = sampler_.AddLookup(s.rows[parent_row], req.drafts[j]);
              if (j == 0) p.first_lookup = lookup;
            }
            if (req.sampling.greedy()) continue;
            // Row r decides position len(x) + depth(r): a bonus from every leaf (a chain's
            // only leaf is b ~ p_{K+1}), M candidates from every row with a child.
            for (size_t r = 0; r <= n; ++r) {
              kernels::Draw d;
              d.seed = req.seed;
              d.sample = req.sample;
              d.prob_slot = s.rows[r];
              d.position = static_cast<uint32_t>(x_len + (r == 0 ? 0 : shape.depths[r - 1]));
              if (!shape.row_has_child[r]) {
                d.purpose = n > 0 ? Purpose::kBonus : Purpose::kTargetSample;
                p.bonus_draws.push_back(sampler_.AddDraw(d));
                continue;
              }
              d.purpose = Purpose::kCandidate;
              for (int32_t m = 0; m < req.num_candidates; ++m) {
                d.index = static_cast<uint32_t>(m);
                p.candidate_draws.push_back(sampler_.AddDraw(d));
              }
            }
          }
          return absl::OkStatus();
        },
        &forward_ns);
  }
  if (!st.ok()) {
    RollBack(inputs);
    for (const size_t i : active) {
      results[i].status = st;
      finish(i);
    }
    for (const size_t i : chunked) {
      results[i].status = st;
      finish(i);
    }
    return results;
  }
  // Committed text into the cache: x (and u) for the verified sequences (not their drafts or
  // tree nodes), and the chunks.
  for (const size_t i : active) {
    CacheCommittedPair(batch[i], static_cast<int64_t>(batch[i].drafts.size()));
  }
  ChunksFed(chunk_inputs);

  for (const size_t i : active) {
    const VerifySequenceRequest& req = batch[i];
    VerifySequenceResult& r = results[i];
    const Planned& p = plan[i];
    Sequence& s = seqs_[req.seq];
    const size_t n = req.drafts.size();
    const size_t M = static_cast<size_t>(req.num_candidates);
    r.forward_ns = forward_ns;
    r.position = static_cast<int32_t>(s.tokens.size() - n);
    int32_t error = kernels::kRowOk;
    r.argmax.resize(n + 1);
    for (size_t j = 0; j <= n; ++j) {
      const int32_t row = p.first_row + static_cast<int32_t>(j);
      if (error == kernels::kRowOk) error = sampler_.row_error(row);
      r.argmax[j] = sampler_.argmax(row);
    }
    r.p_draft.resize(n);
    for (size_t j = 0; j < n; ++j) {
      r.p_draft[j] = sampler_.lookup(p.first_lookup + static_cast<int32_t>(j));
    }
    if (req.sampling.greedy()) {
      r.bonus_token = r.argmax[n];
    } else if (error == kernels::kRowOk) {
      std::vector<int32_t> bonus;
      for (const int32_t draw : p.bonus_draws) {
        if (error == kernels::kRowOk) error = sampler_.draw_error(draw);
        bonus.push_back(sampler_.token(draw));
      }
      if (shapes[i].tree) {
        r.leaf_bonus = std::move(bonus);
      } else {
        r.bonus_token = bonus.front();
      }
      const size_t with_child = p.candidate_draws.size() / std::max<size_t>(M, 1);
      r.candidate_tokens.assign(M > 0 ? with_child : n, std::vector<int32_t>(M));
      r.candidate_probs.assign(M > 0 ? with_child : n, std::vector<float>(M));
      for (size_t j = 0; j < p.candidate_draws.size(); ++j) {
        const int32_t draw = p.candidate_draws[j];
        if (error == kernels::kRowOk) error = sampler_.draw_error(draw);
        r.candidate_tokens[j / M][j % M] = sampler_.token(draw);
        r.candidate_probs[j / M][j % M] = sampler_.token_prob(draw);
      }
    }
    if (error != kernels::kRowOk) {
      // No half-filled rows: ReadRows and Truncate queries must not read them.
      ReleaseRows(s);
      r = VerifySequenceResult();
      r.seq = req.seq;
      r.status = RowError(req.seq, error);
    }
  }
  std::vector<LogprobPlan> logprob_plans;
  for (const size_t i : active) {
    if (batch[i].logprobs.mode == LogprobsMode::kOff || !results[i].status.ok()) continue;
    logprob_plans.push_back({&batch[i], &results[i], plan[i].first_row});
  }
  if (absl::Status lp = AddLogprobs(logprob_plans); !lp.ok()) {
    for (const LogprobPlan& l : logprob_plans) {
      ReleaseRows(seqs_[l.req->seq]);
      *l.result = VerifySequenceResult();
      l.result->seq = l.req->seq;
      l.result->status = lp;
    }
  }
  for (const size_t i : active) finish(i);
  for (const size_t i : chunked) {
    results[i].prefilling = true;
    results[i].forward_ns = forward_ns;
    finish(i);
  }
  return results;
}

}  // namespace specd
