// Which SIMD kernel table the CPU back end runs, chosen at run time.
#ifndef SPECD_KERNELS_CPU_CPU_ISA_H_
#define SPECD_KERNELS_CPU_CPU_ISA_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "kernels/cpu/simd.h"

namespace specd::kernels::cpu {

enum class CpuIsa : uint8_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

absl::string_view CpuIsaName(CpuIsa isa);

// True when this build contains the kernels for `isa` and this CPU and OS can run them
// (AVX2 needs AVX2 + FMA + F16C; AVX-512 needs F, BW and VL).
bool CpuIsaSupported(CpuIsa isa);

// The fastest supported ISA.
CpuIsa BestCpuIsa();

// The kernel table of `isa`; only for an ISA that CpuIsaSupported() accepts.
const SimdOps& SimdOpsFor(CpuIsa isa);

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_CPU_ISA_H_
