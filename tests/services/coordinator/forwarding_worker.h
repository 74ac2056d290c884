// A WorkerApi that passes every call to another one. The coordinator tests' doubles (broken
// variants, recorders, counters) derive from it and override only the calls they change or watch.
#ifndef SPECD_TESTS_SERVICES_COORDINATOR_FORWARDING_WORKER_H_
#define SPECD_TESTS_SERVICES_COORDINATOR_FORWARDING_WORKER_H_

#include <condition_variable>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "services/coordinator/worker_api.h"

namespace specd::testing {

class ForwardingWorker : public WorkerApi {
 public:
  explicit ForwardingWorker(WorkerApi& inner) : inner_(inner) {}

  absl::StatusOr<std::vector<SequenceOutcome>> Draft(
      std::span<const DraftSequenceRequest> batch,
      const std::function<void(const DraftStep&)>& on_step) override {
    return inner_.Draft(batch, on_step);
  }
  absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest> batch) override {
    return inner_.Verify(batch);
  }
  absl::StatusOr<std::vector<SequenceAnswer<TruncateResult>>> Truncate(
      std::span<const TruncateSequenceRequest> batch) override {
    return inner_.Truncate(batch);
  }
  absl::StatusOr<std::vector<SequenceAnswer<ProbRow>>> ReadRows(
      std::span<const RowQuery> batch) override {
    return inner_.ReadRows(batch);
  }
  absl::StatusOr<std::vector<SequenceAnswer<std::vector<float>>>> QueryLogprobs(
      std::span<const LogprobQuery> batch) override {
    return inner_.QueryLogprobs(batch);
  }
  absl::Status Release(SeqId seq) override { return inner_.Release(seq); }
  int64_t FreeKvTokens() const override { return inner_.FreeKvTokens(); }
  absl::StatusOr<WorkerProbe> Probe(absl::Duration timeout) override {
    return inner_.Probe(timeout);
  }
  std::string Name() const override { return inner_.Name(); }

 protected:
  WorkerApi& inner_;
};

// A worker whose Probe waits for Open(). The scheduler probes its workers once before it admits
// anything, so requests submitted before Open() are admitted together in its first round, however
// late the test's own thread runs. Open it in an absl::Cleanup declared after the scheduler, so a
// failed assertion does not leave ~Scheduler waiting for its thread.
class GatedWorker final : public ForwardingWorker {
 public:
  explicit GatedWorker(WorkerApi& inner) : ForwardingWorker(inner) {}
  absl::StatusOr<WorkerProbe> Probe(absl::Duration timeout) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return open_; });
    }
    return inner_.Probe(timeout);
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

}  // namespace specd::testing

#endif  // SPECD_TESTS_SERVICES_COORDINATOR_FORWARDING_WORKER_H_
