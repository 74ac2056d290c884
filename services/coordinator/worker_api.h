// The coordinator's view of a worker: the five calls of DESIGN.md's speculation round. The gRPC
// client (grpc_worker) implements it over the wire; LocalWorker (local_worker.h, tests only)
// implements it over an in-process WorkerRuntime, so the round logic is tested without processes
// and served with them. Only the worker protocol's types appear here: the coordinator links no
// engine.
#ifndef SPECD_SERVICES_COORDINATOR_WORKER_API_H_
#define SPECD_SERVICES_COORDINATOR_WORKER_API_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/protocol/worker_protocol.h"

namespace specd {

// What a liveness probe learns about a worker.
// A worker's prefix cache as its InfoResponse declares it (prefix_caching, kv_block_size,
// kv_total_blocks): in-batch prefix sharing follows the target's.
struct PrefixCacheShape {
  int64_t block_size = 0;  // 0: the worker caches no prefixes
  int64_t pool_blocks = 0;
};

struct WorkerProbe {
  // Changes every time the worker process starts: a new epoch means its caches are gone.
  uint64_t epoch = 0;
  // The worker's per-pass token budget (InfoResponse.max_pass_tokens), which a restart with other
  // flags may change; nullopt where the worker does not say (in-process workers).
  std::optional<int64_t> max_pass_tokens;
  // Its prefix cache, which a restart with other flags may change too; nullopt where the worker
  // does not say.
  std::optional<PrefixCacheShape> prefix_cache;
};

class WorkerApi {
 public:
  virtual ~WorkerApi() = default;

  // Draft worker: one callback per step (see DraftStep); returns per-sequence outcomes. A non-OK
  // return is a failure of the whole call (e.g. the worker is unreachable).
  virtual absl::StatusOr<std::vector<SequenceOutcome>> Draft(
      std::span<const DraftSequenceRequest> batch,
      const std::function<void(const DraftStep&)>& on_step) = 0;

  // Target worker.
  virtual absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest> batch) = 0;

  // Every sequence's Truncate in one call, with per-sequence answers in request order.
  virtual absl::StatusOr<std::vector<SequenceAnswer<TruncateResult>>> Truncate(
      std::span<const TruncateSequenceRequest> batch) = 0;
  // Kept rows of several sequences in one call, answers in request order.
  virtual absl::StatusOr<std::vector<SequenceAnswer<ProbRow>>> ReadRows(
      std::span<const RowQuery> batch) = 0;
  // Target worker: the logprobs of tokens at positions of each sequence's last Verify (the
  // residual fallback's tokens, which Verify could not know), answers in request order.
  virtual absl::StatusOr<std::vector<SequenceAnswer<std::vector<float>>>> QueryLogprobs(
      std::span<const LogprobQuery> batch) = 0;
  virtual absl::Status Release(SeqId seq) = 0;

  // Free KV capacity in tokens as of the worker's latest reply; the scheduler admits new requests
  // against it (and preempts if a round still runs out).
  virtual int64_t FreeKvTokens() const = 0;

  // A cheap liveness check bounded by `timeout` (the scheduler probes a worker that failed a
  // call before it sends it work again). An in-process worker is always up and never restarts.
  virtual absl::StatusOr<WorkerProbe> Probe(absl::Duration /*timeout*/) { return WorkerProbe(); }
  // False when the transport is known to have dropped (a gRPC channel that is no longer READY):
  // the worker may have died while nothing called it, so the scheduler probes it before a
  // request needs it, and health can say so.
  virtual bool Connected() const { return true; }

  // How errors name this worker, e.g. "target worker at 127.0.0.1:7002".
  virtual std::string Name() const { return "in-process worker"; }
};

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_WORKER_API_H_
