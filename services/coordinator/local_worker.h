// WorkerApi over a WorkerRuntime in this process: the round and scheduler tests run the same code
// the worker processes serve, without processes. Not linked into specd-coordinator, which links
// no engine.
#ifndef SPECD_SERVICES_COORDINATOR_LOCAL_WORKER_H_
#define SPECD_SERVICES_COORDINATOR_LOCAL_WORKER_H_

#include <memory>
#include <utility>
#include <vector>

#include "common/worker/worker_runtime.h"
#include "services/coordinator/worker_api.h"

namespace specd {

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
  absl::StatusOr<std::vector<SequenceAnswer<TruncateResult>>> Truncate(
      std::span<const TruncateSequenceRequest> batch) override {
    std::vector<SequenceAnswer<TruncateResult>> out;
    for (const TruncateSequenceRequest& r : batch) {
      out.push_back({r.seq, runtime_->Truncate(r)});
    }
    return out;
  }
  absl::StatusOr<std::vector<SequenceAnswer<ProbRow>>> ReadRows(
      std::span<const RowQuery> batch) override {
    std::vector<SequenceAnswer<ProbRow>> out;
    for (const RowQuery& q : batch) out.push_back({q.seq, runtime_->ReadRow(q.seq, q.step)});
    return out;
  }
  absl::StatusOr<std::vector<SequenceAnswer<std::vector<float>>>> QueryLogprobs(
      std::span<const LogprobQuery> batch) override {
    std::vector<SequenceAnswer<std::vector<float>>> out;
    for (const LogprobQuery& q : batch) {
      out.push_back({q.seq, runtime_->QueryLogprobs(q.seq, q.step, q.tokens)});
    }
    return out;
  }
  absl::Status Release(SeqId seq) override { return runtime_->Release(seq); }
  int64_t FreeKvTokens() const override { return runtime_->kv_free().tokens; }

  WorkerRuntime& runtime() { return *runtime_; }

 private:
  std::unique_ptr<WorkerRuntime> runtime_;
};

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_LOCAL_WORKER_H_
