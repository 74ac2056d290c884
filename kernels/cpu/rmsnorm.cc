#include "kernels/cpu/rmsnorm.h"

#include <cmath>
#include <cstdint>

#include "base/math.h"
#include "base/status_macros.h"
#include "kernels/validate.h"

namespace specd::kernels::cpu {
namespace {

// Rows are cheap; only a batch this big is worth waking the other threads for.
constexpr int64_t kMinElementsPerChunk = 32 * 1024;

}  // namespace

absl::Status CpuRmsNorm(const RmsNormArgs& args, const CpuContext& ctx) {
  SPECD_RETURN_IF_ERROR(ValidateRmsNormArgs(args));
  if (args.n_tokens == 0) return absl::OkStatus();

  const SimdOps& ops = *ctx.ops;
  const int64_t dim = args.dim;
  const auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* x = args.x + t * dim;
      float* y = args.y + t * dim;
      const float mean_sq = ops.dot(x, x, dim) / static_cast<float>(dim);
      const float r = 1.0f / std::sqrt(mean_sq + args.eps);
      for (int64_t i = 0; i < dim; ++i) y[i] = (x[i] * r) * args.weight[i];
    }
  };
  const int64_t grain = CeilDiv(kMinElementsPerChunk, dim);
  ctx.pool->ParallelFor(args.n_tokens, grain, rows);
  return absl::OkStatus();
}

}  // namespace specd::kernels::cpu
