#include "services/common/engine_thread.h"

#include <utility>

namespace specd {

EngineThread::EngineThread(std::unique_ptr<WorkerRuntime> runtime, DeviceLost on_device_lost)
    : runtime_(std::move(runtime)), on_device_lost_(std::move(on_device_lost)) {
  thread_ = std::thread([this] { Loop(); });
}

EngineThread::~EngineThread() { Stop(); }

void EngineThread::Post(Job job) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_) {
      queue_.push_back(std::move(job));
      return;
    }
  }
  absl::MutexLock lock(&inline_mu_);
  std::move(job)(*runtime_);
}

void EngineThread::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  thread_.join();
}

bool EngineThread::HasWorkOrStopping() const { return stopping_ || !queue_.empty(); }

void EngineThread::Loop() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &EngineThread::HasWorkOrStopping));
      if (queue_.empty()) {
        stopped_ = true;  // stopping and drained: later posts run inline
        return;
      }
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(job)(*runtime_);
    if (!on_device_lost_) continue;
    if (const absl::Status health = runtime_->engine().backend().Health(); !health.ok()) {
      DeviceLost lost = std::move(on_device_lost_);
      on_device_lost_ = nullptr;
      std::move(lost)(health);
    }
  }
}

}  // namespace specd
