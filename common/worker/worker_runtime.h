// The engine side of a worker (DESIGN.md, "One speculation round", steps 1, 2, 4 and 5): a
// sequence table over one LlamaEngine that catches sequences up, drafts K tokens or verifies them,
// keeps the processed rows of the last round for residual queries, truncates and releases. It
// holds nothing the coordinator could not rebuild by replaying tokens. Not thread-safe: the gRPC
// layer gives it to one engine thread.
#ifndef SPECD_COMMON_WORKER_WORKER_RUNTIME_H_
#define SPECD_COMMON_WORKER_WORKER_RUNTIME_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/inverse_cdf.h"
#include "base/sampling_params.h"
#include "common/engine/llama_engine.h"
#include "common/sampling/processed.h"

namespace specd {

enum class DraftMode { kProbabilistic, kGreedy };

// Whole-call limits: a request over them is malformed, not merely expensive.
inline constexpr int32_t kMaxDraftTokens = 64;  // K
inline constexpr int32_t kMaxCandidates = 64;   // M

// What every per-sequence request carries.
struct SequenceRequest {
  KvPool::SeqId seq = 0;
  std::vector<int32_t> catch_up;    // x[len_w:]
  int64_t expected_cached_len = 0;  // len_w as the coordinator believes it; 0 creates the sequence
  SamplingParams sampling;
  uint64_t seed = 0;
  int64_t prompt_len = 0;  // how much of x is prompt (for the penalties)
  // The worker may hold more than expected_cached_len tokens (the previous round's rejected
  // drafts: a Truncate folded into this call); they are dropped before anything else.
  bool drop_tail = false;
};

struct DraftSequenceRequest : SequenceRequest {
  int32_t num_draft_tokens = 1;  // K in [1, kMaxDraftTokens]
  DraftMode mode = DraftMode::kProbabilistic;
};

struct DraftToken {
  KvPool::SeqId seq = 0;
  int32_t token = 0;
  float q_prob = 0.0f;  // q_k(t_k)
};

struct SequenceOutcome {
  KvPool::SeqId seq = 0;
  absl::Status status;
  int64_t cached_len = 0;
};

// One draft step as the Draft call reports it. Every sequence of the call is in exactly one
// `failed` list or drafts until its own K; the last step also carries every sequence's outcome.
struct DraftStep {
  int32_t step = 0;  // 1-based; 0 only when no sequence got as far as drafting
  std::span<const DraftToken> tokens;
  std::span<const SequenceOutcome> failed;  // sequences that failed since the previous step
  bool last = false;
  std::span<const SequenceOutcome> outcomes;  // last step only: all sequences, in request order
  int64_t forward_ns = 0;                     // this step's forward pass
};

struct VerifySequenceRequest : SequenceRequest {
  std::vector<int32_t> drafts;  // t_1..t_K; K = 0 is plain decoding
  int32_t num_candidates = 0;   // M in [0, kMaxCandidates]
};

struct VerifySequenceResult {
  KvPool::SeqId seq = 0;
  absl::Status status;
  int32_t position = 0;         // absolute position of t_1 (or of the K = 0 token)
  std::vector<float> p_draft;   // p_i(t_i), i = 1..K
  std::vector<int32_t> argmax;  // i = 1..K+1
  int32_t bonus_token = 0;      // b ~ p_{K+1} (K > 0) or the sampled token (K = 0)
  std::vector<std::vector<int32_t>> candidate_tokens;  // [K][M]; empty when greedy
  std::vector<std::vector<float>> candidate_probs;     // [K][M]
  int64_t cached_len = 0;
  int64_t forward_ns = 0;  // the batch's forward pass; 0 when the sequence failed before it
};

struct TruncateResult {
  int64_t cached_len = 0;
  std::vector<float> q_probs;  // answers to the query tokens
};

enum class ForwardKind { kCatchUp, kDraftStep, kVerify };

// "catch_up", "draft_step" or "verify": the metrics label.
std::string_view ForwardKindName(ForwardKind kind);

// Told about every forward pass and every change of KV usage (for metrics), on the runtime's
// thread and before the call that caused it returns or reports.
class RuntimeObserver {
 public:
  virtual ~RuntimeObserver() = default;
  virtual void OnForward(ForwardKind kind, int64_t batch_size, int64_t tokens,
                         absl::Duration elapsed) = 0;
  virtual void OnKvChanged(const KvPool& kv) = 0;
};

struct WorkerRuntimeOptions {
  int64_t prefill_chunk = 512;          // longest catch-up fed in one forward call per sequence
  RuntimeObserver* observer = nullptr;  // not owned; must outlive the runtime; may be null
};

class WorkerRuntime {
 public:
  WorkerRuntime(std::unique_ptr<LlamaEngine> engine, const WorkerRuntimeOptions& options);

