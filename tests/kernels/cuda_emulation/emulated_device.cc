// The emulator's launches: blocks one at a time in a shuffled order, the threads of a block as
// fibers (Boost.Context) that switch only where a GPU thread must wait for others.
#include "tests/kernels/cuda_emulation/emulated_device.h"

#include <algorithm>
#include <boost/context/fiber.hpp>
#include <boost/context/protected_fixedsize_stack.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <utility>
#include <vector>

#include "tests/kernels/cuda_emulation/emulated_runtime.h"

// Per host thread: a block's fibers all run on the thread that launched the grid.
thread_local dim3 threadIdx;
thread_local dim3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace emu {
namespace {

namespace bctx = boost::context;

constexpr int kWarpSize = 32;
constexpr unsigned kMaxThreads = 1024;
constexpr size_t kMaxDynamicShared = 48 << 10;
// Kernel frames are small (attention's largest holds a few KiB of scores); the guard page below
// each stack turns an overflow into a fault rather than silent corruption.
constexpr size_t kStackBytes = 256 << 10;
// Unwritten shared memory reads as this pattern, so a kernel that reads before it writes shows.
constexpr unsigned char kUnwrittenShared = 0xcd;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "CUDA emulator: %s (block %u,%u,%u, grid %u,%u,%u, %u threads)\n", what,
               blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z,
               blockDim.x * blockDim.y * blockDim.z);
  std::abort();
}

// Shared memory statics are one per kernel, not one per grid: two grids must not interleave,
// even from two host threads (two engines in one test).
std::mutex& GridMutex() {
  static std::mutex mutex;
  return mutex;
}

// Runs a block warp by warp: each warp until all its threads wait at the block barrier or have
// exited, releasing its shuffles as they complete, then the barrier once the whole block waits.
class BlockScheduler {
 public:
  BlockScheduler() = default;
  BlockScheduler(const BlockScheduler&) = delete;
  BlockScheduler& operator=(const BlockScheduler&) = delete;

  // Lets every lane's loop end, so that each fiber returns normally.
  ~BlockScheduler() {
    quitting_ = true;
    for (size_t t = 0; t < lanes_.size(); ++t) {
      if (lanes_[t]->fiber) Resume(static_cast<int>(t));
    }
  }

  void RunGrid(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& kernel) {
    const int n = static_cast<int>(block.x * block.y * block.z);
    while (static_cast<int>(lanes_.size()) < n) AddLane();
    std::vector<dim3> order;
    order.reserve(size_t{grid.x} * grid.y * grid.z);
    for (unsigned z = 0; z < grid.z; ++z) {
      for (unsigned y = 0; y < grid.y; ++y) {
        for (unsigned x = 0; x < grid.x; ++x) order.emplace_back(x, y, z);
      }
    }
    std::shuffle(order.begin(), order.end(), rng_);
    gridDim = grid;
    blockDim = block;
    for (unsigned t = 0; t < static_cast<unsigned>(n); ++t) {
      lanes_[t]->index = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
    }
    kernel_ = &kernel;
    shared_.resize((shared_bytes + sizeof(SharedUnit) - 1) / sizeof(SharedUnit) + 1);
    for (const dim3& b : order) {
      blockIdx = b;
      std::fill_n(reinterpret_cast<unsigned char*>(shared_.data()), shared_bytes, kUnwrittenShared);
      RunBlock(n);
    }
    kernel_ = nullptr;
  }

  void* shared() { return shared_.data(); }

  bool Barrier(int predicate) {
    Lane& lane = *lanes_[static_cast<size_t>(current_)];
    lane.predicate = predicate;
    lane.state = State::kAtBarrier;
    Yield();
    return barrier_or_;
  }

  uint64_t Exchange(uint64_t value, int xor_mask) {
    Lane& lane = *lanes_[static_cast<size_t>(current_)];
    lane.shuffle_value = value;
    lane.xor_mask = xor_mask;
    lane.state = State::kAtShuffle;
    Yield();
    return lane.shuffle_result;
  }

 private:
  enum class State { kRunnable, kAtBarrier, kAtShuffle, kDone };
  struct Lane {
    bctx::fiber fiber;
    State state = State::kDone;
    dim3 index;  // threadIdx in the running grid
    int predicate = 0;
    int xor_mask = 0;
    uint64_t shuffle_value = 0;
    uint64_t shuffle_result = 0;
  };

  // The lane starts when RunWarp first resumes it.
  void AddLane() {
    const int index = static_cast<int>(lanes_.size());
    auto lane = std::make_unique<Lane>();
    lane->fiber = bctx::fiber(std::allocator_arg, bctx::protected_fixedsize_stack(kStackBytes),
                              [this, index](bctx::fiber&& caller) {
                                Slot(from_) = std::move(caller);
                                LaneMain();
                                // The scheduler's resume returns this finished fiber's (empty)
                                // continuation, which then goes to the lane's slot.
                                from_ = index;
                                return std::move(scheduler_);
                              });
    lanes_.push_back(std::move(lane));
  }

  // A lane's life: the kernel once per block, until the scheduler is destroyed.
  void LaneMain() {
    Lane& lane = *lanes_[static_cast<size_t>(current_)];
    while (!quitting_) {
      (*kernel_)();
      lane.state = State::kDone;
      Yield();
    }
  }

