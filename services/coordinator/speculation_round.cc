#include "services/coordinator/speculation_round.h"

#include <algorithm>
#include <future>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "services/coordinator/accept_reject.h"

namespace specd {

int64_t SpeculativeSequence::CompanionLen(int64_t len) const {
  if (!guidance.has_value()) return 0;
  return std::max<int64_t>(0,
                           len - prompt_len + static_cast<int64_t>(guidance->uncond_prompt.size()));
}

std::vector<int32_t> SpeculativeSequence::CompanionCatchUp(int64_t from) const {
  std::vector<int32_t> out;
  if (!guidance.has_value()) return out;
  const std::vector<int32_t>& prompt = guidance->uncond_prompt;
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (from < n) out.assign(prompt.begin() + from, prompt.end());
  out.insert(out.end(), tokens.begin() + prompt_len + std::max<int64_t>(0, from - n), tokens.end());
  return out;
}

int64_t SpeculativeSequence::LongestLen() const {
  const int64_t len = static_cast<int64_t>(tokens.size());
  return guidance.has_value() ? std::max(len, CompanionLen(len)) : len;
}

int32_t EffectiveK(const SpeculativeSequence& s, int64_t max_seq_len) {
  // A round appends up to K + 1 tokens and x never exceeds max_seq_len (prompt + output, as in
  // vLLM's max_model_len), so K <= max_seq_len - len(x) - 1; likewise for a guided sequence's
  // companion, which grows with x, and for the request's own end.
  const int64_t room =
      std::min(max_seq_len - s.LongestLen(), s.done_len - static_cast<int64_t>(s.tokens.size())) -
      1;
  return static_cast<int32_t>(std::clamp<int64_t>(room, 0, s.num_speculative_tokens));
}

namespace {

// Adds the time from construction to destruction to `*total`: every way out of a scope counts,
// failures included.
class AddElapsedOnExit {
 public:
  explicit AddElapsedOnExit(absl::Duration* total) : total_(total) {}
  ~AddElapsedOnExit() { *total_ += absl::Now() - start_; }
  AddElapsedOnExit(const AddElapsedOnExit&) = delete;
  AddElapsedOnExit& operator=(const AddElapsedOnExit&) = delete;

