// What every CUDA-only test file here shares: a back end made with test options, and fixtures
// that skip, saying why, where no CUDA device is present.
#ifndef SPECD_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_
#define SPECD_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_

#include <memory>
#include <random>
#include <utility>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace specd::kernels::cuda_test {

// The CUDA back end with `options`, or null (the fixture has already skipped without a device).
inline std::unique_ptr<Backend> MakeCuda(const CudaBackendOptions& options) {
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateCudaBackendWithOptions(options);
  return b.ok() ? *std::move(b) : nullptr;
}

// `Base` is ::testing::Test or a ::testing::TestWithParam<P>.
template <typename Base>
class CudaTestBase : public Base {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> b = CreateCudaBackend(0);
    if (!b.ok()) GTEST_SKIP() << "no usable CUDA device: " << b.status();
  }
  std::mt19937 rng_{7};
};
using CudaTest = CudaTestBase<::testing::Test>;

}  // namespace specd::kernels::cuda_test

#endif  // SPECD_TESTS_KERNELS_CUDA_CUDA_TEST_UTIL_H_
