#include "kernels/cpu/host_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/math.h"
#include "kernels/cpu/memory_headroom.h"

namespace specd::kernels::cpu {
namespace {

constexpr int64_t kHugePage = int64_t{2} << 20;
constexpr int64_t kCacheLine = 64;
constexpr size_t kSmallPage = 4096;

// Large allocations carry one extra huge page so the usable range starts on a 2 MiB boundary;
// the mapping's base is kept in the first 8 bytes of that page, before the aligned start.
int64_t MappedBytes(int64_t bytes) { return RoundUpTo(bytes, kHugePage) + kHugePage; }

}  // namespace

absl::StatusOr<void*> AllocateHostMemory(int64_t bytes) {
  if (bytes < kHugePage) {
    void* p = std::aligned_alloc(kCacheLine, static_cast<size_t>(RoundUpTo(bytes, kCacheLine)));
    if (p == nullptr) return absl::ResourceExhaustedError("aligned_alloc failed");
    std::memset(p, 0, static_cast<size_t>(bytes));
    return p;
  }
  // Every page is committed below, and past the headroom that does not fail: the kernel swaps,
  // or its OOM killer ends the process with no word of why.
  if (const std::optional<MemoryHeadroom> room = HostMemoryHeadroom();
      room.has_value() && bytes > room->bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "only ", room->bytes >> 20, " MiB more memory can be committed: ", room->limited_by));
  }
  const int64_t mapped = MappedBytes(bytes);
  void* base = mmap(nullptr, static_cast<size_t>(mapped), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return absl::ResourceExhaustedError(strerror(errno));
  // The first huge-page boundary strictly after base leaves room to remember base.
  char* aligned = reinterpret_cast<char*>(
      RoundUpTo(static_cast<int64_t>(reinterpret_cast<uintptr_t>(base)) + 1, kHugePage));
  std::memcpy(aligned - sizeof(void*), &base, sizeof(void*));
  const auto usable = static_cast<size_t>(RoundUpTo(bytes, kHugePage));
  // Advisory: without transparent huge pages the memory still works, only slower.
  (void)madvise(aligned, usable, MADV_HUGEPAGE);
  // Commit every page now. The first write to a fresh huge page makes the kernel zero 2 MiB, and
  // a KV block touches one such page per layer and cache: left to the first request that writes
  // there, that cost 36 ms of an 18-token prefill that otherwise takes 2 ms (stories15M shape,
  // development VM), and every later request that reached a new region of the pool paid again.
  if (madvise(aligned, usable, MADV_POPULATE_WRITE) != 0) {
    if (errno != EINVAL) {
      const int error = errno;
      munmap(base, static_cast<size_t>(mapped));
      return absl::ResourceExhaustedError(
          absl::StrCat("committing ", bytes, " bytes of memory: ", strerror(error)));
    }
    // Kernels before 5.14 have no MADV_POPULATE_WRITE: touch each page instead.
    for (size_t at = 0; at < usable; at += kSmallPage) static_cast<volatile char*>(aligned)[at] = 0;
  }
  return static_cast<void*>(aligned);
}

void FreeHostMemory(void* data, int64_t bytes) {
  if (bytes < kHugePage) {
    std::free(data);
    return;
  }
  void* base;
  std::memcpy(&base, static_cast<char*>(data) - sizeof(void*), sizeof(void*));
  munmap(base, static_cast<size_t>(MappedBytes(bytes)));
}

}  // namespace specd::kernels::cpu
