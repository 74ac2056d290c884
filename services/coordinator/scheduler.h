// The coordinator's scheduler: the single owner of every request (TGI's router queue is the
// model). RPC handlers only Submit and Cancel; one thread admits waiting requests between rounds
// (continuous batching), runs speculation rounds over the running batch, applies stop conditions,
// streams events and releases finished sequences on both workers. A worker that crashes, restarts
// or hangs costs no request: its sequences wait (up to worker_unavailable_timeout) and replay
// their committed tokens once it answers again (worker_recovery.h).
#ifndef SPECD_SERVICES_COORDINATOR_SCHEDULER_H_
#define SPECD_SERVICES_COORDINATOR_SCHEDULER_H_

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tokenizer/text_output.h"
#include "common/tokenizer/tokenizer.h"
#include "services/coordinator/adaptive_k.h"
#include "services/coordinator/prefix_sharing.h"
#include "services/coordinator/speculation_round.h"
#include "services/coordinator/worker_recovery.h"

namespace specd {

enum class FinishReason { kNone, kLength, kEosToken, kStopToken, kStopString };

// A validated, tokenized request.
struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  std::vector<TokenBias> logit_bias;  // ascending tokens
  uint64_t seed = 0;
  int64_t max_new_tokens = 128;
  std::vector<std::string> stop_strings;
  // Ascending and unique (BuildGenerationRequest makes them so): every generated token is looked
  // up in them, on the scheduler's thread.
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t num_speculative_tokens = 4;
  // True lets the scheduler lower K when speculation would not pay (never raise it); false keeps
  // it as asked (see v1::KPolicy for who gets which). Only chains of model drafts adapt.
  bool adaptive_k = false;
  DraftSampling draft_sampling = DraftSampling::kProbabilistic;
  DraftMethod draft_method = DraftMethod::kModel;
  TreeShape tree;     // kModel: branching 0 drafts one chain
  bool egag = false;  // kModel chains: entropy-guided draft length (SchedulerOptions::egag)
  // The output the client expects (speculation.prediction); kNgram drafts are looked up in it.
  std::vector<int32_t> prediction;
  // The completion number: requests with one seed and different numbers are independent (the
  // `sample` of every Philox counter); n completions of one prompt are numbered 0..n-1.
  uint32_t sample = 0;
  LogprobsRequest logprobs;
  // The prompt's own logprobs (positions 1..), reported in one event before any token; kOff: not
  // asked. Never with guidance.
  LogprobsRequest prompt_logprobs;
  // Classifier-free guidance (scale, unconditional prompt, whether the draft is guided too); the
  // scheduler names the companion when the request starts.
  std::optional<Guidance> guidance;
};

// The bit that makes a request's companion id from its sequence id: sequence ids are request
// handles, which count up from 1 and never reach it.
inline constexpr SeqId kCompanionIdBit = SeqId{1} << 63;

struct GenerationUsage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t rounds = 0;
  int64_t drafting_rounds = 0;  // rounds with K > 0 (vLLM's "drafts")
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  std::vector<int64_t> accepted_per_position;  // [k]: rounds that accepted draft k+1
  // The request had a prediction: every draft came from it (OpenAI's accepted and rejected
  // prediction tokens are then accepted_tokens and draft_tokens - accepted_tokens).
  bool predicted = false;
  // Over the decode rounds (all but the first, which prefills): see v1::RoundTimings.
  int64_t timed_rounds = 0;
  int64_t timed_draft_steps = 0;
  absl::Duration draft_forward;
  absl::Duration verify_forward;
  absl::Duration round_time;
};

// One streamed update: the tokens committed by a round (after stop trimming) and their text.
struct GenerationEvent {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;  // aligned with tokens when the request asked
  // The prompt's logprobs, positions 1..prompt_len - 1, in one event (with no tokens) before
  // the first token, when the request asked.
  std::optional<std::vector<TokenLogprobs>> prompt_logprobs;
  std::string text;
  FinishReason finish = FinishReason::kNone;  // set on the last event
  GenerationUsage usage;                      // on the last event
  absl::Status error;                         // a failed request's last event
};

