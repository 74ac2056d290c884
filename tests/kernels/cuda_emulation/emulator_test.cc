// The CUDA emulator's own guarantees, on small kernels written for it: the orders a GPU leaves
// open vary from launch to launch (so a missing barrier changes what a kernel reads), a barrier
// orders them, and the undefined cases (a barrier some threads never reach, lanes of one warp that
// shuffle apart) stop the process, saying why.
#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/cuda_emulation/emulated_device.h"

namespace {

constexpr int kLaunches = 64;
constexpr int32_t kWritten = 7;

// Launches `kernel` kLaunches times, one block of `threads`, and returns every value the reading
// thread saw, read from dynamic shared memory that one thread writes.
std::set<int32_t> ValuesSeen(unsigned threads, void (*kernel)(int32_t*)) {
  std::set<int32_t> seen;
  for (int i = 0; i < kLaunches; ++i) {
    int32_t out = 0;
    emu::Launch(dim3(1), dim3(threads), sizeof(int32_t), nullptr, [&out, kernel] { kernel(&out); });
    seen.insert(out);
  }
  return seen;
}

int32_t Unwritten() {
  int32_t pattern = 0;
  std::memset(&pattern, 0xcd, sizeof pattern);
  return pattern;
}

// Thread kWriter writes a slot of shared memory that thread kReader reads: a race on a GPU
// without the barrier between them.
template <unsigned kWriter, unsigned kReader, bool kBarrier>
void WriteThenRead(int32_t* out) {
  auto* slot = static_cast<int32_t*>(emu::DynamicSharedMemory());
  if (threadIdx.x == kWriter) *slot = kWritten;
  if constexpr (kBarrier) {
    __syncthreads();
  }
  if (threadIdx.x == kReader) *out = *slot;
}

TEST(CudaEmulatorTest, LanesOfAWarpRunInVaryingOrders) {
  // Lane 0 ran before lane 5 in some launches and after it in others.
  EXPECT_EQ(ValuesSeen(32, WriteThenRead<0, 5, false>), (std::set<int32_t>{kWritten, Unwritten()}));
  EXPECT_EQ(ValuesSeen(32, WriteThenRead<0, 5, true>), std::set<int32_t>{kWritten});
}

TEST(CudaEmulatorTest, WarpsOfABlockRunInVaryingOrders) {
  // The second warp's lane 0 writes, the first warp's reads.
  EXPECT_EQ(ValuesSeen(64, WriteThenRead<32, 0, false>),
            (std::set<int32_t>{kWritten, Unwritten()}));
  EXPECT_EQ(ValuesSeen(64, WriteThenRead<32, 0, true>), std::set<int32_t>{kWritten});
}

TEST(CudaEmulatorTest, BlocksRunInVaryingOrders) {
  std::set<std::vector<unsigned>> orders;
  for (int i = 0; i < 8; ++i) {
    std::vector<unsigned> order;
    emu::Launch(dim3(4), dim3(32), 0, nullptr, [&order] {
      if (threadIdx.x == 0) order.push_back(blockIdx.x);
    });
    ASSERT_EQ(order.size(), 4u);
    orders.insert(order);
  }
  EXPECT_GT(orders.size(), 1u);
}

TEST(CudaEmulatorTest, ShufflesExchangeAlongTheirMask) {
  std::vector<int> got(32, -1);
  emu::Launch(dim3(1), dim3(32), 0, nullptr, [&got] {
    got[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x) * 10, 3);
  });
  for (int lane = 0; lane < 32; ++lane) EXPECT_EQ(got[lane], (lane ^ 3) * 10) << lane;
}

using CudaEmulatorDeathTest = ::testing::Test;

TEST_F(CudaEmulatorDeathTest, ABarrierThatExitedThreadsNeverReachStops) {
  EXPECT_DEATH(emu::Launch(dim3(1), dim3(64), 0, nullptr,
                           [] {
                             if (threadIdx.x >= 32) return;
                             __syncthreads();
                           }),
               "threads wait at a barrier that exited threads never reach");
}

TEST_F(CudaEmulatorDeathTest, LanesThatShuffleApartStop) {
  EXPECT_DEATH(emu::Launch(dim3(1), dim3(32), 0, nullptr,
                           [] {
                             if (threadIdx.x % 2 == 0) (void)__shfl_xor_sync(0xffffffffu, 1, 1);
                           }),
               "lanes wait at a warp shuffle that others of their warp");
  EXPECT_DEATH(emu::Launch(dim3(1), dim3(32), 0, nullptr,
                           [] { (void)__shfl_xor_sync(0xffffffffu, 1, threadIdx.x < 16 ? 1 : 2); }),
               "shuffled with different masks");
}

}  // namespace
