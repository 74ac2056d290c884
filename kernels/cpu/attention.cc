#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cpu/kv_cache.h"
#include "kernels/validate.h"

namespace specd::kernels::cpu {
namespace {

// Multiply-adds below which a batch of attention tasks runs on the calling thread alone.
constexpr int64_t kMinParallelMacs = 64 * 1024;

// Sequences, slots, the block table and the tree masks are host memory here, so every token is
// checked before any is attended (a device back end checks them in its kernel).
absl::Status CheckTokens(const AttentionArgs& args) {
  for (int64_t t = 0; t < args.n_tokens; ++t) {
    SPECD_RETURN_IF_ERROR(CheckTokenInCache("Attention", args.cache, args.token_seq, args.slot, t,
                                            /*whole_prefix=*/true));
    if (args.tree_mask == nullptr) continue;
    const int64_t window = int64_t{args.slot[t]} - args.mask_start[t];
    if (args.mask_start[t] < 0 || window < 0 || window >= 64) {
      return absl::InvalidArgumentError(
          absl::StrCat("Attention: mask_start[", t, "] = ", args.mask_start[t],
                       " must be in [slot - 63, slot] (slot[", t, "] = ", args.slot[t], ")"));
    }
    if (((args.tree_mask[t] >> window) & 1) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Attention: tree_mask[", t, "] must let the token see its own slot (bit ", window, ")"));
    }
  }
  return absl::OkStatus();
}

// Element offset of slot s's row of the sequence whose block table is `table`.
int64_t SlotOffset(const PagedKv& cache, const int32_t* table, int64_t s) {
  const int64_t block = table[s / cache.block_size];
  return (block * cache.block_size + s % cache.block_size) * cache.kv_dim;
}

// Per-thread scratch, grown as needed and reused across calls.
float* Scratch(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

void AttendOneHead(const AttentionArgs& args, const SimdOps& ops, int64_t t, int64_t h) {
  const PagedKv& cache = args.cache;
  const int64_t head_dim = args.head_dim;
  const int64_t kv_head = h / (args.n_heads / args.n_kv_heads);
  const int64_t width = args.n_heads * head_dim;
  const int32_t* table = cache.block_tables + int64_t{args.token_seq[t]} * cache.max_blocks;
  const int64_t n_slots = int64_t{args.slot[t]} + 1;
  const float* q = args.q + t * width + h * head_dim;
  float* out = args.out + t * width + h * head_dim;
  const int64_t head_offset = kv_head * head_dim;
  // Slots [s, s + n) of one block are consecutive rows, kv_dim elements apart. An f32 cache is
  // read in place; a bf16/f16 one is widened block by block into a dense [n, head_dim] copy.
  thread_local std::vector<float> widened;
  const auto for_each_block = [&](const void* base, auto&& fn) {
    for (int64_t s = 0; s < n_slots; s += cache.block_size) {
      const int64_t n = std::min(cache.block_size, n_slots - s);
      const int64_t offset = SlotOffset(cache, table, s) + head_offset;
      if (cache.dtype == DType::kF32) {
        fn(s, n, static_cast<const float*>(base) + offset, cache.kv_dim);
      } else {
        float* rows = Scratch(widened, n * head_dim);
        for (int64_t i = 0; i < n; ++i) {
          LoadKvAsF32(base, cache.dtype, offset + i * cache.kv_dim, head_dim, rows + i * head_dim);
        }
        fn(s, n, rows, head_dim);
      }
    }
  };

  thread_local std::vector<float> score_scratch;
  float* scores = Scratch(score_scratch, n_slots);
  for_each_block(cache.k, [&](int64_t s, int64_t n, const float* k, int64_t stride) {
    ops.dot_rows(q, k, stride, n, head_dim, scores + s);
  });
  // A masked slot gets weight exp(-inf) = 0, and fma(0, v, y) == y for the finite v of a stored
  // row, so masking changes no bit of the visible slots' sums.
  const uint64_t mask = args.tree_mask != nullptr ? args.tree_mask[t] : ~uint64_t{0};
  const int64_t mask_start = args.tree_mask != nullptr ? args.mask_start[t] : n_slots;
  float max_score = -INFINITY;
  for (int64_t s = 0; s < n_slots; ++s) {
    const bool visible = s < mask_start || ((mask >> (s - mask_start)) & 1) != 0;
    scores[s] = visible ? scores[s] * args.scale : -INFINITY;
    max_score = std::max(max_score, scores[s]);
  }
  float sum = 0.0f;
  for (int64_t s = 0; s < n_slots; ++s) {
    const float e = std::exp(scores[s] - max_score);
    scores[s] = e;
    sum += e;
  }
  // q is no longer read, so out may be q itself from here on.
  std::fill(out, out + head_dim, 0.0f);
  for_each_block(cache.v, [&](int64_t s, int64_t n, const float* v, int64_t stride) {
    ops.axpy_rows(scores + s, v, stride, n, head_dim, out);
  });
  for (int64_t d = 0; d < head_dim; ++d) out[d] = out[d] / sum;
}

}  // namespace

absl::Status CpuAttention(const AttentionArgs& args, const CpuContext& ctx) {
  SPECD_RETURN_IF_ERROR(ValidateAttentionArgs(args));
  if (args.n_tokens == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckTokens(args));

  const int64_t width = args.n_heads * args.head_dim;
  int64_t macs = 0;
  for (int64_t t = 0; t < args.n_tokens; ++t) macs += (int64_t{args.slot[t]} + 1) * width * 2;
  const int64_t tasks = args.n_tokens * args.n_heads;
  const int64_t grain = macs < kMinParallelMacs ? tasks : 1;
  const SimdOps& ops = *ctx.ops;
  ctx.pool->ParallelFor(tasks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      AttendOneHead(args, ops, i / args.n_heads, i % args.n_heads);
  });
  return absl::OkStatus();
}

}  // namespace specd::kernels::cpu
