// The single owner of a worker's WorkerRuntime: a job queue drained by one thread. gRPC
// reactions never block; they post a job here and return, and the job finishes their call.
// Jobs run one at a time in posting order, so the runtime needs no locks (an actor, as TGI's
// router queue). After each job the thread asks the engine's back end for its health, and hands
// a lost device to `on_device_lost` (kernels::Backend::Health).
#ifndef SPECD_SERVICES_COMMON_ENGINE_THREAD_H_
#define SPECD_SERVICES_COMMON_ENGINE_THREAD_H_

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/worker/worker_runtime.h"
#include "services/common/work_queue.h"

namespace specd {

class EngineThread {
 public:
  using Job = absl::AnyInvocable<void(WorkerRuntime&) &&>;
  using DeviceLost = absl::AnyInvocable<void(const absl::Status&)>;

  // `on_device_lost` runs on the engine thread, at most once.
  EngineThread(std::unique_ptr<WorkerRuntime> runtime, DeviceLost on_device_lost);
  ~EngineThread();  // Stop()

  EngineThread(const EngineThread&) = delete;
  EngineThread& operator=(const EngineThread&) = delete;

  // Queues `job`. Every posted job runs exactly once, even one posted after Stop() (it then runs
  // on the caller's thread), so a reactor waiting on it always finishes.
  void Post(Job job);

  // Runs every queued job, then joins the thread. Idempotent.
  void Stop() { queue_.Stop(); }

 private:
  void Run(Job job);

  // Held while a job runs: the queue's one thread needs it only for the jobs run inline after
  // Stop(), which may come from several threads at once.
  absl::Mutex run_mu_;
  std::unique_ptr<WorkerRuntime> runtime_ ABSL_GUARDED_BY(run_mu_);
  DeviceLost on_device_lost_ ABSL_GUARDED_BY(run_mu_);  // empty once run
  WorkQueue queue_{1};                                  // last: stopped before the runtime goes
};

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_ENGINE_THREAD_H_
