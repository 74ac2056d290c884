// The engine side of a worker (DESIGN.md, "One speculation round", steps 1, 2, 4 and 5): a
// sequence table over one LlamaEngine that catches sequences up, drafts K tokens or verifies them,
// keeps the processed rows of the last round for residual queries, truncates and releases. It
// holds nothing the coordinator could not rebuild by replaying tokens. Not thread-safe: the gRPC
// layer gives it to one engine thread.
//
// Catch-up and the prefix cache. A sequence's catch-up first reuses the longest prefix the KV
// pool has cached (never its last token, which is always fed so that there are logits). The rest
// is fed in the call's one forward pass, or, when it is longer than the request's
// max_prefill_tokens, only that many tokens are fed and the call produces nothing else for the
// sequence: the coordinator feeds a long prompt one chunk per round (chunked prefill).
#ifndef SPECD_COMMON_WORKER_WORKER_RUNTIME_H_
#define SPECD_COMMON_WORKER_WORKER_RUNTIME_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
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
#include "common/engine/output_vocab.h"
#include "common/protocol/worker_protocol.h"
#include "common/sampling/logprob_rows.h"
#include "common/sampling/row_pool.h"
#include "common/sampling/row_sampler.h"

namespace specd {

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
  // A catch-up met the prefix cache: of `queried` tokens that needed KV (the catch-up tokens this
  // call covers, less the last one, which is always fed), `hit` were found cached.
  virtual void OnPrefixCache(int64_t queried, int64_t hit) = 0;
  // With every KV change: the blocks companion sequences hold, each counted once.
  virtual void OnCompanionKv(int64_t /*blocks*/) {}
};

struct WorkerRuntimeOptions {
  RuntimeObserver* observer = nullptr;  // not owned; must outlive the runtime; may be null
};

class WorkerRuntime {
 public:
  WorkerRuntime(std::unique_ptr<LlamaEngine> engine, const WorkerRuntimeOptions& options);

  // Drafts K tokens for every sequence with one forward pass per step across the batch, calling
  // `on_step` once per step and always at least once (the last call has `last` set). Failed
  // sequences are reported once and never disturb the others; sequences that only fed a prefill
  // chunk ride in the first pass and come back `prefilling`. Returns every sequence's outcome.
  // A sequence with a tree shape drafts its tree one level per step instead (draft_tree.h): its
  // nodes see only their ancestors, and its K - 1 fed levels stay in the cache until the
  // coordinator names the accepted branch (KvCompaction). EGAG (entropy_stop) may end a chain
  // before its K.
  std::vector<SequenceOutcome> Draft(std::span<const DraftSequenceRequest> batch,
                                     const std::function<void(const DraftStep&)>& on_step = {});

  // Verifies every sequence in one forward pass, with the prefill chunks of sequences that are
  // still prefilling (their results come back `prefilling`); a draft tree's nodes are verified
  // together, each against its ancestors only. `on_result` sees each sequence's result as soon
  // as it is ready: sequences rejected before the forward pass first, then the rest in request
  // order. Returns all results in request order.
  std::vector<VerifySequenceResult> Verify(
      std::span<const VerifySequenceRequest> batch,
      const std::function<void(const VerifySequenceResult&)>& on_result = {});

  // Keeps min(cached, new_len) tokens (and a guided sequence's companion min(its cached,
  // companion_new_len)); idempotent. `query_step` >= 1 asks for the probabilities of
  // `query_tokens` in the kept row of that step (q on the draft, p on the target). A bad request
  // is reported before anything is truncated.
  absl::StatusOr<TruncateResult> Truncate(const TruncateSequenceRequest& req);

  // One kept processed row (1-based step), sparse when that is smaller on the wire. The only call
  // that copies a whole row out of back-end memory.
  absl::StatusOr<ProbRow> ReadRow(SeqId seq, int32_t step);

