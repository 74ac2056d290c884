// The device side of the CUDA emulator: what the kernels of kernels/cuda/ use of CUDA C++ (thread
// and block indices, __syncthreads, warp shuffles, atomics, rounding intrinsics, half and bfloat16
// widening), so that the host compiler builds those .cu files unchanged once cu_to_host.py has
// turned their dynamic shared memory into a pointer.
//
// A launch runs its blocks one after another, in a shuffled order (no kernel may depend on block
// order), and the threads of a block as fibers on the calling thread (emulated_device.cc): a
// thread runs until it waits at __syncthreads or a warp shuffle, which releases only when every
// thread of the block, or of the warp, has arrived. A thread that exits while others wait at a
// barrier, or lanes that shuffle with different masks, stop the process with a message: on a GPU
// that is undefined behaviour that happens to work until it does not.
//
// What it does not show: data races between threads that a GPU interleaves (compute-sanitizer's
// racecheck on the device does), timing, and the last bits of expf, exp, log and sincos, which the
// host's libm computes.
#ifndef SPECD_TESTS_KERNELS_CUDA_EMULATION_EMULATED_DEVICE_H_
#define SPECD_TESTS_KERNELS_CUDA_EMULATION_EMULATED_DEVICE_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

#include "kernels/dtype.h"

// The names, types and signatures are CUDA's own, which the code under test calls.
// NOLINTBEGIN(bugprone-reserved-identifier,google-runtime-int,google-global-names-in-headers,readability-identifier-naming,bugprone-macro-parentheses,readability-inconsistent-declaration-parameter-name)
#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
// Shared memory is one object per block; blocks run one at a time, so a static serves.
#define __shared__ static

struct dim3 {
  unsigned x = 1;
  unsigned y = 1;
  unsigned z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1)  // NOLINT: CUDA's implicit
      : x(x_), y(y_), z(z_) {}
};

// Set by the scheduler for the running thread.
extern thread_local dim3 threadIdx;
extern thread_local dim3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};

inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace emu {

// Runs `kernel` once per thread of every block of `grid`, as a launch on `stream`: now, or, while
// the stream captures a graph, when the graph is launched. Invalid configurations (an empty grid,
// grid.y or grid.z above 65535, more than 1024 threads, more than 48 KiB of dynamic shared
// memory) launch nothing and become the thread's last CUDA error, as on a GPU; a block of a partial
// warp, which the emulator does not model, stops the process.
void Launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, cudaStream_t stream,
            std::function<void()> kernel);

// The running block's dynamic shared memory (the launch's third parameter), 16-byte aligned.
void* DynamicSharedMemory();

// Blocks the calling thread until every thread of its block arrives; returns whether any of them
// passed a nonzero `predicate`.
bool BlockBarrier(int predicate);

// The value lane (this lane ^ xor_mask) of this warp passed; every lane of the warp must call it
// with the same mask.
uint64_t WarpExchange(uint64_t value, int xor_mask);

}  // namespace emu

inline void __syncthreads() { (void)emu::BlockBarrier(0); }
inline int __syncthreads_or(int predicate) { return emu::BlockBarrier(predicate) ? 1 : 0; }
// Threads switch only at barriers, so every write is already visible to every other thread.
inline void __threadfence() {}
inline void __threadfence_system() {}

template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int xor_mask) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  if (mask != 0xffffffffu) std::abort();  // the kernels shuffle whole warps only
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = emu::WarpExchange(bits, xor_mask);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// Atomics: threads switch only at barriers, so a read-modify-write is never interrupted.
template <typename T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
T atomicMin(T* p, T v) {
  const T old = *p;
  if (v < old) *p = v;
  return old;
}
template <typename T>
T atomicOr(T* p, T v) {
  const T old = *p;
  *p = old | v;
  return old;
}
template <typename T>
T atomicCAS(T* p, T compare, T v) {
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}

template <typename T>
T __ldg(const T* p) {
  // The device faults on a vector load that is not naturally aligned.
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) std::abort();
  return *p;
}
template <typename T>
T __ldcg(const T* p) {
  return __ldg(p);
}

inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((uint64_t{a} * uint64_t{b}) >> 32);
}
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }

// The host's SSE arithmetic rounds to nearest even, as these intrinsics do, and the emulation is
// built with -ffp-contract=off, as the kernels are with -fmad=false.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float __double2float_rn(double d) { return static_cast<float>(d); }

// CUDA declares the classification functions in the global namespace.
using std::isfinite;
using std::isinf;
using std::isnan;

// CUDA's min and max: overloads for every arithmetic type, the floating ones as fminf and fmaxf
// (a NaN loses to a number).
template <typename A, typename B>
auto min(A a, B b) -> std::common_type_t<A, B> {
  using T = std::common_type_t<A, B>;
  if constexpr (std::is_floating_point_v<T>) {
    return std::fmin(static_cast<T>(a), static_cast<T>(b));
  } else {
    return static_cast<T>(b) < static_cast<T>(a) ? static_cast<T>(b) : static_cast<T>(a);
  }
}
template <typename A, typename B>
auto max(A a, B b) -> std::common_type_t<A, B> {
  using T = std::common_type_t<A, B>;
  if constexpr (std::is_floating_point_v<T>) {
    return std::fmax(static_cast<T>(a), static_cast<T>(b));
  } else {
    return static_cast<T>(a) < static_cast<T>(b) ? static_cast<T>(b) : static_cast<T>(a);
  }
}

struct __half {
  unsigned short x;
};
struct alignas(4) __half2 {
  __half x, y;
};
struct __nv_bfloat16 {
  unsigned short x;
};
inline __half __ushort_as_half(unsigned short bits) { return {bits}; }
// Exact widening by IEEE fields, independent of kernels/dtype.cc.
inline float __half2float(__half h) {
  const unsigned sign = h.x >> 15;
  const int exponent = (h.x >> 10) & 31;
  const unsigned mantissa = h.x & 1023u;
  float v;
  if (exponent == 0) {
    v = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    v = mantissa != 0 ? std::nanf("") : HUGE_VALF;
  } else {
    v = std::ldexp(static_cast<float>(mantissa | 1024u), exponent - 25);
  }
  return sign != 0 ? -v : v;
}
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
inline __half __float2half_rn(float f) { return {specd::kernels::F32ToF16(f)}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {specd::kernels::F32ToBf16(f)}; }

// NOLINTEND(bugprone-reserved-identifier,google-runtime-int,google-global-names-in-headers,readability-identifier-naming,bugprone-macro-parentheses,readability-inconsistent-declaration-parameter-name)

#endif  // SPECD_TESTS_KERNELS_CUDA_EMULATION_EMULATED_DEVICE_H_
