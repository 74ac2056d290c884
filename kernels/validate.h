// Argument checks of the ops in kernels/backend.h that do not depend on the back end. Each
// returns INVALID_ARGUMENT with a message that names the op and the field, e.g. "Matmul: w.cols
// must be > 0, got 0".
#ifndef SPECD_KERNELS_VALIDATE_H_
#define SPECD_KERNELS_VALIDATE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace specd::kernels {

absl::Status CheckNotNull(absl::string_view op, absl::string_view field, const void* p);
absl::Status CheckPositive(absl::string_view op, absl::string_view field, int64_t value);
absl::Status CheckNonNegative(absl::string_view op, absl::string_view field, int64_t value);
absl::Status CheckDType(absl::string_view op, absl::string_view field, DType dtype);

// a * b elements must stay far below the int64 range, so offsets never overflow.
absl::Status CheckElementCount(absl::string_view op, absl::string_view what, int64_t a, int64_t b);

// Fails when the byte ranges [a, a + a_bytes) and [b, b + b_bytes) overlap.
absl::Status CheckNoOverlap(absl::string_view op, absl::string_view a_name, const void* a,
                            int64_t a_bytes, absl::string_view b_name, const void* b,
                            int64_t b_bytes);

// The PagedKv fields an op reads (named "cache.<field>" in messages): both caches and the block
// table non-null, a known dtype, the sizes positive.
absl::Status CheckPagedKv(absl::string_view op, const PagedKv& cache);

// Token t of a paged op: its row of block_tables and its KV slot are in range, and every block
// that holds slots [0, slot] (all of them when `whole_prefix`, else only the block of slot) is a
// block of the cache. Reads token_seq, slot and the block table, so only a back end whose
// arguments are host memory can call it; `cache` must have passed CheckPagedKv.
absl::Status CheckTokenInCache(absl::string_view op, const PagedKv& cache, const int32_t* token_seq,
                               const int32_t* slot, int64_t t, bool whole_prefix);

}  // namespace specd::kernels

#endif  // SPECD_KERNELS_VALIDATE_H_
