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

namespace specd {
namespace {

static_assert(kMaxLogprobs == kernels::kMaxTopLogprobs,
              "the worker protocol's top-N cap is the Logprobs op's");

absl::Status RowError(SeqId seq, int32_t code) {
  return absl::InvalidArgumentError(
      absl::StrCat("sequence ", seq, ": ", ToAbsl(kernels::RowErrorMessage(code))));
}

// INVALID_ARGUMENT for the second and later requests naming an id already seen in the call (as
// a sequence or a companion), so one sequence is never fed twice in one forward pass.
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

}  // namespace

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
      options_(options),
      pool_(engine_->backend(), engine_->config().vocab_size),
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
  if (it != seqs_.end() && req.drop_tail) {
    // The pair drops its tails together: the companion was fed the same drafts.
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
  if (it == seqs_.end() && req.expected_cached_len != 0) {
    return absl::NotFoundError(
        absl::StrCat("unknown sequence ", req.seq, " (expected ", req.expected_cached_len,
                     " cached tokens; the worker may have restarted: replay from position 0)"));
  }
  if (it != seqs_.end() &&
      static_cast<int64_t>(it->second.tokens.size()) != req.expected_cached_len) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", req.seq, ": coordinator expects ", req.expected_cached_len,
                     " cached tokens, worker holds ", it->second.tokens.size()));
  }
  if (comp != nullptr) {
    // A new sequence's companion is new too; a known one's is known (they come and go together).
    const int64_t held = it == seqs_.end() ? 0 : LengthOrZero(comp->seq);
    if (it == seqs_.end() && comp->expected_cached_len != 0) {
      return absl::NotFoundError(absl::StrCat("unknown companion ", comp->seq, " of sequence ",
                                              req.seq, " (expected ", comp->expected_cached_len,
                                              " cached tokens; replay the pair from position 0)"));
    }
    if (held != comp->expected_cached_len) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence ", req.seq, ": coordinator expects its companion ", comp->seq, " to hold ",
          comp->expected_cached_len, " cached tokens, worker holds ", held));
    }
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

