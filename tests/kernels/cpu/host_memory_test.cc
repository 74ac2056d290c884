#include "kernels/cpu/host_memory.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/memory_cgroup.h"

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

// Committing past a cgroup's limit gets the OOM killer, which ends the process with no word of
// why; the allocation must fail first, naming the limit. A child process joins a new cgroup of
// 256 MiB and asks for 512 MiB: without the check the kernel kills it.
TEST(HostMemoryTest, PastACgroupLimitTheAllocationFailsNamingTheLimitInsteadOfBeingKilled) {
  absl::StatusOr<std::unique_ptr<testing::ScopedMemoryCgroup>> cgroup =
      testing::ScopedMemoryCgroup::Create(256 * kMiB);
  if (!cgroup.ok()) GTEST_SKIP() << cgroup.status().message();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (!(std::ofstream((*cgroup)->procs()) << getpid() << std::flush)) _exit(3);
    const absl::StatusOr<void*> p = AllocateHostMemory(512 * kMiB);
    if (p.ok()) _exit(1);
    const bool named = absl::IsResourceExhausted(p.status()) &&
                       absl::StrContains(p.status().message(), "memory cgroup limit of 256 MiB");
    _exit(named ? 0 : 2);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_FALSE(WIFSIGNALED(status)) << "the child was killed by signal " << WTERMSIG(status);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 3) GTEST_SKIP() << "cannot move a process into the cgroup";
  EXPECT_NE(WEXITSTATUS(status), 1) << "512 MiB were committed under a 256 MiB limit";
  EXPECT_NE(WEXITSTATUS(status), 2) << "the error is not RESOURCE_EXHAUSTED naming the limit";
}

}  // namespace
}  // namespace specd::kernels::cpu
