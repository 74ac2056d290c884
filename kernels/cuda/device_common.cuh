// Device helpers shared by the kernels of kernels/cuda/ (private to this folder): error reports,
// element loads by dtype, and reductions whose order is fixed by the block shape alone, so a
// result never depends on how many rows a launch covers.
//
// Every .cu file here is compiled with -fmad=false: nvcc does not fuse a*b+c on its own, and a
// kernel that wants a fused multiply-add says so with fmaf. The same source then gives the same
// bits in every configuration of a kernel (the CUDA counterpart of -ffp-contract=off).
#ifndef SPECD_KERNELS_CUDA_DEVICE_COMMON_CUH_
#define SPECD_KERNELS_CUDA_DEVICE_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/cuda/cuda_context.h"
#include "kernels/dtype.h"

namespace specd::kernels::cuda {

inline constexpr int kWarp = 32;

// Programmatic dependent launch (sm_90). LaunchKernel with `programmatic` lets the GPU start a
// kernel's blocks while the kernel before it in the stream is still running, so that the launch
// and the blocks' start overlap that kernel's tail instead of following it. Every kernel calls
// this first, before it reads or writes any memory: it waits until the kernel before it has
// finished and its writes are visible (a kernel launched plainly has nothing to wait for), then
// lets the kernel after it start early in turn. Memory thus sees plain stream order, and at most
// two kernels share the SMs.
__device__ __forceinline__ void AfterPreviousKernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), as a programmatic dependent launch
// when `programmatic` (CudaContext::programmatic_launch). As after <<<>>>, a failed launch is the
// thread's last CUDA error, which the launcher then checks.
template <typename... Params, typename... Args>
void LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                  cudaStream_t stream, bool programmatic, Args&&... args) {
  cudaLaunchAttribute attribute[1] = {};
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = programmatic ? attribute : nullptr;
  config.numAttrs = programmatic ? 1 : 0;
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

__device__ inline void ReportError(DeviceError* e, DeviceOp op, DeviceField field, int64_t index,
                                   int64_t value) {
  if (e == nullptr) return;
  if (atomicCAS(&e->claimed, 0, 1) == 0) {
    e->op = static_cast<int32_t>(op);
    e->field = static_cast<int32_t>(field);
    e->index = index;
    e->value = value;
    __threadfence_system();
  }
}

// Element i of a buffer of dtype D, widened to f32 (exact).
template <DType D>
__device__ __forceinline__ float LoadAsF32(const void* p, int64_t i) {
  if constexpr (D == DType::kF32) {
    return __ldg(static_cast<const float*>(p) + i);
  } else if constexpr (D == DType::kBF16) {
    const unsigned short h = __ldg(static_cast<const unsigned short*>(p) + i);
    return __uint_as_float(static_cast<unsigned int>(h) << 16);
  } else {
    const unsigned short h = __ldg(static_cast<const unsigned short*>(p) + i);
    return __half2float(__ushort_as_half(h));
  }
}

// The storage type of a cache of dtype D and its widening to f32 (exact), apart, so that a kernel
// can issue several loads before it widens (waits for) any of them. Caches change between
// launches, so they are read without __ldg.
template <DType D>
using CacheBits = std::conditional_t<D == DType::kF32, float, unsigned short>;
template <DType D>
__device__ __forceinline__ float WidenCache(CacheBits<D> x) {
  if constexpr (D == DType::kF32) {
    return x;
  } else if constexpr (D == DType::kBF16) {
    return __uint_as_float(static_cast<unsigned int>(x) << 16);
  } else {
    return __half2float(__ushort_as_half(x));
  }
}

// silu(g) * u = g / (1 + exp(-g)) * u, each operation rounded once: SwiGlu and the epilogue of
// the gate/up product share it, so the fused op has the separate ops' bits.
__device__ __forceinline__ float SiluMul(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// Lane-order-independent warp sum: the xor butterfly. Lanes l and l^m add the same two values
// (addition commutes), so every lane ends with the same bits.
template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = v + __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

template <typename T>
__device__ __forceinline__ T WarpMax(T v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

// Sum over the block in a fixed tree (butterfly within warps, then over the warps' sums in warp
// order). Every thread gets the result. `smem` holds 32 T. blockDim.x must be a multiple of 32.
template <typename T>
__device__ T BlockSum(T v, T* smem) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = WarpSum(v);
  __syncthreads();  // smem may still be read by a previous reduction
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  T w = lane < warps ? smem[lane] : T(0);
  return WarpSum(w);
}

// RMSNorm's two halves, shared by RmsNorm and the products that fold it in (MatmulGroup's
// input_norm), so that both give the same bits. RowInvRms is 1 / sqrt(mean(row^2) + eps): thread
// i of a kNormThreads-thread block sums the squares of elements i, i + kNormThreads, ... with
// fused multiply-adds, then BlockSum. Every thread of the block calls it (it has barriers) and
// gets the result; `smem` holds 32 floats.
inline constexpr int kNormThreads = 128;
__device__ __forceinline__ float RowInvRms(const float* row, int64_t dim, float eps, float* smem) {
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += kNormThreads) ss = fmaf(row[i], row[i], ss);
  const float total = BlockSum(ss, smem);
  const float mean = __fdiv_rn(total, static_cast<float>(dim));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
}
__device__ __forceinline__ float Normed(float x, float inv_rms, float weight) {
  return __fmul_rn(__fmul_rn(x, inv_rms), weight);
}

template <typename T>
__device__ T BlockMax(T v, T* smem, T lowest) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  T w = lane < warps ? smem[lane] : lowest;
  return WarpMax(w);
}

// (value, id) with the larger value winning and the lower id on ties (-0 == +0 tie).
struct ArgMax {
  float value;
  int32_t id;
};
__device__ __forceinline__ ArgMax Better(ArgMax a, ArgMax b) {
  if (b.value > a.value || (b.value == a.value && b.id < a.id)) return b;
  return a;
}
__device__ inline ArgMax BlockArgMax(ArgMax v, float* smem_v, int32_t* smem_i) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    ArgMax o{__shfl_xor_sync(0xffffffffu, v.value, m), __shfl_xor_sync(0xffffffffu, v.id, m)};
    v = Better(v, o);
  }
  __syncthreads();
  if (lane == 0) {
    smem_v[warp] = v.value;
    smem_i[warp] = v.id;
  }
  __syncthreads();
  ArgMax w{-__int_as_float(0x7f800000), 0x7fffffff};
  if (lane < warps) w = {smem_v[lane], smem_i[lane]};
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    ArgMax o{__shfl_xor_sync(0xffffffffu, w.value, m), __shfl_xor_sync(0xffffffffu, w.id, m)};
    w = Better(w, o);
  }
  return w;
}

__host__ __device__ constexpr int64_t DivUp(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_DEVICE_COMMON_CUH_
