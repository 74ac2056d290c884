// How much more memory this process can commit before the kernel has to swap or kill: the least
// of the machine's MemAvailable and, for each memory cgroup enclosing the process, its limit less
// its usage. Committing past it does not fail cleanly: a worker in a container with a memory
// limit is killed by the OOM killer while it populates its KV cache, and the user sees only
// "Killed". Checking first turns that into an error that names the bytes and the limit.
#ifndef SPECD_KERNELS_CPU_MEMORY_HEADROOM_H_
#define SPECD_KERNELS_CPU_MEMORY_HEADROOM_H_

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace specd::kernels::cpu {

struct MemoryHeadroom {
  int64_t bytes = 0;
  // What sets it, for a person: "MemAvailable in /proc/meminfo" or the cgroup and its limit.
  std::string limited_by;
};

// One memory cgroup of this process, as /proc/self/cgroup names it: v1's memory controller or
// v2's unified hierarchy, with the names of that version's files.
struct MemoryCgroup {
  std::filesystem::path mount;  // where the hierarchy's files are, e.g. /sys/fs/cgroup/memory
  std::filesystem::path path;   // the process's cgroup under `mount` (relative)
  const char* limit_file;       // memory.limit_in_bytes (v1) or memory.max (v2)
  const char* usage_file;       // memory.usage_in_bytes or memory.current
  const char* inactive_file;    // memory.stat's key: total_inactive_file or inactive_file
};

// This process's memory cgroups, read from `proc`/self/cgroup, with v1's under
// `cgroup_root`/memory and v2's under `cgroup_root`. A listed cgroup's files may be missing
// (a v2 line on a host whose memory controller is v1's, a container's namespaced path).
std::vector<MemoryCgroup> MemoryCgroupsAt(const std::filesystem::path& proc,
                                          const std::filesystem::path& cgroup_root);

// The headroom of this process; nullopt when neither /proc/meminfo nor a cgroup says.
std::optional<MemoryHeadroom> HostMemoryHeadroom();

// The same, read from `proc` (for /proc) and `cgroup_root` (for /sys/fs/cgroup). Both cgroup
// versions are read: v2's memory.max, memory.current and memory.stat's inactive_file under
// `cgroup_root`, v1's memory.limit_in_bytes, memory.usage_in_bytes and total_inactive_file under
// `cgroup_root`/memory. Page cache on the inactive list is not counted as used, because the
// kernel drops it before it kills (as `docker stats` counts). Every enclosing level is read, so a
// limit on a parent counts, and a container whose /proc/self/cgroup names a path its own mount
// does not have still finds the limit at the mount's root.
std::optional<MemoryHeadroom> HostMemoryHeadroomAt(const std::filesystem::path& proc,
                                                   const std::filesystem::path& cgroup_root);

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_MEMORY_HEADROOM_H_
