// One speculation round for a batch of running sequences (DESIGN.md, "One speculation round"):
// Draft on the draft worker, Verify on the target worker, accept/reject here, Truncate both, and
// append the accepted tokens plus the correction or bonus token. A model-drafted sequence's first
// token is the target's alone: until it has one, the draft only reads the prompt.
//
// Chunked prefill: a worker feeds at most `prefill_chunk` catch-up tokens of a sequence per round
// beyond what its prefix cache holds. A sequence whose catch-up is longer spends the round
// prefilling on that worker: it draws nothing and appends nothing until both workers have its
// whole prompt, while the other sequences of the batch decode as usual. Each worker's pass
// budget may cut a round's chunks shorter, or defer a sequence to the next round (pass_budget.h).
#ifndef SPECD_SERVICES_COORDINATOR_SPECULATION_ROUND_H_
#define SPECD_SERVICES_COORDINATOR_SPECULATION_ROUND_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "base/sampling_params.h"
#include "services/coordinator/egag.h"
#include "services/coordinator/ngram_proposer.h"
#include "services/coordinator/worker_api.h"

namespace specd {

// Who proposes a sequence's drafts.
enum class DraftMethod {
  kModel,  // the draft worker: a chain of K sampled drafts, or a tree (SpeculativeSequence::tree)
  kNgram,  // prompt lookup by the coordinator itself (ngram_proposer.h); no draft worker
};

// Classifier-free guidance for one sequence: its companion on the target (and, when the draft is
// guided too, on the draft) holds u = the unconditional prompt followed by x's generated tokens.
// The companion is fed, truncated, released and replayed with its sequence; its tokens are never
// stored, since x determines them.
struct Guidance {
  float scale = 1.0f;  // s: the target's p (and a guided draft's q) is softmax-of u + s (c - u)
  std::vector<int32_t> uncond_prompt;
  SeqId companion = 0;       // the companion's id, on both workers
  bool draft = false;        // the draft is guided too, with its own companion
  int64_t draft_cached = 0;  // the companion's cached lengths, as for the sequence
  int64_t target_cached = 0;
};

// An emitted token's log-probability under the target (never the draft), and its position's
// top alternatives, as LogprobsMode defines them.
struct TokenLogprobs {
  float logprob = 0.0f;
  std::vector<int32_t> top_ids;  // by (logprob desc, id asc)
  std::vector<float> top_logprobs;
};

// The coordinator's record of one running sequence: the committed tokens x are the truth;
// the workers' cached lengths are what the coordinator believes each worker holds.
struct SpeculativeSequence {
  SeqId id = 0;
  std::vector<int32_t> tokens;  // x: prompt + generated
  int64_t prompt_len = 0;
  SamplingParams sampling;
  std::vector<TokenBias> logit_bias;  // ascending tokens; sent with every Draft and Verify
  uint64_t seed = 0;
  int32_t num_speculative_tokens = 4;  // K requested; 0 = plain decoding
  // The length of x at which the request has all the tokens it asked for (prompt +
  // max_new_tokens): drafting past it would be wasted work and skew the acceptance figures.
  int64_t done_len = std::numeric_limits<int64_t>::max();
  DraftSampling draft_sampling = DraftSampling::kProbabilistic;
  DraftMethod draft_method = DraftMethod::kModel;
  NgramOptions ngram;
  // kNgram: drafts are looked up in this expected output instead of in x (ProposeFromPrediction).
  std::vector<int32_t> prediction;
  TreeShape tree;              // kModel only: branching 0 drafts one chain
  EgagState egag;              // kModel chains only
  int32_t num_candidates = 4;  // M
  uint32_t sample = 0;         // the completion number (DESIGN.md, "Randomness")
  LogprobsRequest logprobs;    // what the emitted tokens report
  // Prompt logprobs (OpenAI's echo with logprobs, vLLM's prompt_logprobs), when the mode is not
  // kOff: before anything is drafted, the target verifies the prompt's own tokens as a forced
  // chain of up to kMaxSpeculativeTokens per round, each round feeding only the last scored token
  // again as its catch-up, and reports each token's logprob at its position. prompt_scores holds
  // positions 1..scored_len - 1 (position 0 has no context); a target that lost them (a restart)
  // scores again from what it still holds.
  LogprobsRequest prompt_logprobs;
  int64_t scored_len = 1;
  std::vector<TokenLogprobs> prompt_scores;
  bool prompt_scored = false;  // reported in RoundStats::prompt_logprobs
  int64_t draft_cached = 0;
  int64_t target_cached = 0;
  // The worker may still hold rejected drafts past *_cached: a Truncate that needed no answer
  // is folded into the worker's next Draft or Verify call (drop_tail), saving an RPC per round.
  bool draft_tail = false;
  bool target_tail = false;
  // After a tree round, the accepted branch still has to be moved into place on the worker;
  // it travels with the worker's next Draft or Verify, before drop_tail. While one is pending,
  // *_cached counts the branch as if it were in place.
  KvCompaction draft_compact;
  KvCompaction target_compact;
  // Consecutive rounds the per-pass token budget left this decoding stream out: it goes first in
  // the next round's plan (pass_budget.h).
  int32_t rounds_left_out = 0;

