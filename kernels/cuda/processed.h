// The processed distribution on the GPU: ProcessRows (see ProcessRowsArgs in kernels/backend.h
// and the rounding steps fixed in kernels/cpu/processed.h, its CPU reference).
//
// One 1024-thread block per row, working in place in the row's pool slot. Penalties, the argmax,
// temperature, top-k (ties to the lower id) and the softmax's exponentials (the same polynomial
// as the CPU, operation for operation) are element-wise or exact (max, integer counts), so the
// argmax, one-hot rows, greedy tokens and top-k's kept set match the CPU bit for bit. The fp64
// sums (softmax total, top-p prefix masses, renormalisation) are taken in a fixed order of this
// kernel (each thread a strided set in ascending id, then a fixed tree), not the CPU's
// sequential order, so a sampled row's entries may differ from the CPU's in the last bit or two,
// and top-p and min-p, which compare those probabilities, may keep or drop a token within
// rounding of their threshold where the CPU does the opposite. On this back end the same row
// always gets the same bits whatever the batch.
//
// Top-k and top-p find their thresholds by a four-way search over the order-preserving bit
// patterns of the values (count, or fp64 mass, of the entries at or above a candidate; three
// candidates per pass over the row, so 16 passes where a bisection takes 32, landing on the same
// key), then keep ties at the threshold in ascending id order, as the CPU does. The first penalty
// pass uses the row's pool slot (or the `penalized` row) as scratch for per-token counts, so no
// other memory is needed; `logits` must not overlap the pool.
#ifndef SPECD_KERNELS_CUDA_PROCESSED_H_
#define SPECD_KERNELS_CUDA_PROCESSED_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_context.h"

namespace specd::kernels::cuda {

// A row whose prob_slot, mode, history range or sampling parameters are invalid is reported
// through ctx.error (so Synchronize fails, naming the row). n_rows == 0 is a no-op.
absl::Status LaunchProcessRows(const ProcessRowsArgs& args, const CudaContext& ctx,
                               cudaStream_t stream);

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_PROCESSED_H_
