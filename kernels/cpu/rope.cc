#include "kernels/cpu/rope.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/math.h"
#include "base/status_macros.h"
#include "kernels/cpu/kv_cache.h"
#include "kernels/validate.h"

namespace specd::kernels::cpu {
namespace {

constexpr int64_t kMinElementsPerChunk = int64_t{32} * 1024;

}  // namespace

absl::Status CpuRope(const RopeArgs& args, const CpuContext& ctx) {
  SPECD_RETURN_IF_ERROR(ValidateRopeArgs(args));
  if (args.n_tokens == 0) return absl::OkStatus();
  // Positions in host memory: checked here, before any token is rotated.
  for (int64_t t = 0; t < args.n_tokens; ++t) {
    if (args.pos[t] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Rope: pos[", t, "] must be >= 0, got ", args.pos[t]));
    }
  }

  const int64_t width = args.n_heads * args.head_dim;
  const int64_t width2 = args.n_heads2 * args.head_dim;
  const int64_t half = args.head_dim / 2;
  const auto rotate = [&](float* x, int64_t n_heads, int64_t i, float c, float s) {
    for (int64_t h = 0; h < n_heads; ++h) {
      float* head = x + h * args.head_dim;
      const float x0 = head[i];
      const float x1 = head[i + half];
      head[i] = x0 * c - x1 * s;
      head[i + half] = x1 * c + x0 * s;
    }
  };
  const auto tokens = [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float p = static_cast<float>(args.pos[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = p * args.inv_freq[i];
        const float c = static_cast<float>(std::cos(static_cast<double>(angle)));
        const float s = static_cast<float>(std::sin(static_cast<double>(angle)));
        rotate(args.x + t * width, args.n_heads, i, c, s);
        if (args.n_heads2 > 0) rotate(args.x2 + t * width2, args.n_heads2, i, c, s);
      }
    }
  };
  const int64_t grain = CeilDiv(kMinElementsPerChunk, width + width2);
  ctx.pool->ParallelFor(args.n_tokens, grain, tokens);
  // The store reads the rotated keys from memory, as a StoreKv call of its own would.
  if (args.store.has_value()) return CpuStoreKv(*args.store, ctx);
  return absl::OkStatus();
}

}  // namespace specd::kernels::cpu
