#include "common/worker/worker_runtime.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/absl_string.h"
#include "base/math.h"
#include "base/philox.h"
#include "base/status_macros.h"
#include "common/worker/worker_runtime_internal.h"

namespace specd {
namespace worker_internal {

static_assert(kMaxLogprobs == kernels::kMaxTopLogprobs,
              "the worker protocol's top-N cap is the Logprobs op's");

absl::Status RowError(SeqId seq, int32_t code) {
  return absl::InvalidArgumentError(
      absl::StrCat("sequence ", seq, ": ", ToAbsl(kernels::RowErrorMessage(code))));
}

absl::Status CheckUnique(const SequenceRequest& req, absl::flat_hash_set<SeqId>* seen) {
  if (!seen->insert(req.seq).second) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", req.seq, " appears more than once in one call"));
  }
  if (req.companion.has_value() && !seen->insert(req.companion->seq).second) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq, ": companion ",
                                                   req.companion->seq,
                                                   " appears more than once in one call"));
  }
  return absl::OkStatus();
}

}  // namespace worker_internal

std::string_view ForwardKindName(ForwardKind kind) {
  switch (kind) {
    case ForwardKind::kCatchUp:
      return "catch_up";
    case ForwardKind::kDraftStep:
      return "draft_step";
    case ForwardKind::kVerify:
      return "verify";
  }
  return "unknown";
}

WorkerRuntime::WorkerRuntime(std::unique_ptr<LlamaEngine> engine,
                             const WorkerRuntimeOptions& options)
    : engine_(std::move(engine)),
      vocab_(engine_->config().vocab_size, engine_->output_vocab()),
      options_(options),
      pool_(engine_->backend(), engine_->logits_width()),
      sampler_(engine_->backend()),
      logprob_rows_(engine_->backend()) {}

absl::Status WorkerRuntime::CheckCatchUp(SeqId seq, const char* what,
                                         std::span<const int32_t> catch_up) const {
  const int64_t vocab = engine_->config().vocab_size;
  if (catch_up.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", seq, ": ", what, " must hold at least the last committed token"));
  }
  for (size_t i = 0; i < catch_up.size(); ++i) {
    if (catch_up[i] < 0 || catch_up[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, ": token id ", catch_up[i],
                                                     " at ", what, " index ", i, " is outside [0, ",
                                                     vocab, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status WorkerRuntime::CheckCompanion(const SequenceRequest& req) const {
  const auto it = seqs_.find(req.seq);
  if (it != seqs_.end() && it->second.owner.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq, " is the companion of ",
                                                   *it->second.owner, ", which feeds it"));
  }
  const std::optional<SeqId> named =
      req.companion.has_value() ? std::optional<SeqId>(req.companion->seq) : std::nullopt;
  if (it != seqs_.end() && it->second.companion != named) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence ", req.seq, " was created ",
        it->second.companion.has_value() ? absl::StrCat("with companion ", *it->second.companion)
                                         : std::string("without a companion"),
        ", and this request names ",
        named.has_value() ? absl::StrCat("companion ", *named) : std::string("none")));
  }
  if (!req.companion.has_value()) return absl::OkStatus();
  if (!req.compact.empty()) {
    // A guided sequence drafts and verifies chains only, so it never has a tree to compact.
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence ", req.seq, ": a guided sequence (with a companion) has no tree to compact"));
  }
  const CompanionRequest& c = *req.companion;
  if (c.seq == req.seq) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", req.seq, ": companion.seq_id must differ from the seq_id"));
  }
  if (const auto cit = seqs_.find(c.seq);
      cit != seqs_.end() && cit->second.owner != std::optional<SeqId>(req.seq)) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq, ": companion.seq_id ",
                                                   c.seq, " is another sequence of this worker"));
  }
  if (!std::isfinite(c.scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", req.seq, ": companion.scale must be finite, got ", c.scale));
  }
  if (c.expected_cached_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", req.seq, ": companion.expected_cached_len must be >= 0, got ",
                     c.expected_cached_len));
  }
  return CheckCatchUp(req.seq, "companion catch-up", c.catch_up);
}

int64_t WorkerRuntime::ChunkFeed(int64_t len, int64_t left, int64_t limit) const {
  int64_t feed = std::min(left - 1, limit);
  // A chunk of a block or more ends on a block boundary, so that the next chunk's blocks can
  // still be found in the cache (another sequence may be caching the same prompt meanwhile).
  const int64_t block = engine_->kv().block_size();
  const int64_t aligned = (len + feed) / block * block;
  if (feed == limit && limit >= block && aligned > len) feed = aligned - len;
  return feed;
}

