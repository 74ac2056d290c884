#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cstdint>

#include "base/math.h"
#include "base/status_macros.h"
#include "kernels/validate.h"

namespace specd::kernels::cpu {
namespace {

static_assert(static_cast<int>(WeightType::kF32) == static_cast<int>(DType::kF32));
static_assert(static_cast<int>(WeightType::kF16) == static_cast<int>(DType::kF16));
static_assert(static_cast<int>(WeightType::kBF16) == static_cast<int>(DType::kBF16));

// A chunk should carry enough multiply-adds to hide the cost of handing it out, and there
// should be a few chunks per thread so a descheduled thread's share is picked up by others.
constexpr int64_t kMinMacsPerChunk = 64 * 1024;
constexpr int64_t kChunksPerThread = 4;
constexpr int64_t kRowAlign = 16;

int64_t RowGrain(int64_t rows, int64_t cols, int64_t n_tokens, int threads) {
  const int64_t balanced = CeilDiv(rows, threads * kChunksPerThread);
  const int64_t min_rows = CeilDiv(kMinMacsPerChunk, cols * n_tokens);
  const int64_t grain = std::max(balanced, min_rows);
  return RoundUpTo(grain, kRowAlign);
}

}  // namespace

absl::Status CpuMatmul(const MatmulArgs& args, const CpuContext& ctx) {
  SPECD_RETURN_IF_ERROR(ValidateMatmulArgs(args));
  if (args.n_tokens == 0) return absl::OkStatus();

  const MatmulTask task{
      .x = args.x,
      .w = args.w.data,
      .wtype = static_cast<WeightType>(args.w.dtype),
      .y = args.y,
      .n_tokens = args.n_tokens,
      .rows = args.w.rows,
      .cols = args.w.cols,
  };
  const SimdOps& ops = *ctx.ops;
  ctx.pool->ParallelFor(task.rows,
                        RowGrain(task.rows, task.cols, task.n_tokens, ctx.pool->num_threads()),
                        [&](int64_t begin, int64_t end) { ops.matmul_rows(task, begin, end); });
  return absl::OkStatus();
}

}  // namespace specd::kernels::cpu
