// Device helpers for writing the paged KV cache (kernels/backend.h's PagedKv), shared by StoreKv
// (kv_cache.cu) and the Rope that stores the keys it rotates (rope.cu), so both find and round a
// cache element the same way. Private to this folder.
#ifndef SPECD_KERNELS_CUDA_PAGED_KV_CUH_
#define SPECD_KERNELS_CUDA_PAGED_KV_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cuda/device_common.cuh"

namespace specd::kernels::cuda {

// The cache element index of (token's sequence, slot, 0), or -1 after reporting a bad token.
__device__ inline int64_t RowOffset(const PagedKv& c, const int32_t* token_seq, const int32_t* slot,
                                    int64_t t, DeviceOp op, DeviceError* error) {
  const int32_t seq = token_seq[t];
  const int32_t s = slot[t];
  if (seq < 0) {
    ReportError(error, op, DeviceField::kTokenSeq, t, seq);
    return -1;
  }
  if (s < 0 || s / c.block_size >= c.max_blocks) {
    ReportError(error, op, DeviceField::kSlot, t, s);
    return -1;
  }
  const int32_t block = c.block_tables[int64_t{seq} * c.max_blocks + s / c.block_size];
  if (block < 0 || block >= c.num_blocks) {
    ReportError(error, op, DeviceField::kBlockTable, t, block);
    return -1;
  }
  return (int64_t{block} * c.block_size + s % c.block_size) * c.kv_dim;
}

// Element `at` of the cache's k (or v) buffer := value, rounded to nearest even in a 16-bit cache.
__device__ __forceinline__ void StoreKvElement(void* cache, DType dtype, int64_t at, float value) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(cache)[at] = value;
      break;
    case DType::kBF16:
      static_cast<__nv_bfloat16*>(cache)[at] = __float2bfloat16_rn(value);
      break;
    case DType::kF16:
      static_cast<__half*>(cache)[at] = __float2half_rn(value);
      break;
  }
}

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_PAGED_KV_CUH_
