#include "kernels/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace specd::kernels {
namespace {

// 2^48 elements is far beyond any real tensor and keeps every offset (times 4 bytes) in range.
constexpr int64_t kMaxElements = int64_t{1} << 48;

// An RMSNorm's eps: NaN and infinities fail the comparison or the finiteness test.
absl::Status CheckNormEps(absl::string_view op, absl::string_view field, float eps) {
  if (eps >= 0.0f && std::isfinite(eps)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", field, " must be finite and >= 0"));
}

}  // namespace

absl::Status CheckNotNull(absl::string_view op, absl::string_view field, const void* p) {
  if (p != nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", field, " must not be null"));
}

absl::Status CheckPositive(absl::string_view op, absl::string_view field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", field, " must be > 0, got ", value));
}

absl::Status CheckNonNegative(absl::string_view op, absl::string_view field, int64_t value) {
  if (value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", field, " must be >= 0, got ", value));
}

absl::Status CheckDType(absl::string_view op, absl::string_view field, DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", field, " has unknown dtype value ", static_cast<int>(dtype)));
}

absl::Status CheckElementCount(absl::string_view op, absl::string_view what, int64_t a, int64_t b) {
  if (a >= 0 && b >= 0 && (a == 0 || b <= kMaxElements / a)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", what, " = ", a, " x ", b, " elements is out of range"));
}

absl::Status CheckNoOverlap(absl::string_view op, absl::string_view a_name, const void* a,
                            int64_t a_bytes, absl::string_view b_name, const void* b,
                            int64_t b_bytes) {
  const auto a_begin = reinterpret_cast<uintptr_t>(a);
  const auto b_begin = reinterpret_cast<uintptr_t>(b);
  if (a_begin + static_cast<uintptr_t>(a_bytes) <= b_begin ||
      b_begin + static_cast<uintptr_t>(b_bytes) <= a_begin) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", a_name, " must not overlap ", b_name));
}

absl::Status CheckPagedKv(absl::string_view op, const PagedKv& cache) {
  SPECD_RETURN_IF_ERROR(CheckNotNull(op, "cache.k", cache.k));
  SPECD_RETURN_IF_ERROR(CheckNotNull(op, "cache.v", cache.v));
  SPECD_RETURN_IF_ERROR(CheckDType(op, "cache.dtype", cache.dtype));
  SPECD_RETURN_IF_ERROR(CheckNotNull(op, "cache.block_tables", cache.block_tables));
  SPECD_RETURN_IF_ERROR(CheckPositive(op, "cache.max_blocks", cache.max_blocks));
  SPECD_RETURN_IF_ERROR(CheckPositive(op, "cache.num_blocks", cache.num_blocks));
  SPECD_RETURN_IF_ERROR(CheckPositive(op, "cache.block_size", cache.block_size));
  SPECD_RETURN_IF_ERROR(CheckPositive(op, "cache.kv_dim", cache.kv_dim));
  SPECD_RETURN_IF_ERROR(
      CheckElementCount(op, "cache.block_size x cache.kv_dim", cache.block_size, cache.kv_dim));
  return CheckElementCount(op, "cache.num_blocks x cache.block_size x cache.kv_dim",
                           cache.num_blocks, cache.block_size * cache.kv_dim);
}

absl::Status CheckTokenInCache(absl::string_view op, const PagedKv& cache, const int32_t* token_seq,
                               const int32_t* slot, int64_t t, bool whole_prefix) {
  const int64_t seq = token_seq[t];
  const int64_t s = slot[t];
  if (seq < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": token_seq[", t, "] must be >= 0, got ", seq));
  }
  if (s < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": slot[", t, "] must be >= 0, got ", s));
  }
  const int64_t last_block = s / cache.block_size;
  if (last_block >= cache.max_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": slot[", t, "] = ", s, " needs block ", last_block, " but cache.max_blocks is ",
        cache.max_blocks, " (cache.block_size ", cache.block_size, ")"));
  }
  if (seq > kMaxElements / cache.max_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": token_seq[", t, "] = ", seq, " is out of range"));
  }
  const int32_t* table = cache.block_tables + seq * cache.max_blocks;
  for (int64_t b = whole_prefix ? 0 : last_block; b <= last_block; ++b) {
    if (table[b] < 0 || table[b] >= cache.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": cache.block_tables[", seq, "][", b, "] = ", table[b],
          " is not a block of the cache (", cache.num_blocks, " blocks; slot[", t, "] = ", s, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateMatmulArgs(const MatmulArgs& args) {
  constexpr absl::string_view kOp = "Matmul";
  SPECD_RETURN_IF_ERROR(CheckDType(kOp, "w.dtype", args.w.dtype));
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "w.rows", args.w.rows));
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "w.cols", args.w.cols));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_tokens", args.n_tokens));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "w.rows x w.cols", args.w.rows, args.w.cols));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_tokens x w.cols", args.n_tokens, args.w.cols));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_tokens x w.rows", args.n_tokens, args.w.rows));
  if (args.n_tokens == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "x", args.x));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "w.data", args.w.data));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "y", args.y));
  const int64_t y_bytes = args.n_tokens * args.w.rows * 4;
  SPECD_RETURN_IF_ERROR(
      CheckNoOverlap(kOp, "y", args.y, y_bytes, "x", args.x, args.n_tokens * args.w.cols * 4));
  return CheckNoOverlap(kOp, "y", args.y, y_bytes, "w.data", args.w.data,
                        args.w.rows * args.w.cols * DTypeSize(args.w.dtype));
}

