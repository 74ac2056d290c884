#include "kernels/cpu/memory_headroom.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace specd::kernels::cpu {
namespace {

namespace fs = std::filesystem;

// cgroup v1 writes "no limit" as the largest page-aligned int64 (9223372036854771712).
constexpr int64_t kNoLimit = int64_t{1} << 60;

std::optional<std::string> ReadSmallFile(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A file holding one number; nullopt for anything else, v2's "max" (no limit) included.
std::optional<int64_t> ReadNumber(const fs::path& path) {
  const std::optional<std::string> text = ReadSmallFile(path);
  int64_t value = 0;
  if (!text.has_value() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value)) {
    return std::nullopt;
  }
  return value;
}

// The number after `key` in a file of "key value" lines (memory.stat) or "Key: value kB" lines
// (meminfo).
std::optional<int64_t> ReadField(const fs::path& path, absl::string_view key) {
  const std::optional<std::string> text = ReadSmallFile(path);
  if (!text.has_value()) return std::nullopt;
  for (const absl::string_view line : absl::StrSplit(*text, '\n')) {
    const std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::ByAnyChar(" \t:"), absl::SkipEmpty());
    int64_t value = 0;
    if (parts.size() >= 2 && parts[0] == key && absl::SimpleAtoi(parts[1], &value)) return value;
  }
  return std::nullopt;
}

constexpr int64_t kMiB = int64_t{1} << 20;

void Consider(std::optional<MemoryHeadroom>& least, int64_t bytes, std::string limited_by) {
  bytes = std::max<int64_t>(bytes, 0);
  if (!least.has_value() || bytes < least->bytes) least = MemoryHeadroom{bytes, limited_by};
}

// `cgroup` and each cgroup above it, up to the root of its mount.
void ConsiderCgroups(const MemoryCgroup& cgroup, std::optional<MemoryHeadroom>& least) {
  fs::path level = cgroup.path;
  while (true) {
    const fs::path dir = cgroup.mount / level;
    const std::optional<int64_t> limit = ReadNumber(dir / cgroup.limit_file);
    const std::optional<int64_t> usage = ReadNumber(dir / cgroup.usage_file);
    if (limit.has_value() && *limit < kNoLimit && usage.has_value()) {
      const int64_t inactive =
          ReadField(dir / "memory.stat", cgroup.inactive_file).value_or(int64_t{0});
      const int64_t used = std::max<int64_t>(*usage - inactive, 0);
      Consider(least, *limit - used,
               absl::StrFormat("the memory cgroup limit of %d MiB (%s), with %d MiB in use",
                               *limit / kMiB, (dir / cgroup.limit_file).string(), used / kMiB));
    }
    if (level.empty()) return;
    level = level.parent_path();
  }
}

}  // namespace

std::vector<MemoryCgroup> MemoryCgroupsAt(const fs::path& proc, const fs::path& cgroup_root) {
  std::vector<MemoryCgroup> out;
  const std::optional<std::string> cgroups = ReadSmallFile(proc / "self" / "cgroup");
  if (!cgroups.has_value()) return out;
  // Lines are "hierarchy-id:controllers:path"; v2's is "0::path".
  for (const absl::string_view line : absl::StrSplit(*cgroups, '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    const fs::path path = fs::path(std::string(fields[2])).relative_path();
    if (fields[0] == "0" && fields[1].empty()) {
      out.push_back({cgroup_root, path, "memory.max", "memory.current", "inactive_file"});
      continue;
    }
    for (const absl::string_view c : absl::StrSplit(fields[1], ',')) {
      if (c != "memory") continue;
      out.push_back({cgroup_root / "memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes",
                     "total_inactive_file"});
    }
  }
  return out;
}

std::optional<MemoryHeadroom> HostMemoryHeadroomAt(const fs::path& proc,
                                                   const fs::path& cgroup_root) {
  std::optional<MemoryHeadroom> least;
  if (const std::optional<int64_t> kib = ReadField(proc / "meminfo", "MemAvailable")) {
    Consider(least, *kib * 1024, "MemAvailable in /proc/meminfo");
  }
  for (const MemoryCgroup& cgroup : MemoryCgroupsAt(proc, cgroup_root)) {
    ConsiderCgroups(cgroup, least);
  }
  return least;
}

std::optional<MemoryHeadroom> HostMemoryHeadroom() {
  return HostMemoryHeadroomAt("/proc", "/sys/fs/cgroup");
}

}  // namespace specd::kernels::cpu