absl::StatusOr<WorkerRuntime::Feed> WorkerRuntime::Admit(const SequenceRequest& req,
                                                         int64_t draft_tokens,
                                                         int64_t* reserved_blocks) {
  SPECD_RETURN_IF_ERROR(ValidateSamplingParams(req.sampling, engine_->config().vocab_size));
  if (absl::Status bias = ValidateLogitBias(req.logit_bias, engine_->config().vocab_size);
      !bias.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq, ": ", bias.message()));
  }
  if (req.prompt_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", req.seq, ": prompt_len must be >= 0, got ", req.prompt_len));
  }
  if (req.expected_cached_len < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence ", req.seq, ": expected_cached_len must be >= 0, got ", req.expected_cached_len));
  }
  if (req.max_prefill_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence ", req.seq, ": max_prefill_tokens must be >= 0, got ", req.max_prefill_tokens));
  }
  SPECD_RETURN_IF_ERROR(CheckCatchUp(req.seq, "catch-up", req.catch_up));
  SPECD_RETURN_IF_ERROR(CheckCompanion(req));
  const CompanionRequest* comp = req.companion.has_value() ? &*req.companion : nullptr;

  const auto it = seqs_.find(req.seq);
  const bool known = it != seqs_.end();
  if (!known && req.expected_cached_len != 0) {
    return absl::NotFoundError(
        absl::StrCat("unknown sequence ", req.seq, " (expected ", req.expected_cached_len,
                     " cached tokens; the worker may have restarted: replay from position 0)"));
  }
  if (!known && comp != nullptr && comp->expected_cached_len != 0) {
    // A new sequence's companion is new too; a known one's is known (they come and go together).
    return absl::NotFoundError(absl::StrCat("unknown companion ", comp->seq, " of sequence ",
                                            req.seq, " (expected ", comp->expected_cached_len,
                                            " cached tokens; replay the pair from position 0)"));
  }
  // What the sequence and its companion hold once the tail this call drops is gone: everything is
  // checked on that before anything changes, so that a refused request leaves them as they were.
  const bool compact = known && !req.compact.empty();
  const bool drop = known && !compact && req.drop_tail;
  int64_t held = known ? static_cast<int64_t>(it->second.tokens.size()) : 0;
  int64_t comp_held = known && comp != nullptr ? LengthOrZero(comp->seq) : 0;
  if (compact) {
    if (req.compact.tree_start + static_cast<int64_t>(req.compact.kept_nodes.size()) !=
        req.expected_cached_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", req.seq, ": keeping ", req.compact.kept_nodes.size(),
                       " tree nodes from slot ", req.compact.tree_start,
                       " does not leave the expected ", req.expected_cached_len, " cached tokens"));
    }
    SPECD_RETURN_IF_ERROR(
        engine_->kv().CheckCompaction(req.seq, req.compact.tree_start, req.compact.kept_nodes));
    held = req.expected_cached_len;
  } else if (drop) {
    // The pair drops its tails together: the companion was fed the same drafts.
    held = std::min(held, req.expected_cached_len);
    if (comp != nullptr) comp_held = std::min(comp_held, comp->expected_cached_len);
  }
  if (known && held != req.expected_cached_len) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", req.seq, ": coordinator expects ", req.expected_cached_len,
                     " cached tokens, worker holds ", held));
  }
  if (comp != nullptr && comp_held != comp->expected_cached_len) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sequence ", req.seq, ": coordinator expects its companion ", comp->seq, " to hold ",
        comp->expected_cached_len, " cached tokens, worker holds ", comp_held));
  }
  const int64_t grown_by_drafts = req.prefill_only ? 0 : draft_tokens;
  const int64_t max_len = engine_->max_seq_len();
  const int64_t reach =
      req.expected_cached_len + static_cast<int64_t>(req.catch_up.size()) + grown_by_drafts;
  if (reach > max_len) {
    return absl::OutOfRangeError(absl::StrCat("sequence ", req.seq, " would reach ", reach,
                                              " tokens, over max_seq_len ", max_len));
  }
  if (comp != nullptr) {
    const int64_t comp_reach =
        comp->expected_cached_len + static_cast<int64_t>(comp->catch_up.size()) + grown_by_drafts;
    if (comp_reach > max_len) {
      return absl::OutOfRangeError(absl::StrCat("sequence ", req.seq,
                                                ": its companion would reach ", comp_reach,
                                                " tokens, over max_seq_len ", max_len));
    }
  }
  if (compact) {
    // A guided sequence never holds a tree (CheckCompanion), so its companion has no tail here.
    SPECD_RETURN_IF_ERROR(
        CompactAndTruncate(req.seq, it->second, req.compact, req.expected_cached_len));
  } else if (drop) {
    bool dropped = false;
    if (static_cast<int64_t>(it->second.tokens.size()) > req.expected_cached_len) {
      SPECD_RETURN_IF_ERROR(engine_->Truncate(req.seq, req.expected_cached_len));
      it->second.tokens.resize(static_cast<size_t>(req.expected_cached_len));
      dropped = true;
    }
    if (comp != nullptr) {
      Sequence& c = seqs_[comp->seq];
      if (static_cast<int64_t>(c.tokens.size()) > comp->expected_cached_len) {
        SPECD_RETURN_IF_ERROR(engine_->Truncate(comp->seq, comp->expected_cached_len));
        c.tokens.resize(static_cast<size_t>(comp->expected_cached_len));
        dropped = true;
      }
    }
    if (dropped) ReportKv();
  }
  const bool created = it == seqs_.end();
  if (created) {
    SPECD_RETURN_IF_ERROR(engine_->AddSequence(req.seq));
    if (comp != nullptr) {
      if (absl::Status st = engine_->AddSequence(comp->seq); !st.ok()) {
        (void)engine_->Release(req.seq);
        return st;
      }
      seqs_[comp->seq].owner = req.seq;
    }
    seqs_[req.seq].companion = comp != nullptr ? std::optional<SeqId>(comp->seq) : std::nullopt;
  }
  Sequence& s = seqs_[req.seq];
  Sequence* c = comp != nullptr ? &seqs_[comp->seq] : nullptr;
  const auto undo = [&] {
    if (created) {
      (void)engine_->Release(req.seq);
      seqs_.erase(req.seq);
      if (comp != nullptr) {
        (void)engine_->Release(comp->seq);
        seqs_.erase(comp->seq);
      }
    } else {
      (void)engine_->Truncate(req.seq, req.expected_cached_len);
      s.tokens.resize(static_cast<size_t>(req.expected_cached_len));
      if (comp != nullptr) {
        (void)engine_->Truncate(comp->seq, comp->expected_cached_len);
        c->tokens.resize(static_cast<size_t>(comp->expected_cached_len));
      }
    }
    ReportKv();
  };

  // The longest cached prefix, never the last token: it is fed, so that there are logits.
  Feed f;
  absl::StatusOr<int64_t> attached =
      engine_->AttachCached(req.seq, req.catch_up, static_cast<int64_t>(req.catch_up.size()) - 1);
  if (attached.ok() && comp != nullptr) {
    absl::StatusOr<int64_t> comp_attached = engine_->AttachCached(
        comp->seq, comp->catch_up, static_cast<int64_t>(comp->catch_up.size()) - 1);
    if (comp_attached.ok()) {
      f.companion_cached = *comp_attached;
      c->tokens.insert(c->tokens.end(), comp->catch_up.begin(),
                       comp->catch_up.begin() + f.companion_cached);
    } else {
      attached = comp_attached.status();
    }
  }
  if (!attached.ok()) {
    undo();
    return attached.status();
  }
  f.cached = *attached;
  s.tokens.insert(s.tokens.end(), req.catch_up.begin(), req.catch_up.begin() + f.cached);
  const int64_t left = static_cast<int64_t>(req.catch_up.size()) - f.cached;
  const int64_t comp_left =
      comp != nullptr ? static_cast<int64_t>(comp->catch_up.size()) - f.companion_cached : 0;
  const int64_t limit =
      req.max_prefill_tokens > 0 ? req.max_prefill_tokens : std::numeric_limits<int64_t>::max();
  // A pair drafts or verifies only once both halves have their whole catch-up; until then each
  // feeds its own chunk, never its last token.
  f.complete = !req.prefill_only && left <= limit && comp_left <= limit;
  if (f.complete) {
    f.feed = left;
    f.companion_feed = comp_left;
  } else {
    f.feed = ChunkFeed(static_cast<int64_t>(s.tokens.size()), left, limit);
    if (comp != nullptr) {
      f.companion_feed = ChunkFeed(static_cast<int64_t>(c->tokens.size()), comp_left, limit);
    }
  }
  const int64_t drafts = f.complete ? draft_tokens : 0;
  int64_t need = *engine_->kv().BlocksNeeded(req.seq, f.feed + drafts);
  if (comp != nullptr) need += *engine_->kv().BlocksNeeded(comp->seq, f.companion_feed + drafts);
  const int64_t available = engine_->kv().free_blocks() - *reserved_blocks;
  if (need > available) {
    const int64_t tokens = static_cast<int64_t>(s.tokens.size()) + f.feed + drafts;
    undo();
    return absl::ResourceExhaustedError(absl::StrCat(
        "sequence ", req.seq, " needs ", need, " more KV blocks for ", tokens, " tokens",
        comp != nullptr ? " (with its companion)" : "", " but only ", available, " are free"));
  }
  *reserved_blocks += need;
  s.prompt_len = req.prompt_len;
  ReleaseRows(s);  // rows live until the sequence's next Draft or Verify
  if (engine_->kv().prefix_caching() && options_.observer != nullptr) {
    const int64_t last = f.complete ? 1 : 0;
    options_.observer->OnPrefixCache(f.cached + f.feed - last, f.cached);
    if (comp != nullptr) {
      options_.observer->OnPrefixCache(f.companion_cached + f.companion_feed - last,
                                       f.companion_cached);
    }
  }
  if (f.cached + f.companion_cached > 0) ReportKv();
  return f;
}

