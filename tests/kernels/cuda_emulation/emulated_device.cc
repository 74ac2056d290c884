// The emulator's launches: blocks one at a time in a shuffled order, the threads of a block as
// fibers (Boost.Context) that switch only where a GPU thread must wait for others. Between two
// such waits the warps of a block, and the lanes of a warp, run in a varying order too: a GPU
// promises no order there, so a kernel that shares memory between them without a barrier reads
// what another thread has not written yet, or has already overwritten, and shows.
#include "tests/kernels/cuda_emulation/emulated_device.h"

#include <algorithm>
#include <array>
#include <boost/context/fiber.hpp>
#include <boost/context/protected_fixedsize_stack.hpp>
#include <cstdio>
#include <cstdlib>
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

// Runs a block warp by warp, in a shuffled order: each warp until all its threads wait at the
// block barrier or have exited, releasing its shuffles as they complete, then the barrier once
// the whole block waits. A warp's lanes run one after another in an order drawn per grid.
class BlockScheduler {
 public:
  BlockScheduler() = default;
  BlockScheduler(const BlockScheduler&) = delete;
  BlockScheduler& operator=(const BlockScheduler&) = delete;

  // Lets every lane's loop end, so that each fiber returns normally.
  ~BlockScheduler() {
    quitting_ = true;
    for (int t = 0; t < lanes_made_; ++t) {
      if (fibers_[static_cast<size_t>(t)]) Resume(t);
    }
  }

