// What every CPU op needs besides its arguments: the back end's threads and its kernel table.
#ifndef SPECD_KERNELS_CPU_CPU_CONTEXT_H_
#define SPECD_KERNELS_CPU_CPU_CONTEXT_H_

#include "kernels/cpu/simd.h"
#include "kernels/cpu/thread_pool.h"

namespace specd::kernels::cpu {

struct CpuContext {
  ThreadPool* pool = nullptr;
  const SimdOps* ops = nullptr;
};

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_CPU_CONTEXT_H_