absl::Status WorkerRuntime::FeedOnly(std::span<const SequenceInput> batch) {
  const absl::Time start = absl::Now();
  SPECD_RETURN_IF_ERROR(engine_->Forward(batch).status());
  // Timed to the end of the work, not of its enqueueing.
  SPECD_RETURN_IF_ERROR(engine_->Synchronize());
  ReportForward(ForwardKind::kCatchUp, batch, absl::Now() - start);
  return absl::OkStatus();
}

void WorkerRuntime::CacheCommitted(SeqId seq, int64_t committed) {
  // Only fails for an unknown sequence, and the caller just fed it.
  (void)engine_->CacheCommitted(seq, committed);
}

void WorkerRuntime::ReportForward(ForwardKind kind, std::span<const SequenceInput> batch,
                                  absl::Duration elapsed) {
  if (options_.observer == nullptr) return;
  int64_t tokens = 0;
  for (const SequenceInput& in : batch) tokens += static_cast<int64_t>(in.tokens.size());
  options_.observer->OnForward(kind, static_cast<int64_t>(batch.size()), tokens, elapsed);
  ReportKv();
}

absl::Status WorkerRuntime::ForwardAndSample(ForwardKind kind, std::span<const SequenceInput> batch,
                                             const std::function<absl::Status()>& add_work,
                                             int64_t* forward_ns) {
  const absl::Time start = absl::Now();
  SPECD_ASSIGN_OR_RETURN(const Logits logits, engine_->Forward(batch));
  sampler_.Clear();
  SPECD_RETURN_IF_ERROR(add_work());
  SPECD_RETURN_IF_ERROR(sampler_.Run(logits.data, logits.rows, pool_));
  const absl::Duration elapsed = absl::Now() - start;
  if (forward_ns != nullptr) *forward_ns = absl::ToInt64Nanoseconds(elapsed);
  ReportForward(kind, batch, elapsed);
  return absl::OkStatus();
}

