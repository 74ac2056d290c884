#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace specd::kernels::cpu {
namespace {

class ThreadPoolTest : public ::testing::TestWithParam<int> {};

TEST_P(ThreadPoolTest, EveryIndexExactlyOnceInAlignedChunks) {
  auto pool = ThreadPool::Create(GetParam());
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->num_threads(), GetParam());
  for (const int64_t n : {1, 2, 7, 64, 1000, 12345}) {
    for (const int64_t grain : {1, 3, 16, 5000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<bool> bad_range{false};
      (*pool)->ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
        if (begin % grain != 0 || end - begin > grain || end <= begin || end > n) bad_range = true;
        for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
      });
      EXPECT_FALSE(bad_range) << "n " << n << " grain " << grain;
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " i " << i;
    }
  }
}

TEST_P(ThreadPoolTest, ManySmallJobsBackToBack) {
  auto pool = ThreadPool::Create(GetParam());
  ASSERT_TRUE(pool.ok());
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 20000; ++job) {
    (*pool)->ParallelFor(4, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) sum.fetch_add(i + 1);
    });
  }
  EXPECT_EQ(sum.load(), 20000 * 10);
}

TEST_P(ThreadPoolTest, NestedCallsRunInline) {
  auto pool = ThreadPool::Create(GetParam());
  ASSERT_TRUE(pool.ok());
  std::atomic<int64_t> count{0};
  (*pool)->ParallelFor(8, 1, [&](int64_t, int64_t) {
    (*pool)->ParallelFor(10, 2, [&](int64_t begin, int64_t end) { count += end - begin; });
  });
  EXPECT_EQ(count.load(), 80);
}

TEST_P(ThreadPoolTest, CallsFromSeveralThreadsAreSerialised) {
  auto pool = ThreadPool::Create(GetParam());
  ASSERT_TRUE(pool.ok());
  std::atomic<int64_t> count{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int j = 0; j < 300; ++j) {
        (*pool)->ParallelFor(100, 7, [&](int64_t begin, int64_t end) { count += end - begin; });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(count.load(), 3 * 300 * 100);
}

INSTANTIATE_TEST_SUITE_P(Threads, ThreadPoolTest, ::testing::Values(1, 2, 3, 8));

TEST(ThreadPoolCreateTest, RejectsBadThreadCounts) {
  EXPECT_EQ(ThreadPool::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ThreadPool::Create(-2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ThreadPool::Create(ThreadPool::kMaxThreads + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ThreadPoolCreateTest, EmptyRangeCallsNothing) {
  auto pool = ThreadPool::Create(2);
  ASSERT_TRUE(pool.ok());
  bool called = false;
  (*pool)->ParallelFor(0, 4, [&](int64_t, int64_t) { called = true; });
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace specd::kernels::cpu
