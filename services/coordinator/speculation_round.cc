#include "services/coordinator/speculation_round.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace specd {

int32_t EffectiveK(const SpeculativeSequence& s, int64_t max_seq_len) {
  // A round appends up to K + 1 tokens and x never exceeds max_seq_len (prompt + output, as in
  // vLLM's max_model_len), so K <= max_seq_len - len(x) - 1; likewise for the request's own end.
  const int64_t room =
      std::min(max_seq_len, s.done_len) - static_cast<int64_t>(s.tokens.size()) - 1;
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

// The target's logprobs of the tokens a round emits: the values Verify reported for each
// position, or, for the residual fallback's token (none of those), a query to the target.
absl::StatusOr<std::vector<TokenLogprobs>> EmittedLogprobs(WorkerApi& target, SeqId seq,
                                                           const VerifySequenceResult& v,
                                                           std::span<const int32_t> emitted,
                                                           int32_t K) {
  if (v.logprobs.size() != static_cast<size_t>(K) + 1) {
    return absl::InternalError(absl::StrCat("target worker returned logprobs for ",
                                            v.logprobs.size(), " positions of sequence ", seq,
                                            ", expected ", K + 1));
  }
  std::vector<TokenLogprobs> out;
  for (size_t j = 0; j < emitted.size(); ++j) {
    const PositionLogprobs& p = v.logprobs[j];
    TokenLogprobs t;
    t.top_ids = p.top_ids;
    t.top_logprobs = p.top_logprobs;
    const auto it = std::find(p.token_ids.begin(), p.token_ids.end(), emitted[j]);
    if (it != p.token_ids.end() && p.token_logprobs.size() == p.token_ids.size()) {
      t.logprob = p.token_logprobs[static_cast<size_t>(it - p.token_ids.begin())];
    } else {
      absl::StatusOr<std::vector<float>> q =
          target.QueryLogprobs(seq, static_cast<int32_t>(j) + 1, std::span(&emitted[j], 1));
      if (!q.ok()) return q.status();
      if (q->size() != 1) {
        return absl::InternalError(absl::StrCat("target worker answered ", q->size(),
                                                " logprobs for one token of sequence ", seq));
      }
      t.logprob = q->front();
    }
    out.push_back(std::move(t));
  }
  return out;
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
    if (static_cast<int64_t>(batch[i]->tokens.size()) >= options.max_seq_len) {
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
    r.num_draft_tokens = k[i];
    r.mode = s.draft_mode;
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
        batch[i]->draft_cached = o.cached_len;
        if (o.status.ok()) batch[i]->draft_tail = false;
      }
      if (stats[i].status.ok() && static_cast<int32_t>(drafts[i].size()) != k[i]) {
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
    r.drafts = drafts[i];
    r.num_candidates = s.sampling.greedy() ? 0 : s.num_candidates;
    r.logprobs = s.logprobs;
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
    times.verify_tokens += static_cast<int64_t>(r.catch_up.size() + r.drafts.size());
  }

  // 3-5. Accept/reject, truncate, append.
  const absl::Time accept_start = absl::Now();
  for (const VerifySequenceResult& v : *verified) {
    const size_t i = index[v.seq];
    SpeculativeSequence& s = *batch[i];
    RoundStats& st = stats[i];
    if (!v.status.ok()) {
      st.status = v.status;
      continue;
    }
    s.target_cached = v.cached_len;
    s.target_tail = false;
    const bool greedy = s.sampling.greedy();
    const int32_t K = k[i];
    RoundEvidence ev;
    ev.seed = s.seed;
    ev.sample = s.sample;
    ev.position = static_cast<uint32_t>(v.position);
    ev.draft_tokens = drafts[i];
    ev.q_draft = q_draft[i];
    ev.p_draft = v.p_draft;
    ev.target_argmax = v.argmax;
    ev.bonus_token = v.bonus_token;
    const int32_t n = CountAccepted(ev, greedy);
    st.accepted = n;
    const int64_t len_old = static_cast<int64_t>(s.tokens.size());
    std::vector<int32_t> appended(drafts[i].begin(), drafts[i].begin() + n);

    // Truncate both workers to what stays committed. The draft call also asks q_r(y) for the
    // residual candidates when the round ended in a sampled rejection.
    const bool needs_residual = n < K && !greedy;
    const int32_t r_step = n + 1;
    std::vector<int32_t> ys;
    if (needs_residual) ys = v.candidate_tokens[static_cast<size_t>(n)];
    std::vector<float> q_ys;
    if (K > 0) {
      const AddElapsedOnExit truncate_time(&times.truncate);
      // Only a Truncate that must answer a query (q_r(y) for the residual candidates) is a call
      // of its own; dropping the rejected drafts rides on each worker's next Draft or Verify.
      const int64_t draft_keep = std::min(s.draft_cached, len_old + n);
      if (needs_residual) {
        absl::StatusOr<TruncateResult> tr = draft.Truncate(s.id, draft_keep, r_step, ys);
        if (!tr.ok()) {
          st.status = tr.status();
          continue;
        }
        s.draft_cached = tr->cached_len;
        s.draft_tail = false;
        q_ys = std::move(tr->q_probs);
      } else if (draft_keep < s.draft_cached) {
        s.draft_cached = draft_keep;
        s.draft_tail = true;
      }
      const int64_t target_keep = std::min(s.target_cached, len_old + n);
      if (target_keep < s.target_cached) {
        s.target_cached = target_keep;
        s.target_tail = true;
      }
    }

    int32_t next = v.bonus_token;  // n == K (incl. K == 0): the bonus / plain sampled token
    if (n < K) {
      const uint32_t pos_r = ev.position + static_cast<uint32_t>(n);
      if (greedy) {
        next = v.argmax[static_cast<size_t>(n)];
      } else if (std::optional<int32_t> c =
                     ChooseCandidate(s.seed, s.sample, pos_r, ys,
                                     v.candidate_probs[static_cast<size_t>(n)], q_ys)) {
        next = *c;
      } else {
        st.used_read_rows = true;
        absl::StatusOr<ProbRow> p_row = target.ReadRow(s.id, r_step);
        absl::StatusOr<ProbRow> q_row = draft.ReadRow(s.id, r_step);
        if (!p_row.ok() || !q_row.ok()) {
          st.status = !p_row.ok() ? p_row.status() : q_row.status();
          continue;
        }
        const int64_t vocab = p_row->dense()   ? static_cast<int64_t>(p_row->probs.size())
                              : q_row->dense() ? static_cast<int64_t>(q_row->probs.size())
                                               : 0;
        int64_t v_size = vocab;
        if (v_size == 0) {
          // Both sparse: the vocabulary only needs to cover their ids.
          for (const int32_t id : p_row->ids) v_size = std::max<int64_t>(v_size, id + 1);
          for (const int32_t id : q_row->ids) v_size = std::max<int64_t>(v_size, id + 1);
        }
        absl::StatusOr<int32_t> t = SampleResidual(s.seed, s.sample, pos_r, *p_row, *q_row, v_size);
        if (!t.ok()) {
          st.status = t.status();
          continue;
        }
        next = *t;
      }
    }
    appended.push_back(next);
    if (s.logprobs.mode != LogprobsMode::kOff) {
      absl::StatusOr<std::vector<TokenLogprobs>> lps =
          EmittedLogprobs(target, s.id, v, appended, K);
      if (!lps.ok()) {
        st.status = lps.status();
        continue;
      }
      st.logprobs = *std::move(lps);
    }
    s.tokens.insert(s.tokens.end(), appended.begin(), appended.end());
    st.appended = std::move(appended);
  }
  times.accept = absl::Now() - accept_start - times.truncate;
  return stats;
}

}  // namespace specd
