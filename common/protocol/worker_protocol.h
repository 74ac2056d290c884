// The worker protocol as C++ types (DESIGN.md, "One speculation round"): what the coordinator
// asks a draft or target worker and what it gets back. Both sides speak it: the worker runtime
// serves it, the coordinator's WorkerApi calls it, and the gRPC codec carries it over the wire.
// No engine types appear here, so the coordinator links none.
#ifndef SPECD_COMMON_PROTOCOL_WORKER_PROTOCOL_H_
#define SPECD_COMMON_PROTOCOL_WORKER_PROTOCOL_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/inverse_cdf.h"
#include "base/sampling_params.h"
#include "common/protocol/draft_tree.h"

namespace specd {

// The version of this protocol, which a worker reports in Info and a coordinator requires of
// its workers. Raise it with every change to what a message carries or means, so that a
// coordinator and workers of different releases (a half-finished rolling upgrade) refuse each
// other at connection instead of misreading each other's messages.
inline constexpr uint32_t kWorkerProtocolVersion = 1;

// A sequence's id, chosen by the coordinator and unique among the sequences a worker holds.
using SeqId = uint64_t;

enum class DraftSampling { kProbabilistic, kGreedy };

// Whole-call limits: a request over them is malformed, not merely expensive.
inline constexpr int32_t kMaxSpeculativeTokens = 64;  // K
inline constexpr int32_t kMaxCandidates = 64;         // M
inline constexpr int32_t kMaxLogprobs = 20;           // top-N alternatives (OpenAI's cap)
// The smallest per-pass token budget a worker may declare (InfoResponse.max_pass_tokens): a lone
// sequence's largest round, 1 catch-up token and 64 drafts or tree nodes, twice with a CFG
// companion, always fits.
inline constexpr int64_t kMinMaxPassTokens = 256;

// Moves the accepted branch of a sequence's last draft tree into place before anything else is
// done with the sequence: the KV of node kept_nodes[i] (BFS order, node 0 at slot tree_start)
// moves to slot tree_start + i. The tree's other nodes are then dropped by drop_tail. Empty
// kept_nodes: nothing to move.
struct KvCompaction {
  int64_t tree_start = 0;
  std::vector<int32_t> kept_nodes;  // strictly increasing, each >= its index
  bool empty() const { return kept_nodes.empty(); }
  bool operator==(const KvCompaction&) const = default;
};

// Classifier-free guidance: a guided sequence owns a companion, a sequence of the same worker
// whose text is the unconditional prompt followed by the same generated tokens. Both are fed in
// the same forward pass, and every logit row of the guided sequence becomes u + scale * (c - u)
// (Backend::CombineLogits, fp32) before its processed distribution, whose penalties read the
// guided sequence's own history. The pair is one unit: created, dropped (drop_tail), truncated,
// released and prefilled together; the companion draws nothing and keeps no rows.
struct CompanionRequest {
  SeqId seq = 0;                    // the companion's own id, unique among the worker's sequences
  float scale = 1.0f;               // s, finite
  std::vector<int32_t> catch_up;    // u[len_c:], at least its last committed token
  int64_t expected_cached_len = 0;  // len_c as the coordinator believes it; 0 creates it
  bool operator==(const CompanionRequest&) const = default;
};

// What every per-sequence request carries.
struct SequenceRequest {
  SeqId seq = 0;
  std::vector<int32_t> catch_up;    // x[len_w:]
  int64_t expected_cached_len = 0;  // len_w as the coordinator believes it; 0 creates the sequence
  SamplingParams sampling;
  // OpenAI's logit_bias, ascending tokens (base/sampling_params.h); part of the processed
  // distribution on both workers.
  std::vector<TokenBias> logit_bias;
  uint64_t seed = 0;
  int64_t prompt_len = 0;  // how much of x is prompt (for the penalties)
  // The worker may hold more than expected_cached_len tokens (the previous round's rejected
  // drafts: a Truncate folded into this call); they are dropped before anything else, after
  // `compact` has moved the accepted branch of a draft tree into place.
  bool drop_tail = false;
  // Chunked prefill: the most catch-up tokens this call may feed beyond those found in the
  // prefix cache (0 = no limit). When more are left, the worker feeds only that many and the
  // sequence comes back `prefilling`, having drafted or verified nothing.
  int64_t max_prefill_tokens = 0;
  // Feed catch-up only (within max_prefill_tokens, and never its last token) and come back
  // `prefilling`: the coordinator's round for this sequence is not ready to draw anything yet.
  bool prefill_only = false;
  // The completion number of a request that asks for several: the `sample` field of every
  // Philox counter the sequence draws from, so completions of one seed are independent.
  uint32_t sample = 0;
  KvCompaction compact;  // applied before drop_tail
  // Set for a guided sequence on this worker (always the target's; the draft's only when the
  // request guides its draft too). drop_tail drops the companion's tail as well.
  std::optional<CompanionRequest> companion;
  bool operator==(const SequenceRequest&) const = default;
};

// Entropy-guided adaptive draft length (EGAG): after each draft step the worker reports the
// normalized entropy H = H(softmax(logits))/log V of the draft's raw logits at temperature 1, and
// stops the sequence after step k >= min_tokens when H > threshold.
struct EntropyStop {
  bool enabled = false;
  int32_t min_tokens = 1;
  float threshold = 1.0f;
  bool operator==(const EntropyStop&) const = default;
};

struct DraftSequenceRequest : SequenceRequest {
  int32_t num_speculative_tokens = 1;  // K in [1, kMaxSpeculativeTokens]: linear drafts or depth
  DraftSampling draft_sampling = DraftSampling::kProbabilistic;
  TreeShape tree;  // branching 0: one chain of K drafts
  EntropyStop entropy_stop;
  bool operator==(const DraftSequenceRequest&) const = default;
};

// A draft step reports, per sequence, one token per chain (linear drafts) or every node of the
// tree level it drafted, in BFS order (see common/protocol/draft_tree.h).
struct DraftToken {
  SeqId seq = 0;
  int32_t token = 0;
  float q_prob = 0.0f;   // q_k(t_k); 1 for a tree node (a deterministic child)
  float entropy = 0.0f;  // normalized entropy of the step's raw logits when EGAG is on
  bool operator==(const DraftToken&) const = default;
};

struct SequenceOutcome {
  SeqId seq = 0;
  absl::Status status;
  int64_t cached_len = 0;
  bool prefilling = false;           // only part of the catch-up was fed; nothing was drafted
  int64_t companion_cached_len = 0;  // a guided sequence's companion (0 without one)
  bool operator==(const SequenceOutcome&) const = default;
};

// One draft step as the Draft call reports it. Every sequence of the call is in exactly one
// `failed` list, or drafts until its own K, or only prefills (no step names it); the last step
// also carries every sequence's outcome.
struct DraftStep {
  int32_t step = 0;  // 1-based; 0 only when no sequence got as far as drafting
  std::span<const DraftToken> tokens;
  std::span<const SequenceOutcome> failed;  // sequences that failed since the previous step
  bool last = false;
  std::span<const SequenceOutcome> outcomes;  // last step only: all sequences, in request order
  int64_t forward_ns = 0;                     // this step's forward pass
};

// Which log-probabilities a Verify reports, always of the target's distribution.
enum class LogprobsMode {
  kOff,
  // vLLM's default: the log-softmax of the penalised logits, before temperature and truncation
  // (LogprobsArgs in kernels/backend.h). A greedy request gets real values, not a one-hot row's.
  kRaw,
  // The log of the processed distribution the token is drawn from, fl32(log(fp64 p)): -inf for
  // every token that temperature 0, top-k, top-p or min-p removed.
  kProcessed,
};

struct LogprobsRequest {
  LogprobsMode mode = LogprobsMode::kOff;
  int32_t top_n = 0;  // [0, kMaxLogprobs]
  bool operator==(const LogprobsRequest&) const = default;
};

struct VerifySequenceRequest : SequenceRequest {
  // t_1..t_K (K = 0 is plain decoding), or a draft tree's nodes in BFS order.
  std::vector<int32_t> drafts;
  // Empty: drafts are one chain. Otherwise the parent of each node (-1: a child of the last
  // committed token), each parent before its children; at most kMaxTreeNodes nodes.
  std::vector<int32_t> tree_parents;
  int32_t num_candidates = 0;  // M in [0, kMaxCandidates]
  LogprobsRequest logprobs;
  bool operator==(const VerifySequenceRequest&) const = default;
};

// One verified row's log-probabilities. The worker cannot know which rows the coordinator will
// emit from, so it reports every row, each with its top-N and every token the coordinator could
// emit there: the row's drafts (a chain's t_i, a tree node's children), the argmax, the residual
// candidates (rows with a child) and the bonus (leaf rows). A token the residual fallback picks
// is none of these; the coordinator then asks with QueryLogprobs.
struct PositionLogprobs {
  std::vector<int32_t> top_ids;  // by (logprob desc, id asc) of the raw logprobs
  std::vector<float> top_logprobs;
  std::vector<int32_t> token_ids;  // distinct
  std::vector<float> token_logprobs;
  bool operator==(const PositionLogprobs&) const = default;
};

// The target's rows are numbered 0..N: row 0 is the distribution after the last committed
// token, row i the one after draft (or node) i - 1. A chain of K drafts is the tree in which
// node i - 1 is the parent of node i: rows 0..K-1 have a child and row K is the leaf.
struct VerifySequenceResult {
  SeqId seq = 0;
  absl::Status status;
  int32_t position = 0;             // absolute position of t_1 (or of the K = 0 token)
  std::vector<float> p_draft;       // per draft: its probability in its parent's row
  std::vector<int32_t> argmax;      // per row
  int32_t bonus_token = 0;          // chain: b ~ p_{K+1} (K > 0) or the sampled token (K = 0)
  std::vector<int32_t> leaf_bonus;  // tree: b ~ each leaf's row, leaves in node order
  // Per row that has a child, in row order: M candidates y ~ that row. Empty when greedy.
  std::vector<std::vector<int32_t>> candidate_tokens;
  std::vector<std::vector<float>> candidate_probs;
  int64_t cached_len = 0;
  int64_t forward_ns = 0;   // the batch's forward pass; 0 when the sequence failed before it
  bool prefilling = false;  // only part of the catch-up was fed; nothing was verified
  int64_t companion_cached_len = 0;        // a guided sequence's companion (0 without one)
  std::vector<PositionLogprobs> logprobs;  // per row (a chain: [K+1]) when asked
  bool operator==(const VerifySequenceResult&) const = default;
};

// A worker's free KV capacity, reported with every reply about a sequence (the coordinator
// admits new requests against it).
struct KvFree {
  int64_t blocks = 0;
  int64_t tokens = 0;
  bool operator==(const KvFree&) const = default;
};

struct TruncateSequenceRequest {
  SeqId seq = 0;
  int64_t new_len = 0;  // keep min(cached_len, new_len) tokens
  // The 1-based step of the kept row whose probabilities of `query_tokens` are wanted before
  // truncating (q_r(y) for the residual candidates); 0 asks nothing.
  int32_t query_step = 0;
  std::vector<int32_t> query_tokens;
  // Required for a guided sequence, refused for any other: its companion keeps
  // min(companion cached_len, companion_new_len) tokens, in the same call.
  std::optional<int64_t> companion_new_len;
  bool operator==(const TruncateSequenceRequest&) const = default;
};

struct TruncateResult {
  int64_t cached_len = 0;
  std::vector<float> q_probs;  // answers to the query tokens
  int64_t companion_cached_len = 0;
  bool operator==(const TruncateResult&) const = default;
};

// Which kept row ReadRows returns: the 1-based draft step, or the verify position 1..K+1.
struct RowQuery {
  SeqId seq = 0;
  int32_t step = 0;
  bool operator==(const RowQuery&) const = default;
};

// The log-probabilities of `tokens` at verify position `step` (1-based) of a sequence's last
// Verify, in the LogprobsMode it asked for: the residual fallback's token, which that Verify
// could not know.
struct LogprobQuery {
  SeqId seq = 0;
  int32_t step = 0;
  std::vector<int32_t> tokens;
  bool operator==(const LogprobQuery&) const = default;
};

// One sequence's answer in a batched call (Truncate, ReadRows, QueryLogprobs): a failed sequence
// does not fail the others.
template <typename T>
struct SequenceAnswer {
  SeqId seq = 0;
  absl::StatusOr<T> value;
  bool operator==(const SequenceAnswer&) const = default;
};

}  // namespace specd

#endif  // SPECD_COMMON_PROTOCOL_WORKER_PROTOCOL_H_
