// The paged KV cache's own ops on the GPU: storing new rows and copying rows (see StoreKvArgs,
// CopyKvRowsArgs and PagedKv in kernels/backend.h), beside kernels/cpu/kv_cache.h.
// Invariance: element by element (a store rounds f32 to the cache dtype, nearest even; a copy
// moves bits), so both are batch invariant by construction.
#ifndef SPECD_KERNELS_CUDA_KV_CACHE_H_
#define SPECD_KERNELS_CUDA_KV_CACHE_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_context.h"

namespace specd::kernels::cuda {

// A token whose sequence, slot or block-table entry is out of range is reported through
// ctx.error and stores nothing. n_tokens == 0 is a no-op.
absl::Status LaunchStoreKv(const StoreKvArgs& args, const CudaContext& ctx, cudaStream_t stream);

// Each block owns a range of columns of one layer's k or v, reads every source row of that range
// into shared memory and only then writes the destinations, so chained pairs see the old
// contents (columns are disjoint between blocks, so no block can overwrite another's source).
// A row outside [0, layer_stride) is reported through ctx.error and its pair is skipped.
// INVALID_ARGUMENT when n exceeds what one column of shared memory holds (kMaxCopyKvRows).
absl::Status LaunchCopyKvRows(const CopyKvRowsArgs& args, const CudaContext& ctx,
                              cudaStream_t stream);
inline constexpr int64_t kMaxCopyKvRows = 12 * 1024;

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_KV_CACHE_H_
