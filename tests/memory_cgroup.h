// A memory cgroup of the test's own, a child of the process's (as memory_headroom.h finds it),
// with a limit, for tests of what a process does at the limit: without care the kernel's OOM
// killer ends it with no word of why. Creating one needs root and a writable cgroup mount (v1, or
// v2 with the memory controller delegated); where that is missing, Create says why, for
// GTEST_SKIP.
#ifndef SPECD_TESTS_MEMORY_CGROUP_H_
#define SPECD_TESTS_MEMORY_CGROUP_H_

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/memory_headroom.h"

namespace specd::testing {

class ScopedMemoryCgroup {
 public:
  static absl::StatusOr<std::unique_ptr<ScopedMemoryCgroup>> Create(int64_t limit_bytes) {
    std::string why = "no memory cgroup in /proc/self/cgroup";
    for (const kernels::cpu::MemoryCgroup& own :
         kernels::cpu::MemoryCgroupsAt("/proc", "/sys/fs/cgroup")) {
      // Only a cgroup file system has cgroup.procs in every cgroup; a v2 line on a host whose
      // memory controller is v1's names a directory of plain files.
      const std::filesystem::path parent = own.mount / own.path;
      if (!std::filesystem::exists(parent / "cgroup.procs")) continue;
      const std::filesystem::path dir = parent / ("specd-test-" + std::to_string(getpid()));
      std::error_code ec;
      if (!std::filesystem::create_directory(dir, ec)) {
        why = absl::StrCat("cannot create a memory cgroup at ", dir.string(), " (", ec.message(),
                           "): this needs root and a writable cgroup mount");
        continue;
      }
      auto cgroup = std::unique_ptr<ScopedMemoryCgroup>(new ScopedMemoryCgroup(dir));
      // The kernel makes the limit file; writing one that is not there would only create it.
      if (!std::filesystem::exists(dir / own.limit_file) ||
          !(std::ofstream(dir / own.limit_file) << limit_bytes << std::flush)) {
        why = absl::StrCat("cannot set ", (dir / own.limit_file).string());
        continue;
      }
      return cgroup;
    }
    return absl::UnavailableError(why);
  }
  ScopedMemoryCgroup(const ScopedMemoryCgroup&) = delete;
  ScopedMemoryCgroup& operator=(const ScopedMemoryCgroup&) = delete;
  // Only an empty cgroup can go: its processes must have ended by now.
  ~ScopedMemoryCgroup() { rmdir(dir_.c_str()); }

  // Writing a pid here moves that process in.
  std::filesystem::path procs() const { return dir_ / "cgroup.procs"; }

 private:
  explicit ScopedMemoryCgroup(std::filesystem::path dir) : dir_(std::move(dir)) {}
  std::filesystem::path dir_;
};

}  // namespace specd::testing

#endif  // SPECD_TESTS_MEMORY_CGROUP_H_
