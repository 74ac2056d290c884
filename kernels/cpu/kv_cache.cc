#include "kernels/cpu/kv_cache.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/dtype.h"
#include "kernels/validate.h"

namespace specd::kernels::cpu {
namespace {

// Element offset of slot s's row of the sequence whose block table is `table`.
int64_t SlotOffset(const PagedKv& cache, const int32_t* table, int64_t s) {
  const int64_t block = table[s / cache.block_size];
  return (block * cache.block_size + s % cache.block_size) * cache.kv_dim;
}

void StoreRow(const float* src, int64_t n, DType dtype, void* cache, int64_t offset) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(static_cast<float*>(cache) + offset, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kF16: {
      uint16_t* dst = static_cast<uint16_t*>(cache) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = F32ToF16(src[i]);
      return;
    }
    case DType::kBF16: {
      uint16_t* dst = static_cast<uint16_t*>(cache) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = F32ToBf16(src[i]);
      return;
    }
  }
}

}  // namespace

void LoadKvAsF32(const void* cache, DType dtype, int64_t offset, int64_t n, float* out) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out, static_cast<const float*>(cache) + offset, static_cast<size_t>(n) * 4);
      return;
    case DType::kF16: {
      const uint16_t* src = static_cast<const uint16_t*>(cache) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = F16ToF32(src[i]);
      return;
    }
    case DType::kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(cache) + offset;
      for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToF32(src[i]);
      return;
    }
  }
}

absl::Status CpuStoreKv(const StoreKvArgs& args, const CpuContext& ctx) {
  (void)ctx;  // a copy of n_tokens rows is not worth other threads
  SPECD_RETURN_IF_ERROR(ValidateStoreKvArgs(args));
  if (args.n_tokens == 0) return absl::OkStatus();
  // Sequences, slots and the block table are host memory here: every token is checked before
  // anything is stored, so a bad call writes nothing.
  for (int64_t t = 0; t < args.n_tokens; ++t) {
    SPECD_RETURN_IF_ERROR(CheckTokenInCache("StoreKv", args.cache, args.token_seq, args.slot, t,
                                            /*whole_prefix=*/false));
  }

  const PagedKv& cache = args.cache;
  for (int64_t t = 0; t < args.n_tokens; ++t) {
    const int32_t* table = cache.block_tables + int64_t{args.token_seq[t]} * cache.max_blocks;
    const int64_t offset = SlotOffset(cache, table, args.slot[t]);
    StoreRow(args.k + t * cache.kv_dim, cache.kv_dim, cache.dtype, cache.k, offset);
    StoreRow(args.v + t * cache.kv_dim, cache.kv_dim, cache.dtype, cache.v, offset);
  }
  return absl::OkStatus();
}

absl::Status CpuCopyKvRows(const CopyKvRowsArgs& args, const CpuContext& ctx) {
  (void)ctx;
  SPECD_RETURN_IF_ERROR(ValidateCopyKvRowsArgs(args));
  if (args.n == 0) return absl::OkStatus();
  // Row indices in host memory: checked here, before any row is copied.
  for (int64_t i = 0; i < args.n; ++i) {
    for (const auto& [name, rows] :
         {std::pair{"src_rows", args.src_rows}, std::pair{"dst_rows", args.dst_rows}}) {
      if (rows[i] < 0 || rows[i] >= args.layer_stride) {
        return absl::InvalidArgumentError(absl::StrCat("CopyKvRows: ", name, "[", i,
                                                       "] = ", rows[i], " is outside [0, ",
                                                       args.layer_stride, ")"));
      }
    }
  }

  const int64_t row_bytes = args.kv_dim * DTypeSize(args.dtype);
  std::vector<char> scratch(static_cast<size_t>(args.n * row_bytes));
  for (void* base : {args.k, args.v}) {
    for (int64_t l = 0; l < args.n_layers; ++l) {
      char* layer = static_cast<char*>(base) + l * args.layer_stride * row_bytes;
      for (int64_t i = 0; i < args.n; ++i) {
        std::memcpy(scratch.data() + i * row_bytes, layer + args.src_rows[i] * row_bytes,
                    static_cast<size_t>(row_bytes));
      }
      for (int64_t i = 0; i < args.n; ++i) {
        std::memcpy(layer + args.dst_rows[i] * row_bytes, scratch.data() + i * row_bytes,
                    static_cast<size_t>(row_bytes));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace specd::kernels::cpu
