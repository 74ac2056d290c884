// A memory cgroup of the test's own, with a limit, for tests of what a process does at the limit:
// without care the kernel's OOM killer ends it with no word of why. Creating one needs root and a
// writable cgroup mount (v1, or v2 with the memory controller delegated); where that is missing,
// Create says why, for GTEST_SKIP.
#ifndef SPECD_TESTS_MEMORY_CGROUP_H_
#define SPECD_TESTS_MEMORY_CGROUP_H_

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace specd::testing {

class ScopedMemoryCgroup {
 public:
  static absl::StatusOr<std::unique_ptr<ScopedMemoryCgroup>> Create(int64_t limit_bytes) {
    std::ifstream in("/proc/self/cgroup");
    std::ostringstream text;
    text << in.rdbuf();
    std::optional<std::filesystem::path> parent;
    const char* limit_file = nullptr;
    for (const absl::string_view line : absl::StrSplit(text.str(), '\n', absl::SkipEmpty())) {
      const std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
      if (f.size() != 3) continue;
      const std::filesystem::path rel = std::filesystem::path(std::string(f[2])).relative_path();
      if (f[1] == "memory") {
        parent = "/sys/fs/cgroup/memory" / rel;
        limit_file = "memory.limit_in_bytes";
        break;
      }
      if (f[0] == "0" && f[1].empty() &&
          std::filesystem::exists("/sys/fs/cgroup/cgroup.controllers")) {
        parent = "/sys/fs/cgroup" / rel;
        limit_file = "memory.max";
      }
    }
    if (!parent.has_value()) {
      return absl::UnavailableError("no memory cgroup in /proc/self/cgroup");
    }
    const std::filesystem::path dir = *parent / ("specd-test-" + std::to_string(getpid()));
    std::error_code ec;
    if (!std::filesystem::create_directory(dir, ec)) {
      return absl::UnavailableError(absl::StrCat("cannot create a memory cgroup at ", dir.string(),
                                                 " (", ec.message(),
                                                 "): this needs root and a writable cgroup mount"));
    }
    auto cgroup = std::unique_ptr<ScopedMemoryCgroup>(new ScopedMemoryCgroup(dir));
    if (!(std::ofstream(dir / limit_file) << limit_bytes << std::flush)) {
      return absl::UnavailableError(absl::StrCat("cannot set ", (dir / limit_file).string()));
    }
    return cgroup;
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
