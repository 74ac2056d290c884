// The argument checks of the ops in kernels/backend.h that do not depend on the back end: sizes,
// dtypes, null pointers and overlapping outputs, everything the host sees without reading an
// argument's contents. Every back end calls Validate<Op>Args before anything else, so a bad call
// gets the same INVALID_ARGUMENT, naming the op and the field (e.g. "Matmul: w.cols must be > 0,
// got 0"), whichever back end runs it.
//
// What stays in a back end: checks that read the arguments' contents (ids, positions, slots, row
// indices: host memory on the CPU, which checks them before it computes; device memory on a GPU,
// where the kernels check them and Synchronize reports them), and a back end's own limits (CUDA's
// launch dimensions, shared memory and kernel shapes).
//
// Empty calls. Each Validate<Op>Args checks the scalar arguments (sizes, dtypes, eps, top_n)
// first; when they make the call empty (the count named below is 0) it returns OK without
// checking the pointers, which may then be null, and the caller must do nothing more.
#ifndef SPECD_KERNELS_VALIDATE_H_
#define SPECD_KERNELS_VALIDATE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace specd::kernels {

// ---------------------------------------------------------------------------------------------
// One check per op. Empty when the named count is 0.

absl::Status ValidateMatmulArgs(const MatmulArgs& args);                // n_tokens
absl::Status ValidateMatmulGroupArgs(const MatmulGroupArgs& args);      // n_tokens
absl::Status ValidateRmsNormArgs(const RmsNormArgs& args);              // n_tokens
absl::Status ValidateRopeArgs(const RopeArgs& args);                    // n_tokens
absl::Status ValidateStoreKvArgs(const StoreKvArgs& args);              // n_tokens
absl::Status ValidateAttentionArgs(const AttentionArgs& args);          // n_tokens
absl::Status ValidateSwiGluArgs(const SwiGluArgs& args);                // n_tokens
absl::Status ValidateEmbeddingArgs(const EmbeddingArgs& args);          // n_tokens
absl::Status ValidateGatherRowsArgs(const GatherRowsArgs& args);        // n
absl::Status ValidateCopyKvRowsArgs(const CopyKvRowsArgs& args);        // n
absl::Status ValidateCombineLogitsArgs(const CombineLogitsArgs& args);  // n_pairs
absl::Status ValidateProcessRowsArgs(const ProcessRowsArgs& args);      // n_rows
absl::Status ValidateSampleRowsArgs(const SampleRowsArgs& args);        // n
absl::Status ValidateGatherProbsArgs(const GatherProbsArgs& args);      // n
absl::Status ValidateLogprobsArgs(const LogprobsArgs& args);            // n_rows and n_queries

// A back end's Upload, Download or CopyDeviceToDevice (named by `op`): no negative size, and no
// null pointer unless nothing is copied.
absl::Status ValidateCopyArgs(absl::string_view op, const void* dst, const void* src,
                              int64_t bytes);

// ---------------------------------------------------------------------------------------------
// The pieces they are made of, for a back end's own checks. Each returns INVALID_ARGUMENT with a
// message that starts with "<op>: " and names the field.

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
