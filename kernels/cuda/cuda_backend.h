// The CUDA back end: kernels::Backend on one NVIDIA GPU (built when CMake finds nvcc and the CUDA
// toolkit; see kernels/CMakeLists.txt). Device memory comes from plain cudaMalloc (never managed
// memory), staging memory is pinned host memory, and everything is enqueued on one stream;
// Synchronize reports the first execution failure since the last one: a CUDA error, or an
// argument only the device could see (an id, slot or row index in device memory) that a kernel
// found out of range and skipped. Forward passes can be recorded and replayed as CUDA graphs
// (Backend::BeginRecording).
#ifndef SPECD_KERNELS_CUDA_CUDA_BACKEND_H_
#define SPECD_KERNELS_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace specd::kernels {

struct CudaBackendOptions {
  int device = 0;
  // Op scratch (attention's per-chunk partials, logprob row statistics), allocated once.
  int64_t workspace_bytes = int64_t{64} << 20;
  // For tests that show every kernel configuration gives the same bits: attention's split over KV
  // chunks (0 = by occupancy, 1 = always, -1 = never) and the matmul's tokens per warp (0 = by
  // n_tokens, else 1, 2, 4 or 8).
  int attention_split = 0;
  int matmul_tokens_per_warp = 0;
  // Launch kernels as programmatic dependent launches where the device has them (sm_90 and up)
  // and a probe at creation shows they work (kernels/cuda/device_common.cuh); off for A/B
  // measurements.
  bool programmatic_launch = true;
};

// Whether --backend auto should choose CUDA: a device is usable, or an NVIDIA driver is loaded but
// cannot serve this build (e.g. older than its CUDA runtime), which is then reported rather than
// silently replaced by the CPU. False without a driver, or with a driver that sees no device.
bool AutoChoosesCuda();

// FAILED_PRECONDITION naming the reason when no usable device is present (no driver, no device,
// or a device this build has no kernels for).
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device);
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackendWithOptions(
    const CudaBackendOptions& options);

}  // namespace specd::kernels

#endif  // SPECD_KERNELS_CUDA_CUDA_BACKEND_H_