int32_t WorkerRuntime::AddRow(const Sequence& s, std::span<const int32_t> history,
                              const SequenceRequest& req, kernels::RowMode mode, int32_t slot) {
  // This round's earlier drafts count as output for the penalties.
  const size_t prompt = std::min(history.size(), static_cast<size_t>(s.prompt_len));
  if (vocab_.full()) {
    return sampler_.AddRow(req.sampling, mode, history.subspan(0, prompt), history.subspan(prompt),
                           slot, req.logit_bias);
  }
  // A penalty or a bias on a token outside the reduced head changes nothing: its probability is
  // 0. The head's ids ascend, so the biases stay in order.
  const std::vector<int32_t> p = vocab_.ToIndices(history.subspan(0, prompt));
  const std::vector<int32_t> o = vocab_.ToIndices(history.subspan(prompt));
  std::vector<TokenBias> bias;
  for (const TokenBias& b : req.logit_bias) {
    if (const int32_t i = vocab_.ToIndex(b.token); i >= 0) bias.push_back({i, b.bias});
  }
  return sampler_.AddRow(req.sampling, mode, p, o, slot, bias);
}

int32_t WorkerRuntime::AddKeptRow(Sequence& s, size_t len, const SequenceRequest& req,
                                  kernels::RowMode mode, int32_t slot) {
  s.rows.push_back(slot);
  return AddRow(s, std::span<const int32_t>(s.tokens.data(), len), req, mode, slot);
}