  // Classifier-free guidance, when asked for: never with a tree (the request is refused), and
  // with prompt lookup only on the target (nothing is drafted by a model).
  std::optional<Guidance> guidance;

  bool uses_draft_worker() const { return draft_method == DraftMethod::kModel; }
  // The target is still scoring the prompt: the sequence draws nothing this round.
  bool scoring() const {
    return prompt_logprobs.mode != LogprobsMode::kOff && !prompt_scored && scored_len < prompt_len;
  }
  // What a worker holds is no longer known (it restarted, or the sequence was released there):
  // the sequence replays from `len` tokens, with no pending compaction, and a guided sequence's
  // companion there from the same generated tokens (from 0 when `len` is 0).
  void ResetDraftCache(int64_t len);
  void ResetTargetCache(int64_t len);

  // The companion's length when x has `len` tokens (the same generated tokens after another
  // prompt); `len` is at least prompt_len - 1. 0 without guidance.
  int64_t CompanionLen(int64_t len) const;
  // u[from:], the companion's catch-up from `from`.
  std::vector<int32_t> CompanionCatchUp(int64_t from) const;
  // The longer of x and u: what max_seq_len bounds.
  int64_t LongestLen() const;
};

struct RoundStats {
  int32_t drafted = 0;                  // K used this round: drafts, or a tree's depth
  int32_t accepted = 0;                 // n
  std::vector<int32_t> appended;        // tokens committed this round (n accepted + 1)
  std::vector<TokenLogprobs> logprobs;  // aligned with appended, when the sequence asks
  // Set once, in the round in which the sequence's prompt logprobs became complete: positions
  // 1..prompt_len - 1 (empty for a one-token prompt).
  std::optional<std::vector<TokenLogprobs>> prompt_logprobs;
  bool used_read_rows = false;
  int32_t tree_nodes = 0;               // nodes the target verified, for a tree
  int32_t later_children_accepted = 0;  // tree: accepted children that were not the first tried
  bool entropy_stopped = false;         // EGAG stopped the draft before the round's K
  // Only prefill chunks were fed: nothing was drawn, drafted counts 0, appended is empty.
  bool prefilling = false;
  // The pass budget left no room: nothing was sent for the sequence this round.
  bool deferred = false;
  absl::Status status;
};

// Wall time of a round's phases, for metrics. Accept covers accept/reject and the choice of the
// correction token (ReadRows included); truncate covers both workers' Truncate calls.
struct RoundPhaseTimes {
  absl::Duration draft;
  absl::Duration verify;
  absl::Duration accept;
  absl::Duration truncate;
  // The workers' own forward-pass times inside draft and verify (the rest of those phases is RPC
  // and queueing), and the whole round's wall time: the benchmark's T_d, T_v(K) and overhead.
  absl::Duration draft_forward;
  int32_t draft_steps = 0;
  absl::Duration verify_forward;
  int64_t verify_tokens = 0;  // tokens sent to the target: catch-up (>= 1, up to a chunk) + drafts
  absl::Duration round;
};

struct RoundOptions {
  int64_t max_seq_len = 0;                 // the smaller of the workers' limits
  RoundPhaseTimes* phase_times = nullptr;  // when set, receives this round's phase times
  // Catch-up tokens a worker feeds per sequence and round beyond its prefix cache; 0 = all.
  int64_t prefill_chunk = 0;
  // Each worker's per-pass token budget (InfoResponse.max_pass_tokens; pass_budget.h); 0 = none.
  int64_t draft_pass_tokens = 0;
  int64_t target_pass_tokens = 0;
};

// Runs one round for `batch`, appending to each sequence's tokens. Per-sequence failures land in
// that sequence's RoundStats; a failed call to a worker fails every sequence that needed it.
std::vector<RoundStats> RunSpeculationRound(WorkerApi& draft, WorkerApi& target,
                                            std::span<SpeculativeSequence* const> batch,
                                            const RoundOptions& options);

// The K a sequence can use this round. A round appends up to K + 1 tokens, so near the end (of
// max_seq_len for x or a guided sequence's companion, or of the tokens the request still needs) K
// shrinks to what can still be used, and for the last token decoding falls back to K = 0. With
// EGAG it is the request's γ.
int32_t EffectiveK(const SpeculativeSequence& s, int64_t max_seq_len);

// Target KV tokens a round with K may add to the sequence: K drafts, or a tree's nodes.
int32_t VerifiedDrafts(const SpeculativeSequence& s, int32_t k);

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_SPECULATION_ROUND_H_
