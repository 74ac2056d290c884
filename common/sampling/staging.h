// Helpers for the one-copy uploads and downloads of the per-token math (RowSampler, LogprobRows):
// arrays laid out one after another in a staging buffer and its back-end twin.
#ifndef SPECD_COMMON_SAMPLING_STAGING_H_
#define SPECD_COMMON_SAMPLING_STAGING_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "base/math.h"
#include "kernels/backend.h"

namespace specd::sampling_internal {

// Lays arrays out one after another, each 16-byte aligned.
class Layout {
 public:
  template <typename T>
  int64_t Take(size_t count) {
    const int64_t at = bytes_;
    bytes_ = RoundUpTo(bytes_ + static_cast<int64_t>(count * sizeof(T)), 16);
    return at;
  }
  int64_t bytes() const { return bytes_; }

 private:
  int64_t bytes_ = 0;
};

// Makes `buffer` hold at least `bytes` (its contents are not kept).
absl::Status Ensure(kernels::Backend& backend, kernels::Buffer& buffer, int64_t bytes,
                    kernels::MemoryKind kind, const char* what);

// Runs `enqueue` (the ops that read what was uploaded from the staging buffer, and the download
// back into it), then waits for the device. If `enqueue` fails part-way it still waits before
// returning the error: the next use must not overwrite staging that an upload is still reading.
absl::Status EnqueueAndWait(kernels::Backend& backend, absl::FunctionRef<absl::Status()> enqueue);

template <typename T>
void Put(char* base, int64_t at, const std::vector<T>& v) {
  if (!v.empty()) std::memcpy(base + at, v.data(), v.size() * sizeof(T));
}

template <typename T>
void Get(const char* base, int64_t at, std::vector<T>& v) {
  if (!v.empty()) std::memcpy(v.data(), base + at, v.size() * sizeof(T));
}

}  // namespace specd::sampling_internal

#endif  // SPECD_COMMON_SAMPLING_STAGING_H_
