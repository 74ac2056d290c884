// A small persistent thread pool for the CPU back end.
#ifndef SPECD_KERNELS_CPU_THREAD_POOL_H_
#define SPECD_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace specd::kernels::cpu {

// `num_threads` threads in all: the caller of ParallelFor plus num_threads - 1 workers that spin
// briefly after each job (so back-to-back ops wake them cheaply) and then sleep on a futex.
// Work is handed out in chunks claimed from a shared counter, so a descheduled worker delays
// nothing; which thread runs a chunk never changes what the chunk computes.
// CPUs this process may run on (its affinity mask), at least 1.
int AvailableCpuCount();

class ThreadPool {
 public:
  static constexpr int kMaxThreads = 1024;

  // num_threads in [1, kMaxThreads].
  static absl::StatusOr<std::unique_ptr<ThreadPool>> Create(int num_threads);

  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint ranges that cover [0, n); every range starts at a multiple
  // of `grain` (>= 1) and holds at most `grain` items. Returns when all calls have returned.
  // Calls from several threads are serialised; a call from inside `fn` runs inline.
  void ParallelFor(int64_t n, int64_t grain, absl::FunctionRef<void(int64_t, int64_t)> fn);

 private:
  ThreadPool() = default;

  void WorkerMain();
  // Claims and runs chunks of the current job until none is left.
  void RunChunks();

  // The job: written by the caller before it publishes a new `state_`, read by a thread only
  // after it has claimed a chunk, and stable until every claimed chunk has been counted in done_.
  const absl::FunctionRef<void(int64_t, int64_t)>* job_fn_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_grain_ = 1;

  // generation (16 bits) | chunk count (24 bits) | next unclaimed chunk (24 bits).
  alignas(64) std::atomic<uint64_t> state_{0};
  alignas(64) std::atomic<uint32_t> done_{0};  // chunks finished in the current job
  alignas(64) std::atomic<uint32_t> wake_{0};  // bumped for every job and at shutdown
  std::atomic<bool> stop_{false};

  std::mutex call_mu_;       // one ParallelFor at a time
  uint16_t generation_ = 0;  // guarded by call_mu_
  std::vector<std::thread> workers_;
};

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_THREAD_POOL_H_
