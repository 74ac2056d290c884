// A few threads that run posted tasks, for work that must not run on a network thread. The
// coordinator parses and tokenizes requests here (a 4 MiB prompt is tens of milliseconds of
// tokenizer), so that neither gRPC's callback threads nor the HTTP API's I/O threads stall the
// streams of other requests meanwhile: TGI's validation workers, vLLM's tokenizer pool.
#ifndef SPECD_SERVICES_COMMON_WORK_QUEUE_H_
#define SPECD_SERVICES_COMMON_WORK_QUEUE_H_

#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace specd {

class WorkQueue {
 public:
  using Task = absl::AnyInvocable<void() &&>;

  explicit WorkQueue(int num_threads);  // at least one thread
  ~WorkQueue();                         // Stop()

  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `task`; tasks start in posting order. Every posted task runs exactly once, even one
  // posted after Stop() (it then runs on the caller's thread), so a call waiting on it always
  // finishes.
  void Post(Task task);

  // Runs every queued task, then joins the threads. Idempotent.
  void Stop();

 private:
  void Loop();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_WORK_QUEUE_H_
