// Paged grouped-query attention over a varlen batch on the GPU (see AttentionArgs and PagedKv in
// kernels/backend.h), beside kernels/cpu/attention.h: one-token decode, (K+1)-token verify,
// chunked prefill and draft trees (64-bit node masks) in one launch, reading the block table in
// the kernel.
//
// Invariance. The keys a token sees are numbered by rank (its prefix, then with a tree mask the
// slots the mask shows, in slot order) and cut into chunks of kAttentionChunk keys at FIXED
// ranks (ranks [64c, 64c + 64)), never at points chosen from the batch, and the chunks into fixed
// groups of kAttentionGroupChunks. Cutting ranks rather than slots makes a tree node, whose
// ancestors sit at slots with holes between them, give the bits of its path fed at consecutive
// slots, as the CPU's does. A chunk's partial softmax (its max, sum of exponentials and weighted
// values) is computed by one block with a fixed thread mapping; a group's state is its chunks
// merged in ascending order from an empty state, and the output is the groups' states merged in
// ascending order, every merge by one function. The launcher may run all groups of a (token, KV
// head) in one block, or each group in its own block with the last block to finish merging the
// stored group states in the same order: the two give the same bits, so that choice, which does
// depend on the batch's size, never changes a result.
#ifndef SPECD_KERNELS_CUDA_ATTENTION_H_
#define SPECD_KERNELS_CUDA_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_context.h"

namespace specd::kernels::cuda {

inline constexpr int64_t kAttentionChunk = 64;
inline constexpr int64_t kAttentionGroupChunks = 2;  // 128 keys per chunk group
inline constexpr int64_t kAttentionMaxGroup = 16;    // n_heads / n_kv_heads
inline constexpr int64_t kAttentionMaxHeadDim = 256;
inline constexpr int64_t kAttentionMaxGroupTimesHeadDim = 2048;

// A bad token, by the CPU's checks (sequence or slot out of range, any block-table entry of its
// prefix outside the cache, or with a tree mask: mask_start outside [slot - 63, slot] or the
// token's own bit clear), is reported through ctx.error and its output rows are zeros.
// UNIMPLEMENTED beyond the group and head_dim limits. n_tokens == 0 is a no-op.
absl::Status LaunchAttention(const AttentionArgs& args, const CudaContext& ctx,
                             cudaStream_t stream);

// Workspace bytes the split form needs for `n_tokens` tokens (partials and arrival counters).
int64_t AttentionSplitWorkspaceBytes(const AttentionArgs& args);

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_ATTENTION_H_