absl::Status ValidateMatmulGroupArgs(const MatmulGroupArgs& args) {
  constexpr absl::string_view kOp = "MatmulGroup";
  if (args.n_parts < 1 || args.n_parts > kMaxMatmulGroup) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": n_parts must be in [1, ", kMaxMatmulGroup, "], got ", args.n_parts));
  }
  const MatmulArgs& first = args.parts[0];
  if (args.swiglu) {
    const MatmulArgs& up = args.parts[1];
    if (args.n_parts != 2 || first.w.rows != up.w.rows || first.accumulate || up.accumulate) {
      return absl::InvalidArgumentError(absl::StrCat(
          kOp, ": swiglu needs two parts (gate, up) of equal w.rows, neither accumulating"));
    }
  }
  for (int i = 0; i < args.n_parts; ++i) {
    const MatmulArgs& p = args.parts[static_cast<size_t>(i)];
    if (absl::Status st = ValidateMatmulArgs(p); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(kOp, " parts[", i, "]: ", st.message()));
    }
    if (p.x != first.x || p.n_tokens != first.n_tokens || p.w.cols != first.w.cols) {
      return absl::InvalidArgumentError(
          absl::StrCat(kOp, ": parts[", i, "] must share x, n_tokens and w.cols with parts[0]"));
    }
  }
  const InputNorm& norm = args.input_norm;
  if (norm.weight != nullptr) SPECD_RETURN_IF_ERROR(CheckNormEps(kOp, "input_norm.eps", norm.eps));
  if (first.n_tokens == 0) return absl::OkStatus();
  if (norm.weight != nullptr) {
    SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "input_norm.normed", norm.normed));
    const int64_t normed_bytes = first.n_tokens * first.w.cols * 4;
    if (norm.normed != first.x) {
      SPECD_RETURN_IF_ERROR(CheckNoOverlap(kOp, "input_norm.normed", norm.normed, normed_bytes, "x",
                                           first.x, normed_bytes));
    }
    for (int i = 0; i < args.n_parts; ++i) {
      const MatmulArgs& p = args.parts[static_cast<size_t>(i)];
      SPECD_RETURN_IF_ERROR(CheckNoOverlap(kOp, "input_norm.normed", norm.normed, normed_bytes,
                                           absl::StrCat("parts[", i, "].y"), p.y,
                                           p.n_tokens * p.w.rows * 4));
      SPECD_RETURN_IF_ERROR(CheckNoOverlap(kOp, "input_norm.normed", norm.normed, normed_bytes,
                                           absl::StrCat("parts[", i, "].w.data"), p.w.data,
                                           p.w.rows * p.w.cols * DTypeSize(p.w.dtype)));
    }
  }
  for (int i = 0; i < args.n_parts; ++i) {
    const MatmulArgs& a = args.parts[static_cast<size_t>(i)];
    for (int j = 0; j < args.n_parts; ++j) {
      if (j == i) continue;
      const MatmulArgs& b = args.parts[static_cast<size_t>(j)];
      const std::string a_name = absl::StrCat("parts[", i, "].y");
      SPECD_RETURN_IF_ERROR(CheckNoOverlap(kOp, a_name, a.y, a.n_tokens * a.w.rows * 4,
                                           absl::StrCat("parts[", j, "].y"), b.y,
                                           b.n_tokens * b.w.rows * 4));
      SPECD_RETURN_IF_ERROR(CheckNoOverlap(kOp, a_name, a.y, a.n_tokens * a.w.rows * 4,
                                           absl::StrCat("parts[", j, "].w.data"), b.w.data,
                                           b.w.rows * b.w.cols * DTypeSize(b.w.dtype)));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRmsNormArgs(const RmsNormArgs& args) {
  constexpr absl::string_view kOp = "RmsNorm";
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "dim", args.dim));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_tokens", args.n_tokens));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_tokens x dim", args.n_tokens, args.dim));
  SPECD_RETURN_IF_ERROR(CheckNormEps(kOp, "eps", args.eps));
  if (args.n_tokens == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "x", args.x));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "weight", args.weight));
  return CheckNotNull(kOp, "y", args.y);
}

