#include "common/worker/worker_runtime.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/math.h"
#include "base/philox.h"
#include "base/status_macros.h"

namespace specd {
namespace {

// A point mass at `token`: the q of a greedy draft. Any q is exact as long as the same row
// samples t, reports q(t) and answers q(y) (DESIGN.md, "The processed distribution").
void PointMass(int32_t token, int64_t vocab, std::vector<float>* row) {
  row->assign(static_cast<size_t>(vocab), 0.0f);
  (*row)[static_cast<size_t>(token)] = 1.0f;
}

int32_t ArgmaxLowestId(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// INVALID_ARGUMENT for the second and later requests naming an id already seen in the call, so
// one sequence is never fed twice in one forward pass.
absl::Status CheckUnique(KvPool::SeqId seq, absl::flat_hash_set<KvPool::SeqId>* seen) {
  if (!seen->insert(seq).second) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", seq, " appears more than once in one call"));
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
    : engine_(std::move(engine)), options_(options) {
  options_.prefill_chunk = std::max<int64_t>(1, options_.prefill_chunk);
}

absl::Status WorkerRuntime::Admit(const SequenceRequest& req, int64_t extra_tokens,
                                  int64_t* blocks_budget) {
  const int64_t vocab = engine_->config().vocab_size;
  SPECD_RETURN_IF_ERROR(ValidateSamplingParams(req.sampling, vocab));
  if (req.prompt_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", req.seq, ": prompt_len must be >= 0, got ", req.prompt_len));
  }
  if (req.expected_cached_len < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence ", req.seq, ": expected_cached_len must be >= 0, got ", req.expected_cached_len));
  }
  if (req.catch_up.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence ", req.seq, ": catch-up must hold at least the last committed token"));
  }
  for (size_t i = 0; i < req.catch_up.size(); ++i) {
    if (req.catch_up[i] < 0 || req.catch_up[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq, ": token id ",
                                                     req.catch_up[i], " at catch-up index ", i,
                                                     " is outside [0, ", vocab, ")"));
    }
  }
  const auto it = seqs_.find(req.seq);
  if (it != seqs_.end() && req.drop_tail &&
      static_cast<int64_t>(it->second.tokens.size()) > req.expected_cached_len) {
    const int64_t free_before = engine_->kv().free_blocks();
    SPECD_RETURN_IF_ERROR(engine_->Truncate(req.seq, req.expected_cached_len));
    it->second.tokens.resize(static_cast<size_t>(req.expected_cached_len));
    *blocks_budget += engine_->kv().free_blocks() - free_before;
    ReportKv();
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
  const int64_t new_len = req.expected_cached_len + extra_tokens;
  if (new_len > engine_->max_seq_len()) {
    return absl::OutOfRangeError(absl::StrCat("sequence ", req.seq, " would reach ", new_len,
                                              " tokens, over max_seq_len ",
                                              engine_->max_seq_len()));
  }
  const int64_t block = engine_->kv().block_size();
  const int64_t need = CeilDiv(new_len, block) - CeilDiv(req.expected_cached_len, block);
  if (need > *blocks_budget) {
    return absl::ResourceExhaustedError(
        absl::StrCat("sequence ", req.seq, " needs ", need, " more KV blocks for ", new_len,
                     " tokens but only ", *blocks_budget, " are free"));
  }
  if (it == seqs_.end()) {
    SPECD_RETURN_IF_ERROR(engine_->AddSequence(req.seq));
    seqs_.try_emplace(req.seq);
  }
  *blocks_budget -= need;
  Sequence& s = seqs_[req.seq];
  s.prompt_len = req.prompt_len;
  s.rows.clear();  // rows live until the sequence's next Draft or Verify
  return absl::OkStatus();
}

absl::StatusOr<ForwardResult> WorkerRuntime::TimedForward(ForwardKind kind,
                                                          std::span<const SequenceInput> batch,
                                                          int64_t* forward_ns) {
  const absl::Time start = absl::Now();
  absl::StatusOr<ForwardResult> out = engine_->Forward(batch);
  const absl::Duration elapsed = absl::Now() - start;
  if (forward_ns != nullptr) *forward_ns = absl::ToInt64Nanoseconds(elapsed);
  if (out.ok() && options_.observer != nullptr) {
    int64_t tokens = 0;
    for (const SequenceInput& in : batch) tokens += static_cast<int64_t>(in.tokens.size());
    options_.observer->OnForward(kind, static_cast<int64_t>(batch.size()), tokens, elapsed);
    options_.observer->OnKvChanged(engine_->kv());
  }
  return out;
}

void WorkerRuntime::ReportKv() {
  if (options_.observer != nullptr) options_.observer->OnKvChanged(engine_->kv());
}

absl::Status WorkerRuntime::FeedLongCatchUps(std::span<const SequenceRequest* const> reqs) {
  // Every chunk but the last goes in calls of at most prefill_chunk tokens per sequence; the last
  // chunk rides with the step that needs logits.
  std::vector<size_t> fed(reqs.size(), 0);
  while (true) {
    std::vector<SequenceInput> batch;
    std::vector<size_t> which;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const size_t left = reqs[i]->catch_up.size() - fed[i];
      if (left <= static_cast<size_t>(options_.prefill_chunk)) continue;
      SequenceInput in;
      in.seq = reqs[i]->seq;
      in.tokens = std::span<const int32_t>(reqs[i]->catch_up)
                      .subspan(fed[i], static_cast<size_t>(options_.prefill_chunk));
      in.start_pos = static_cast<int64_t>(seqs_[in.seq].tokens.size());
      batch.push_back(in);
      which.push_back(i);
    }
    if (batch.empty()) return absl::OkStatus();
    SPECD_RETURN_IF_ERROR(TimedForward(ForwardKind::kCatchUp, batch, nullptr).status());
    for (size_t b = 0; b < batch.size(); ++b) {
      std::vector<int32_t>& tokens = seqs_[batch[b].seq].tokens;
      tokens.insert(tokens.end(), batch[b].tokens.begin(), batch[b].tokens.end());
      fed[which[b]] += batch[b].tokens.size();
    }
  }
}

TokenHistory WorkerRuntime::History(const Sequence& s, size_t len) const {
  const size_t prompt = std::min(len, static_cast<size_t>(s.prompt_len));
  const std::span<const int32_t> all(s.tokens.data(), len);
  return TokenHistory{all.subspan(0, prompt), all.subspan(prompt)};
}

int64_t WorkerRuntime::LengthOrZero(KvPool::SeqId seq) const {
  const auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : static_cast<int64_t>(it->second.tokens.size());
}

std::vector<SequenceOutcome> WorkerRuntime::Draft(
    std::span<const DraftSequenceRequest> batch,
    const std::function<void(const DraftStep&)>& on_step) {
  const int64_t vocab = engine_->config().vocab_size;
  std::vector<SequenceOutcome> outcomes(batch.size());
  std::vector<SequenceOutcome> failed;  // not yet reported to on_step
  auto fail = [&](size_t i, absl::Status st) {
    outcomes[i].status = std::move(st);
    failed.push_back({batch[i].seq, outcomes[i].status, LengthOrZero(batch[i].seq)});
  };

  std::vector<size_t> active;  // still drafting
  absl::flat_hash_set<KvPool::SeqId> seen;
  int64_t budget = engine_->kv().free_blocks();
  for (size_t i = 0; i < batch.size(); ++i) {
    const DraftSequenceRequest& req = batch[i];
    outcomes[i].seq = req.seq;
    absl::Status st = CheckUnique(req.seq, &seen);
    if (st.ok() && (req.num_draft_tokens < 1 || req.num_draft_tokens > kMaxDraftTokens)) {
      st = absl::InvalidArgumentError(
          absl::StrCat("sequence ", req.seq, ": num_draft_tokens must be in [1, ", kMaxDraftTokens,
                       "], got ", req.num_draft_tokens));
    }
    // The last draft token is sampled but never fed, hence K - 1.
    if (st.ok()) {
      st =
          Admit(req, static_cast<int64_t>(req.catch_up.size()) + req.num_draft_tokens - 1, &budget);
    }
    if (st.ok()) {
      active.push_back(i);
    } else {
      fail(i, std::move(st));
    }
  }
  auto fail_active = [&](const absl::Status& st) {
    for (const size_t i : active) fail(i, st);
    active.clear();
  };

  std::vector<const SequenceRequest*> reqs;
  for (const size_t i : active) reqs.push_back(&batch[i]);
  if (absl::Status st = FeedLongCatchUps(reqs); !st.ok()) fail_active(st);

  std::vector<int32_t> last(batch.size(), 0);  // t_{k-1} per request
  std::vector<DraftToken> step_tokens;
  int32_t k = 0;
  int64_t forward_ns = 0;
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
        const size_t done = static_cast<size_t>(in.start_pos - batch[i].expected_cached_len);
        in.tokens = std::span<const int32_t>(batch[i].catch_up).subspan(done);
      } else {
        in.tokens = std::span<const int32_t>(&last[i], 1);
      }
      in.logit_indices = {static_cast<int32_t>(in.tokens.size() - 1)};
      inputs.push_back(in);
    }
    absl::StatusOr<ForwardResult> out = TimedForward(ForwardKind::kDraftStep, inputs, &forward_ns);
    if (!out.ok()) {
      fail_active(out.status());
      break;
    }
    for (size_t b = 0; b < inputs.size(); ++b) {
      const size_t i = active[b];
      const DraftSequenceRequest& req = batch[i];
      Sequence& s = seqs_[req.seq];
      s.tokens.insert(s.tokens.end(), inputs[b].tokens.begin(), inputs[b].tokens.end());
      // t_k sits at position len(x) + k - 1, which is what the cache now holds.
      const uint32_t position = static_cast<uint32_t>(s.tokens.size());
      const TokenHistory history = History(s, s.tokens.size());
      const std::span<const float> logits = out->row(static_cast<int64_t>(b));
      std::vector<float> row(static_cast<size_t>(vocab));
      absl::Status st;
      int32_t token = 0;
      if (req.sampling.greedy()) {
        absl::StatusOr<int32_t> t = processor_.GreedyToken(logits, req.sampling, history);
        st = t.status();
        if (st.ok()) PointMass(token = *t, vocab, &row);
      } else {
        st = processor_.ProcessedDistribution(logits, req.sampling, history, row);
        if (st.ok() && req.mode == DraftMode::kGreedy) {
          PointMass(token = ArgmaxLowestId(row), vocab, &row);
        } else if (st.ok()) {
          const double u = StreamUniform(req.seed, position, Purpose::kDraftSample);
          absl::StatusOr<int32_t> t = SampleInverseCdf(row, u);
          st = t.status();
          if (st.ok()) token = *t;
        }
      }
      if (!st.ok()) {
        fail(i, std::move(st));
        continue;
      }
      last[i] = token;
      step_tokens.push_back({req.seq, token, row[static_cast<size_t>(token)]});
      s.rows.push_back(std::move(row));
    }
    active.erase(std::remove_if(active.begin(), active.end(),
                                [&](size_t i) {
                                  return !outcomes[i].status.ok() || batch[i].num_draft_tokens == k;
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
  for (size_t i = 0; i < batch.size(); ++i) outcomes[i].cached_len = LengthOrZero(batch[i].seq);
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
    if (on_result) on_result(results[i]);
  };

  std::vector<size_t> active;
  absl::flat_hash_set<KvPool::SeqId> seen;
  int64_t budget = engine_->kv().free_blocks();
  for (size_t i = 0; i < batch.size(); ++i) {
    const VerifySequenceRequest& req = batch[i];
    results[i].seq = req.seq;
    absl::Status st = CheckUnique(req.seq, &seen);
    if (st.ok() && (req.num_candidates < 0 || req.num_candidates > kMaxCandidates)) {
      st = absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq,
                                                   ": num_candidates must be in [0, ",
                                                   kMaxCandidates, "], got ", req.num_candidates));
    }
    if (st.ok() && req.drafts.size() > static_cast<size_t>(kMaxDraftTokens)) {
      st = absl::InvalidArgumentError(absl::StrCat("sequence ", req.seq, ": ", req.drafts.size(),
                                                   " draft tokens, at most ", kMaxDraftTokens,
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
      st = Admit(req, static_cast<int64_t>(req.catch_up.size() + req.drafts.size()), &budget);
    }
    if (st.ok()) {
      active.push_back(i);
    } else {
      results[i].status = std::move(st);
      finish(i);
    }
  }
  if (active.empty()) return results;

  std::vector<const SequenceRequest*> reqs;
  for (const size_t i : active) reqs.push_back(&batch[i]);
  absl::Status st = FeedLongCatchUps(reqs);
  // The rest of each catch-up plus the drafts, with logits at the last K+1 positions.
  std::vector<std::vector<int32_t>> feeds(batch.size());
  std::vector<SequenceInput> inputs;
  for (const size_t i : active) {
    if (!st.ok()) break;
    const VerifySequenceRequest& req = batch[i];
    const Sequence& s = seqs_[req.seq];
    const size_t done = s.tokens.size() - static_cast<size_t>(req.expected_cached_len);
    feeds[i].assign(req.catch_up.begin() + static_cast<std::ptrdiff_t>(done), req.catch_up.end());
    feeds[i].insert(feeds[i].end(), req.drafts.begin(), req.drafts.end());
    SequenceInput in;
    in.seq = req.seq;
    in.tokens = feeds[i];
    in.start_pos = static_cast<int64_t>(s.tokens.size());
    const int32_t n = static_cast<int32_t>(feeds[i].size());
    const int32_t K = static_cast<int32_t>(req.drafts.size());
    for (int32_t j = n - K - 1; j < n; ++j) in.logit_indices.push_back(j);
    inputs.push_back(in);
  }
  int64_t forward_ns = 0;
  absl::StatusOr<ForwardResult> out = st.ok()
                                          ? TimedForward(ForwardKind::kVerify, inputs, &forward_ns)
                                          : absl::StatusOr<ForwardResult>(st);
  if (!out.ok()) {
    for (const size_t i : active) {
      results[i].status = out.status();
      finish(i);
    }
    return results;
  }

  int64_t row_base = 0;
  for (const size_t i : active) {
    const VerifySequenceRequest& req = batch[i];
    VerifySequenceResult& r = results[i];
    r.forward_ns = forward_ns;
    Sequence& s = seqs_[req.seq];
    s.tokens.insert(s.tokens.end(), feeds[i].begin(), feeds[i].end());
    const size_t K = req.drafts.size();
    const size_t x_len = s.tokens.size() - K;  // len(x): committed tokens
    r.position = static_cast<int32_t>(x_len);
    r.argmax.resize(K + 1);
    r.p_draft.resize(K);
    s.rows.resize(K + 1);
    absl::Status row_status;
    for (size_t j = 0; j <= K && row_status.ok(); ++j) {
      const std::span<const float> logits = out->row(row_base + static_cast<int64_t>(j));
      // p_{j+1} conditions on x and t_1..t_j, which count as output for the penalties.
      const TokenHistory history = History(s, x_len + j);
      absl::StatusOr<int32_t> greedy = processor_.GreedyToken(logits, req.sampling, history);
      if (!greedy.ok()) {
        row_status = greedy.status();
        break;
      }
      r.argmax[j] = *greedy;
      if (req.sampling.greedy()) {
        PointMass(*greedy, vocab, &s.rows[j]);
      } else {
        s.rows[j].resize(static_cast<size_t>(vocab));
        row_status = processor_.ProcessedDistribution(logits, req.sampling, history, s.rows[j]);
      }
    }
    row_base += static_cast<int64_t>(K + 1);
    if (row_status.ok()) {
      for (size_t j = 0; j < K; ++j) {
        r.p_draft[j] = s.rows[j][static_cast<size_t>(req.drafts[j])];
      }
      if (req.sampling.greedy()) {
        r.bonus_token = r.argmax[K];
      } else {
        const uint32_t bonus_pos = static_cast<uint32_t>(x_len + K);
        const double u =
            StreamUniform(req.seed, bonus_pos, K > 0 ? Purpose::kBonus : Purpose::kTargetSample);
        absl::StatusOr<int32_t> b = SampleInverseCdf(s.rows[K], u);
        row_status = b.status();
        if (b.ok()) r.bonus_token = *b;
        r.candidate_tokens.assign(K, {});
        r.candidate_probs.assign(K, {});
        for (size_t j = 0; j < K && row_status.ok(); ++j) {
          for (int32_t m = 0; m < req.num_candidates; ++m) {
            const double uc = StreamUniform(req.seed, static_cast<uint32_t>(x_len + j),
                                            Purpose::kCandidate, static_cast<uint32_t>(m));
            absl::StatusOr<int32_t> y = SampleInverseCdf(s.rows[j], uc);
            if (!y.ok()) {
              row_status = y.status();
              break;
            }
            r.candidate_tokens[j].push_back(*y);
            r.candidate_probs[j].push_back(s.rows[j][static_cast<size_t>(*y)]);
          }
        }
      }
    }
    if (!row_status.ok()) {
      // No half-filled rows: ReadRows and Truncate queries must not read them.
      s.rows.clear();
      r = VerifySequenceResult();
      r.seq = req.seq;
      r.status = row_status;
    }
    finish(i);
  }
  return results;
}

absl::StatusOr<TruncateResult> WorkerRuntime::Truncate(KvPool::SeqId seq, int64_t new_len,
                                                       int32_t query_step,
                                                       std::span<const int32_t> query_tokens) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  }
  if (new_len < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence ", seq, ": new_len must be >= 0, got ", new_len));
  }
  Sequence& s = it->second;
  TruncateResult result;
  if (query_step != 0 || !query_tokens.empty()) {
    if (query_step < 1 || query_step > static_cast<int32_t>(s.rows.size())) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence ", seq, ": no kept row for query_step ", query_step, " (",
                       s.rows.size(), " rows are kept from the last Draft/Verify)"));
    }
    const std::vector<float>& row = s.rows[static_cast<size_t>(query_step - 1)];
    for (const int32_t y : query_tokens) {
      if (y < 0 || y >= static_cast<int32_t>(row.size())) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, ": query token ", y,
                                                       " is outside [0, ", row.size(), ")"));
      }
      result.q_probs.push_back(row[static_cast<size_t>(y)]);
    }
  }
  SPECD_RETURN_IF_ERROR(engine_->Truncate(seq, new_len));
  if (new_len < static_cast<int64_t>(s.tokens.size())) {
    s.tokens.resize(static_cast<size_t>(new_len));
  }
  ReportKv();
  result.cached_len = static_cast<int64_t>(s.tokens.size());
  return result;
}

absl::StatusOr<ProbRow> WorkerRuntime::ReadRow(KvPool::SeqId seq, int32_t step) const {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  const Sequence& s = it->second;
  if (step < 1 || step > static_cast<int32_t>(s.rows.size())) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, ": no kept row for step ",
                                                      step, " (", s.rows.size(), " kept)"));
  }
  return CompactRow(s.rows[static_cast<size_t>(step - 1)]);
}

absl::Status WorkerRuntime::Release(KvPool::SeqId seq) {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  SPECD_RETURN_IF_ERROR(engine_->Release(seq));
  seqs_.erase(it);
  ReportKv();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> WorkerRuntime::CachedLength(KvPool::SeqId seq) const {
  const auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", seq));
  return static_cast<int64_t>(it->second.tokens.size());
}

}  // namespace specd