absl::Status WorkerRuntime::CompactAndTruncate(SeqId seq, Sequence& s, const KvCompaction& compact,
                                               int64_t keep) {
  SPECD_RETURN_IF_ERROR(engine_->CompactKv(seq, compact.tree_start, compact.kept_nodes));
  for (size_t i = 0; i < compact.kept_nodes.size(); ++i) {
    s.tokens[static_cast<size_t>(compact.tree_start) + i] =
        s.tokens[static_cast<size_t>(compact.tree_start + compact.kept_nodes[i])];
  }
  SPECD_RETURN_IF_ERROR(engine_->Truncate(seq, keep));
  s.tokens.resize(static_cast<size_t>(std::min<int64_t>(keep, s.tokens.size())));
  ReportKv();
  return absl::OkStatus();
}

void WorkerRuntime::RollBack(std::span<const SequenceInput> inputs) {
  for (const SequenceInput& in : inputs) {
    Sequence& s = seqs_[in.seq];
    (void)engine_->Truncate(in.seq, in.start_pos);
    s.tokens.resize(static_cast<size_t>(std::min<int64_t>(in.start_pos, s.tokens.size())));
    ReleaseRows(s);
  }
  ReportKv();
}

void WorkerRuntime::ReleaseRows(Sequence& s) {
  pool_.Release(s.rows);
  s.rows.clear();
  pool_.Release(s.logit_rows);
  s.logit_rows.clear();
  s.logprobs_mode = LogprobsMode::kOff;
}

void WorkerRuntime::ReportKv() {
  if (options_.observer == nullptr) return;
  options_.observer->OnKvChanged(engine_->kv());
  // Blocks that companions hold, each counted once (prefix-cached ones may be shared).
  absl::flat_hash_set<int32_t> blocks;
  for (const auto& [id, s] : seqs_) {
    if (!s.owner.has_value()) continue;
    const absl::StatusOr<const std::vector<int32_t>*> table = engine_->kv().BlockTable(id);
    if (table.ok()) blocks.insert((*table)->begin(), (*table)->end());
  }
  options_.observer->OnCompanionKv(static_cast<int64_t>(blocks.size()));
}

int64_t WorkerRuntime::CompanionLengthOrZero(const SequenceRequest& req) const {
  return req.companion.has_value() ? LengthOrZero(req.companion->seq) : 0;
}

void WorkerRuntime::AddChunkInputs(const SequenceRequest& req, const Feed& f,
                                   std::vector<SequenceInput>* inputs) const {
  const auto add = [&](SeqId seq, std::span<const int32_t> catch_up, int64_t cached, int64_t feed) {
    if (feed == 0) return;
    SequenceInput in;
    in.seq = seq;
    in.start_pos = LengthOrZero(seq);
    in.tokens = catch_up.subspan(static_cast<size_t>(cached), static_cast<size_t>(feed));
    inputs->push_back(in);
  };
  add(req.seq, req.catch_up, f.cached, f.feed);
  if (req.companion.has_value()) {
    add(req.companion->seq, req.companion->catch_up, f.companion_cached, f.companion_feed);
  }
}

void WorkerRuntime::ChunksFed(std::span<const SequenceInput> chunks) {
  for (const SequenceInput& in : chunks) {
    Sequence& s = seqs_[in.seq];
    s.tokens.insert(s.tokens.end(), in.tokens.begin(), in.tokens.end());
    CacheCommitted(in.seq, static_cast<int64_t>(s.tokens.size()));
  }
}

void WorkerRuntime::CacheCommittedPair(const SequenceRequest& req, int64_t drafts) {
  CacheCommitted(req.seq, LengthOrZero(req.seq) - drafts);
  if (req.companion.has_value()) {
    CacheCommitted(req.companion->seq, LengthOrZero(req.companion->seq) - drafts);
  }
}

SequenceInput WorkerRuntime::VerifyInput(SeqId seq, std::span<const int32_t> feed,
                                         size_t drafts) const {
  SequenceInput in;
  in.seq = seq;
  in.tokens = feed;
  in.start_pos = LengthOrZero(seq);
  const int32_t n = static_cast<int32_t>(feed.size());
  for (int32_t j = n - static_cast<int32_t>(drafts) - 1; j < n; ++j) in.logit_indices.push_back(j);
  return in;
}

