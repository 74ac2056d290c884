// The coordinator's Prometheus metrics on /metrics. Speculative-decoding counters use vLLM's
// names with the specd_ prefix so existing dashboards translate (DESIGN.md, "Observability").
// Labels are bounded: finish reason, error code, draft position, round phase and worker role;
// never request or sequence ids. Every method is thread-safe.
#ifndef SPECD_SERVICES_COORDINATOR_COORDINATOR_METRICS_H_
#define SPECD_SERVICES_COORDINATOR_COORDINATOR_METRICS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/common/metrics_exposer.h"

namespace specd {

// Which distributions a request's rounds compared (classifier-free guidance): the acceptance rate
// is counted per kind, since guiding the target but not the draft lowers it.
enum class GuidanceKind { kOff, kTarget, kTargetAndDraft };
inline constexpr size_t kNumGuidanceKinds = 3;

// What one finished request reports; mirrors the usage fields of the public API.
struct RequestMetrics {
  GuidanceKind guidance = GuidanceKind::kOff;
  std::string finish_reason;  // "length", "eos_token", "stop_token", "stop_string"
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t drafting_rounds = 0;  // its rounds with K > 0
  int64_t draft_tokens = 0;     // sum of K over its rounds
  int64_t accepted_tokens = 0;
  std::vector<int64_t> accepted_per_position;  // [k]: rounds that accepted draft k+1
  absl::Duration duration;                     // from arrival to the last event
};

class CoordinatorMetrics final {
 public:
  // kOverhead: the round's wall time outside the workers' forward passes (RPC, accept/reject,
  // scheduling); the other phases overlap it.
  enum class Phase { kDraft, kVerify, kAccept, kTruncate, kOverhead };
  enum class Worker { kDraft, kTarget };

  // Positions 0 .. max_position-1 of the per-position counter exist from the start (at zero),
  // so rate() works before the first request; larger positions appear when first seen.
  explicit CoordinatorMetrics(int max_position = 16);
  ~CoordinatorMetrics();
  CoordinatorMetrics(const CoordinatorMetrics&) = delete;
  CoordinatorMetrics& operator=(const CoordinatorMetrics&) = delete;

  // Serves /metrics over HTTP on host:port (port 0 picks a free one) and returns the bound port.
  // UNAVAILABLE naming the address when it cannot bind.
  absl::StatusOr<int> Serve(const std::string& host, int port);

  // Read at every scrape for the running and waiting gauges (e.g. the scheduler's counts).
  void SetQueueSource(std::function<int64_t()> running, std::function<int64_t()> waiting);

  // A request finished normally. Adds its speculative-decoding totals; its drafting rounds are
  // drafts, as vLLM counts steps with K > 0.
  void OnRequestFinished(const RequestMetrics& r);
  // A request failed with `code` (absl::StatusCodeToString, e.g. "RESOURCE_EXHAUSTED").
  void OnRequestError(absl::StatusCode code);
  // A request with classifier-free guidance was queued (kTarget: its draft is unguided).
  void OnGuidedRequest(GuidanceKind kind);
  // A chat reply came back as `calls` tool calls instead of content (the HTTP API's tools).
  void OnToolCallReply(int64_t calls);
  void OnFirstToken(absl::Duration since_arrival);
  // `tokens` tokens arrived together `gap` after the previous ones: each counts gap / tokens.
  void OnTokens(int64_t tokens, absl::Duration gap);
  void OnRoundPhase(Phase phase, absl::Duration elapsed);
  void OnRpc(Worker worker, int64_t request_bytes, int64_t response_bytes, absl::Duration elapsed);
  // The adaptive-K controller planned a round at K = `k` for `reason` (KChoiceReasonName) while
  // estimating the per-token acceptance `alpha`.
  void OnKChoice(int32_t k, absl::string_view reason, double alpha);
  // One sequence drafted K = `k` in a round (the realized K distribution); `entropy_stopped`
  // when EGAG ended its draft early.
  void OnDraftLength(int32_t k, bool entropy_stopped);
  // `sequences` running sequences waited out a round: the workers' pass budget was full.
  void OnDeferred(int64_t sequences);
  // `sequences` running sequences waited out a round for a prompt prefix another was computing.
  void OnPrefixWait(int64_t sequences);
  // Whether the coordinator can use `worker` now (1) or waits for it (0): crashed, hung, or back
  // computing something else. A worker the coordinator runs without has no series.
  void SetWorkerUp(Worker worker, bool up);
  // Whether a round's calls to `worker` go over its same-host socket (1) or gRPC (0).
  void SetWorkerLocalSocket(Worker worker, bool local);
  // `worker` came back as a new process, whose sequences the coordinator replays.
  void OnWorkerRestart(Worker worker);

  // The Prometheus text exposition of every metric, as a scrape would see it.
  std::string Text() const;

 private:
  class QueueCollectable;

  prometheus::Counter& PositionCounter(size_t k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<QueueCollectable> collectable_;
  prometheus::Counter* num_drafts_;
  prometheus::Counter* num_draft_tokens_;
  prometheus::Counter* num_accepted_tokens_;
  prometheus::Family<prometheus::Counter>* per_pos_family_;
  std::array<prometheus::Counter*, kNumGuidanceKinds> draft_tokens_by_guidance_{};
  std::array<prometheus::Counter*, kNumGuidanceKinds> accepted_tokens_by_guidance_{};
  std::array<prometheus::Counter*, kNumGuidanceKinds> guided_requests_{};
  prometheus::Counter* tool_call_replies_ = nullptr;
  prometheus::Counter* tool_calls_ = nullptr;
  prometheus::Histogram* acceptance_rate_;
  prometheus::Histogram* accepted_length_;
  prometheus::Histogram* draft_length_;
  prometheus::Counter* egag_stops_;
  prometheus::Counter* deferred_;
  prometheus::Counter* prefix_waits_;
  prometheus::Family<prometheus::Gauge>* worker_up_family_;
  prometheus::Family<prometheus::Gauge>* worker_local_socket_family_;
  std::array<prometheus::Counter*, 2> worker_restarts_{};
  prometheus::Family<prometheus::Counter>* finished_family_;
  prometheus::Family<prometheus::Counter>* errors_family_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* request_duration_;
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* adaptive_k_;
  prometheus::Gauge* adaptive_alpha_;
  prometheus::Family<prometheus::Counter>* k_choices_family_;
  std::array<prometheus::Histogram*, 5> phase_seconds_{};
  std::array<prometheus::Histogram*, 2> rpc_seconds_{};
  std::array<prometheus::Counter*, 2> rpc_sent_bytes_{};
  std::array<prometheus::Counter*, 2> rpc_received_bytes_{};

  mutable absl::Mutex mu_;
  std::vector<prometheus::Counter*> per_pos_ ABSL_GUARDED_BY(mu_);
  std::function<int64_t()> running_source_ ABSL_GUARDED_BY(mu_);
  std::function<int64_t()> waiting_source_ ABSL_GUARDED_BY(mu_);

  std::unique_ptr<MetricsExposer> exposer_;
};

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_COORDINATOR_METRICS_H_