absl::Status ValidateRopeArgs(const RopeArgs& args) {
  constexpr absl::string_view kOp = "Rope";
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "n_heads", args.n_heads));
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "head_dim", args.head_dim));
  if (args.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rope: head_dim must be even, got ", args.head_dim));
  }
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_tokens", args.n_tokens));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_heads x head_dim", args.n_heads, args.head_dim));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_tokens x n_heads x head_dim", args.n_tokens,
                                          args.n_heads * args.head_dim));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_heads2", args.n_heads2));
  SPECD_RETURN_IF_ERROR(
      CheckElementCount(kOp, "n_heads2 x head_dim", args.n_heads2, args.head_dim));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_tokens x n_heads2 x head_dim", args.n_tokens,
                                          args.n_heads2 * args.head_dim));
  if (args.store.has_value()) {
    const StoreKvArgs& store = *args.store;
    if (absl::Status st = ValidateStoreKvArgs(store); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(kOp, " store: ", st.message()));
    }
    if (store.k != args.x2 || store.n_tokens != args.n_tokens ||
        store.cache.kv_dim != args.n_heads2 * args.head_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          kOp,
          ": store must store the rotated x2 of the same tokens: store.k == x2, "
          "store.n_tokens == n_tokens and store.cache.kv_dim == n_heads2 x head_dim (",
          args.n_heads2, " x ", args.head_dim, "), got cache.kv_dim ", store.cache.kv_dim));
    }
  }
  if (args.n_tokens == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "x", args.x));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "pos", args.pos));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "inv_freq", args.inv_freq));
  if (args.n_heads2 == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "x2", args.x2));
  return CheckNoOverlap(kOp, "x2", args.x2, args.n_tokens * args.n_heads2 * args.head_dim * 4, "x",
                        args.x, args.n_tokens * args.n_heads * args.head_dim * 4);
}

absl::Status ValidateStoreKvArgs(const StoreKvArgs& args) {
  constexpr absl::string_view kOp = "StoreKv";
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_tokens", args.n_tokens));
  SPECD_RETURN_IF_ERROR(CheckPagedKv(kOp, args.cache));
  SPECD_RETURN_IF_ERROR(
      CheckElementCount(kOp, "n_tokens x cache.kv_dim", args.n_tokens, args.cache.kv_dim));
  if (args.n_tokens == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "k", args.k));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "v", args.v));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "token_seq", args.token_seq));
  return CheckNotNull(kOp, "slot", args.slot);
}

absl::Status ValidateAttentionArgs(const AttentionArgs& args) {
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
  // n_kv_heads divides n_heads, so this product is in range too.
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
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "token_seq", args.token_seq));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "slot", args.slot));
  if (args.tree_mask != nullptr) {
    SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "mask_start", args.mask_start));
  }
  return absl::OkStatus();
}

absl::Status ValidateSwiGluArgs(const SwiGluArgs& args) {
  constexpr absl::string_view kOp = "SwiGlu";
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "dim", args.dim));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_tokens", args.n_tokens));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_tokens x dim", args.n_tokens, args.dim));
  if (args.n_tokens == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "gate", args.gate));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "up", args.up));
  return CheckNotNull(kOp, "out", args.out);
}

absl::Status ValidateEmbeddingArgs(const EmbeddingArgs& args) {
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
  return CheckNotNull(kOp, "out", args.out);
}

absl::Status ValidateGatherRowsArgs(const GatherRowsArgs& args) {
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
  return CheckNoOverlap(kOp, "dst", args.dst, args.n * args.dim * 4, "src", args.src,
                        args.n_src * args.dim * 4);
}

absl::Status ValidateCopyKvRowsArgs(const CopyKvRowsArgs& args) {
  constexpr absl::string_view kOp = "CopyKvRows";
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n", args.n));
  SPECD_RETURN_IF_ERROR(CheckDType(kOp, "dtype", args.dtype));
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "n_layers", args.n_layers));
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "layer_stride", args.layer_stride));
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "kv_dim", args.kv_dim));
  SPECD_RETURN_IF_ERROR(
      CheckElementCount(kOp, "n_layers x layer_stride", args.n_layers, args.layer_stride));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_layers x layer_stride x kv_dim",
                                          args.n_layers * args.layer_stride, args.kv_dim));
  if (args.n == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "k", args.k));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "v", args.v));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "src_rows", args.src_rows));
  return CheckNotNull(kOp, "dst_rows", args.dst_rows);
}

absl::Status ValidateCombineLogitsArgs(const CombineLogitsArgs& args) {
  constexpr absl::string_view kOp = "CombineLogits";
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "vocab", args.vocab));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_rows", args.n_rows));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_pairs", args.n_pairs));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_rows x vocab", args.n_rows, args.vocab));
  if (args.n_pairs == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "logits", args.logits));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "cond_rows", args.cond_rows));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "uncond_rows", args.uncond_rows));
  return CheckNotNull(kOp, "scale", args.scale);
}