int64_t WorkerRuntime::LengthOrZero(SeqId seq) const {
  const auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : static_cast<int64_t>(it->second.tokens.size());
}

absl::Status WorkerRuntime::AddLogprobs(std::span<const LogprobPlan> plans) {
  if (plans.empty()) return absl::OkStatus();
  const int64_t vocab = engine_->config().vocab_size;
  logprob_rows_.Clear();
  // Per plan, the index of its first LogprobRows row; queries are added in the same order.
  std::vector<std::vector<std::vector<int32_t>>> queried(plans.size());
  std::vector<int32_t> first_lp_row(plans.size());
  for (size_t p = 0; p < plans.size(); ++p) {
    const VerifySequenceRequest& req = *plans[p].req;
    const VerifySequenceResult& r = *plans[p].result;
    Sequence& s = seqs_[req.seq];
    const size_t n = req.drafts.size();
    const bool processed = req.logprobs.mode == LogprobsMode::kProcessed;
    s.logprobs_mode = req.logprobs.mode;
    // Row j's drafts: a chain's t_{j+1}, a tree node's children. The rows with any are 0..R-1
    // (a tree's leaves are its last nodes); the rest are leaves, whose bonus is drawn there.
    std::vector<std::vector<int32_t>> children(n + 1);
    for (size_t i = 0; i < n; ++i) {
      const size_t parent_row =
          req.tree_parents.empty() ? i : static_cast<size_t>(req.tree_parents[i] + 1);
      children[parent_row].push_back(req.drafts[i]);
    }
    size_t with_child = 0;
    while (with_child <= n && !children[with_child].empty()) ++with_child;
    // The residual fallback emits a token that is none of those below; it asks QueryLogprobs
    // later, which for raw logprobs needs the penalised rows that have drafts.
    if (!processed && !req.sampling.greedy() && with_child > 0) {
      SPECD_ASSIGN_OR_RETURN(s.logit_rows, pool_.Acquire(static_cast<int64_t>(with_child)));
      for (size_t j = 0; j < with_child; ++j) {
        SPECD_RETURN_IF_ERROR(engine_->backend().CopyDeviceToDevice(
            pool_.rows() + int64_t{s.logit_rows[j]} * vocab,
            sampler_.penalized(plans[p].first_row + static_cast<int32_t>(j)), vocab * 4));
      }
    }
    queried[p].resize(n + 1);
    for (size_t j = 0; j <= n; ++j) {
      const int32_t row = logprob_rows_.AddRow(
          {sampler_.penalized(plans[p].first_row + static_cast<int32_t>(j)), -1},
          req.logprobs.top_n, processed ? s.rows[j] : -1);
      if (j == 0) first_lp_row[p] = row;
      // Every token the coordinator may emit from this row.
      std::vector<int32_t>& tokens = queried[p][j];
      auto add = [&tokens](int32_t t) {
        if (std::find(tokens.begin(), tokens.end(), t) == tokens.end()) tokens.push_back(t);
      };
      for (const int32_t t : children[j]) add(t);
      add(r.argmax[j]);
      if (j < r.candidate_tokens.size()) {
        for (const int32_t y : r.candidate_tokens[j]) add(y);
      }
      if (j >= with_child) {
        const size_t leaf = j - with_child;
        add(req.tree_parents.empty()     ? r.bonus_token
            : leaf < r.leaf_bonus.size() ? r.leaf_bonus[leaf]
                                         : r.argmax[j]);
      }
      for (const int32_t t : tokens) logprob_rows_.AddQuery(row, t);
    }
  }
  SPECD_RETURN_IF_ERROR(logprob_rows_.Run(pool_));
  int32_t query = 0;
  for (size_t p = 0; p < plans.size(); ++p) {
    VerifySequenceResult& r = *plans[p].result;
    r.logprobs.resize(queried[p].size());
    for (size_t j = 0; j < queried[p].size(); ++j) {
      PositionLogprobs& out = r.logprobs[j];
      const int32_t row = first_lp_row[p] + static_cast<int32_t>(j);
      const std::span<const int32_t> ids = logprob_rows_.top_ids(row);
      const std::span<const float> lps = logprob_rows_.top_logprobs(row);
      out.top_ids.assign(ids.begin(), ids.end());
      out.top_logprobs.assign(lps.begin(), lps.end());
      out.token_ids = queried[p][j];
      for (size_t t = 0; t < out.token_ids.size(); ++t) {
        out.token_logprobs.push_back(logprob_rows_.query(query++));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> WorkerRuntime::QueryLogprobs(SeqId seq, int32_t step,
                                                                std::span<const int32_t> tokens) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  const Sequence& s = it->second;
  const bool processed = s.logprobs_mode == LogprobsMode::kProcessed;
  const std::vector<int32_t>& kept = processed ? s.rows : s.logit_rows;
  if (s.logprobs_mode == LogprobsMode::kOff || step < 1 ||
      step > static_cast<int32_t>(kept.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq, ": no kept logprobs for step ", step,
                     " (the last Verify must have asked for logprobs and kept its rows; ",
                     kept.size(), " kept)"));
  }
  const int64_t vocab = engine_->config().vocab_size;
  for (const int32_t t : tokens) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", seq, ": query token ", t, " is outside [0, ", vocab, ")"));
    }
  }
  const int32_t slot = kept[static_cast<size_t>(step - 1)];
  logprob_rows_.Clear();
  // A processed row's values come from the row itself (the pool slot is also read as logits by
  // the op, whose raw values are then replaced).
  const int32_t row = logprob_rows_.AddRow({nullptr, slot}, 0, processed ? slot : -1);
  for (const int32_t t : tokens) logprob_rows_.AddQuery(row, t);
  SPECD_RETURN_IF_ERROR(logprob_rows_.Run(pool_));
  std::vector<float> out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    out.push_back(logprob_rows_.query(static_cast<int32_t>(i)));
  }
  return out;
}