  // Where the continuation of `who` (-1: the scheduler) is kept while it is suspended.
  bctx::fiber& Slot(int who) {
    return who < 0 ? scheduler_ : lanes_[static_cast<size_t>(who)]->fiber;
  }

  // Suspends `self` (-1: the scheduler) and runs `target` (-1: the scheduler); returns when
  // something switches back to `self`. Lanes pass control along their warp directly, so that a
  // shuffle costs one switch per lane rather than two.
  void Switch(int self, int target) {
    from_ = self;
    if (target >= 0) {
      current_ = target;
      threadIdx = lanes_[static_cast<size_t>(target)]->index;
    }
    bctx::fiber came_from = std::move(Slot(target)).resume();
    Slot(from_) = std::move(came_from);
  }

  // From the running lane, which now waits or has exited: on to the next runnable lane of its
  // warp, or back to the scheduler after the warp's last.
  void Yield() {
    const int self = current_;
    const int warp_end = (self / kWarpSize + 1) * kWarpSize;
    int next = -1;
    for (int t = self + 1; t < warp_end && next < 0; ++t) {
      if (lanes_[static_cast<size_t>(t)]->state == State::kRunnable) next = t;
    }
    Switch(self, next);
  }

  void Resume(int t) { Switch(-1, t); }

  void RunBlock(int n) {
    for (int t = 0; t < n; ++t) lanes_[static_cast<size_t>(t)]->state = State::kRunnable;
    for (;;) {
      for (int w = 0; w < n; w += kWarpSize) RunWarp(w);
      int done = 0;
      for (int t = 0; t < n; ++t) done += lanes_[static_cast<size_t>(t)]->state == State::kDone;
      if (done == n) return;
      if (done > 0)
        Fail("threads wait at a barrier that exited threads never reach: undefined on a GPU");
      barrier_or_ = false;
      for (int t = 0; t < n; ++t) {
        Lane& lane = *lanes_[static_cast<size_t>(t)];
        barrier_or_ = barrier_or_ || lane.predicate != 0;
        lane.state = State::kRunnable;
      }
    }
  }

  // Runs the warp of lanes [w, w + 32) until each waits at the block barrier or has exited.
  void RunWarp(int w) {
    const std::unique_ptr<Lane>* const warp = &lanes_[static_cast<size_t>(w)];
    for (;;) {
      // The lanes run in turn from the first runnable one to the warp's end (Yield).
      for (int l = 0; l < kWarpSize; ++l) {
        if (warp[l]->state == State::kRunnable) {
          Resume(w + l);
          break;
        }
      }
      int at_shuffle = 0;
      for (int l = 0; l < kWarpSize; ++l) at_shuffle += warp[l]->state == State::kAtShuffle;
      if (at_shuffle == 0) return;
      if (at_shuffle != kWarpSize) {
        Fail(
            "lanes wait at a warp shuffle that others of their warp, at a barrier or exited, "
            "never reach");
      }
      const int mask = warp[0]->xor_mask;
      for (int l = 0; l < kWarpSize; ++l) {
        if (warp[l]->xor_mask != mask)
          Fail("the lanes of a warp shuffled with different masks: undefined on a GPU");
        warp[l]->shuffle_result = warp[l ^ mask]->shuffle_value;
      }
      for (int l = 0; l < kWarpSize; ++l) warp[l]->state = State::kRunnable;
    }
  }

  // Lanes never move, so a lane's fiber may hold references to its Lane.
  std::vector<std::unique_ptr<Lane>> lanes_;
  bctx::fiber scheduler_;  // the scheduler's continuation while a lane runs
  int current_ = -1;       // the running lane
  int from_ = -1;          // who switched last (-1: the scheduler); see Switch
  bool quitting_ = false;
  bool barrier_or_ = false;
  const std::function<void()>* kernel_ = nullptr;
  struct alignas(16) SharedUnit {
    unsigned char bytes[16];
  };
  std::vector<SharedUnit> shared_;  // aligned as a GPU's
  std::mt19937_64 rng_{20261127};
};

BlockScheduler& Scheduler() {
  // Fibers stay on the host thread that made them.
  thread_local BlockScheduler scheduler;
  return scheduler;
}

}  // namespace

void Launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, cudaStream_t stream,
            std::function<void()> kernel) {
  const unsigned threads = block.x * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 ||
      threads == 0 || threads > kMaxThreads || dynamic_shared_bytes > kMaxDynamicShared) {
    (void)SetError(cudaErrorInvalidConfiguration);
    return;
  }
  if (threads % kWarpSize != 0)
    Fail("a block of a partial warp, which the emulator does not model");
  Enqueue(stream, [grid, block, dynamic_shared_bytes, kernel = std::move(kernel)] {
    const std::lock_guard<std::mutex> lock(GridMutex());
    Scheduler().RunGrid(grid, block, dynamic_shared_bytes, kernel);
  });
}

void* DynamicSharedMemory() { return Scheduler().shared(); }

bool BlockBarrier(int predicate) { return Scheduler().Barrier(predicate); }

uint64_t WarpExchange(uint64_t value, int xor_mask) {
  if (xor_mask <= 0 || xor_mask >= kWarpSize) Fail("a shuffle mask outside the warp");
  return Scheduler().Exchange(value, xor_mask);
}

}  // namespace emu
