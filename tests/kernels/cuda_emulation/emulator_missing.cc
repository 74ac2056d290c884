// The emulated CUDA back end where this build has no CUDA emulator (Boost.Context, which its
// fibers need, was not found): its tests skip with this reason.
#include "absl/status/status.h"
#include "tests/kernels/cuda_emulation/emulated_cuda.h"

namespace specd::kernels {

absl::StatusOr<std::unique_ptr<Backend>> CreateEmulatedCudaBackend(
    const CudaBackendOptions& /*options*/) {
  return absl::FailedPreconditionError(
      "this build has no CUDA emulator: Boost.Context was not found (Debian: "
      "libboost-context-dev)");
}

}  // namespace specd::kernels
