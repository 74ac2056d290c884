#include "services/coordinator/speculation_round.h"

#include <algorithm>
#include <future>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/protocol/draft_tree.h"
#include "services/coordinator/accept_reject.h"
#include "services/coordinator/pass_budget.h"
#include "services/coordinator/tree_accept.h"

namespace specd {

void SpeculativeSequence::ResetDraftCache(int64_t len) {
  draft_cached = len;
  draft_tail = false;
  draft_compact = KvCompaction();
  if (guidance.has_value()) guidance->draft_cached = len == 0 ? 0 : CompanionLen(len);
}

void SpeculativeSequence::ResetTargetCache(int64_t len) {
  target_cached = len;
  target_tail = false;
  target_compact = KvCompaction();
  if (guidance.has_value()) guidance->target_cached = len == 0 ? 0 : CompanionLen(len);
}

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
  const int32_t k = s.egag.DraftLength(s.num_speculative_tokens);
  return static_cast<int32_t>(std::clamp<int64_t>(room, 0, k));
}

int32_t VerifiedDrafts(const SpeculativeSequence& s, int32_t k) {
  if (k <= 0) return 0;
  return s.draft_method == DraftMethod::kModel && s.tree.is_tree() ? TreeNodeCount(s.tree, k) : k;
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

// How a sequence's drafts are judged.
enum class Judge {
  kNone,           // K = 0: plain decoding
  kSampled,        // a chain sampled from the draft's q (accept_reject.h)
  kDeterministic,  // one-hot proposals: a prompt-lookup chain or a draft tree (tree_accept.h)
  kForced,         // the prompt's own next tokens, scored and kept whatever the target says
};

// One sequence's proposal for the round: what was drafted and how it is judged.
struct Proposal {
  Judge judge = Judge::kNone;
  int32_t k = 0;                 // the K asked for (drafts, or a tree's depth)
  std::vector<int32_t> tokens;   // the drafts, or a tree's nodes in BFS order
  std::vector<int32_t> parents;  // a tree's parents; empty for a chain
  std::vector<float> q;          // q_k(t_k) of a sampled chain
  std::vector<float> entropies;  // EGAG: each step's normalized entropy
  bool tree() const { return !parents.empty(); }
  int32_t depth() const { return tree() ? k : static_cast<int32_t>(tokens.size()); }
};

// One verified sequence on its way from the target's evidence to the tokens it appends.
struct Resolution {
  size_t i = 0;  // index in the batch
  const VerifySequenceResult* v = nullptr;
  uint32_t position = 0;        // absolute position of the first draft
  int32_t n = 0;                // drafts accepted (the path's length for a tree)
  std::vector<int32_t> path;    // deterministic proposals: the accepted nodes
  TreeWalk walk;                // deterministic proposals: where the walk stopped
  bool needs_residual = false;  // a sampled draft was rejected: the draft answers q_r(y)
  std::vector<float> q_ys;      // q_r(y) of the residual candidates
  int32_t next = 0;             // the correction or bonus token
  bool used_read_rows = false;
  bool failed = false;

  // The target row the j-th emitted token was drawn from: a chain's j, a tree's (the accepted
  // path's node j - 1) + 1.
  int32_t RowOf(size_t j) const {
    return j == 0 || path.empty() ? static_cast<int32_t>(j) : path[j - 1] + 1;
  }
};

Judge JudgeFor(const SpeculativeSequence& s, int32_t k) {
  if (k == 0) return Judge::kNone;
  if (s.draft_method == DraftMethod::kNgram || s.tree.is_tree()) return Judge::kDeterministic;
  return Judge::kSampled;
}

// Whether this round decides the sequence's first token: the target alone does, as in plain
// decoding, while a model draft only reads the prompt. Drafting too would make the user wait for
// K draft steps before the first token.
bool FirstTokenRound(const SpeculativeSequence& s, int32_t k) {
  return k > 0 && s.uses_draft_worker() && static_cast<int64_t>(s.tokens.size()) == s.prompt_len;
}

// The draft keeps at most `keep` tokens of x (and a guided draft's companion the same generated
// tokens); anything past that leaves its KV with its next call (drop_tail).
void CutDraft(SpeculativeSequence& s, int64_t keep) {
  if (!s.uses_draft_worker()) return;
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

// Fails `stats[i]` unless it failed already.
void Fail(RoundStats& stats, absl::Status status) {
  if (stats.status.ok()) stats.status = std::move(status);
}

// Before anything indexes a Verify result: the shapes its request implies (worker_verify.cc), and
// the position the coordinator's own length implies. A worker of another build, or a broken one,
// then fails its sequence with a message, never the coordinator (nor the batch's other sequences).
absl::Status CheckVerifyResult(const SpeculativeSequence& s, const Proposal& prop,
                               const VerifySequenceResult& v) {
  const size_t n = prop.tokens.size();
  const std::vector<bool> has_child = RowsWithChildren(n, prop.parents);
  const size_t with_child =
      static_cast<size_t>(std::count(has_child.begin(), has_child.end(), true));
  const auto mismatch = [&](const char* what, size_t got, size_t want) {
    return absl::InternalError(absl::StrCat("the target worker returned ", got, " ", what,
                                            " for sequence ", s.id, ", whose round needs ", want));
  };
  if (v.argmax.size() != n + 1) return mismatch("argmax rows", v.argmax.size(), n + 1);
  if (v.p_draft.size() != n) return mismatch("draft probabilities", v.p_draft.size(), n);
  if (static_cast<int64_t>(v.position) != static_cast<int64_t>(s.tokens.size())) {
    return absl::InternalError(absl::StrCat("the target worker verified sequence ", s.id,
                                            " at position ", v.position, ", not at its length ",
                                            s.tokens.size()));
  }
  if (s.sampling.greedy()) return absl::OkStatus();
  if (prop.tree() && v.leaf_bonus.size() != n + 1 - with_child) {
    return mismatch("leaf bonus tokens", v.leaf_bonus.size(), n + 1 - with_child);
  }
  // M candidates per row with a child; M = 0 leaves one empty list per draft.
  const size_t m = static_cast<size_t>(s.num_candidates);
  const size_t rows = m > 0 ? with_child : n;
  if (v.candidate_tokens.size() != rows) {
    return mismatch("candidate rows", v.candidate_tokens.size(), rows);
  }
  if (v.candidate_probs.size() != rows) {
    return mismatch("candidate probability rows", v.candidate_probs.size(), rows);
  }
  for (size_t r = 0; r < rows; ++r) {
    if (v.candidate_tokens[r].size() != m) {
      return mismatch("candidates in a row", v.candidate_tokens[r].size(), m);
    }
    if (v.candidate_probs[r].size() != m) {
      return mismatch("candidate probabilities in a row", v.candidate_probs[r].size(), m);
    }
  }
  return absl::OkStatus();
}

// The exact residual fallback for sampled chains none of whose candidates passed: both workers'
// kept rows at the rejection step, fetched for the whole batch with one call per worker, the two
// calls at once. Deterministic proposals need only the target's row.
void ResolveByReadRows(WorkerApi& draft, WorkerApi& target,
                       std::span<SpeculativeSequence* const> batch,
                       std::span<const Proposal> proposals, std::span<Resolution* const> fallback,
                       std::vector<RoundStats>& stats) {
  std::vector<RowQuery> p_rows_wanted;
  std::vector<RowQuery> q_rows_wanted;
  for (const Resolution* res : fallback) {
    const int32_t row = proposals[res->i].judge == Judge::kSampled ? res->n : res->walk.row;
    p_rows_wanted.push_back({batch[res->i]->id, row + 1});
    if (proposals[res->i].judge == Judge::kSampled) {
      q_rows_wanted.push_back({batch[res->i]->id, res->n + 1});
    }
  }
  std::future<absl::StatusOr<std::vector<SequenceAnswer<ProbRow>>>> q_future;
  if (!q_rows_wanted.empty()) {
    q_future = std::async(std::launch::async,
                          [&draft, &q_rows_wanted] { return draft.ReadRows(q_rows_wanted); });
  }
  absl::StatusOr<std::vector<SequenceAnswer<ProbRow>>> p_rows = target.ReadRows(p_rows_wanted);
  absl::StatusOr<std::vector<SequenceAnswer<ProbRow>>> q_rows =
      q_future.valid() ? q_future.get() : std::vector<SequenceAnswer<ProbRow>>();
  size_t q_at = 0;
  for (size_t j = 0; j < fallback.size(); ++j) {
    Resolution& res = *fallback[j];
    const SpeculativeSequence& s = *batch[res.i];
    const bool sampled = proposals[res.i].judge == Judge::kSampled;
    res.used_read_rows = true;
    absl::Status status = p_rows.status();
    if (status.ok()) status = (*p_rows)[j].value.status();
    if (status.ok() && sampled) {
      status = !q_rows.ok() ? q_rows.status() : (*q_rows)[q_at].value.status();
    }
    absl::StatusOr<int32_t> t = absl::UnknownError("unreachable");
    if (!status.ok()) {
      t = status;
    } else if (sampled) {
      const ProbRow& p = *(*p_rows)[j].value;
      const ProbRow& q = *(*q_rows)[q_at].value;
      int64_t vocab = p.dense()   ? static_cast<int64_t>(p.probs.size())
                      : q.dense() ? static_cast<int64_t>(q.probs.size())
                                  : 0;
      if (vocab == 0) {
        // Both sparse: the vocabulary only needs to cover their ids.
        for (const int32_t id : p.ids) vocab = std::max<int64_t>(vocab, id + 1);
        for (const int32_t id : q.ids) vocab = std::max<int64_t>(vocab, id + 1);
      }
      t = SampleResidual(s.seed, s.sample, res.position + static_cast<uint32_t>(res.n), p, q,
                         vocab);
    } else {
      const ProbRow& p = *(*p_rows)[j].value;
      const Proposal& prop = proposals[res.i];
      std::vector<int32_t> children;
      int64_t vocab = p.dense() ? static_cast<int64_t>(p.probs.size()) : 0;
      for (const int32_t id : p.ids) vocab = std::max<int64_t>(vocab, id + 1);
      for (const int32_t c : res.walk.children) {
        children.push_back(prop.tokens[static_cast<size_t>(c)]);
        vocab = std::max<int64_t>(vocab, children.back() + 1);
      }
      t = SampleExcluding(s.seed, s.sample, res.position + static_cast<uint32_t>(res.n), p,
                          children, vocab);
    }
    if (sampled) ++q_at;
    if (t.ok()) {
      res.next = *t;
      continue;
    }
    Fail(stats[res.i], t.status());
    res.failed = true;
  }
}

enum class Worker { kDraft, kTarget };

// What every Draft and Verify request says of a sequence: what the coordinator believes `worker`
// holds (its cached length, a tail to drop, a tree branch to move into place), the catch-up
// x[cached:catch_up_end] and how the sequence samples.
void DescribeSequence(const SpeculativeSequence& s, Worker worker, int64_t catch_up_end,
                      int64_t max_prefill_tokens, SequenceRequest& r) {
  const bool target = worker == Worker::kTarget;
  const int64_t cached = target ? s.target_cached : s.draft_cached;
  r.seq = s.id;
  r.catch_up.assign(s.tokens.begin() + cached, s.tokens.begin() + catch_up_end);
  r.expected_cached_len = cached;
  r.drop_tail = target ? s.target_tail : s.draft_tail;
  r.compact = target ? s.target_compact : s.draft_compact;
  r.sampling = s.sampling;
  r.logit_bias = s.logit_bias;
  r.seed = s.seed;
  r.prompt_len = s.prompt_len;
  r.sample = s.sample;
  r.max_prefill_tokens = max_prefill_tokens;
}

// Prompt tokens a scoring sequence has the target score this round: a chain's worth at most, and
// within the target's pass budget beside the one catch-up token.
int32_t ScoreChunk(const SpeculativeSequence& s, const RoundOptions& options) {
  int64_t c = std::min<int64_t>(s.prompt_len - s.scored_len, kMaxSpeculativeTokens);
  if (options.target_pass_tokens > 1) c = std::min(c, options.target_pass_tokens - 1);
  return static_cast<int32_t>(c);
}

// Before a round: a scoring sequence whose target lost part of the scored prefix (a restart, a
// preemption) scores again from what the target holds, so that its catch-up stays one token; one
// with nothing left to score reports its prompt logprobs and decodes from this round on.
void PrepareScoring(SpeculativeSequence& s, RoundStats& stats) {
  if (s.prompt_logprobs.mode == LogprobsMode::kOff || s.prompt_scored) return;
  if (s.target_cached < s.scored_len - 1) {
    s.scored_len = std::max<int64_t>(1, s.target_cached + 1);
    s.prompt_scores.resize(static_cast<size_t>(s.scored_len - 1));
  }
  if (s.scored_len < s.prompt_len) return;
  s.prompt_scored = true;
  stats.prompt_logprobs = std::move(s.prompt_scores);
  s.prompt_scores.clear();
}

// A forced chain's row j holds the logprob of prompt token scored_len + j as the row's child.
absl::Status RecordPromptScores(SpeculativeSequence& s, const Proposal& prop,
                                const VerifySequenceResult& v) {
  const int64_t c = static_cast<int64_t>(prop.tokens.size());
  if (v.cached_len != s.scored_len + c || static_cast<int64_t>(v.logprobs.size()) < c) {
    return absl::InternalError(absl::StrCat("the target worker scored prompt tokens ", s.scored_len,
                                            "..", s.scored_len + c - 1, " of sequence ", s.id,
                                            " with ", v.logprobs.size(), " logprob rows and ",
                                            v.cached_len, " tokens cached"));
  }
  for (size_t j = 0; j < prop.tokens.size(); ++j) {
    const PositionLogprobs& p = v.logprobs[j];
    const auto it = std::find(p.token_ids.begin(), p.token_ids.end(), prop.tokens[j]);
    if (it == p.token_ids.end() || p.token_logprobs.size() != p.token_ids.size()) {
      return absl::InternalError(absl::StrCat("the target worker did not report prompt token ",
                                              s.scored_len + static_cast<int64_t>(j),
                                              " of sequence ", s.id, " in its row"));
    }
    s.prompt_scores.push_back({p.token_logprobs[static_cast<size_t>(it - p.token_ids.begin())],
                               p.top_ids, p.top_logprobs});
  }
  s.scored_len += c;
  // The last scored token is fed again as the next round's catch-up: the row after it is the one
  // that round needs, and only a fed token's row is computed.
  s.target_cached = s.scored_len - 1;
  s.target_tail = true;
  return absl::OkStatus();
}

// What the sequence's round would feed each worker without a pass budget.
SequenceFeeds FeedsOf(const SpeculativeSequence& s, const RoundOptions& options) {
  if (s.scoring()) {
    SequenceFeeds f;
    f.target.called = true;
    f.target.catch_up = s.scored_len - s.target_cached;
    f.target.drafts = ScoreChunk(s, options);
    f.rounds_left_out = s.rounds_left_out;
    return f;
  }
  const int64_t max_seq_len = options.max_seq_len;
  const int32_t k = EffectiveK(s, max_seq_len);
  const int64_t len = static_cast<int64_t>(s.tokens.size());
  const int32_t drafts = FirstTokenRound(s, k) ? 0 : VerifiedDrafts(s, k);
  SequenceFeeds f;
  f.draft.called = JudgeFor(s, k) != Judge::kNone && s.uses_draft_worker();
  f.draft.catch_up = len - s.draft_cached;
  f.draft.drafts = drafts;
  f.target.called = true;
  f.target.catch_up = len - s.target_cached;
  f.target.drafts = drafts;
  f.rounds_left_out = s.rounds_left_out;
  if (s.guidance.has_value()) {
    f.target.companion = true;
    f.target.companion_catch_up = s.CompanionLen(len) - s.guidance->target_cached;
    f.draft.companion = s.guidance->draft;
    f.draft.companion_catch_up = s.CompanionLen(len) - s.guidance->draft_cached;
  }
  return f;
}

// Step 1: every drafting sequence's proposal. Prompt lookup happens here, in the coordinator;
// model drafts come from one Draft call for the whole batch.
// Sequences that wait for the next round (the pass budget) are left out; those that may only
// prefill this round feed the draft a chunk and draft nothing.
std::vector<Proposal> Propose(WorkerApi& draft, std::span<SpeculativeSequence* const> batch,
                              std::span<const FeedPlan> plans, const RoundOptions& options,
                              std::vector<RoundStats>& stats, RoundPhaseTimes& times) {
  std::vector<Proposal> proposals(batch.size());
  std::vector<DraftSequenceRequest> draft_reqs;
  absl::flat_hash_map<SeqId, size_t> index;
  for (size_t i = 0; i < batch.size(); ++i) {
    SpeculativeSequence& s = *batch[i];
    Proposal& prop = proposals[i];
    if (stats[i].deferred) continue;
    if (s.scoring() && stats[i].status.ok()) {
      prop.judge = Judge::kForced;
      prop.k = ScoreChunk(s, options);
      prop.tokens.assign(s.tokens.begin() + s.scored_len, s.tokens.begin() + s.scored_len + prop.k);
      continue;
    }
    prop.k = stats[i].status.ok() ? EffectiveK(s, options.max_seq_len) : 0;
    prop.judge = JudgeFor(s, prop.k);
    if (prop.judge == Judge::kNone) continue;
    const bool prefill_only = plans[i].action == FeedPlan::Action::kPrefillOnly;
    if (s.draft_method == DraftMethod::kNgram) {
      if (prefill_only) {
        prop = Proposal();  // the target only prefills
        continue;
      }
      prop.tokens =
          s.prediction.empty()
              ? ProposeNgram(s.tokens, prop.k, s.ngram)
              : ProposeFromPrediction(
                    std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(s.prompt_len)),
                    s.prediction, prop.k, s.ngram);
      prop.k = static_cast<int32_t>(prop.tokens.size());
      if (prop.k == 0) prop.judge = Judge::kNone;  // no match: this round is plain decoding
      continue;
    }
    index[s.id] = i;
    DraftSequenceRequest r;
    DescribeSequence(s, Worker::kDraft, static_cast<int64_t>(s.tokens.size()),
                     plans[i].draft_prefill_limit, r);
    r.num_speculative_tokens = prop.k;
    r.draft_sampling = s.draft_sampling;
    r.prefill_only = prefill_only || FirstTokenRound(s, prop.k);
    if (s.tree.is_tree()) {
      r.tree = s.tree;
      r.tree.depth = std::min(s.tree.depth, prop.k);
    }
    if (s.egag.enabled && !s.tree.is_tree()) {
      r.entropy_stop.enabled = true;
      r.entropy_stop.min_tokens = s.egag.options.min_tokens;
      r.entropy_stop.threshold = static_cast<float>(s.egag.options.threshold);
    }
    if (s.guidance.has_value() && s.guidance->draft) {
      r.companion =
          CompanionRequest{s.guidance->companion, s.guidance->scale,
                           s.CompanionCatchUp(s.guidance->draft_cached), s.guidance->draft_cached};
    }
    draft_reqs.push_back(std::move(r));
  }
  if (draft_reqs.empty()) return proposals;

  const absl::Time draft_start = absl::Now();
  absl::StatusOr<std::vector<SequenceOutcome>> outcomes =
      draft.Draft(draft_reqs, [&](const DraftStep& step) {
        times.draft_forward += absl::Nanoseconds(step.forward_ns);
        if (step.forward_ns > 0) ++times.draft_steps;
        for (const DraftToken& t : step.tokens) {
          const auto it = index.find(t.seq);
          if (it == index.end()) continue;
          Proposal& prop = proposals[it->second];
          prop.tokens.push_back(t.token);
          prop.q.push_back(t.q_prob);
          prop.entropies.push_back(t.entropy);
        }
      });
  times.draft = absl::Now() - draft_start;
  for (const DraftSequenceRequest& r : draft_reqs) {
    const size_t i = index[r.seq];
    SpeculativeSequence& s = *batch[i];
    Proposal& prop = proposals[i];
    if (!outcomes.ok()) {
      Fail(stats[i], outcomes.status());
      continue;
    }
    for (const SequenceOutcome& o : *outcomes) {
      if (o.seq != r.seq) continue;
      if (!o.status.ok()) Fail(stats[i], o.status);
      s.draft_cached = o.cached_len;
      if (r.companion.has_value()) s.guidance->draft_cached = o.companion_cached_len;
      if (o.status.ok()) {
        s.draft_tail = false;
        s.draft_compact = KvCompaction();
        stats[i].prefilling = o.prefilling;
      }
    }
    if (!stats[i].status.ok()) continue;
    if (FirstTokenRound(s, r.num_speculative_tokens) &&
        plans[i].action != FeedPlan::Action::kPrefillOnly) {
      // The first token's round: the draft read the prompt, as far as a worker reads before the
      // last token (the next round feeds it with the first token). Unless it is still a chunk
      // short of that, the target decides the first token alone, as at K = 0.
      stats[i].prefilling = s.draft_cached < static_cast<int64_t>(s.tokens.size()) - 1;
      prop = Proposal();
      continue;
    }
    if (stats[i].prefilling) {
      // Only a prefill chunk was fed: nothing was drafted, and the target only prefills too.
      prop = Proposal();
      continue;
    }
    const int32_t got = static_cast<int32_t>(prop.tokens.size());
    if (r.tree.is_tree()) {
      prop.parents = TreeParents(r.tree, prop.k);
      if (got != static_cast<int32_t>(prop.parents.size())) {
        Fail(stats[i], absl::InternalError(absl::StrCat("draft worker returned ", got, " of ",
                                                        prop.parents.size(),
                                                        " tree nodes for sequence ", r.seq)));
      }
      continue;
    }
    // EGAG may stop a chain early, never before its minimum.
    const int32_t least =
        r.entropy_stop.enabled ? std::min(prop.k, r.entropy_stop.min_tokens) : prop.k;
    if (got < least || got > prop.k) {
      Fail(stats[i], absl::InternalError(absl::StrCat("draft worker returned ", got, " of ", prop.k,
                                                      " tokens for sequence ", r.seq)));
      continue;
    }
    stats[i].entropy_stopped = got < prop.k;
    prop.k = got;
  }
  return proposals;
}

// The target's logprobs of the tokens each sequence emits: the values Verify reported for the row
// each was drawn from (a chain's j-th token: row j; a tree's: the row of the node before it on the
// accepted path), and for the residual fallback's tokens (none of those) one QueryLogprobs call
// for the whole batch. The draft's numbers never enter.
void AddEmittedLogprobs(WorkerApi& target, std::span<SpeculativeSequence* const> batch,
                        std::span<Resolution> resolutions, std::vector<RoundStats>& stats) {
  std::vector<LogprobQuery> queries;
  std::vector<std::pair<Resolution*, size_t>> asked;  // (sequence, emitted index) per query
  for (Resolution& res : resolutions) {
    const SpeculativeSequence& s = *batch[res.i];
    if (res.failed || s.logprobs.mode == LogprobsMode::kOff) continue;
    RoundStats& st = stats[res.i];
    const VerifySequenceResult& v = *res.v;
    const size_t last_row = static_cast<size_t>(res.RowOf(st.appended.size() - 1));
    if (v.logprobs.size() <= last_row) {
      st.status = absl::InternalError(absl::StrCat("the target worker returned logprobs for ",
                                                   v.logprobs.size(), " rows of sequence ", s.id,
                                                   ", which emits from row ", last_row));
      res.failed = true;
      continue;
    }
    st.logprobs.resize(st.appended.size());
    for (size_t j = 0; j < st.appended.size(); ++j) {
      const int32_t row = res.RowOf(j);
      const PositionLogprobs& p = v.logprobs[static_cast<size_t>(row)];
      TokenLogprobs& t = st.logprobs[j];
      t.top_ids = p.top_ids;
      t.top_logprobs = p.top_logprobs;
      const auto it = std::find(p.token_ids.begin(), p.token_ids.end(), st.appended[j]);
      if (it != p.token_ids.end() && p.token_logprobs.size() == p.token_ids.size()) {
        t.logprob = p.token_logprobs[static_cast<size_t>(it - p.token_ids.begin())];
      } else {
        queries.push_back({s.id, row + 1, {st.appended[j]}});
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
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i]->LongestLen() >= options.max_seq_len) {
      stats[i].status = absl::OutOfRangeError(
          absl::StrCat("sequence ", batch[i]->id, " is at max_seq_len ", options.max_seq_len));
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) PrepareScoring(*batch[i], stats[i]);
  std::vector<SequenceFeeds> feeds(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    if (stats[i].status.ok()) feeds[i] = FeedsOf(*batch[i], options);
  }
  const std::vector<FeedPlan> plans = PlanFeeds(
      feeds, options.prefill_chunk, options.draft_pass_tokens, options.target_pass_tokens);
  for (size_t i = 0; i < batch.size(); ++i) {
    stats[i].deferred = plans[i].action == FeedPlan::Action::kWait;
    batch[i]->rounds_left_out = RoundsLeftOut(feeds[i], plans[i]);
  }

  // 1. Draft: model drafts from the draft worker, prompt lookup here.
  const std::vector<Proposal> proposals = Propose(draft, batch, plans, options, stats, times);
  for (size_t i = 0; i < batch.size(); ++i) {
    // A forced chain is the prompt being read, not drafts.
    stats[i].drafted = proposals[i].judge == Judge::kForced ? 0 : proposals[i].depth();
    stats[i].tree_nodes =
        proposals[i].tree() ? static_cast<int32_t>(proposals[i].tokens.size()) : 0;
  }

  // 2. Verify every healthy sequence in one call.
  std::vector<VerifySequenceRequest> verify_reqs;
  absl::flat_hash_map<SeqId, size_t> index;
  for (size_t i = 0; i < batch.size(); ++i) {
    index[batch[i]->id] = i;
    if (!stats[i].status.ok() || stats[i].deferred) continue;
    const SpeculativeSequence& s = *batch[i];
    VerifySequenceRequest r;
    const bool forced = proposals[i].judge == Judge::kForced;
    DescribeSequence(s, Worker::kTarget,
                     forced ? s.scored_len : static_cast<int64_t>(s.tokens.size()),
                     plans[i].target_prefill_limit, r);
    // The draft is still prefilling (or the pass budget leaves room for a prefill chunk only):
    // the target may prefill too, but this round has no drafts for the sequence, so nothing may
    // be drawn for it yet.
    r.prefill_only = stats[i].prefilling || plans[i].action == FeedPlan::Action::kPrefillOnly;
    if (!r.prefill_only) {
      r.drafts = proposals[i].tokens;
      r.tree_parents = proposals[i].parents;
      r.num_candidates = s.sampling.greedy() || forced ? 0 : s.num_candidates;
      r.logprobs = forced ? s.prompt_logprobs : s.logprobs;
    }
    if (s.guidance.has_value() && !forced) {
      // Prompt lookup's drafts are verified like a model's chain: the companion is fed them too.
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
    for (const VerifySequenceRequest& r : verify_reqs) Fail(stats[index[r.seq]], verified.status());
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
        (r.max_prefill_tokens > 0 ? std::min(catch_up, r.max_prefill_tokens + 1) : catch_up) +
        static_cast<int64_t>(r.drafts.size());
  }

  // 3. Accept/reject: how many drafts each sequence keeps. Rejected drafts leave both workers'
  // KV through drop_tail on their next call (after moving a tree's accepted branch into place),
  // unless the draft must answer q_r(y) for the residual.
  const absl::Time accept_start = absl::Now();
  std::vector<Resolution> resolutions;
  resolutions.reserve(verified->size());
  for (const VerifySequenceResult& v : *verified) {
    const size_t i = index[v.seq];
    if (!v.status.ok()) {
      Fail(stats[i], v.status);
      continue;
    }
    SpeculativeSequence& s = *batch[i];
    const Proposal& prop = proposals[i];
    const int64_t len = static_cast<int64_t>(s.tokens.size());
    s.target_cached = v.cached_len;
    s.target_tail = false;
    s.target_compact = KvCompaction();
    if (s.guidance.has_value()) s.guidance->target_cached = v.companion_cached_len;
    if (v.prefilling) {
      stats[i].prefilling = true;
      stats[i].drafted = 0;
      stats[i].tree_nodes = 0;
      stats[i].entropy_stopped = false;
      // Drafts the target never judged: the draft keeps x but its last token, which its next
      // catch-up feeds again, and drops the rest (a tree's nodes included) with that call.
      CutDraft(s, len - 1);
      continue;
    }
    if (prop.judge == Judge::kForced) {
      stats[i].prefilling = true;  // nothing drawn: the prompt is still being read
      if (absl::Status st = RecordPromptScores(s, prop, v); !st.ok()) Fail(stats[i], std::move(st));
      continue;
    }
    if (absl::Status shape = CheckVerifyResult(s, prop, v); !shape.ok()) {
      Fail(stats[i], std::move(shape));
      continue;
    }
    Resolution& res = resolutions.emplace_back();
    res.i = i;
    res.v = &v;
    res.position = static_cast<uint32_t>(v.position);
    if (prop.judge == Judge::kDeterministic) {
      ProposalEvidence ev;
      ev.seed = s.seed;
      ev.sample = s.sample;
      ev.position = res.position;
      ev.tokens = prop.tokens;
      ev.parents = prop.parents;
      ev.p_node = v.p_draft;
      ev.argmax = v.argmax;
      res.walk = WalkProposal(ev, s.sampling.greedy());
      res.path = res.walk.path;
      res.n = static_cast<int32_t>(res.path.size());
      stats[i].later_children_accepted = res.walk.later_children_accepted;
    } else {
      RoundEvidence ev;
      ev.seed = s.seed;
      ev.sample = s.sample;
      ev.position = res.position;
      ev.draft_tokens = prop.tokens;
      ev.q_draft = prop.q;
      ev.p_draft = v.p_draft;
      ev.target_argmax = v.argmax;
      ev.bonus_token = v.bonus_token;
      res.n = CountAccepted(ev, s.sampling.greedy());
      res.needs_residual = res.n < prop.k && !s.sampling.greedy();
    }
    const int64_t keep = len + res.n;
    if (prop.tree()) {
      // The accepted branch moves into place, the rest of the tree goes, on each worker's next
      // call. The draft fed every node but the leaves (depth K).
      s.target_compact = {len, res.path};
      s.target_cached = keep;
      s.target_tail = true;
      const int32_t fed = std::min(res.n, prop.k - 1);
      s.draft_compact = {len, std::vector<int32_t>(res.path.begin(), res.path.begin() + fed)};
      if (s.draft_compact.empty()) s.draft_compact = KvCompaction();
      s.draft_cached = std::min(s.draft_cached, len + fed);
      s.draft_tail = true;
      continue;
    }
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
        Fail(stats[res.i], std::move(status));
        res.failed = true;
      }
    }
  }

  // 5. The correction or bonus token: the first candidate that passes, or (rarely) the residual
  // sampled from the kept rows.
  std::vector<Resolution*> fallback;
  for (Resolution& res : resolutions) {
    if (res.failed) continue;
    const SpeculativeSequence& s = *batch[res.i];
    const Proposal& prop = proposals[res.i];
    const VerifySequenceResult& v = *res.v;
    const int32_t n = res.n;
    if (prop.judge == Judge::kDeterministic) {
      const int32_t row = res.walk.row;
      if (res.walk.children.empty()) {
        // A leaf: the bonus drawn from it (for a tree, leaves are the last nodes, in order).
        const int32_t first_leaf = static_cast<int32_t>(prop.tokens.size() - v.leaf_bonus.size());
        res.next = s.sampling.greedy() ? v.argmax[static_cast<size_t>(row)]
                   : prop.tree()       ? v.leaf_bonus[static_cast<size_t>(row - 1 - first_leaf)]
                                       : v.bonus_token;
      } else if (s.sampling.greedy()) {
        res.next = v.argmax[static_cast<size_t>(row)];
      } else {
        std::vector<int32_t> children;
        for (const int32_t c : res.walk.children) {
          children.push_back(prop.tokens[static_cast<size_t>(c)]);
        }
        if (std::optional<int32_t> c =
                FirstCandidateOutside(v.candidate_tokens[static_cast<size_t>(row)], children)) {
          res.next = *c;
        } else {
          fallback.push_back(&res);
        }
      }
      continue;
    }
    res.next = v.bonus_token;  // n == K (K == 0 included): the bonus or plain sampled token
    if (n == prop.k) continue;
    if (s.sampling.greedy()) {
      res.next = v.argmax[static_cast<size_t>(n)];
    } else if (std::optional<int32_t> c =
                   ChooseCandidate(s.seed, s.sample, res.position + static_cast<uint32_t>(n),
                                   v.candidate_tokens[static_cast<size_t>(n)],
                                   v.candidate_probs[static_cast<size_t>(n)], res.q_ys)) {
      res.next = *c;
    } else {
      fallback.push_back(&res);
    }
  }
  if (!fallback.empty()) ResolveByReadRows(draft, target, batch, proposals, fallback, stats);

  // 6. The emitted tokens, and their logprobs where asked.
  for (Resolution& res : resolutions) {
    if (res.failed) continue;
    const Proposal& prop = proposals[res.i];
    RoundStats& st = stats[res.i];
    st.accepted = res.n;
    if (prop.judge == Judge::kDeterministic) {
      for (const int32_t node : res.path)
        st.appended.push_back(prop.tokens[static_cast<size_t>(node)]);
    } else {
      st.appended.assign(prop.tokens.begin(), prop.tokens.begin() + res.n);
    }
    st.appended.push_back(res.next);
    st.used_read_rows = res.used_read_rows;
  }
  AddEmittedLogprobs(target, batch, resolutions, stats);

  // 7. Append.
  for (const Resolution& res : resolutions) {
    if (res.failed) continue;
    SpeculativeSequence& s = *batch[res.i];
    const Proposal& prop = proposals[res.i];
    const RoundStats& st = stats[res.i];
    s.tokens.insert(s.tokens.end(), st.appended.begin(), st.appended.end());
    // EGAG learns only from steps whose context is now committed (egag.h).
    if (s.egag.enabled) {
      const size_t committed = std::min(prop.entropies.size(), static_cast<size_t>(res.n) + 1);
      s.egag.Observe(std::span<const float>(prop.entropies).first(committed));
    }
  }
  times.accept = absl::Now() - accept_start - times.truncate;
  return stats;
}

}  // namespace specd
