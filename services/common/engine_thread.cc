#include "services/common/engine_thread.h"

#include <utility>

namespace specd {

EngineThread::EngineThread(std::unique_ptr<WorkerRuntime> runtime, DeviceLost on_device_lost)
    : runtime_(std::move(runtime)), on_device_lost_(std::move(on_device_lost)) {}

EngineThread::~EngineThread() { Stop(); }

void EngineThread::Post(Job job) {
  queue_.Post([this, job = std::move(job)]() mutable { Run(std::move(job)); });
}

void EngineThread::Run(Job job) {
  absl::MutexLock lock(&run_mu_);
  std::move(job)(*runtime_);
  if (!on_device_lost_) return;
  if (const absl::Status health = runtime_->engine().backend().Health(); !health.ok()) {
    DeviceLost lost = std::exchange(on_device_lost_, nullptr);
    std::move(lost)(health);
  }
}

}  // namespace specd
