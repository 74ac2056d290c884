#include "kernels/cpu/elementwise.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/math.h"
#include "base/status_macros.h"
#include "kernels/dtype.h"
#include "kernels/validate.h"

namespace specd::kernels::cpu {
namespace {

// Below this many elements per chunk, waking other threads costs more than it saves.
constexpr int64_t kMinElementsPerChunk = 32 * 1024;

int64_t RowGrain(int64_t dim) { return CeilDiv(kMinElementsPerChunk, dim); }

}  // namespace

absl::Status CpuSwiGlu(const SwiGluArgs& args, const CpuContext& ctx) {
  SPECD_RETURN_IF_ERROR(ValidateSwiGluArgs(args));
  if (args.n_tokens == 0) return absl::OkStatus();

  const int64_t dim = args.dim;
  ctx.pool->ParallelFor(args.n_tokens, RowGrain(dim), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * dim; i < end * dim; ++i) {
      const float g = args.gate[i];
      const float silu = g / (1.0f + std::exp(-g));
      args.out[i] = silu * args.up[i];
    }
  });
  return absl::OkStatus();
}

absl::Status CpuEmbedding(const EmbeddingArgs& args, const CpuContext& ctx) {
  SPECD_RETURN_IF_ERROR(ValidateEmbeddingArgs(args));
  if (args.n_tokens == 0) return absl::OkStatus();
  // The ids are host memory here, so they are checked before any row is written (a device back
  // end checks them in its kernel).
  for (int64_t t = 0; t < args.n_tokens; ++t) {
    if (args.ids[t] < 0 || args.ids[t] >= args.table.rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("Embedding: ids[", t, "] = ", args.ids[t],
                       " is outside [0, table.rows = ", args.table.rows, ")"));
    }
  }

  const int64_t dim = args.table.cols;
  ctx.pool->ParallelFor(args.n_tokens, RowGrain(dim), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t offset = static_cast<int64_t>(args.ids[t]) * dim;
      float* out = args.out + t * dim;
      switch (args.table.dtype) {
        case DType::kF32:
          std::memcpy(out, static_cast<const float*>(args.table.data) + offset,
                      static_cast<size_t>(dim) * sizeof(float));
          break;
        case DType::kF16: {
          const uint16_t* row = static_cast<const uint16_t*>(args.table.data) + offset;
          for (int64_t i = 0; i < dim; ++i) out[i] = F16ToF32(row[i]);
          break;
        }
        case DType::kBF16: {
          const uint16_t* row = static_cast<const uint16_t*>(args.table.data) + offset;
          for (int64_t i = 0; i < dim; ++i) out[i] = Bf16ToF32(row[i]);
          break;
        }
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuGatherRows(const GatherRowsArgs& args, const CpuContext& ctx) {
  (void)ctx;  // a copy of the few rows whose logits are wanted is not worth other threads
  SPECD_RETURN_IF_ERROR(ValidateGatherRowsArgs(args));
  if (args.n == 0) return absl::OkStatus();
  // Row indices in host memory: checked here, before any row is copied.
  for (int64_t i = 0; i < args.n; ++i) {
    if (args.rows[i] < 0 || args.rows[i] >= args.n_src) {
      return absl::InvalidArgumentError(absl::StrCat("GatherRows: rows[", i, "] = ", args.rows[i],
                                                     " is outside [0, n_src = ", args.n_src, ")"));
    }
  }
  for (int64_t i = 0; i < args.n; ++i) {
    std::memcpy(args.dst + i * args.dim, args.src + int64_t{args.rows[i]} * args.dim,
                static_cast<size_t>(args.dim) * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace specd::kernels::cpu