absl::StatusOr<TruncateResult> WorkerRuntime::Truncate(const TruncateSequenceRequest& req) {
  const SeqId seq = req.seq;
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  }
  Sequence& s = it->second;
  if (s.owner.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, " is the companion of ",
                                                   *s.owner, "; truncate that sequence with ",
                                                   "companion_new_len instead"));
  }
  if (req.new_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", seq, ": new_len must be >= 0, got ", req.new_len));
  }
  if (s.companion.has_value() != req.companion_new_len.has_value()) {
    return absl::InvalidArgumentError(
        s.companion.has_value()
            ? absl::StrCat("sequence ", seq, " is guided (companion ", *s.companion,
                           "): companion_new_len is required, the pair is truncated together")
            : absl::StrCat("sequence ", seq, " has no companion; companion_new_len must be unset"));
  }
  if (req.companion_new_len.has_value() && *req.companion_new_len < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence ", seq, ": companion_new_len must be >= 0, got ", *req.companion_new_len));
  }
  TruncateResult result;
  if (req.query_step != 0 || !req.query_tokens.empty()) {
    if (req.query_step < 1 || req.query_step > static_cast<int32_t>(s.rows.size())) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence ", seq, ": no kept row for query_step ", req.query_step, " (",
                       s.rows.size(), " rows are kept from the last Draft/Verify)"));
    }
    const int32_t slot = s.rows[static_cast<size_t>(req.query_step - 1)];
    const int64_t vocab = engine_->config().vocab_size;
    sampler_.Clear();
    std::vector<int32_t> lookup_of;  // -1: outside a reduced head, probability 0
    for (const int32_t y : req.query_tokens) {
      if (y < 0 || y >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", seq, ": query token ", y, " is outside [0, ", vocab, ")"));
      }
      const int32_t index = vocab_.ToIndex(y);
      lookup_of.push_back(index < 0 ? -1 : sampler_.AddLookup(slot, index));
    }
    SPECD_RETURN_IF_ERROR(sampler_.Run(nullptr, 0, pool_));
    for (const int32_t lookup : lookup_of) {
      result.q_probs.push_back(lookup < 0 ? 0.0f : sampler_.lookup(lookup));
    }
  }
  // Both halves or neither: the only failure past the checks above is an unknown sequence.
  SPECD_RETURN_IF_ERROR(engine_->Truncate(seq, req.new_len));
  if (req.new_len < static_cast<int64_t>(s.tokens.size())) {
    s.tokens.resize(static_cast<size_t>(req.new_len));
  }
  if (s.companion.has_value()) {
    Sequence& c = seqs_[*s.companion];
    SPECD_RETURN_IF_ERROR(engine_->Truncate(*s.companion, *req.companion_new_len));
    if (*req.companion_new_len < static_cast<int64_t>(c.tokens.size())) {
      c.tokens.resize(static_cast<size_t>(*req.companion_new_len));
    }
    result.companion_cached_len = static_cast<int64_t>(c.tokens.size());
  }
  ReportKv();
  result.cached_len = static_cast<int64_t>(s.tokens.size());
  return result;
}

