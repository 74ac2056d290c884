#include "kernels/cpu/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <system_error>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/math.h"

namespace specd::kernels::cpu {
namespace {

constexpr uint64_t kFieldMask = (uint64_t{1} << 24) - 1;
constexpr int64_t kMaxChunks = static_cast<int64_t>(kFieldMask);

// Ops in a decode step follow each other within microseconds, so a worker keeps spinning this
// long after a job before it sleeps; the caller spins longer for chunks already under way.
constexpr std::chrono::nanoseconds kWorkerSpin = std::chrono::microseconds(100);
constexpr std::chrono::nanoseconds kCallerSpin = std::chrono::milliseconds(1);

uint64_t PackState(uint16_t generation, uint32_t count, uint32_t next) {
  return (uint64_t{generation} << 48) | (uint64_t{count} << 24) | next;
}

// The pool whose job this thread is running, so that a nested ParallelFor runs inline.
thread_local const ThreadPool* tls_running_pool = nullptr;

class RunningPoolScope {
 public:
  explicit RunningPoolScope(const ThreadPool* pool) : saved_(tls_running_pool) {
    tls_running_pool = pool;
  }
  ~RunningPoolScope() { tls_running_pool = saved_; }
  RunningPoolScope(const RunningPoolScope&) = delete;
  RunningPoolScope& operator=(const RunningPoolScope&) = delete;

 private:
  const ThreadPool* saved_;
};

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until ready() or until `budget` has passed; returns ready().
template <class Ready>
bool SpinUntil(Ready ready, std::chrono::nanoseconds budget) {
  const auto deadline = std::chrono::steady_clock::now() + budget;
  for (uint32_t i = 1;; ++i) {
    if (ready()) return true;
    CpuRelax();
    if (i % 256 == 0 && std::chrono::steady_clock::now() > deadline) return ready();
  }
}

}  // namespace

int AvailableCpuCount() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

absl::StatusOr<std::unique_ptr<ThreadPool>> ThreadPool::Create(int num_threads) {
  if (num_threads < 1 || num_threads > kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat("ThreadPool: num_threads must be in [1, ",
                                                   kMaxThreads, "], got ", num_threads));
  }
  auto pool = absl::WrapUnique(new ThreadPool());
  pool->workers_.reserve(static_cast<size_t>(num_threads - 1));
  try {
    for (int i = 1; i < num_threads; ++i) {
      pool->workers_.emplace_back([p = pool.get()] { p->WorkerMain(); });
    }
  } catch (const std::system_error& e) {
    // The destructor stops and joins the workers started so far.
    return absl::ResourceExhaustedError(absl::StrCat("ThreadPool: could not start worker thread ",
                                                     pool->workers_.size() + 1, " of ", num_threads,
                                                     ": ", e.what()));
  }
  return pool;
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  wake_.fetch_add(1, std::memory_order_release);
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::WorkerMain() {
  uint32_t seen = wake_.load(std::memory_order_acquire);
  for (;;) {
    if (stop_.load(std::memory_order_acquire)) return;
    const auto woken = [&] { return wake_.load(std::memory_order_acquire) != seen; };
    if (!SpinUntil(woken, kWorkerSpin)) wake_.wait(seen, std::memory_order_acquire);
    seen = wake_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    const RunningPoolScope scope(this);
    RunChunks();
  }
}

void ThreadPool::RunChunks() {
  uint64_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    const uint32_t next = static_cast<uint32_t>(s & kFieldMask);
    const uint32_t count = static_cast<uint32_t>((s >> 24) & kFieldMask);
    if (next >= count) return;
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      continue;
    }
    // The claim happened after the caller published this job, so the job fields are its.
    const int64_t begin = static_cast<int64_t>(next) * job_grain_;
    (*job_fn_)(begin, std::min(job_n_, begin + job_grain_));
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == count) done_.notify_one();
    s = state_.load(std::memory_order_acquire);
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (CeilDiv(n, grain) > kMaxChunks) grain = CeilDiv(n, kMaxChunks);
  const int64_t chunks = CeilDiv(n, grain);
  if (workers_.empty() || chunks == 1 || tls_running_pool == this) {
    for (int64_t begin = 0; begin < n; begin += grain) fn(begin, std::min(n, begin + grain));
    return;
  }

  const std::lock_guard<std::mutex> lock(call_mu_);
  job_fn_ = &fn;
  job_n_ = n;
  job_grain_ = grain;
  done_.store(0, std::memory_order_relaxed);
  ++generation_;
  state_.store(PackState(generation_, static_cast<uint32_t>(chunks), 0), std::memory_order_release);
  wake_.fetch_add(1, std::memory_order_release);
  wake_.notify_all();
  {
    const RunningPoolScope scope(this);
    RunChunks();
  }
  // Every chunk is claimed now; wait for the ones still running on workers.
  const auto all_done = [&] { return done_.load(std::memory_order_acquire) == chunks; };
  if (SpinUntil(all_done, kCallerSpin)) return;
  for (;;) {
    const uint32_t d = done_.load(std::memory_order_acquire);
    if (d == chunks) return;
    done_.wait(d, std::memory_order_acquire);
  }
}

}  // namespace specd::kernels::cpu
