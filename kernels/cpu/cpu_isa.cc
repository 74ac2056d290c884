#include "kernels/cpu/cpu_isa.h"

#if defined(SPECD_CPU_X86_KERNELS)
#include <cpuid.h>
#endif

#include "absl/strings/string_view.h"

namespace specd::kernels::cpu {
namespace {

#if defined(SPECD_CPU_X86_KERNELS)
// Clang has no "f16c" for __builtin_cpu_supports, so ask CPUID (leaf 1, ECX bit 29).
bool HasF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
#endif

}  // namespace

absl::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

bool CpuIsaSupported(CpuIsa isa) {
#if defined(SPECD_CPU_X86_KERNELS)
  __builtin_cpu_init();  // may be called from a static initialiser before libgcc's own
#endif
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
#if defined(SPECD_CPU_X86_KERNELS)
      // libgcc also checks that the OS saves the ymm/zmm state (XCR0) before reporting these.
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
#else
      return false;
#endif
    case CpuIsa::kAvx512:
#if defined(SPECD_CPU_X86_KERNELS)
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && CpuIsaSupported(CpuIsa::kAvx2);
#else
      return false;
#endif
  }
  return false;
}

CpuIsa BestCpuIsa() {
  for (const CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2}) {
    if (CpuIsaSupported(isa)) return isa;
  }
  return CpuIsa::kScalar;
}

const SimdOps& SimdOpsFor(CpuIsa isa) {
#if defined(SPECD_CPU_X86_KERNELS)
  if (isa == CpuIsa::kAvx512) return kAvx512SimdOps;
  if (isa == CpuIsa::kAvx2) return kAvx2SimdOps;
#endif
  (void)isa;
  return kScalarSimdOps;
}

}  // namespace specd::kernels::cpu