struct SchedulerOptions {
  int64_t max_running = 32;
  int64_t max_queued = 256;
  int64_t max_seq_len = 0;
  int32_t num_candidates = 4;
  // Chunked prefill: catch-up tokens each worker feeds per sequence and round beyond its prefix
  // cache, so a long prompt is spread over rounds that also decode the running sequences; 0 feeds
  // every catch-up whole.
  int64_t prefill_chunk = 512;
  // Each worker's per-pass token budget (InfoResponse.max_pass_tokens): rounds cut prefill chunks
  // and defer sequences to keep every forward pass within it (pass_budget.h); 0 = no limit.
  int64_t draft_pass_tokens = 0;
  int64_t target_pass_tokens = 0;
  std::vector<int32_t> eos_token_ids;
  // Called on the scheduler thread after every round with its phase times (metrics); may be
  // empty. Must not block.
  std::function<void(const RoundPhaseTimes&)> on_round;
  // How long a request, running or queued, may wait without progress for an unavailable
  // (crashed, restarting or hung) worker before it fails with UNAVAILABLE naming the worker.
  absl::Duration worker_unavailable_timeout = absl::Seconds(30);
  // Told, in one line each, when a worker becomes unavailable and when it is back; may be empty.
  std::function<void(const std::string&)> on_worker_event;
  // Called on the scheduler thread when a worker turns unavailable or usable again (`target`
  // false: the draft worker), and when it came back as a new process (metrics); may be empty.
  // Must not block.
  std::function<void(bool target, bool up)> on_worker_up;
  std::function<void(bool target)> on_worker_restart;
  // The adaptive-K controller's settings (requests with K_POLICY_FIXED bypass it).
  AdaptiveKOptions adaptive_k;
  // Called on the scheduler thread with every round's K choice and the controller's current
  // acceptance estimate (metrics); may be empty. Must not block.
  std::function<void(const KChoice&, double alpha)> on_k_choice;
  // Called on the scheduler thread for every sequence that drafted in a round, with its realized
  // K and whether EGAG cut it short (metrics); may be empty. Must not block.
  std::function<void(int32_t k, bool entropy_stopped)> on_draft_length;
  // Called on the scheduler thread after a round in which the pass budget deferred `sequences`
  // running sequences (metrics); may be empty. Must not block.
  std::function<void(int64_t sequences)> on_deferred;
  // In-batch prefix sharing (--prefix-sharing): prompts that share blocks another sequence is
  // computing wait for them (prefix_sharing.h), while the target caches prefixes. At the start
  // that is prefix_block_size, the target's KV block size when it caches prefixes (InfoResponse),
  // 0 when it does not, and prefix_pool_blocks, its pool size, the most blocks its cache can hold
  // (what the scheduler remembers of it); a restarted target's probe declares its own.
  bool prefix_sharing = false;
  int64_t prefix_block_size = 0;
  int64_t prefix_pool_blocks = 0;
  // Called on the scheduler thread after a round in which `sequences` running sequences waited for
  // a shared prefix (metrics); may be empty. Must not block.
  std::function<void(int64_t sequences)> on_prefix_wait;
  NgramOptions ngram;  // prompt lookup (DraftMethod::kNgram)
  EgagOptions egag;    // requests with egag set
};

class Scheduler {
 public:
  using EventSink = std::function<void(GenerationEvent)>;
  using RequestHandle = uint64_t;

  // `tokenizer` may be null (then text is empty). The workers and tokenizer must outlive it.
  // `draft` may be the same object as `target` when there is no draft worker (K = 0 only).
  Scheduler(WorkerApi& draft, WorkerApi& target, const Tokenizer* tokenizer,
            const SchedulerOptions& options);
  ~Scheduler();  // stops the thread; pending requests get CANCELLED

  // Queues a request. RESOURCE_EXHAUSTED when the queue is full. `sink` is called from the
  // scheduler thread and must not block; its last call has finish or error set.
  absl::StatusOr<RequestHandle> Submit(GenerationRequest request, EventSink sink);

  // Frees the request's sequence on both workers within one round; the sink gets no more calls
  // after the CANCELLED event.
  void Cancel(RequestHandle handle);

  int64_t running() const { return running_count_.load(); }
  int64_t waiting() const { return waiting_count_.load(); }
  // Sequences released and requeued because a worker's KV pool was full.
  int64_t preemptions() const { return preemptions_.load(); }
  // The coordinator is draining: workers that go away now are stopping with it, so an idle
  // scheduler stops watching their connections (no probe, no "unavailable" line). Calls that
  // fail for requests still in flight are handled as ever. Any thread.
  void BeginShutdown() { shutting_down_ = true; }
  // OK while the target worker is up; otherwise why not (its UnavailableError): a crash being
  // recovered, a hang, or a restart that computes something else. Health reports it. Without
  // the draft worker requests that let the server choose K decode plainly, so only the target
  // counts. Any thread.
  absl::Status TargetStatus() const;

 private:
  struct Active {
    RequestHandle handle = 0;
    GenerationRequest request;
    EventSink sink;
    SpeculativeSequence seq;
    std::unique_ptr<TextOutput> text;
    GenerationUsage usage;
    // The worker's copy of the sequence is in doubt after a failed call: resynced before the
    // sequence runs there again.
    bool draft_in_doubt = false;
    bool target_in_doubt = false;
    // Since when the request has been unable to progress because a worker is unavailable;
    // cleared by its next committed round.
    std::optional<absl::Time> stalled_since;
    int32_t mismatches = 0;  // cache mismatches since the last committed round
    // Hashes of the whole blocks of seq.tokens recorded in computed_prefixes_, in order.
    std::vector<uint64_t> block_hashes;
  };