void WorkerRuntime::AddKeptRow(Sequence& s, size_t len, const SamplingParams& params,
                               kernels::RowMode mode, int32_t slot) {
  // This round's earlier drafts count as output for the penalties.
  const size_t prompt = std::min(len, static_cast<size_t>(s.prompt_len));
  const std::span<const int32_t> all(s.tokens.data(), len);
  sampler_.AddRow(params, mode, all.subspan(0, prompt), all.subspan(prompt), slot);
  s.rows.push_back(slot);
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
    if (st.ok() &&
        (req.num_speculative_tokens < 1 || req.num_speculative_tokens > kMaxSpeculativeTokens)) {
      st = absl::InvalidArgumentError(
          absl::StrCat("sequence ", req.seq, ": num_speculative_tokens must be in [1, ",
                       kMaxSpeculativeTokens, "], got ", req.num_speculative_tokens));
    }
    if (st.ok()) {
      // The last draft token is sampled but never fed, hence K - 1.
      absl::StatusOr<Feed> f = Admit(req, req.num_speculative_tokens - 1, &reserved);
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

  std::vector<int32_t> last(batch.size(), 0);  // t_{k-1} per request
  std::vector<DraftToken> step_tokens;
  int32_t k = 0;
  while (!active.empty()) {
    ++k;
    step_tokens.clear();
    // Every active sequence has K >= k: finished ones leave `active` after their last step.
    std::vector<SequenceInput> inputs;
    for (const size_t i : active) {
      const Sequence& s = seqs_[batch[i].seq];
      SequenceInput in;
      in.seq = batch[i].seq;
      in.start_pos = static_cast<int64_t>(s.tokens.size());
      if (k == 1) {
        in.tokens = std::span<const int32_t>(batch[i].catch_up)
                        .subspan(static_cast<size_t>(plan[i].cached));
      } else {
        in.tokens = std::span<const int32_t>(&last[i], 1);
      }
      in.logit_indices = {static_cast<int32_t>(in.tokens.size() - 1)};
      inputs.push_back(in);
    }
    const size_t drafting = inputs.size();  // inputs[b] is active[b]'s; logit row b is its row
    if (k == 1) inputs.insert(inputs.end(), chunk_inputs.begin(), chunk_inputs.end());
    // The companions of guided sequences, fed the same tokens in the same pass; their logit rows
    // come after every drafting row (chunks have none).
    std::vector<int32_t> companion_input(drafting, -1);
    for (size_t b = 0; b < drafting; ++b) {
      const DraftSequenceRequest& req = batch[active[b]];
      if (!req.companion.has_value()) continue;
      SequenceInput in;
      in.seq = req.companion->seq;
      in.start_pos = LengthOrZero(in.seq);
      if (k == 1) {
        in.tokens = std::span<const int32_t>(req.companion->catch_up)
                        .subspan(static_cast<size_t>(plan[active[b]].companion_cached));
      } else {
        in.tokens = std::span<const int32_t>(&last[active[b]], 1);
      }
      in.logit_indices = {static_cast<int32_t>(in.tokens.size() - 1)};
      companion_input[b] = static_cast<int32_t>(inputs.size());
      inputs.push_back(in);
    }
    // Each active sequence keeps this step's row; tokens are appended before the rows are
    // added, so t_k's history is x and t_1..t_{k-1}.
    std::vector<int32_t> draw_of(drafting, -1);
    const absl::Status pass = ForwardAndSample(
        ForwardKind::kDraftStep, inputs,
        [&]() -> absl::Status {
          SPECD_ASSIGN_OR_RETURN(const std::vector<int32_t> slots,
                                 pool_.Acquire(static_cast<int64_t>(drafting)));
          int32_t companion_row = static_cast<int32_t>(drafting);
          for (size_t b = 0; b < drafting; ++b) {
            const DraftSequenceRequest& req = batch[active[b]];
            Sequence& s = seqs_[req.seq];
            s.tokens.insert(s.tokens.end(), inputs[b].tokens.begin(), inputs[b].tokens.end());
            if (companion_input[b] >= 0) {
              const SequenceInput& in = inputs[static_cast<size_t>(companion_input[b])];
              std::vector<int32_t>& u = seqs_[in.seq].tokens;
              u.insert(u.end(), in.tokens.begin(), in.tokens.end());
              sampler_.AddGuidance(static_cast<int32_t>(b), companion_row++, req.companion->scale);
            }
            // A greedy request's q is its argmax; a greedy draft of a sampled request takes the
            // processed row's argmax. A point mass is exact as long as the same row samples t,
            // reports q(t) and answers q(y) (DESIGN.md, "The processed distribution").
            const kernels::RowMode mode = req.sampling.greedy() ? kernels::RowMode::kGreedy
                                          : req.draft_sampling == DraftSampling::kGreedy
                                              ? kernels::RowMode::kArgmaxOfProcessed
                                              : kernels::RowMode::kSample;
            AddKeptRow(s, s.tokens.size(), req.sampling, mode, slots[b]);
            if (mode != kernels::RowMode::kSample) continue;
            // t_k sits at position len(x) + k - 1, which is what the cache now holds.
            kernels::Draw d;
            d.prob_slot = slots[b];
            d.seed = req.seed;
            d.position = static_cast<uint32_t>(s.tokens.size());
            d.purpose = Purpose::kDraftSample;
            d.sample = req.sample;
            draw_of[b] = sampler_.AddDraw(d);
          }
          return absl::OkStatus();
        },
        &forward_ns);
    if (!pass.ok()) {
      RollBack(inputs);
      fail_active(pass);
      if (k == 1) fail_chunked(pass);
      break;
    }
    if (k == 1) {
      // x (and u) are all in the cache now; the drafts that follow are not committed.
      for (const size_t i : active) CacheCommittedPair(batch[i], 0);
      ChunksFed(chunk_inputs);
    }
    for (size_t b = 0; b < drafting; ++b) {
      const size_t i = active[b];
      const DraftSequenceRequest& req = batch[i];
      Sequence& s = seqs_[req.seq];
      const int32_t row = static_cast<int32_t>(b);
      const int32_t draw = draw_of[b];
      const int32_t error = sampler_.row_error(row) != kernels::kRowOk
                                ? sampler_.row_error(row)
                                : (draw >= 0 ? sampler_.draw_error(draw) : kernels::kRowOk);
      if (error != kernels::kRowOk) {
        ReleaseRows(s);  // no half-filled rows for Truncate queries or ReadRows
        fail(i, RowError(req.seq, error));
        continue;
      }
      const int32_t token = draw >= 0 ? sampler_.token(draw) : sampler_.argmax(row);
      last[i] = token;
      step_tokens.push_back({req.seq, token, draw >= 0 ? sampler_.token_prob(draw) : 1.0f});
    }
    active.erase(std::remove_if(active.begin(), active.end(),
                                [&](size_t i) {
                                  return !outcomes[i].status.ok() ||
                                         batch[i].num_speculative_tokens == k;
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
    if (st.ok() && (req.num_candidates < 0 || req.num_candidates > kMaxCandidates)) {
      st = absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq,
                                                   ": num_candidates must be in [0, ",
                                                   kMaxCandidates, "], got ", req.num_candidates));
    }
    if (st.ok() && (req.logprobs.top_n < 0 || req.logprobs.top_n > kMaxLogprobs)) {
      st = absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq,
                                                   ": logprobs top_n must be in [0, ", kMaxLogprobs,
                                                   "], got ", req.logprobs.top_n));
    }
    if (st.ok() && req.drafts.size() > static_cast<size_t>(kMaxSpeculativeTokens)) {
      st = absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq, ": ", req.drafts.size(),
                                                   " draft tokens, at most ", kMaxSpeculativeTokens,
                                                   " allowed"));
    }
    for (size_t k = 0; st.ok() && k < req.drafts.size(); ++k) {
      if (req.drafts[k] < 0 || req.drafts[k] >= vocab) {
        st = absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq, ": draft token ",
                                                     req.drafts[k], " at step ", k + 1,
                                                     " is outside [0, ", vocab, ")"));
      }
    }
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

  // One pass: each verifying sequence feeds the rest of its catch-up and its drafts, with logits
  // at the last K+1 positions; then the prefill chunks, without logits; then the companions of
  // guided sequences, fed their own catch-up and the same drafts, whose logit rows thus come
  // after every row that is processed.
  std::vector<std::vector<int32_t>> feeds(batch.size());
  std::vector<std::vector<int32_t>> companion_feeds(batch.size());
  std::vector<SequenceInput> inputs;
  for (const size_t i : active) {
    const VerifySequenceRequest& req = batch[i];
    feeds[i].assign(req.catch_up.begin() + feed_plan[i].cached, req.catch_up.end());
    feeds[i].insert(feeds[i].end(), req.drafts.begin(), req.drafts.end());
    inputs.push_back(VerifyInput(req.seq, feeds[i], req.drafts.size()));
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
    int32_t bonus_draw = -1;
    int32_t first_candidate = -1;
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
            Sequence& s = seqs_[req.seq];
            s.tokens.insert(s.tokens.end(), feeds[i].begin(), feeds[i].end());
            const size_t K = req.drafts.size();
            const size_t x_len = s.tokens.size() - K;  // len(x): committed tokens
            const kernels::RowMode mode =
                req.sampling.greedy() ? kernels::RowMode::kGreedy : kernels::RowMode::kSample;
            Planned& p = plan[i];
            p.first_row = static_cast<int32_t>(next_slot);
            if (req.companion.has_value()) {
              std::vector<int32_t>& u = seqs_[req.companion->seq].tokens;
              u.insert(u.end(), companion_feeds[i].begin(), companion_feeds[i].end());
              for (size_t j = 0; j <= K; ++j) {
                sampler_.AddGuidance(p.first_row + static_cast<int32_t>(j), companion_row++,
                                     req.companion->scale);
              }
            }
            for (size_t j = 0; j <= K; ++j) {
              // p_{j+1} conditions on x and t_1..t_j, which count as output for the penalties.
              AddKeptRow(s, x_len + j, req.sampling, mode, slots[next_slot++]);
            }
            for (size_t j = 0; j < K; ++j) {
              const int32_t lookup = sampler_.AddLookup(s.rows[j], req.drafts[j]);
              if (j == 0) p.first_lookup = lookup;
            }
            if (req.sampling.greedy()) continue;
            kernels::Draw d;
            d.seed = req.seed;
            d.sample = req.sample;
            d.prob_slot = s.rows[K];
            d.position = static_cast<uint32_t>(x_len + K);
            d.purpose = K > 0 ? Purpose::kBonus : Purpose::kTargetSample;
            p.bonus_draw = sampler_.AddDraw(d);
            for (size_t j = 0; j < K; ++j) {
              for (int32_t m = 0; m < req.num_candidates; ++m) {
                d.prob_slot = s.rows[j];
                d.position = static_cast<uint32_t>(x_len + j);
                d.purpose = Purpose::kCandidate;
                d.index = static_cast<uint32_t>(m);
                const int32_t draw = sampler_.AddDraw(d);
                if (j == 0 && m == 0) p.first_candidate = draw;
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
  // Committed text into the cache: x (and u) for the verified sequences (not their drafts), and
  // the chunks.
  for (const size_t i : active) {
    CacheCommittedPair(batch[i], static_cast<int64_t>(batch[i].drafts.size()));
  }
  ChunksFed(chunk_inputs);

  for (const size_t i : active) {
    const VerifySequenceRequest& req = batch[i];
    VerifySequenceResult& r = results[i];
    const Planned& p = plan[i];
    Sequence& s = seqs_[req.seq];
    const size_t K = req.drafts.size();
    const size_t M = static_cast<size_t>(req.num_candidates);
    r.forward_ns = forward_ns;
    r.position = static_cast<int32_t>(s.tokens.size() - K);
    int32_t error = kernels::kRowOk;
    r.argmax.resize(K + 1);
    for (size_t j = 0; j <= K; ++j) {
      const int32_t row = p.first_row + static_cast<int32_t>(j);
      if (error == kernels::kRowOk) error = sampler_.row_error(row);
      r.argmax[j] = sampler_.argmax(row);
    }
    r.p_draft.resize(K);
    for (size_t j = 0; j < K; ++j)
      r.p_draft[j] = sampler_.lookup(p.first_lookup + static_cast<int32_t>(j));
    if (req.sampling.greedy()) {
      r.bonus_token = r.argmax[K];
    } else if (error == kernels::kRowOk) {
      error = sampler_.draw_error(p.bonus_draw);
      r.bonus_token = sampler_.token(p.bonus_draw);
      r.candidate_tokens.assign(K, std::vector<int32_t>(M));
      r.candidate_probs.assign(K, std::vector<float>(M));
      for (size_t j = 0; j < K; ++j) {
        for (size_t m = 0; m < M; ++m) {
          const int32_t draw = p.first_candidate + static_cast<int32_t>(j * M + m);
          if (error == kernels::kRowOk) error = sampler_.draw_error(draw);
          r.candidate_tokens[j][m] = sampler_.token(draw);
          r.candidate_probs[j][m] = sampler_.token_prob(draw);
        }
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
    const size_t K = req.drafts.size();
    const bool processed = req.logprobs.mode == LogprobsMode::kProcessed;
    s.logprobs_mode = req.logprobs.mode;
    // The residual fallback emits a token that is none of those below; it asks QueryLogprobs
    // later, which for raw logprobs needs the penalised rows of positions 1..K.
    if (!processed && !req.sampling.greedy() && K > 0) {
      SPECD_ASSIGN_OR_RETURN(s.logit_rows, pool_.Acquire(static_cast<int64_t>(K)));
      for (size_t j = 0; j < K; ++j) {
        SPECD_RETURN_IF_ERROR(engine_->backend().CopyDeviceToDevice(
            pool_.rows() + int64_t{s.logit_rows[j]} * vocab,
            sampler_.penalized(plans[p].first_row + static_cast<int32_t>(j)), vocab * 4));
      }
    }
    queried[p].resize(K + 1);
    for (size_t j = 0; j <= K; ++j) {
      const int32_t row = logprob_rows_.AddRow(
          {sampler_.penalized(plans[p].first_row + static_cast<int32_t>(j)), -1},
          req.logprobs.top_n, processed ? s.rows[j] : -1);
      if (j == 0) first_lp_row[p] = row;
      // Every token the coordinator may emit at this position.
      std::vector<int32_t>& tokens = queried[p][j];
      auto add = [&tokens](int32_t t) {
        if (std::find(tokens.begin(), tokens.end(), t) == tokens.end()) tokens.push_back(t);
      };
      if (j < K) add(req.drafts[j]);
      add(r.argmax[j]);
      if (j < r.candidate_tokens.size()) {
        for (const int32_t y : r.candidate_tokens[j]) add(y);
      }
      if (j == K) add(r.bonus_token);
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
    for (const int32_t y : req.query_tokens) {
      if (y < 0 || y >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", seq, ": query token ", y, " is outside [0, ", vocab, ")"));
      }
      sampler_.AddLookup(slot, y);
    }
    SPECD_RETURN_IF_ERROR(sampler_.Run(nullptr, 0, pool_));
    for (size_t i = 0; i < req.query_tokens.size(); ++i) {
      result.q_probs.push_back(sampler_.lookup(static_cast<int32_t>(i)));
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
  return CompactRow(row);
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

absl::StatusOr<int64_t> WorkerRuntime::CachedLength(SeqId seq) const {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  return static_cast<int64_t>(it->second.tokens.size());
}

}  // namespace specd
