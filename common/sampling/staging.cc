#include "common/sampling/staging.h"

#include "base/status_macros.h"

namespace specd::sampling_internal {

absl::Status Ensure(kernels::Backend& backend, kernels::Buffer& buffer, int64_t bytes,
                    kernels::MemoryKind kind, const char* what) {
  if (buffer.bytes() >= bytes) return absl::OkStatus();
  buffer = kernels::Buffer();
  SPECD_ASSIGN_OR_RETURN(buffer, backend.Allocate(RoundUpTo(bytes, 4096), kind, what));
  return absl::OkStatus();
}

absl::Status EnqueueAndWait(kernels::Backend& backend, absl::FunctionRef<absl::Status()> enqueue) {
  if (absl::Status st = enqueue(); !st.ok()) {
    (void)backend.Synchronize();
    return st;
  }
  return backend.Synchronize();
}

}  // namespace specd::sampling_internal