  void Loop();
  // A newly admitted request's sequence: its prompt is the first catch-up on both workers.
  void StartSequence(Active& a);
  // KV tokens `a` needs on the target (or the draft) to run its next round from what it has
  // committed: its tokens so far plus a full round, and its companion's where it has one there.
  static int64_t KvTokensForNextRound(const Active& a, bool target);
  // Applies one round's tokens to `a`; returns true when the request finished.
  bool Commit(Active& a, const RoundStats& stats, const RoundPhaseTimes& times);
  void Finish(Active& a, FinishReason reason, absl::Status error, GenerationEvent event);
  // `gone`: the request is over, so a worker that cannot be reached now is asked again later.
  void ReleaseOnWorkers(Active& a, bool gone);
  void ReleaseOn(SupervisedWorker& w, Active& a, bool gone);

  // Recovery from unavailable workers (worker_recovery.h).
  SupervisedWorker& draft() { return draft_ != nullptr ? *draft_ : *target_; }
  std::vector<SupervisedWorker*> workers();
  // Probes unavailable workers that are due; a restarted one holds nothing any more.
  void RecoverWorkers();
  // Prefix sharing after a target restart: the new process's cache, of its own block size, or
  // none.
  void FollowTargetPrefixCache();
  // Makes TargetStatus() say what the target is now, and tells on_worker_up of every change.
  void PublishWorkerState();
  // The unavailable worker that `a`'s next round needs, or null.
  SupervisedWorker* UnavailableWorkerFor(const Active& a) const;
  // The same, after resyncing `a` on the workers where its copy is in doubt.
  SupervisedWorker* BlockingWorker(Active& a);
  // Makes `a`'s copy on `w` known again; false when `w` cannot be reached.
  bool Resync(Active& a, SupervisedWorker& w);
  // Starts or continues `a`'s stall on `w`; true once it has lasted the allowed time.
  bool StallExpired(Active& a, absl::Time now);
  // After a failed round: true when the request stays and replays, false when it fails with
  // `*error` (possibly rewritten to name an unavailable worker).
  bool SurvivesFailedRound(Active& a, absl::Status* error);
  // When to look again while every request waits for an unavailable worker (nullopt: only when
  // a request arrives).
  std::optional<absl::Time> NextWake() const;
  // Whether the adaptive-K controller may lower `a`'s K.
  static bool Adapts(const Active& a);
  // Sets this round's K for every running sequence: the adaptive controller's choice for the
  // batch, capped by what each request asked (FIXED requests keep theirs). While the draft
  // worker is down adaptive requests decode plainly, which is just as exact.
  KChoice PlanK();
  // Tells the controller how the round it planned went (only rounds without failures: a failed
  // round's times are partial). `draft_catch_up[i]`: what running_[i] had to catch up on the
  // draft worker when the round began, or nullopt when it was not to draft.
  void ObserveRound(const std::vector<RoundStats>& stats, const RoundPhaseTimes& times,
                    const std::vector<std::optional<int64_t>>& draft_catch_up);

  // target_ is always set; draft_ is null when the draft is the target itself.
  std::unique_ptr<SupervisedWorker> target_;
  std::unique_ptr<SupervisedWorker> draft_;
  const Tokenizer* tokenizer_;
  SchedulerOptions options_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Active>> waiting_;   // guarded by mu_
  absl::flat_hash_set<RequestHandle> cancelled_;  // guarded by mu_
  bool stopping_ = false;                         // guarded by mu_
  RequestHandle next_handle_ = 1;                 // guarded by mu_
  bool poked_ = false;  // guarded by mu_: a request arrived or was cancelled

  std::vector<std::unique_ptr<Active>> running_;  // scheduler thread only
  AdaptiveK adaptive_k_;                          // scheduler thread only
  std::optional<absl::Time> idle_until_;          // scheduler thread only
  // What the target's prefix cache holds, as far as the scheduler saw it computed; set when
  // prefix sharing is on. Scheduler thread only.
  std::optional<ComputedPrefixes> computed_prefixes_;
  std::array<bool, 2> worker_up_ = {true, true};  // (draft, target) as last told; scheduler thread
  mutable std::mutex target_status_mu_;
  absl::Status target_status_;  // TargetStatus(); written by the scheduler thread
  // How many may run at once, up to max_running: halved by a round that preempted its whole
  // batch, and grown back by one per round that preempted nothing (see Loop).
  int64_t admission_cap_ = 0;  // scheduler thread only
  std::atomic<int64_t> running_count_{0};
  std::atomic<bool> shutting_down_{false};
  std::atomic<int64_t> waiting_count_{0};
  std::atomic<int64_t> preemptions_{0};
  std::thread thread_;
};

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_SCHEDULER_H_
