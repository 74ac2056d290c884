#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>

#include "base/math.h"
#include "base/status_macros.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/validate.h"

namespace specd::kernels::cpu {
namespace {

static_assert(static_cast<int>(WeightType::kF32) == static_cast<int>(DType::kF32));
static_assert(static_cast<int>(WeightType::kF16) == static_cast<int>(DType::kF16));
static_assert(static_cast<int>(WeightType::kBF16) == static_cast<int>(DType::kBF16));

// A chunk should carry enough multiply-adds to hide the cost of handing it out, and there
// should be a few chunks per thread so a descheduled thread's share is picked up by others.
constexpr int64_t kMinMacsPerChunk = int64_t{64} * 1024;
constexpr int64_t kChunksPerThread = 4;
constexpr int64_t kRowAlign = 16;

int64_t RowGrain(int64_t rows, int64_t cols, int64_t n_tokens, int threads) {
  const int64_t balanced = CeilDiv(rows, threads * kChunksPerThread);
  const int64_t min_rows = CeilDiv(kMinMacsPerChunk, cols * n_tokens);
  const int64_t grain = std::max(balanced, min_rows);
  return RoundUpTo(grain, kRowAlign);
}

MatmulTask TaskOf(const MatmulArgs& args) {
  return MatmulTask{
      .x = args.x,
      .w = args.w.data,
      .wtype = static_cast<WeightType>(args.w.dtype),
      .y = args.y,
      .n_tokens = args.n_tokens,
      .rows = args.w.rows,
      .cols = args.w.cols,
      .accumulate = args.accumulate,
  };
}

// The parts' rows as one range, split among the threads in one ParallelFor: a chunk that
// straddles two parts computes the end of one and the start of the next.
void RunTasks(std::span<const MatmulTask> tasks, const CpuContext& ctx) {
  int64_t total_rows = 0;
  for (const MatmulTask& t : tasks) total_rows += t.rows;
  const MatmulTask& first = tasks.front();
  const SimdOps& ops = *ctx.ops;
  ctx.pool->ParallelFor(total_rows,
                        RowGrain(total_rows, first.cols, first.n_tokens, ctx.pool->num_threads()),
                        [&](int64_t begin, int64_t end) {
                          int64_t offset = 0;
                          for (const MatmulTask& t : tasks) {
                            const int64_t b = std::max(begin, offset);
                            const int64_t e = std::min(end, offset + t.rows);
                            if (b < e) ops.matmul_rows(t, b - offset, e - offset);
                            offset += t.rows;
                          }
                        });
}

}  // namespace

absl::Status CpuMatmul(const MatmulArgs& args, const CpuContext& ctx) {
  SPECD_RETURN_IF_ERROR(ValidateMatmulArgs(args));
  if (args.n_tokens == 0) return absl::OkStatus();
  const MatmulTask task = TaskOf(args);
  RunTasks({&task, 1}, ctx);
  return absl::OkStatus();
}

absl::Status CpuMatmulGroup(const MatmulGroupArgs& args, const CpuContext& ctx) {
  SPECD_RETURN_IF_ERROR(ValidateMatmulGroupArgs(args));
  if (args.parts[0].n_tokens == 0) return absl::OkStatus();
  // The norm goes through memory, as the separate op's: its bits by construction (a CPU launch
  // costs nothing to save).
  const InputNorm& norm = args.input_norm;
  const float* x = args.parts[0].x;
  if (norm.weight != nullptr) {
    SPECD_RETURN_IF_ERROR(CpuRmsNorm(
        {x, norm.weight, norm.normed, args.parts[0].n_tokens, args.parts[0].w.cols, norm.eps},
        ctx));
    x = norm.normed;
  }
  std::array<MatmulTask, kMaxMatmulGroup> tasks{};
  for (int i = 0; i < args.n_parts; ++i) {
    MatmulArgs part = args.parts[static_cast<size_t>(i)];
    part.x = x;
    tasks[static_cast<size_t>(i)] = TaskOf(part);
  }
  RunTasks({tasks.data(), static_cast<size_t>(args.n_parts)}, ctx);
  if (!args.swiglu) return absl::OkStatus();
  // Here the products go through memory: SwiGlu's own pass over them gives its bits by
  // construction.
  const MatmulArgs& gate = args.parts[0];
  return CpuSwiGlu({gate.y, args.parts[1].y, gate.y, gate.n_tokens, gate.w.rows}, ctx);
}

}  // namespace specd::kernels::cpu