  void RunGrid(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& kernel) {
    const int n = static_cast<int>(block.x * block.y * block.z);
    while (lanes_made_ < n) AddLane();
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
      lanes_[t].index = dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y));
    }
    kernel_ = &kernel;
    shared_.resize((shared_bytes + sizeof(SharedUnit) - 1) / sizeof(SharedUnit) + 1);
    // The lanes' order is a rotation, ascending or descending, drawn per grid: every two lanes
    // run both ways round over a few launches, while the kernel's memory accesses stay in
    // sequence, as they are fastest on the host.
    const int rotation = static_cast<int>(rng_() % kWarpSize);
    const int step = rng_() % 2 == 0 ? 1 : kWarpSize - 1;
    for (int i = 0; i < kWarpSize; ++i) {
      lane_order_[static_cast<size_t>(i)] = (rotation + i * step) % kWarpSize;
      lane_rank_[static_cast<size_t>(lane_order_[static_cast<size_t>(i)])] = i;
    }
    warp_order_.clear();
    for (int w = 0; w < n; w += kWarpSize) warp_order_.push_back(w);
    std::shuffle(warp_order_.begin(), warp_order_.end(), rng_);
    for (const dim3& b : order) {
      blockIdx = b;
      std::fill_n(reinterpret_cast<unsigned char*>(shared_.data()), shared_bytes, kUnwrittenShared);
      RunBlock(n);
    }
    kernel_ = nullptr;
  }

  void* shared() { return shared_.data(); }

  bool Barrier(int predicate) {
    Lane& lane = lanes_[static_cast<size_t>(current_)];
    lane.predicate = predicate;
    lane.state = State::kAtBarrier;
    Yield();
    return barrier_or_;
  }

  uint64_t Exchange(uint64_t value, int xor_mask) {
    Lane& lane = lanes_[static_cast<size_t>(current_)];
    lane.shuffle_value = value;
    lane.xor_mask = xor_mask;
    lane.state = State::kAtShuffle;
    Yield();
    return lane.shuffle_result;
  }

 private:
  enum class State : uint8_t { kRunnable, kAtBarrier, kAtShuffle, kDone };
  // What the scheduler reads and writes at every switch, kept apart from the fibers and in one
  // array, so that it stays in the cache beside the kernels' own data.
  struct Lane {
    State state = State::kDone;
    int predicate = 0;
    int xor_mask = 0;
    dim3 index;  // threadIdx in the running grid
    uint64_t shuffle_value = 0;
    uint64_t shuffle_result = 0;
  };

  // The lane starts when RunWarp first resumes it.
  void AddLane() {
    const int index = lanes_made_++;
    fibers_[static_cast<size_t>(index)] =
        bctx::fiber(std::allocator_arg, bctx::protected_fixedsize_stack(kStackBytes),
                    [this, index](bctx::fiber&& caller) {
                      Slot(from_) = std::move(caller);
                      LaneMain(index);
                      // The scheduler's resume returns this finished fiber's (empty)
                      // continuation, which then goes to the lane's slot.
                      from_ = index;
                      return std::move(scheduler_);
                    });
  }

  // A lane's life: the kernel once per block, until the scheduler is destroyed.
  void LaneMain(int index) {
    while (!quitting_) {
      (*kernel_)();
      lanes_[static_cast<size_t>(index)].state = State::kDone;
      Yield();
    }
  }

  // Where the continuation of `who` (-1: the scheduler) is kept while it is suspended.
  bctx::fiber& Slot(int who) { return who < 0 ? scheduler_ : fibers_[static_cast<size_t>(who)]; }

  // Suspends `self` (-1: the scheduler) and runs `target` (-1: the scheduler); returns when
  // something switches back to `self`. Lanes pass control along their warp directly, so that a
  // shuffle costs one switch per lane rather than two.
  void Switch(int self, int target) {
    from_ = self;
    if (target >= 0) {
      current_ = target;
      threadIdx = lanes_[static_cast<size_t>(target)].index;
    }
    bctx::fiber came_from = std::move(Slot(target)).resume();
    Slot(from_) = std::move(came_from);
  }

  // From the running lane, which now waits or has exited: on to the next runnable lane of its
  // warp in lane_order_, or back to the scheduler after the warp's last.
  void Yield() {
    const int self = current_;
    const int warp_begin = self / kWarpSize * kWarpSize;
    int next = -1;
    for (int i = lane_rank_[static_cast<size_t>(self - warp_begin)] + 1; i < kWarpSize && next < 0;
         ++i) {
      const int t = warp_begin + lane_order_[static_cast<size_t>(i)];
      if (lanes_[static_cast<size_t>(t)].state == State::kRunnable) next = t;
    }
    Switch(self, next);
  }

  void Resume(int t) { Switch(-1, t); }

  void RunBlock(int n) {
    for (int t = 0; t < n; ++t) lanes_[static_cast<size_t>(t)].state = State::kRunnable;
    for (bool forward = true;; forward = !forward) {
      // Phases alternate between warp_order_ and its reverse, so that each pair of warps runs
      // both ways round in a block with barriers.
      if (forward) {
        for (const int w : warp_order_) RunWarp(w);
      } else {
        for (auto w = warp_order_.rbegin(); w != warp_order_.rend(); ++w) RunWarp(*w);
      }
      int done = 0;
      for (int t = 0; t < n; ++t) done += lanes_[static_cast<size_t>(t)].state == State::kDone;
      if (done == n) return;
      if (done > 0) {
        Fail("threads wait at a barrier that exited threads never reach: undefined on a GPU");
      }
      barrier_or_ = false;
      for (int t = 0; t < n; ++t) {
        Lane& lane = lanes_[static_cast<size_t>(t)];
        barrier_or_ = barrier_or_ || lane.predicate != 0;
        lane.state = State::kRunnable;
      }
    }
  }

  // Runs the warp of lanes [w, w + 32) until each waits at the block barrier or has exited.
  void RunWarp(int w) {
    Lane* const warp = &lanes_[static_cast<size_t>(w)];
    for (;;) {
      // The lanes run in turn from the first runnable one in lane_order_ to its end (Yield).
      for (const int l : lane_order_) {
        if (warp[l].state == State::kRunnable) {
          Resume(w + l);
          break;
        }
      }
      int at_shuffle = 0;
      for (int l = 0; l < kWarpSize; ++l) at_shuffle += warp[l].state == State::kAtShuffle;
      if (at_shuffle == 0) return;
      if (at_shuffle != kWarpSize) {
        Fail(
            "lanes wait at a warp shuffle that others of their warp, at a barrier or exited, "
            "never reach");
      }
      const int mask = warp[0].xor_mask;
      for (int l = 0; l < kWarpSize; ++l) {
        if (warp[l].xor_mask != mask) {
          Fail("the lanes of a warp shuffled with different masks: undefined on a GPU");
        }
        warp[l].shuffle_result = warp[l ^ mask].shuffle_value;
      }
      for (int l = 0; l < kWarpSize; ++l) warp[l].state = State::kRunnable;
    }
  }

  // The scheduler never moves (one per host thread), so a lane's fiber may refer to it.
  std::array<Lane, kMaxThreads> lanes_{};
  std::array<bctx::fiber, kMaxThreads> fibers_{};  // each lane's continuation while suspended
  int lanes_made_ = 0;                             // lanes [0, lanes_made_) have fibers
  bctx::fiber scheduler_;                          // the scheduler's continuation while a lane runs
  int current_ = -1;                               // the running lane
  int from_ = -1;  // who switched last (-1: the scheduler); see Switch
  bool quitting_ = false;
  bool barrier_or_ = false;
  const std::function<void()>* kernel_ = nullptr;
  struct alignas(16) SharedUnit {
    unsigned char bytes[16];
  };
  std::vector<SharedUnit> shared_;  // aligned as a GPU's
  std::mt19937_64 rng_{20261127};
  // Drawn by RunGrid for each grid:
  std::array<int, kWarpSize> lane_order_{};  // the order a warp's lanes run in
  std::array<int, kWarpSize> lane_rank_{};   // each lane's place in lane_order_
  std::vector<int> warp_order_;              // the first lanes of the block's warps, shuffled
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
  if (threads % kWarpSize != 0) {
    Fail("a block of a partial warp, which the emulator does not model");
  }
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
