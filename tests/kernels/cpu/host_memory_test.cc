#include "kernels/cpu/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace specd::kernels::cpu {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

bool IsZero(const void* data, int64_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (int64_t i = 0; i < bytes; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// A request's first write must not fault: mincore says whether each page is in memory.
TEST(HostMemoryTest, LargeAllocationsAreResidentZeroedAndHugePageAligned) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  for (const int64_t bytes : {2 * kMiB, 8 * kMiB + 5, 33 * kMiB}) {
    absl::StatusOr<void*> p = AllocateHostMemory(bytes);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % (2 * kMiB), 0u) << bytes;
    const int64_t pages = (bytes + page - 1) / page;
    std::vector<unsigned char> resident(static_cast<size_t>(pages));
    ASSERT_EQ(mincore(*p, static_cast<size_t>(bytes), resident.data()), 0);
    int64_t missing = 0;
    for (const unsigned char r : resident) missing += (r & 1) == 0 ? 1 : 0;
    EXPECT_EQ(missing, 0) << "of " << pages << " pages, allocation of " << bytes << " bytes";
    EXPECT_TRUE(IsZero(*p, bytes)) << bytes;
    FreeHostMemory(*p, bytes);
  }
}

TEST(HostMemoryTest, SmallAllocationsAreZeroedAndCacheLineAligned) {
  for (const int64_t bytes : {int64_t{1}, int64_t{64}, int64_t{4097}, 2 * kMiB - 1}) {
    absl::StatusOr<void*> p = AllocateHostMemory(bytes);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 64, 0u) << bytes;
    EXPECT_TRUE(IsZero(*p, bytes)) << bytes;
    FreeHostMemory(*p, bytes);
  }
}

}  // namespace
}  // namespace specd::kernels::cpu
