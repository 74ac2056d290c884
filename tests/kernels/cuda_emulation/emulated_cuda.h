// The CUDA back end (kernels/cuda/cuda_backend.cc and every kernel of kernels/cuda/) built for
// the CUDA emulator (emulated_device.h, emulated_runtime.h) instead of a GPU, so that the
// conformance suite and the engine tests run the CUDA code in CI, where no GPU is: its indexing,
// tiling, reductions, argument checks, device-side error reports and CUDA-graph recording.
//
// What a run shows and what it does not is in emulated_device.h; the kernels' speed and their
// races are the device's to show (scripts/gpu/device_check.sh).
#ifndef SPECD_TESTS_KERNELS_CUDA_EMULATION_EMULATED_CUDA_H_
#define SPECD_TESTS_KERNELS_CUDA_EMULATION_EMULATED_CUDA_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace specd::kernels {

// kernels/cuda/cuda_backend.cc's CreateCudaBackendWithOptions, compiled under this name (see
// CMakeLists.txt) so that a binary can hold it beside the real one.
absl::StatusOr<std::unique_ptr<Backend>> CreateEmulatedCudaBackend(
    const CudaBackendOptions& options);

}  // namespace specd::kernels

#endif  // SPECD_TESTS_KERNELS_CUDA_EMULATION_EMULATED_CUDA_H_
