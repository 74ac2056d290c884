// The headroom read from fake /proc and /sys/fs/cgroup trees laid out as the kernel writes them
// (cgroup v1 and v2, nested limits, a container's namespaced path, no limit at all), and from
// this machine's real ones.
#include "kernels/cpu/memory_headroom.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace specd::kernels::cpu {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

class MemoryHeadroomTest : public ::testing::Test {
 protected:
  fs::path proc() const { return tmp_.path() / "proc"; }
  fs::path cgroup() const { return tmp_.path() / "cgroup"; }

  void Write(const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  void MemAvailable(int64_t bytes) {
    Write(proc() / "meminfo",
          "MemTotal:       32000000 kB\nMemFree:         1000 kB\n"
          "MemAvailable:   " +
              std::to_string(bytes / 1024) + " kB\nBuffers: 12 kB\n");
  }
  void SelfCgroup(const std::string& text) { Write(proc() / "self" / "cgroup", text); }
  // A v2 cgroup at `dir` under the mount.
  void V2(const std::string& dir, const std::string& max, int64_t current, int64_t inactive) {
    Write(cgroup() / dir / "memory.max", max + "\n");
    Write(cgroup() / dir / "memory.current", std::to_string(current) + "\n");
    Write(cgroup() / dir / "memory.stat",
          "anon 4096\nfile 8192\ninactive_anon 0\n"
          "inactive_file " +
              std::to_string(inactive) + "\nactive_file 77\n");
  }
  void V1(const std::string& dir, int64_t limit, int64_t usage, int64_t inactive) {
    const fs::path d = cgroup() / "memory" / dir;
    Write(d / "memory.limit_in_bytes", std::to_string(limit) + "\n");
    Write(d / "memory.usage_in_bytes", std::to_string(usage) + "\n");
    // v1's memory.stat has the cgroup's own inactive_file and the hierarchy's total.
    Write(d / "memory.stat",
          "cache 1\ninactive_file 5\ntotal_inactive_file " + std::to_string(inactive) + "\n");
  }
  std::optional<MemoryHeadroom> Read() const { return HostMemoryHeadroomAt(proc(), cgroup()); }

  testing::ScopedTempDir tmp_;
};

TEST_F(MemoryHeadroomTest, WithoutACgroupLimitItIsMemAvailable) {
  MemAvailable(20 * kGiB);
  SelfCgroup("0::/user.slice/session-1.scope\n");
  V2("user.slice/session-1.scope", "max", 3 * kGiB, 0);
  const std::optional<MemoryHeadroom> room = Read();
  ASSERT_TRUE(room.has_value());
  EXPECT_EQ(room->bytes, 20 * kGiB);
  EXPECT_THAT(room->limited_by, HasSubstr("MemAvailable"));
}

TEST_F(MemoryHeadroomTest, CgroupV2LimitLessUsageNotCountingInactivePageCache) {
  MemAvailable(20 * kGiB);
  SelfCgroup("0::/system.slice/docker-abc.scope\n");
  V2("system.slice/docker-abc.scope", std::to_string(kGiB), 700 * kMiB, 200 * kMiB);
  const std::optional<MemoryHeadroom> room = Read();
  ASSERT_TRUE(room.has_value());
  EXPECT_EQ(room->bytes, kGiB - 500 * kMiB);
  EXPECT_THAT(room->limited_by, HasSubstr("limit of 1024 MiB"));
  EXPECT_THAT(room->limited_by, HasSubstr("500 MiB in use"));
  EXPECT_THAT(room->limited_by, HasSubstr("docker-abc.scope/memory.max"));
}

TEST_F(MemoryHeadroomTest, ATighterParentLimitWins) {
  MemAvailable(20 * kGiB);
  SelfCgroup("0::/a/b\n");
  V2("a/b", std::to_string(4 * kGiB), kGiB, 0);
  V2("a", std::to_string(2 * kGiB), 1536 * kMiB, 0);  // b's GiB and 512 MiB of a sibling's
  const std::optional<MemoryHeadroom> room = Read();
  ASSERT_TRUE(room.has_value());
  EXPECT_EQ(room->bytes, 512 * kMiB);
  EXPECT_THAT(room->limited_by, HasSubstr("a/memory.max"));
}

// In a container with a cgroup namespace missing, /proc/self/cgroup names the host's path while
// the container's own cgroup is mounted at the root.
TEST_F(MemoryHeadroomTest, AContainerPathMissingFromTheMountFindsTheLimitAtItsRoot) {
  MemAvailable(20 * kGiB);
  SelfCgroup("0::/docker/0123456789abcdef\n");
  V2("", std::to_string(3 * kGiB), kGiB, 0);
  const std::optional<MemoryHeadroom> room = Read();
  ASSERT_TRUE(room.has_value());
  EXPECT_EQ(room->bytes, 2 * kGiB);
}

TEST_F(MemoryHeadroomTest, CgroupV1MemoryControllerWithItsNoLimitValue) {
  MemAvailable(20 * kGiB);
  SelfCgroup("12:pids:/x\n5:cpu,cpuacct:/x\n4:memory:/process_api/x\n1:name=systemd:/x\n0::/x\n");
  V1("process_api/x", 2 * kGiB, 1200 * kMiB, 100 * kMiB);
  V1("process_api", int64_t{9223372036854771712}, 5 * kGiB, 0);  // v1's "no limit"
  V1("", int64_t{9223372036854771712}, 9 * kGiB, 0);
  std::optional<MemoryHeadroom> room = Read();
  ASSERT_TRUE(room.has_value());
  EXPECT_EQ(room->bytes, 2 * kGiB - 1100 * kMiB);
  EXPECT_THAT(room->limited_by, HasSubstr("process_api/x/memory.limit_in_bytes"));

  V1("process_api/x", int64_t{9223372036854771712}, 1200 * kMiB, 0);
  room = Read();
  ASSERT_TRUE(room.has_value());
  EXPECT_EQ(room->bytes, 20 * kGiB);
}

TEST_F(MemoryHeadroomTest, UsageOverTheLimitLeavesNothing) {
  MemAvailable(20 * kGiB);
  SelfCgroup("0::/a\n");
  V2("a", std::to_string(kGiB), kGiB + 4096, 0);
  const std::optional<MemoryHeadroom> room = Read();
  ASSERT_TRUE(room.has_value());
  EXPECT_EQ(room->bytes, 0);
}

TEST_F(MemoryHeadroomTest, UnreadableOrMalformedFilesAreIgnored) {
  EXPECT_FALSE(Read().has_value());  // no /proc at all
  Write(proc() / "meminfo", "MemAvailable: lots\n");
  SelfCgroup("garbage\n0::\n4:memory\n0::/a\n");
  Write(cgroup() / "a" / "memory.max", "12 34\n");
  Write(cgroup() / "a" / "memory.current", "100\n");
  EXPECT_FALSE(Read().has_value());
  // A limit without a usage says nothing either.
  Write(cgroup() / "a" / "memory.max", "1000\n");
  fs::remove(cgroup() / "a" / "memory.current");
  EXPECT_FALSE(Read().has_value());
}

TEST(HostMemoryHeadroomTest, ThisMachineHasSomeAndNoMoreThanItsMemory) {
  const std::optional<MemoryHeadroom> room = HostMemoryHeadroom();
  ASSERT_TRUE(room.has_value()) << "Linux has MemAvailable in /proc/meminfo since 3.14";
  const int64_t total = sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE);
  EXPECT_GT(room->bytes, 0);
  EXPECT_LE(room->bytes, total);
}

}  // namespace
}  // namespace specd::kernels::cpu
