// What every CUDA kernel benchmark starts with: its one flag, --reps N, and the CUDA back end on
// device 0.
#ifndef SPECD_TOOLS_BENCH_KERNELS_CUDA_BENCH_SETUP_H_
#define SPECD_TOOLS_BENCH_KERNELS_CUDA_BENCH_SETUP_H_

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace specd {

// --reps N from the command line, else `default_reps`.
inline int RepsFlag(int argc, char** argv, int default_reps) {
  int reps = default_reps;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--reps") reps = std::atoi(argv[i + 1]);
  }
  return reps;
}

// The CUDA back end on device 0, or null after saying why on stderr.
inline std::unique_ptr<kernels::Backend> CudaBackendOrReport() {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> made = kernels::CreateCudaBackend(0);
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", std::string(made.status().message()).c_str());
    return nullptr;
  }
  return *std::move(made);
}

}  // namespace specd

#endif  // SPECD_TOOLS_BENCH_KERNELS_CUDA_BENCH_SETUP_H_