  // Drafts K tokens for every sequence with one forward pass per step across the batch, calling
  // `on_step` once per step and always at least once (the last call has `last` set). Failed
  // sequences are reported once and never disturb the others. Returns every sequence's outcome.
  std::vector<SequenceOutcome> Draft(std::span<const DraftSequenceRequest> batch,
                                     const std::function<void(const DraftStep&)>& on_step = {});

  // Verifies every sequence in one forward pass (after chunked catch-up calls when needed).
  // `on_result` sees each sequence's result as soon as it is ready: sequences rejected before
  // the forward pass first, then the rest in request order. Returns all results in request order.
  std::vector<VerifySequenceResult> Verify(
      std::span<const VerifySequenceRequest> batch,
      const std::function<void(const VerifySequenceResult&)>& on_result = {});

  // Keeps min(cached, new_len) tokens; idempotent. `query_step` >= 1 asks for the probabilities
  // of `query_tokens` in the kept row of that step (q on the draft, p on the target). A bad
  // query is reported before anything is truncated.
  absl::StatusOr<TruncateResult> Truncate(KvPool::SeqId seq, int64_t new_len, int32_t query_step,
                                          std::span<const int32_t> query_tokens);

  // One kept processed row (1-based step), sparse when that is smaller on the wire.
  absl::StatusOr<ProbRow> ReadRow(KvPool::SeqId seq, int32_t step) const;

  absl::Status Release(KvPool::SeqId seq);

  // NOT_FOUND for an unknown sequence.
  absl::StatusOr<int64_t> CachedLength(KvPool::SeqId seq) const;

  const LlamaEngine& engine() const { return *engine_; }
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }

 private:
  struct Sequence {
    std::vector<int32_t> tokens;  // exactly what the KV cache holds
    int64_t prompt_len = 0;
    std::vector<std::vector<float>> rows;  // last round's processed rows, 1-based step - 1
  };

  // Checks a request against the table, creating the sequence when expected_cached_len is 0 and
  // it is unknown. `extra_tokens` is how far the request will grow the sequence's KV, charged to
  // `*blocks_budget`.
  absl::Status Admit(const SequenceRequest& req, int64_t extra_tokens, int64_t* blocks_budget);
  // Feeds every catch-up but its last prefill_chunk (or fewer) tokens per sequence, in chunks.
  absl::Status FeedLongCatchUps(std::span<const SequenceRequest* const> reqs);
  // engine_->Forward, timed and reported to the observer.
  absl::StatusOr<ForwardResult> TimedForward(ForwardKind kind, std::span<const SequenceInput> batch,
                                             int64_t* forward_ns);
  TokenHistory History(const Sequence& s, size_t len) const;
  int64_t LengthOrZero(KvPool::SeqId seq) const;
  void ReportKv();

  std::unique_ptr<LlamaEngine> engine_;
  WorkerRuntimeOptions options_;
  absl::flat_hash_map<KvPool::SeqId, Sequence> seqs_;
  LogitsProcessor processor_;
};

}  // namespace specd

#endif  // SPECD_COMMON_WORKER_WORKER_RUNTIME_H_