 private:
  absl::Duration* total_;
  absl::Time start_ = absl::Now();
};

// One verified sequence on its way from the target's evidence to the tokens it appends.
struct Resolution {
  size_t i = 0;  // index in the batch
  const VerifySequenceResult* v = nullptr;
  RoundEvidence ev;
  int32_t n = 0;                // drafts accepted
  bool needs_residual = false;  // a sampled draft was rejected
  std::vector<float> q_ys;      // q_r(y) of the residual candidates
  int32_t next = 0;             // the correction or bonus token
  bool used_read_rows = false;
  bool failed = false;
};

// The draft keeps at most `keep` tokens of x (and a guided draft's companion the same generated
// tokens); anything past that leaves its KV with its next call (drop_tail).
void CutDraft(SpeculativeSequence& s, int64_t keep) {
  if (s.draft_cached > keep) {
    s.draft_cached = keep;
    s.draft_tail = true;
  }
  if (s.guidance.has_value() && s.guidance->draft &&
      s.guidance->draft_cached > s.CompanionLen(keep)) {
    s.guidance->draft_cached = s.CompanionLen(keep);
    s.draft_tail = true;
  }
}

// The exact residual fallback for sequences none of whose candidates passed: both workers' kept
// rows at the rejection step, fetched for the whole batch with one call per worker, the two calls
// at once.
void ResolveByReadRows(WorkerApi& draft, WorkerApi& target,
                       std::span<SpeculativeSequence* const> batch,
                       std::span<Resolution* const> fallback, std::vector<RoundStats>& stats) {
  std::vector<RowQuery> rows;
  for (const Resolution* res : fallback) rows.push_back({batch[res->i]->id, res->n + 1});
  std::future<absl::StatusOr<std::vector<SequenceAnswer<ProbRow>>>> q_future =
      std::async(std::launch::async, [&draft, &rows] { return draft.ReadRows(rows); });
  absl::StatusOr<std::vector<SequenceAnswer<ProbRow>>> p_rows = target.ReadRows(rows);
  absl::StatusOr<std::vector<SequenceAnswer<ProbRow>>> q_rows = q_future.get();
  for (size_t j = 0; j < fallback.size(); ++j) {
    Resolution& res = *fallback[j];
    res.used_read_rows = true;
    absl::Status status = !p_rows.ok() ? p_rows.status() : q_rows.status();
    if (status.ok()) {
      status = !(*p_rows)[j].value.ok() ? (*p_rows)[j].value.status() : (*q_rows)[j].value.status();
    }
    if (status.ok()) {
      const ProbRow& p = *(*p_rows)[j].value;
      const ProbRow& q = *(*q_rows)[j].value;
      int64_t vocab = p.dense()   ? static_cast<int64_t>(p.probs.size())
                      : q.dense() ? static_cast<int64_t>(q.probs.size())
                                  : 0;
      if (vocab == 0) {
        // Both sparse: the vocabulary only needs to cover their ids.
        for (const int32_t id : p.ids) vocab = std::max<int64_t>(vocab, id + 1);
        for (const int32_t id : q.ids) vocab = std::max<int64_t>(vocab, id + 1);
      }
      const SpeculativeSequence& s = *batch[res.i];
      absl::StatusOr<int32_t> t = SampleResidual(
          s.seed, s.sample, res.ev.position + static_cast<uint32_t>(res.n), p, q, vocab);
      if (t.ok()) {
        res.next = *t;
        continue;
      }
      status = t.status();
    }
    stats[res.i].status = std::move(status);
    res.failed = true;
  }
}

// The target's logprobs of the tokens each sequence emits: the values Verify reported for each
// position, and for the residual fallback's tokens (none of those) one QueryLogprobs call for the
// whole batch. The draft's numbers never enter.
void AddEmittedLogprobs(WorkerApi& target, std::span<SpeculativeSequence* const> batch,
                        std::span<Resolution> resolutions, std::vector<RoundStats>& stats) {
  std::vector<LogprobQuery> queries;
  std::vector<std::pair<Resolution*, size_t>> asked;  // (sequence, emitted index) per query
  for (Resolution& res : resolutions) {
    const SpeculativeSequence& s = *batch[res.i];
    if (res.failed || s.logprobs.mode == LogprobsMode::kOff) continue;
    RoundStats& st = stats[res.i];
    const VerifySequenceResult& v = *res.v;
    if (v.logprobs.size() < st.appended.size()) {
      st.status = absl::InternalError(absl::StrCat(
          "the target worker returned logprobs for ", v.logprobs.size(), " positions of sequence ",
          s.id, ", which emits ", st.appended.size(), " tokens"));
      res.failed = true;
      continue;
    }
    st.logprobs.resize(st.appended.size());
    for (size_t j = 0; j < st.appended.size(); ++j) {
      const PositionLogprobs& p = v.logprobs[j];
      TokenLogprobs& t = st.logprobs[j];
      t.top_ids = p.top_ids;
      t.top_logprobs = p.top_logprobs;
      const auto it = std::find(p.token_ids.begin(), p.token_ids.end(), st.appended[j]);
      if (it != p.token_ids.end() && p.token_logprobs.size() == p.token_ids.size()) {
        t.logprob = p.token_logprobs[static_cast<size_t>(it - p.token_ids.begin())];
      } else {
        queries.push_back({s.id, static_cast<int32_t>(j) + 1, {st.appended[j]}});
        asked.emplace_back(&res, j);
      }
    }
  }
  if (queries.empty()) return;
  absl::StatusOr<std::vector<SequenceAnswer<std::vector<float>>>> answers =
      target.QueryLogprobs(queries);
  for (size_t q = 0; q < queries.size(); ++q) {
    auto [res, j] = asked[q];
    RoundStats& st = stats[res->i];
    absl::Status status = answers.status();
    if (answers.ok()) {
      const absl::StatusOr<std::vector<float>>& lp = (*answers)[q].value;
      if (lp.ok() && lp->size() == 1) {
        st.logprobs[j].logprob = lp->front();
        continue;
      }
      status = lp.ok() ? absl::InternalError(absl::StrCat("the target worker answered ", lp->size(),
                                                          " logprobs for one token"))
                       : lp.status();
    }
    if (!res->failed) {
      st.status = std::move(status);
      res->failed = true;
    }
  }
}

}  // namespace

std::vector<RoundStats> RunSpeculationRound(WorkerApi& draft, WorkerApi& target,
                                            std::span<SpeculativeSequence* const> batch,
                                            const RoundOptions& options) {
  std::vector<RoundStats> stats(batch.size());
  RoundPhaseTimes unused_times;
  RoundPhaseTimes& times = options.phase_times != nullptr ? *options.phase_times : unused_times;
  times = RoundPhaseTimes();
  const AddElapsedOnExit round_time(&times.round);
  std::vector<int32_t> k(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    k[i] = EffectiveK(*batch[i], options.max_seq_len);
    stats[i].drafted = k[i];
    if (batch[i]->LongestLen() >= options.max_seq_len) {
      stats[i].status = absl::OutOfRangeError(
          absl::StrCat("sequence ", batch[i]->id, " is at max_seq_len ", options.max_seq_len));
    }
  }

  // 1. Draft: per step, every drafting sequence's t_k and q_k(t_k).
  std::vector<DraftSequenceRequest> draft_reqs;
  absl::flat_hash_map<SeqId, size_t> index;
  for (size_t i = 0; i < batch.size(); ++i) {
    index[batch[i]->id] = i;
    if (k[i] == 0 || !stats[i].status.ok()) continue;
    const SpeculativeSequence& s = *batch[i];
    DraftSequenceRequest r;
    r.seq = s.id;
    r.catch_up.assign(s.tokens.begin() + s.draft_cached, s.tokens.end());
    r.expected_cached_len = s.draft_cached;
    r.drop_tail = s.draft_tail;
    r.sampling = s.sampling;
    r.seed = s.seed;
    r.prompt_len = s.prompt_len;
    r.sample = s.sample;
    r.num_speculative_tokens = k[i];
    r.draft_sampling = s.draft_sampling;
    r.max_prefill_tokens = options.prefill_chunk;
    if (s.guidance.has_value() && s.guidance->draft) {
      r.companion =
          CompanionRequest{s.guidance->companion, s.guidance->scale,
                           s.CompanionCatchUp(s.guidance->draft_cached), s.guidance->draft_cached};
    }
    draft_reqs.push_back(std::move(r));
  }
  std::vector<std::vector<int32_t>> drafts(batch.size());
  std::vector<std::vector<float>> q_draft(batch.size());
  if (!draft_reqs.empty()) {
    const absl::Time draft_start = absl::Now();
    absl::StatusOr<std::vector<SequenceOutcome>> outcomes =
        draft.Draft(draft_reqs, [&](const DraftStep& step) {
          times.draft_forward += absl::Nanoseconds(step.forward_ns);
          if (step.forward_ns > 0) ++times.draft_steps;
          for (const DraftToken& t : step.tokens) {
            const size_t i = index[t.seq];
            drafts[i].push_back(t.token);
            q_draft[i].push_back(t.q_prob);
          }
        });
    times.draft = absl::Now() - draft_start;
    for (const DraftSequenceRequest& r : draft_reqs) {
      const size_t i = index[r.seq];
      if (!outcomes.ok()) {
        stats[i].status = outcomes.status();
        continue;
      }
      for (const SequenceOutcome& o : *outcomes) {
        if (o.seq != r.seq) continue;
        stats[i].status = o.status;
        stats[i].prefilling = o.status.ok() && o.prefilling;
        batch[i]->draft_cached = o.cached_len;
        if (r.companion.has_value()) batch[i]->guidance->draft_cached = o.companion_cached_len;
        if (o.status.ok()) batch[i]->draft_tail = false;
      }
      if (stats[i].status.ok() && !stats[i].prefilling &&
          static_cast<int32_t>(drafts[i].size()) != k[i]) {
        stats[i].status =
            absl::InternalError(absl::StrCat("draft worker returned ", drafts[i].size(), " of ",
                                             k[i], " tokens for sequence ", r.seq));
      }
    }
  }

  // 2. Verify every healthy sequence in one call.
  std::vector<VerifySequenceRequest> verify_reqs;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!stats[i].status.ok()) continue;
    const SpeculativeSequence& s = *batch[i];
    VerifySequenceRequest r;
    r.seq = s.id;
    r.catch_up.assign(s.tokens.begin() + s.target_cached, s.tokens.end());
    r.expected_cached_len = s.target_cached;
    r.drop_tail = s.target_tail;
    r.sampling = s.sampling;
    r.seed = s.seed;
    r.prompt_len = s.prompt_len;
    r.sample = s.sample;
    r.max_prefill_tokens = options.prefill_chunk;
    // The draft is still prefilling: the target may prefill too, but this round's K has no
    // drafts, so nothing may be drawn for the sequence yet.
    r.prefill_only = stats[i].prefilling;
    if (!r.prefill_only) {
      r.drafts = drafts[i];
      r.num_candidates = s.sampling.greedy() ? 0 : s.num_candidates;
      r.logprobs = s.logprobs;
    }
    if (s.guidance.has_value()) {
      r.companion = CompanionRequest{s.guidance->companion, s.guidance->scale,
                                     s.CompanionCatchUp(s.guidance->target_cached),
                                     s.guidance->target_cached};
    }
    verify_reqs.push_back(std::move(r));
  }
  if (verify_reqs.empty()) return stats;
  const absl::Time verify_start = absl::Now();
  absl::StatusOr<std::vector<VerifySequenceResult>> verified = target.Verify(verify_reqs);
  times.verify = absl::Now() - verify_start;
  if (!verified.ok()) {
    for (const VerifySequenceRequest& r : verify_reqs)
      stats[index[r.seq]].status = verified.status();
    return stats;
  }
  // One batched forward pass: every result reports the same time (0 for those that failed first).
  int64_t verify_forward_ns = 0;
  for (const VerifySequenceResult& v : *verified) {
    verify_forward_ns = std::max(verify_forward_ns, v.forward_ns);
  }
  times.verify_forward = absl::Nanoseconds(verify_forward_ns);
  for (const VerifySequenceRequest& r : verify_reqs) {
    const int64_t catch_up = static_cast<int64_t>(r.catch_up.size());
    times.verify_tokens +=
        (options.prefill_chunk > 0 ? std::min(catch_up, options.prefill_chunk + 1) : catch_up) +
        static_cast<int64_t>(r.drafts.size());
  }

  // 3. Accept/reject: how many drafts each sequence keeps. Rejected drafts leave both workers'
  // KV through drop_tail on their next call, unless the draft must answer q_r(y) for the residual.
  const absl::Time accept_start = absl::Now();
  std::vector<Resolution> resolutions;
  resolutions.reserve(verified->size());
  for (const VerifySequenceResult& v : *verified) {
    const size_t i = index[v.seq];
    if (!v.status.ok()) {
      stats[i].status = v.status;
      continue;
    }
    SpeculativeSequence& s = *batch[i];
    s.target_cached = v.cached_len;
    s.target_tail = false;
    if (s.guidance.has_value()) s.guidance->target_cached = v.companion_cached_len;
    if (v.prefilling) {
      stats[i].prefilling = true;
      stats[i].drafted = 0;
      // Drafts the target never judged: the draft keeps x but its last token, which its next
      // catch-up feeds again, and drops the rest with that call.
      CutDraft(s, static_cast<int64_t>(s.tokens.size()) - 1);
      continue;
    }
    Resolution& res = resolutions.emplace_back();
    res.i = i;
    res.v = &v;
    res.ev.seed = s.seed;
    res.ev.sample = s.sample;
    res.ev.position = static_cast<uint32_t>(v.position);
    res.ev.draft_tokens = drafts[i];
    res.ev.q_draft = q_draft[i];
    res.ev.p_draft = v.p_draft;
    res.ev.target_argmax = v.argmax;
    res.ev.bonus_token = v.bonus_token;
    res.n = CountAccepted(res.ev, s.sampling.greedy());
    res.needs_residual = res.n < k[i] && !s.sampling.greedy();
    const int64_t keep = static_cast<int64_t>(s.tokens.size()) + res.n;
    if (keep < s.target_cached) {
      s.target_cached = keep;
      s.target_tail = true;
    }
    if (s.guidance.has_value() && s.CompanionLen(keep) < s.guidance->target_cached) {
      s.guidance->target_cached = s.CompanionLen(keep);
      s.target_tail = true;
    }
    if (!res.needs_residual) CutDraft(s, keep);
  }

  // 4. The residual queries of every sequence that rejected a sampled draft, in one Truncate call.
  std::vector<TruncateSequenceRequest> queries;
  std::vector<Resolution*> querying;
  for (Resolution& res : resolutions) {
    if (!res.needs_residual) continue;
    const SpeculativeSequence& s = *batch[res.i];
    querying.push_back(&res);
    const int64_t keep = static_cast<int64_t>(s.tokens.size()) + res.n;
    TruncateSequenceRequest& q = queries.emplace_back();
    q.seq = s.id;
    q.new_len = std::min(s.draft_cached, keep);
    q.query_step = res.n + 1;
    q.query_tokens = res.v->candidate_tokens[static_cast<size_t>(res.n)];
    if (s.guidance.has_value() && s.guidance->draft) {
      q.companion_new_len = std::min(s.guidance->draft_cached, s.CompanionLen(keep));
    }
  }
  if (!queries.empty()) {
    const AddElapsedOnExit truncate_time(&times.truncate);
    absl::StatusOr<std::vector<SequenceAnswer<TruncateResult>>> answers = draft.Truncate(queries);
    for (size_t j = 0; j < querying.size(); ++j) {
      Resolution& res = *querying[j];
      SpeculativeSequence& s = *batch[res.i];
      absl::Status status = answers.status();
      if (answers.ok() && (*answers)[j].value.ok()) {
        s.draft_cached = (*answers)[j].value->cached_len;
        if (queries[j].companion_new_len.has_value()) {
          s.guidance->draft_cached = (*answers)[j].value->companion_cached_len;
        }
        s.draft_tail = false;
        res.q_ys = std::move((*answers)[j].value->q_probs);
      } else if (answers.ok()) {
        status = (*answers)[j].value.status();
      }
      if (!status.ok()) {
        stats[res.i].status = std::move(status);
        res.failed = true;
      }
    }
  }

  // 5. The correction token: the first candidate that passes, or (rarely) the residual sampled
  // from both kept rows, read from both workers at once.
  std::vector<Resolution*> fallback;
  for (Resolution& res : resolutions) {
    if (res.failed) continue;
    const SpeculativeSequence& s = *batch[res.i];
    const int32_t n = res.n;
    res.next = res.v->bonus_token;  // n == K (K == 0 included): the bonus or plain sampled token
    if (n == k[res.i]) continue;
    if (s.sampling.greedy()) {
      res.next = res.v->argmax[static_cast<size_t>(n)];
    } else if (std::optional<int32_t> c =
                   ChooseCandidate(s.seed, s.sample, res.ev.position + static_cast<uint32_t>(n),
                                   res.v->candidate_tokens[static_cast<size_t>(n)],
                                   res.v->candidate_probs[static_cast<size_t>(n)], res.q_ys)) {
      res.next = *c;
    } else {
      fallback.push_back(&res);
    }
  }
  if (!fallback.empty()) ResolveByReadRows(draft, target, batch, fallback, stats);

  // 6. The emitted tokens, and their logprobs where asked.
  for (Resolution& res : resolutions) {
    if (res.failed) continue;
    RoundStats& st = stats[res.i];
    st.accepted = res.n;
    st.appended.assign(drafts[res.i].begin(), drafts[res.i].begin() + res.n);
    st.appended.push_back(res.next);
    st.used_read_rows = res.used_read_rows;
  }
  AddEmittedLogprobs(target, batch, resolutions, stats);

  // 7. Append.
  for (const Resolution& res : resolutions) {
    if (res.failed) continue;
    SpeculativeSequence& s = *batch[res.i];
    const RoundStats& st = stats[res.i];
    s.tokens.insert(s.tokens.end(), st.appended.begin(), st.appended.end());
  }
  times.accept = absl::Now() - accept_start - times.truncate;
  return stats;
}

}  // namespace specd
