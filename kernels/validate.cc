#include "kernels/validate.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"

namespace specd::kernels {
namespace {

// 2^48 elements is far beyond any real tensor and keeps every offset (times 4 bytes) in range.
constexpr int64_t kMaxElements = int64_t{1} << 48;

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

}  // namespace specd::kernels
