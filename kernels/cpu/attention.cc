#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "kernels/cpu/validate.h"

namespace specd::kernels::cpu {
namespace {

// Multiply-adds below which a batch of attention tasks runs on the calling thread alone.
constexpr int64_t kMinParallelMacs = 64 * 1024;

absl::Status CheckTokens(absl::string_view op, const PagedKv& cache, const int32_t* token_seq,
                         const int32_t* pos, int64_t n_tokens, bool whole_prefix) {
  SPECD_RETURN_IF_ERROR(CheckNotNull(op, "token_seq", token_seq));
  SPECD_RETURN_IF_ERROR(CheckNotNull(op, "pos", pos));
  for (int64_t t = 0; t < n_tokens; ++t) {
    SPECD_RETURN_IF_ERROR(CheckTokenInCache(op, cache, token_seq, pos, t, whole_prefix));
  }
  return absl::OkStatus();
}

// Offset in floats of position p's row of sequence `table` in a PagedKv cache.
int64_t SlotOffset(const PagedKv& cache, const int32_t* table, int64_t p) {
  const int64_t block = table[p / cache.block_size];
  return (block * cache.block_size + p % cache.block_size) * cache.kv_dim;
}

// Scores for positions [0, pos] of one task; grows per thread and is reused across calls.
std::vector<float>& ScoreScratch(int64_t n) {
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < n) scratch.resize(static_cast<size_t>(n));
  return scratch;
}

void AttendOneHead(const AttentionArgs& args, const SimdOps& ops, int64_t t, int64_t h) {
  const PagedKv& cache = args.cache;
  const int64_t head_dim = args.head_dim;
  const int64_t kv_head = h / (args.n_heads / args.n_kv_heads);
  const int64_t width = args.n_heads * head_dim;
  const int32_t* table = cache.block_tables + int64_t{args.token_seq[t]} * cache.max_blocks;
  const int64_t n_pos = int64_t{args.pos[t]} + 1;
  const float* q = args.q + t * width + h * head_dim;
  float* out = args.out + t * width + h * head_dim;
  const int64_t head_offset = kv_head * head_dim;
  // Positions [p, p + n) of one block are consecutive slots, kv_dim floats apart.
  const auto for_each_block = [&](auto&& fn) {
    for (int64_t p = 0; p < n_pos; p += cache.block_size) {
      const int64_t n = std::min(cache.block_size, n_pos - p);
      fn(p, n, SlotOffset(cache, table, p) + head_offset);
    }
  };

  std::vector<float>& scores = ScoreScratch(n_pos);
  for_each_block([&](int64_t p, int64_t n, int64_t offset) {
    ops.dot_rows(q, cache.k + offset, cache.kv_dim, n, head_dim, scores.data() + p);
  });
  float max_score = -INFINITY;
  for (int64_t p = 0; p < n_pos; ++p) {
    scores[p] *= args.scale;
    max_score = std::max(max_score, scores[p]);
  }
  float sum = 0.0f;
  for (int64_t p = 0; p < n_pos; ++p) {
    const float e = std::exp(scores[p] - max_score);
    scores[p] = e;
    sum += e;
  }
  // q is no longer read, so out may be q itself from here on.
  std::fill(out, out + head_dim, 0.0f);
  for_each_block([&](int64_t p, int64_t n, int64_t offset) {
    ops.axpy_rows(scores.data() + p, cache.v + offset, cache.kv_dim, n, head_dim, out);
  });
  for (int64_t d = 0; d < head_dim; ++d) out[d] = out[d] / sum;
}

}  // namespace

absl::Status CpuStoreKv(const StoreKvArgs& args, const CpuContext& ctx) {
  (void)ctx;  // a copy of n_tokens rows is not worth other threads
  constexpr absl::string_view kOp = "StoreKv";
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_tokens", args.n_tokens));
  SPECD_RETURN_IF_ERROR(CheckPagedKv(kOp, args.cache));
  SPECD_RETURN_IF_ERROR(
      CheckElementCount(kOp, "n_tokens x cache.kv_dim", args.n_tokens, args.cache.kv_dim));
  if (args.n_tokens == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "k", args.k));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "v", args.v));
  SPECD_RETURN_IF_ERROR(
      CheckTokens(kOp, args.cache, args.token_seq, args.pos, args.n_tokens, false));

  const PagedKv& cache = args.cache;
  const size_t row_bytes = static_cast<size_t>(cache.kv_dim) * sizeof(float);
  for (int64_t t = 0; t < args.n_tokens; ++t) {
    const int32_t* table = cache.block_tables + int64_t{args.token_seq[t]} * cache.max_blocks;
    const int64_t offset = SlotOffset(cache, table, args.pos[t]);
    std::memcpy(cache.k + offset, args.k + t * cache.kv_dim, row_bytes);
    std::memcpy(cache.v + offset, args.v + t * cache.kv_dim, row_bytes);
  }
  return absl::OkStatus();
}

absl::Status CpuAttention(const AttentionArgs& args, const CpuContext& ctx) {
  constexpr absl::string_view kOp = "Attention";
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_tokens", args.n_tokens));
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "n_heads", args.n_heads));
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "n_kv_heads", args.n_kv_heads));
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "head_dim", args.head_dim));
  if (args.n_heads % args.n_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Attention: n_heads (", args.n_heads,
                                                   ") must be a multiple of n_kv_heads (",
                                                   args.n_kv_heads, ")"));
  }
  SPECD_RETURN_IF_ERROR(CheckPagedKv(kOp, args.cache));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_heads x head_dim", args.n_heads, args.head_dim));
  if (args.cache.kv_dim != args.n_kv_heads * args.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("Attention: cache.kv_dim (", args.cache.kv_dim,
                                                   ") must equal n_kv_heads x head_dim (",
                                                   args.n_kv_heads, " x ", args.head_dim, ")"));
  }
  if (!std::isfinite(args.scale)) {
    return absl::InvalidArgumentError("Attention: scale must be finite");
  }
  const int64_t width = args.n_heads * args.head_dim;
  SPECD_RETURN_IF_ERROR(
      CheckElementCount(kOp, "n_tokens x n_heads x head_dim", args.n_tokens, width));
  if (args.n_tokens == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "q", args.q));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "out", args.out));
  if (args.out != args.q) {
    const int64_t bytes = args.n_tokens * width * 4;
    SPECD_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", args.out, bytes, "q", args.q, bytes));
  }
  SPECD_RETURN_IF_ERROR(CheckTokens(kOp, args.cache, args.token_seq, args.pos, args.n_tokens,
                                    /*whole_prefix=*/true));

  int64_t macs = 0;
  for (int64_t t = 0; t < args.n_tokens; ++t) macs += (int64_t{args.pos[t]} + 1) * width * 2;
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
