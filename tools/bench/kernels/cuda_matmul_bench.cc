// specd's CUDA matmul against cuBLAS on the GEMMs of a Llama-3.2-3B-shaped model (bf16 weights),
// side by side in one run, and whether cuBLAS keeps a row's bits when the batch grows (the row
// invariance specd's kernel has by construction; see kernels/cuda/matmul.h).
//
// For each weight shape and n_tokens: specd's time and its weight-read bandwidth, cuBLAS's
// time (cublasGemmEx, bf16 x bf16 -> f32 with fp32 compute; it needs the activations in bf16,
// which specd keeps in f32), and the ratio. Then row 0's output from cuBLAS alone and in batches
// of 2..64: "same bits" or the largest difference. Last, the q/k/v projections as one
// MatmulGroup launch against three Matmul launches (what the engine did before), eagerly
// launched, so the difference is the launches and kernel tails the group saves.
//
// usage: cuda_matmul_bench [--reps N]
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "tools/bench/kernels/cuda_bench_setup.h"

namespace specd {
namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  int64_t rows, cols;
};

bool Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

// Seconds per call of `run`, best of two timed rounds after a warm-up; `sync` waits for the
// calls' stream.
template <class Run, class Sync>
double BestSeconds(int reps, Run run, Sync sync) {
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = Clock::now();
    for (int r = 0; r < reps; ++r) run();
    sync();
    if (round > 0) {
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / reps);
    }
  }
  return best;
}

// q (3072 rows), k and v (1024 rows each) of 3072 columns: grouped against separate launches.
bool GroupedAgainstSeparate(kernels::Backend& be, int reps) {
  constexpr int64_t kCols = 3072;
  const int64_t rows[3] = {3072, 1024, 1024};
  const int64_t max_n = 8;
  std::vector<void*> buffers;
  auto alloc = [&](int64_t bytes) -> void* {
    void* p = nullptr;
    if (!Check(cudaMalloc(&p, bytes), "cudaMalloc")) return nullptr;
    cudaMemset(p, 0, bytes);
    buffers.push_back(p);
    return p;
  };
  kernels::MatmulGroupArgs group;
  group.n_parts = 3;
  auto* x = static_cast<float*>(alloc(max_n * kCols * 4));
  for (int i = 0; i < 3; ++i) {
    void* w = alloc(rows[i] * kCols * 2);
    auto* y = static_cast<float*>(alloc(max_n * rows[i] * 4));
    if (x == nullptr || w == nullptr || y == nullptr) return false;
    group.parts[static_cast<size_t>(i)] = {x, {w, kernels::DType::kBF16, rows[i], kCols}, y, 0};
  }
  std::printf("\nq/k/v projections (3072 + 1024 + 1024 rows x 3072, bf16), eager launches\n");
  std::printf("%6s %14s %14s %10s\n", "n", "3 Matmuls us", "1 group us", "saved us");
  for (const int64_t n : {int64_t{1}, int64_t{5}}) {
    for (kernels::MatmulArgs& part : group.parts) part.n_tokens = n;
    const auto sync = [&] { (void)be.Synchronize(); };
    const double separate = BestSeconds(
        reps,
        [&] {
          for (const kernels::MatmulArgs& part : group.parts) (void)be.Matmul(part);
        },
        sync);
    const double grouped = BestSeconds(
        reps, [&] { (void)be.MatmulGroup(group); }, sync);
    std::printf("%6ld %14.2f %14.2f %10.2f\n", static_cast<long>(n), separate * 1e6, grouped * 1e6,
                (separate - grouped) * 1e6);
  }
  for (void* p : buffers) cudaFree(p);
  return true;
}

