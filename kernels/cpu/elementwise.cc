#include "kernels/cpu/elementwise.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
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
  constexpr absl::string_view kOp = "SwiGlu";
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "dim", args.dim));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_tokens", args.n_tokens));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_tokens x dim", args.n_tokens, args.dim));
  if (args.n_tokens == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "gate", args.gate));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "up", args.up));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "out", args.out));

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

absl::Status CpuAdd(const AddArgs& args, const CpuContext& ctx) {
  constexpr absl::string_view kOp = "Add";
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "dim", args.dim));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n", args.n));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n x dim", args.n, args.dim));
  if (args.n == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "y", args.y));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "x", args.x));

  const int64_t dim = args.dim;
  ctx.pool->ParallelFor(args.n, RowGrain(dim), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * dim; i < end * dim; ++i) args.y[i] += args.x[i];
  });
  return absl::OkStatus();
}

absl::Status CpuEmbedding(const EmbeddingArgs& args, const CpuContext& ctx) {
  constexpr absl::string_view kOp = "Embedding";
  SPECD_RETURN_IF_ERROR(CheckDType(kOp, "table.dtype", args.table.dtype));
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "table.rows", args.table.rows));
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "table.cols", args.table.cols));
  SPECD_RETURN_IF_ERROR(
      CheckElementCount(kOp, "table.rows x table.cols", args.table.rows, args.table.cols));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_tokens", args.n_tokens));
  SPECD_RETURN_IF_ERROR(
      CheckElementCount(kOp, "n_tokens x table.cols", args.n_tokens, args.table.cols));
  if (args.n_tokens == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "table.data", args.table.data));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "ids", args.ids));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "out", args.out));
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
  constexpr absl::string_view kOp = "GatherRows";
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "dim", args.dim));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n", args.n));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_src", args.n_src));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n x dim", args.n, args.dim));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_src x dim", args.n_src, args.dim));
  if (args.n == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "src", args.src));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "rows", args.rows));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "dst", args.dst));
  SPECD_RETURN_IF_ERROR(CheckNoOverlap(kOp, "dst", args.dst, args.n * args.dim * 4, "src", args.src,
                                       args.n_src * args.dim * 4));
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
