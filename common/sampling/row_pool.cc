#include "common/sampling/row_pool.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "common/sampling/staging.h"

namespace specd {
namespace {

constexpr int64_t kMinRows = 16;

}  // namespace

absl::StatusOr<std::vector<int32_t>> RowPool::Acquire(int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("cannot acquire ", n, " rows"));
  if (static_cast<int64_t>(free_.size()) < n) {
    const int64_t needed = capacity_ - static_cast<int64_t>(free_.size()) + n;
    const int64_t grown = std::max({kMinRows, capacity_ * 2, needed});
    SPECD_ASSIGN_OR_RETURN(
        kernels::Buffer bigger,
        backend_->Allocate(grown * vocab_ * 4, kernels::MemoryKind::kRows, "probability rows"));
    if (capacity_ > 0) {
      SPECD_RETURN_IF_ERROR(
          backend_->CopyDeviceToDevice(bigger.data(), buffer_.data(), capacity_ * vocab_ * 4));
      // The old buffer may still be read by the copy just enqueued.
      SPECD_RETURN_IF_ERROR(backend_->Synchronize());
    }
    buffer_ = std::move(bigger);
    // New slots are handed out lowest first.
    for (int64_t s = grown - 1; s >= capacity_; --s) free_.push_back(static_cast<int32_t>(s));
    capacity_ = grown;
  }
  std::vector<int32_t> slots(free_.end() - n, free_.end());
  free_.resize(free_.size() - static_cast<size_t>(n));
  return slots;
}

void RowPool::Release(std::span<const int32_t> slots) {
  free_.insert(free_.end(), slots.begin(), slots.end());
}

absl::StatusOr<std::vector<float>> RowPool::ReadRow(int32_t slot) {
  if (slot < 0 || slot >= capacity_) {
    return absl::InvalidArgumentError(absl::StrCat("row slot ", slot, " is outside the pool"));
  }
  const int64_t bytes = vocab_ * 4;
  SPECD_RETURN_IF_ERROR(sampling_internal::Ensure(*backend_, staging_, bytes,
                                                  kernels::MemoryKind::kStaging, "one row"));
  SPECD_RETURN_IF_ERROR(backend_->Download(staging_.data(), rows() + slot * vocab_, bytes));
  SPECD_RETURN_IF_ERROR(backend_->Synchronize());
  std::vector<float> row(static_cast<size_t>(vocab_));
  std::memcpy(row.data(), staging_.data(), static_cast<size_t>(bytes));
  return row;
}

}  // namespace specd
