// The device copy bandwidth that the GPU benchmarks hold their numbers against, measured in the
// same run (these machines are shared, so a bound from a spec sheet would not do).
#ifndef SPECD_TOOLS_BENCH_DEVICE_COPY_H_
#define SPECD_TOOLS_BENCH_DEVICE_COPY_H_

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace specd {

// Device-to-device copy bandwidth (bytes read + written per second, in GB/s) of `backend`, best
// of five 1 GiB copies after one that warms up; 0 when it cannot be measured.
inline double DeviceCopyGBps(kernels::Backend& backend) {
  constexpr int64_t kBytes = int64_t{1} << 30;
  absl::StatusOr<kernels::Buffer> a = backend.Allocate(kBytes, kernels::MemoryKind::kScratch, "bw");
  absl::StatusOr<kernels::Buffer> b = backend.Allocate(kBytes, kernels::MemoryKind::kScratch, "bw");
  if (!a.ok() || !b.ok()) return 0;
  double best = 0;
  for (int pass = 0; pass < 6; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!backend.CopyDeviceToDevice(b->data(), a->data(), kBytes).ok()) return 0;
    if (!backend.Synchronize().ok()) return 0;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (pass > 0) best = std::max(best, 2.0 * kBytes / s / 1e9);
  }
  return best;
}

}  // namespace specd

#endif  // SPECD_TOOLS_BENCH_DEVICE_COPY_H_
