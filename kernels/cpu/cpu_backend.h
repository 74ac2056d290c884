// The CPU back end: kernels::Backend over a persistent thread pool and a SIMD kernel table
// chosen at run time (AVX-512, AVX2 or portable scalar; all give bit-identical results).
//
// Beyond kernels/backend.h: every op accepts n_tokens == 0 (or n == 0) as a no-op, checks its
// arguments before touching memory and returns INVALID_ARGUMENT naming the op and field.
// The back end may be called from several threads; calls then run one at a time.
#ifndef SPECD_KERNELS_CPU_CPU_BACKEND_H_
#define SPECD_KERNELS_CPU_CPU_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_isa.h"

namespace specd::kernels {

// Like CreateCpuBackend, but with a given kernel table (for tests and benchmarks that compare
// them). FAILED_PRECONDITION when this CPU or build cannot run `isa`.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackendWithIsa(int num_threads, cpu::CpuIsa isa);

}  // namespace specd::kernels

#endif  // SPECD_KERNELS_CPU_CPU_BACKEND_H_
