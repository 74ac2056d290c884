// The per-token math on the CPU: classifier-free guidance, the processed distribution, inverse-CDF
// draws, probability lookups and log-probabilities (see CombineLogitsArgs, ProcessRowsArgs,
// SampleRowsArgs, GatherProbsArgs and LogprobsArgs in kernels/backend.h). Every row, draw and
// lookup is computed alone by the same scalar code (processed.h, base/inverse_cdf.h), so the
// results are batch invariant by construction and are the reference for other back ends.
#ifndef SPECD_KERNELS_CPU_SAMPLING_H_
#define SPECD_KERNELS_CPU_SAMPLING_H_

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_context.h"

namespace specd::kernels::cpu {

absl::Status CpuCombineLogits(const CombineLogitsArgs& args, const CpuContext& ctx);

// Rows run in parallel, each on one thread with that thread's LogitsProcessor.
absl::Status CpuProcessRows(const ProcessRowsArgs& args, const CpuContext& ctx);

absl::Status CpuSampleRows(const SampleRowsArgs& args, const CpuContext& ctx);

absl::Status CpuGatherProbs(const GatherProbsArgs& args, const CpuContext& ctx);

absl::Status CpuLogprobs(const LogprobsArgs& args, const CpuContext& ctx);

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_SAMPLING_H_