KvFree WorkerRuntime::kv_free() const {
  const KvPool& kv = engine_->kv();
  return KvFree{kv.free_blocks(), kv.free_blocks() * kv.block_size()};
}

absl::StatusOr<ProbRow> WorkerRuntime::ReadRow(SeqId seq, int32_t step) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  const Sequence& s = it->second;
  if (step < 1 || step > static_cast<int32_t>(s.rows.size())) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, ": no kept row for step ",
                                                      step, " (", s.rows.size(), " kept)"));
  }
  SPECD_ASSIGN_OR_RETURN(const std::vector<float> row,
                         pool_.ReadRow(s.rows[static_cast<size_t>(step - 1)]));
  if (vocab_.full()) return CompactRow(row);
  // A reduced head's row, by its support in token ids (which ascend with the row's indices).
  ProbRow out = ExtractSupport(row);
  for (int32_t& id : out.ids) id = vocab_.ToId(id);
  return out;
}

absl::Status WorkerRuntime::WarmUp(bool draft) {
  constexpr int32_t kDrafts = 4;
  constexpr int64_t kPrompt = 8;
  // An id no coordinator hands out before the worker serves, and not a companion's.
  constexpr SeqId kWarmUpSeq = (SeqId{1} << 62) + 1;
  const int64_t room =
      std::min(engine_->max_seq_len(), engine_->kv().total_blocks() * engine_->kv().block_size());
  const int64_t prompt = std::min(kPrompt, room - kDrafts - 1);
  if (prompt < 1) return absl::OkStatus();  // a pool too small to warm up in serves as it is
  const int64_t vocab = engine_->config().vocab_size;
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < prompt; ++i)
    tokens.push_back(static_cast<int32_t>((i * 7919 + 1) % vocab));
  SamplingParams sampling;
  sampling.temperature = 1.0f;
  RuntimeObserver* const observer = options_.observer;
  options_.observer = nullptr;
  absl::Status status;
  if (draft) {
    DraftSequenceRequest r;
    r.seq = kWarmUpSeq;
    r.catch_up = tokens;
    r.num_speculative_tokens = kDrafts;
    r.sampling = sampling;
    r.prompt_len = prompt;
    const std::vector<SequenceOutcome> out = Draft({&r, 1});
    status = out.empty() ? absl::InternalError("no outcome") : out[0].status;
  } else {
    VerifySequenceRequest r;
    r.seq = kWarmUpSeq;
    r.catch_up = tokens;
    r.drafts.assign(kDrafts, tokens.back());
    r.num_candidates = kDrafts;
    r.sampling = sampling;
    r.prompt_len = prompt;
    const std::vector<VerifySequenceResult> out = Verify({&r, 1});
    status = out.empty() ? absl::InternalError("no result") : out[0].status;
  }
  if (seqs_.contains(kWarmUpSeq)) status.Update(Release(kWarmUpSeq));
  options_.observer = observer;
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("the warm-up ", draft ? "Draft" : "Verify",
                                                    " call failed: ", status.message()));
  }
  return absl::OkStatus();
}

absl::Status WorkerRuntime::Release(SeqId seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  if (it->second.owner.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, " is the companion of ",
                                                   *it->second.owner,
                                                   "; releasing that sequence releases both"));
  }
  const std::optional<SeqId> companion = it->second.companion;
  SPECD_RETURN_IF_ERROR(engine_->Release(seq));
  ReleaseRows(it->second);
  seqs_.erase(it);
  if (companion.has_value()) {
    (void)engine_->Release(*companion);  // created and released with its sequence: known
    seqs_.erase(*companion);
  }
  ReportKv();
  return absl::OkStatus();
}

int64_t WorkerRuntime::ReleaseAll() {
  std::vector<SeqId> owners;
  for (const auto& [seq, s] : seqs_) {
    if (!s.owner.has_value()) owners.push_back(seq);
  }
  for (const SeqId seq : owners) (void)Release(seq);  // each one known and no companion
  return static_cast<int64_t>(owners.size());
}

absl::StatusOr<int64_t> WorkerRuntime::CachedLength(SeqId seq) const {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  return static_cast<int64_t>(it->second.tokens.size());
}

}  // namespace specd
