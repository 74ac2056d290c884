// Paged grouped-query attention over a varlen batch on the GPU (see AttentionArgs and PagedKv in
// kernels/backend.h), beside kernels/cpu/attention.h: one-token decode, (K+1)-token verify,
// chunked prefill and draft trees (64-bit node masks) in one launch, reading the block table in
// the kernel.
//
// Invariance. A token's keys are cut into chunks of kAttentionChunk slots at FIXED slot
// positions (slots [64c, 64c + 64)), never at points chosen from the batch. A chunk's partial
// softmax (its max m_c, sum l_c and weighted values) is computed by one block with a fixed
// thread mapping, and the partials are merged in ascending chunk order with one merge function.
// The launcher may run all chunks of a (token, KV head) in one block (merging as it goes) or each
// chunk in its own block, with the last block to finish merging the stored partials in the same
// order: the two give the same bits, so that choice, which does depend on the batch's size, never
// changes a result. A chunk whose slots are all hidden (tree masks) is skipped in both.
#ifndef SPECD_KERNELS_CUDA_ATTENTION_H_
#define SPECD_KERNELS_CUDA_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_context.h"

namespace specd::kernels::cuda {

inline constexpr int64_t kAttentionChunk = 64;
inline constexpr int64_t kAttentionMaxGroup = 16;     // n_heads / n_kv_heads
inline constexpr int64_t kAttentionMaxHeadDim = 256;  // and even

// A token whose sequence, slot or block table is out of range is reported through ctx.error and
// its output is zeros. UNIMPLEMENTED beyond the group and head_dim limits. n_tokens == 0 is a
// no-op.
absl::Status LaunchAttention(const AttentionArgs& args, const CudaContext& ctx,
                             cudaStream_t stream);

// Workspace bytes the split form needs for `n_tokens` tokens (partials and arrival counters).
int64_t AttentionSplitWorkspaceBytes(const AttentionArgs& args);

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_ATTENTION_H_
