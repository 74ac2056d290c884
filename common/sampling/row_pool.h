// Processed probability rows kept in back-end memory between calls: a worker keeps the K (draft)
// or K+1 (target) rows of a sequence's last round for Truncate queries and ReadRows, and only
// ReadRows copies a whole row to the host. Rows are handed out as slots of one buffer, which
// grows (keeping every live row) when the slots run out.
#ifndef SPECD_COMMON_SAMPLING_ROW_POOL_H_
#define SPECD_COMMON_SAMPLING_ROW_POOL_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace specd {

class RowPool {
 public:
  RowPool(kernels::Backend& backend, int64_t vocab) : backend_(&backend), vocab_(vocab) {}

  // `n` free slots; grows the pool first when fewer are free. RESOURCE_EXHAUSTED when the back
  // end cannot give the memory.
  absl::StatusOr<std::vector<int32_t>> Acquire(int64_t n);
  // Returns slots to the free list. Each must have come from Acquire and not been released.
  void Release(std::span<const int32_t> slots);

  // Row `slot` copied to the host; synchronizes the back end.
  absl::StatusOr<std::vector<float>> ReadRow(int32_t slot);

  float* rows() const { return buffer_.as<float>(); }
  int64_t capacity() const { return capacity_; }
  int64_t vocab() const { return vocab_; }
  int64_t in_use() const { return capacity_ - static_cast<int64_t>(free_.size()); }

 private:
  kernels::Backend* backend_;
  int64_t vocab_;
  kernels::Buffer buffer_;  // [capacity_, vocab_]
  // One row of host staging, kept: pinned memory costs a GPU back end a page-locking allocation,
  // and its free a device-wide synchronization, which a fallback round would pay per row.
  kernels::Buffer staging_;
  int64_t capacity_ = 0;
  std::vector<int32_t> free_;
};

}  // namespace specd

#endif  // SPECD_COMMON_SAMPLING_ROW_POOL_H_