int Main(int argc, char** argv) {
  const int reps = RepsFlag(argc, argv, 50);
  const std::unique_ptr<kernels::Backend> made = CudaBackendOrReport();
  if (made == nullptr) return 1;
  kernels::Backend& be = *made;
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return 1;
  const Shape shapes[] = {{"q/o_proj", 3072, 3072},
                          {"gate/up", 8192, 3072},
                          {"down", 3072, 8192},
                          {"classifier", 128256, 3072}};
  const int64_t ns[] = {1, 5, 64, 512};
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::printf("%s, bf16 weights\n", std::string(be.name()).c_str());
  std::printf("%-11s %6s %12s %12s %12s %10s\n", "matrix", "n", "specd us", "specd GB/s",
              "cuBLAS us", "cuBLAS/specd");
  for (const Shape& s : shapes) {
    const int64_t max_n = 512;
    std::vector<uint16_t> w(static_cast<size_t>(s.rows * s.cols));
    for (uint16_t& v : w) v = kernels::F32ToBf16(normal(rng) * 0.02f);
    std::vector<float> x(static_cast<size_t>(max_n * s.cols));
    for (float& v : x) v = normal(rng);
    std::vector<uint16_t> x16(x.size());
    for (size_t i = 0; i < x.size(); ++i) x16[i] = kernels::F32ToBf16(x[i]);
    void* dw = nullptr;
    void* dx = nullptr;
    void* dx16 = nullptr;
    void* dy = nullptr;
    void* dy2 = nullptr;
    if (!Check(cudaMalloc(&dw, w.size() * 2), "cudaMalloc") ||
        !Check(cudaMalloc(&dx, x.size() * 4), "cudaMalloc") ||
        !Check(cudaMalloc(&dx16, x16.size() * 2), "cudaMalloc") ||
        !Check(cudaMalloc(&dy, max_n * s.rows * 4), "cudaMalloc") ||
        !Check(cudaMalloc(&dy2, max_n * s.rows * 4), "cudaMalloc")) {
      return 1;
    }
    cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dx16, x16.data(), x16.size() * 2, cudaMemcpyHostToDevice);
    const float one = 1.0f;
    const float zero = 0.0f;
    // y^T [rows, n] = W [rows, cols] x^T [cols, n], column-major: W is cols x rows transposed.
    auto cublas = [&](int64_t n, void* out) {
      return cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(s.rows),
                          static_cast<int>(n), static_cast<int>(s.cols), &one, dw, CUDA_R_16BF,
                          static_cast<int>(s.cols), dx16, CUDA_R_16BF, static_cast<int>(s.cols),
                          &zero, out, CUDA_R_32F, static_cast<int>(s.rows), CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
    };
    for (const int64_t n : ns) {
      const kernels::MatmulArgs args{static_cast<const float*>(dx),
                                     {dw, kernels::DType::kBF16, s.rows, s.cols},
                                     static_cast<float*>(dy),
                                     n};
      const auto sync_specd = [&] { (void)be.Synchronize(); };
      const double specd_s = BestSeconds(
          reps, [&] { (void)be.Matmul(args); }, sync_specd);
      const double cublas_s = BestSeconds(
          reps, [&] { (void)cublas(n, dy2); }, [] { cudaDeviceSynchronize(); });
      std::printf("%-11s %6ld %12.2f %12.1f %12.2f %10.3f\n", s.name, static_cast<long>(n),
                  specd_s * 1e6, s.rows * s.cols * 2 / specd_s / 1e9, cublas_s * 1e6,
                  cublas_s / specd_s);
    }
    // cuBLAS's row 0 alone and in larger batches.
    std::vector<float> alone(static_cast<size_t>(s.rows));
    std::vector<float> batched(alone.size());
    cublas(1, dy2);
    cudaMemcpy(alone.data(), dy2, alone.size() * 4, cudaMemcpyDeviceToHost);
    for (const int64_t n : {2, 5, 17, 64, 512}) {
      cublas(n, dy2);
      cudaMemcpy(batched.data(), dy2, batched.size() * 4, cudaMemcpyDeviceToHost);
      double worst = 0;
      for (size_t i = 0; i < alone.size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(alone[i] - batched[i])));
      }
      const bool same = std::memcmp(alone.data(), batched.data(), alone.size() * 4) == 0;
      std::printf("  cuBLAS %-10s row 0 alone vs in a batch of %3ld: %s", s.name,
                  static_cast<long>(n), same ? "same bits\n" : "DIFFERENT");
      if (!same) std::printf(" (max |diff| %.3g)\n", worst);
    }
    cudaFree(dw), cudaFree(dx), cudaFree(dx16), cudaFree(dy), cudaFree(dy2);
  }
  cublasDestroy(handle);
  return GroupedAgainstSeparate(be, reps) ? 0 : 1;
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) { return specd::Main(argc, argv); }
