// The coordinator's view of a worker: the five calls of DESIGN.md's speculation round. The gRPC
// clients implement it over the wire; LocalWorker implements it over an in-process WorkerRuntime,
// so the round logic is tested without processes and served with them.
#ifndef SPECD_SERVICES_COORDINATOR_WORKER_API_H_
#define SPECD_SERVICES_COORDINATOR_WORKER_API_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/worker/worker_runtime.h"
#include "services/coordinator/accept_reject.h"

namespace specd {

// What a liveness probe learns about a worker.
struct WorkerProbe {
  // Changes every time the worker process starts: a new epoch means its caches are gone.
  uint64_t epoch = 0;
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

  virtual absl::StatusOr<TruncateResult> Truncate(SeqId seq, int64_t new_len, int32_t query_step,
                                                  std::span<const int32_t> query_tokens) = 0;
  virtual absl::StatusOr<ProbRow> ReadRow(SeqId seq, int32_t step) = 0;
  // Target worker: the log-probabilities of `tokens` at position `step` of the last Verify (the
  // residual fallback's token, which Verify could not know).
  virtual absl::StatusOr<std::vector<float>> QueryLogprobs(SeqId seq, int32_t step,
                                                           std::span<const int32_t> tokens) = 0;
  virtual absl::Status Release(SeqId seq) = 0;

  // Free KV capacity in tokens as of the worker's latest reply; the scheduler admits new requests
  // against it (and preempts if a round still runs out).
  virtual int64_t FreeKvTokens() const = 0;

  // A cheap liveness check bounded by `timeout` (the scheduler probes a worker that failed a
  // call before it sends it work again). An in-process worker is always up and never restarts.
  virtual absl::StatusOr<WorkerProbe> Probe(absl::Duration /*timeout*/) { return WorkerProbe(); }

  // How errors name this worker, e.g. "target worker at 127.0.0.1:7002".
  virtual std::string Name() const { return "in-process worker"; }
};

// A worker in this process (tests, and a future single-process mode).
class LocalWorker final : public WorkerApi {
 public:
  explicit LocalWorker(std::unique_ptr<WorkerRuntime> runtime) : runtime_(std::move(runtime)) {}

  absl::StatusOr<std::vector<SequenceOutcome>> Draft(
      std::span<const DraftSequenceRequest> batch,
      const std::function<void(const DraftStep&)>& on_step) override {
    return runtime_->Draft(batch, on_step);
  }
  absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest> batch) override {
    return runtime_->Verify(batch);
  }
  absl::StatusOr<TruncateResult> Truncate(SeqId seq, int64_t new_len, int32_t query_step,
                                          std::span<const int32_t> query_tokens) override {
    return runtime_->Truncate(seq, new_len, query_step, query_tokens);
  }
  absl::StatusOr<ProbRow> ReadRow(SeqId seq, int32_t step) override {
    return runtime_->ReadRow(seq, step);
  }
  absl::StatusOr<std::vector<float>> QueryLogprobs(SeqId seq, int32_t step,
                                                   std::span<const int32_t> tokens) override {
    return runtime_->QueryLogprobs(seq, step, tokens);
  }
  absl::Status Release(SeqId seq) override { return runtime_->Release(seq); }
  int64_t FreeKvTokens() const override {
    const KvPool& kv = runtime_->engine().kv();
    return kv.free_blocks() * kv.block_size();
  }

  WorkerRuntime& runtime() { return *runtime_; }

 private:
  std::unique_ptr<WorkerRuntime> runtime_;
};

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_WORKER_API_H_