absl::Status ValidateProcessRowsArgs(const ProcessRowsArgs& args) {
  constexpr absl::string_view kOp = "ProcessRows";
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "vocab", args.vocab));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_rows", args.n_rows));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "history_len", args.history_len));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_biases", args.n_biases));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "prob_capacity", args.prob_capacity));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_rows x vocab", args.n_rows, args.vocab));
  SPECD_RETURN_IF_ERROR(
      CheckElementCount(kOp, "prob_capacity x vocab", args.prob_capacity, args.vocab));
  if (args.n_rows == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "logits", args.logits));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "rows", args.rows));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "probs", args.probs));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "argmax", args.argmax));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "error", args.error));
  if (args.top_n < 0 || args.top_n > kMaxTopTokens || args.top_n > args.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": top_n must be in [0, ",
                                                   std::min<int64_t>(kMaxTopTokens, args.vocab),
                                                   "], got ", args.top_n));
  }
  if (args.top_n > 0) SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "top_ids", args.top_ids));
  // A row's pool slot is written while other rows' logits may still be read.
  const int64_t logits_bytes = args.n_rows * args.vocab * 4;
  const int64_t probs_bytes = args.prob_capacity * args.vocab * 4;
  SPECD_RETURN_IF_ERROR(
      CheckNoOverlap(kOp, "probs", args.probs, probs_bytes, "logits", args.logits, logits_bytes));
  if (args.penalized == nullptr) return absl::OkStatus();
  // A GPU row counts its history in its penalised row before it reads its logits.
  SPECD_RETURN_IF_ERROR(CheckNoOverlap(kOp, "penalized", args.penalized, logits_bytes, "logits",
                                       args.logits, logits_bytes));
  return CheckNoOverlap(kOp, "penalized", args.penalized, logits_bytes, "probs", args.probs,
                        probs_bytes);
}

absl::Status ValidateSampleRowsArgs(const SampleRowsArgs& args) {
  constexpr absl::string_view kOp = "SampleRows";
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "vocab", args.vocab));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n", args.n));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "prob_capacity", args.prob_capacity));
  SPECD_RETURN_IF_ERROR(
      CheckElementCount(kOp, "prob_capacity x vocab", args.prob_capacity, args.vocab));
  if (args.n == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "probs", args.probs));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "draws", args.draws));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "tokens", args.tokens));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "token_probs", args.token_probs));
  return CheckNotNull(kOp, "error", args.error);
}

absl::Status ValidateGatherProbsArgs(const GatherProbsArgs& args) {
  constexpr absl::string_view kOp = "GatherProbs";
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "vocab", args.vocab));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n", args.n));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "prob_capacity", args.prob_capacity));
  SPECD_RETURN_IF_ERROR(
      CheckElementCount(kOp, "prob_capacity x vocab", args.prob_capacity, args.vocab));
  if (args.n == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "probs", args.probs));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "slots", args.slots));
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "tokens", args.tokens));
  return CheckNotNull(kOp, "out", args.out);
}

absl::Status ValidateLogprobsArgs(const LogprobsArgs& args) {
  constexpr absl::string_view kOp = "Logprobs";
  SPECD_RETURN_IF_ERROR(CheckPositive(kOp, "vocab", args.vocab));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_rows", args.n_rows));
  SPECD_RETURN_IF_ERROR(CheckNonNegative(kOp, "n_queries", args.n_queries));
  SPECD_RETURN_IF_ERROR(CheckElementCount(kOp, "n_rows x vocab", args.n_rows, args.vocab));
  if (args.top_n < 0 || args.top_n > kMaxTopLogprobs || args.top_n > args.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": top_n must be in [0, ",
                                                   std::min<int64_t>(kMaxTopLogprobs, args.vocab),
                                                   "], got ", args.top_n));
  }
  if (args.n_rows == 0 && args.n_queries == 0) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "logits", args.logits));
  if (args.top_n > 0 && args.n_rows > 0) {
    SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "top_ids", args.top_ids));
    SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "top_logprobs", args.top_logprobs));
  }
  if (args.n_queries > 0) {
    SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "query_rows", args.query_rows));
    SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "query_tokens", args.query_tokens));
    SPECD_RETURN_IF_ERROR(CheckNotNull(kOp, "query_logprobs", args.query_logprobs));
  }
  return absl::OkStatus();
}

absl::Status ValidateCopyArgs(absl::string_view op, const void* dst, const void* src,
                              int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": bytes must be >= 0, got ", bytes));
  }
  if (bytes > 0 && (dst == nullptr || src == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": null pointer"));
  }
  return absl::OkStatus();
}

}  // namespace specd::kernels