  // The log-probabilities of `tokens` at verify position `step` (1-based) of the sequence's last
  // Verify, in the LogprobsMode it asked for: what the residual fallback's token needs, since it
  // is none of the tokens Verify reported. FAILED_PRECONDITION when that Verify kept no such row
  // (raw logprobs keep the penalised rows that have drafts, of sampled requests only).
  absl::StatusOr<std::vector<float>> QueryLogprobs(SeqId seq, int32_t step,
                                                   std::span<const int32_t> tokens);

  // Forgets a sequence, and a guided one's companion with it. A companion is never released on
  // its own (INVALID_ARGUMENT).
  absl::Status Release(SeqId seq);
  // Forgets every sequence: what a coordinator that exited or crashed left here, claimed by the
  // one that starts next. Returns how many sequences were released (companions not counted).
  int64_t ReleaseAll();

  // Runs one throwaway call of the kind this worker serves (a Draft of 4 tokens, or a Verify of 4
  // drafts with candidates, after a short prompt) and releases its sequence, so that the first
  // request does not pay for what a process meets the first time: on the CPU, fresh scratch and
  // row buffers and cold code (the first Verify pass took 4.4-4.9 ms against 2.3-2.5 ms warm,
  // stories15M shape); on a GPU, lazily loaded kernels and the first CUDA graphs. Call before
  // serving, with no sequence held. The observer sees none of it. The only trace it can leave is
  // evictable prefix-cache blocks, where blocks are smaller than its 12 tokens.
  absl::Status WarmUp(bool draft);

  // NOT_FOUND for an unknown sequence.
  absl::StatusOr<int64_t> CachedLength(SeqId seq) const;

  // Free KV capacity, as every reply about a sequence reports it.
  KvFree kv_free() const;

  const LlamaEngine& engine() const { return *engine_; }
  // The tokens this worker's rows cover: all of them, or a draft's reduced head (FR-Spec).
  const OutputVocab& output_vocab() const { return vocab_; }
  int64_t num_sequences() const { return static_cast<int64_t>(seqs_.size()); }

 private:
  struct Sequence {
    std::vector<int32_t> tokens;  // exactly what the KV cache holds
    int64_t prompt_len = 0;
    // Row-pool slots of the last round's processed rows, 1-based step - 1. They stay in back-end
    // memory until the sequence's next Draft or Verify, or its Release.
    std::vector<int32_t> rows;
    // Classifier-free guidance: a guided sequence names its companion, and the companion (an
    // entry of its own, fed but never sampled) its owner.
    std::optional<SeqId> companion;
    std::optional<SeqId> owner;
    // The last Verify's logprobs: its mode, and for raw logprobs of a sampled request the
    // penalised logits of positions 1..K (pool slots), kept as long as `rows`.
    LogprobsMode logprobs_mode = LogprobsMode::kOff;
    std::vector<int32_t> logit_rows;
  };
  // A verified sequence that asked for logprobs: its request, its result and its first row in
  // the pass's sampler.
  struct LogprobPlan {
    const VerifySequenceRequest* req = nullptr;
    VerifySequenceResult* result = nullptr;
    int32_t first_row = 0;
  };

  // What one call does for one admitted sequence: catch_up[cached, cached + feed) is fed; with
  // `complete` that is the whole rest of the catch-up and the call drafts or verifies. A guided
  // sequence's companion feeds its own catch-up alike, in the same pass; `complete` is the
  // pair's.
  struct Feed {
    int64_t cached = 0;  // leading catch-up tokens found in the prefix cache (already attached)
    int64_t feed = 0;
    bool complete = false;
    int64_t companion_cached = 0;
    int64_t companion_feed = 0;
  };

