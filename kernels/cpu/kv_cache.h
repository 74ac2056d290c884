// The paged KV cache's own ops on the CPU: storing new rows and copying rows (see StoreKvArgs,
// CopyKvRowsArgs and PagedKv in kernels/backend.h). Rows are copied or rounded element by
// element, so both are batch invariant by construction.
#ifndef SPECD_KERNELS_CPU_KV_CACHE_H_
#define SPECD_KERNELS_CPU_KV_CACHE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_context.h"

namespace specd::kernels::cpu {

// Writes each token's k and v rows into its (sequence, slot) place, rounding to the cache's
// dtype (nearest even). Every token is checked before anything is written. n_tokens == 0 is a
// no-op.
absl::Status CpuStoreKv(const StoreKvArgs& args, const CpuContext& ctx);

// Gathers every source row (all layers) into scratch, then writes every destination, so chained
// pairs see the old contents. Checks every index first.
absl::Status CpuCopyKvRows(const CopyKvRowsArgs& args, const CpuContext& ctx);

// Widens `n` consecutive cache elements of `dtype` starting at element `offset` into `out`.
void LoadKvAsF32(const void* cache, DType dtype, int64_t offset, int64_t n, float* out);

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_KV_CACHE_H_