  // Checks a request against the table, creating the sequence when expected_cached_len is 0 and
  // it is unknown, attaches its cached prefix and decides how much of the catch-up to feed.
  // `draft_tokens` is how many more tokens a complete call feeds; the blocks the call needs are
  // added to `*reserved_blocks`. On error the sequence is as it was (gone if it was new).
  absl::StatusOr<Feed> Admit(const SequenceRequest& req, int64_t draft_tokens,
                             int64_t* reserved_blocks);
  // INVALID_ARGUMENT unless `catch_up` is non-empty and every id is in the vocabulary.
  absl::Status CheckCatchUp(SeqId seq, const char* what, std::span<const int32_t> catch_up) const;
  // INVALID_ARGUMENT for a companion that does not fit the table: a request for a companion
  // itself, another companion than the sequence was created with (or none), an id another
  // sequence holds, a non-finite scale.
  absl::Status CheckCompanion(const SequenceRequest& req) const;
  // How much of `left` catch-up tokens a sequence of `len` tokens feeds in a chunk of `limit`:
  // never the last one, and ending on a block boundary when the chunk is a block or more.
  int64_t ChunkFeed(int64_t len, int64_t left, int64_t limit) const;
  // The prefill chunks of a sequence that is not complete (and of its companion), as inputs.
  void AddChunkInputs(const SequenceRequest& req, const Feed& f,
                      std::vector<SequenceInput>* inputs) const;
  // After a successful pass: the chunks are in the table and their committed blocks cached.
  void ChunksFed(std::span<const SequenceInput> chunks);
  // After a successful pass: a sequence's (and its companion's) tokens but the last `drafts` are
  // committed text.
  void CacheCommittedPair(const SequenceRequest& req, int64_t drafts);
  // `feed` (the rest of the catch-up and `drafts` drafts) with logits at the last drafts + 1.
  SequenceInput VerifyInput(SeqId seq, std::span<const int32_t> feed, size_t drafts) const;
  int64_t CompanionLengthOrZero(const SequenceRequest& req) const;
  // A forward pass without logits (only prefill chunks), timed to its synchronization.
  absl::Status FeedOnly(std::span<const SequenceInput> batch);
  // After a successful pass: `seq`'s first `committed` tokens are text the coordinator committed,
  // so their full blocks may serve later sequences.
  void CacheCommitted(SeqId seq, int64_t committed);
  // A forward pass with logits, then the sampler's work on them (`add_work` fills the sampler),
  // up to the one synchronization. Timed from the forward's start and reported to the observer.
  absl::Status ForwardAndSample(ForwardKind kind, std::span<const SequenceInput> batch,
                                const std::function<absl::Status()>& add_work, int64_t* forward_ns);
  void ReportForward(ForwardKind kind, std::span<const SequenceInput> batch,
                     absl::Duration elapsed);
  // Adds the next processed row of this pass with `history` (prompt + output so far, this
  // round's drafts included) into pool slot `slot`; returns its sampler row. Token ids become row
  // indices on a reduced head. `req` gives the sampling parameters and the logit bias.
  int32_t AddRow(const Sequence& s, std::span<const int32_t> history, const SequenceRequest& req,
                 kernels::RowMode mode, int32_t slot);
  // The same into a new kept slot of `s`, with the first `len` tokens of `s` as history.
  int32_t AddKeptRow(Sequence& s, size_t len, const SequenceRequest& req, kernels::RowMode mode,
                     int32_t slot);
  // Applies `compact` and drops what is past `keep` tokens of a known sequence.
  absl::Status CompactAndTruncate(SeqId seq, Sequence& s, const KvCompaction& compact,
                                  int64_t keep);
  void ReleaseRows(Sequence& s);
  // Fills the logprobs of `plans` from the pass just sampled (its penalised rows).
  absl::Status AddLogprobs(std::span<const LogprobPlan> plans);
  // Undoes a pass that failed after its forward: each input's sequence goes back to start_pos,
  // with no kept rows.
  void RollBack(std::span<const SequenceInput> inputs);
  int64_t LengthOrZero(SeqId seq) const;
  void ReportKv();

  std::unique_ptr<LlamaEngine> engine_;
  OutputVocab vocab_;
  WorkerRuntimeOptions options_;
  absl::flat_hash_map<SeqId, Sequence> seqs_;
  RowPool pool_;
  RowSampler sampler_;
  LogprobRows logprob_rows_;
};

}  // namespace specd

#endif  // SPECD_COMMON_WORKER_WORKER_RUNTIME_H_
