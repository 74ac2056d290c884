// What every CUDA launcher needs besides its Args struct and the stream: where kernels report
// argument errors that only the device can see (ids and slots live in device memory), the back
// end's op workspace, and the device's size. Owned by CudaBackend (cuda_backend.cc).
#ifndef SPECD_KERNELS_CUDA_CUDA_CONTEXT_H_
#define SPECD_KERNELS_CUDA_CUDA_CONTEXT_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace specd::kernels::cuda {

// The op and the argument a kernel found out of range. Numbered for DeviceError; never reorder.
enum class DeviceOp : int32_t {
  kNone = 0,
  kEmbedding,
  kRope,
  kStoreKv,
  kAttention,
  kGatherRows,
  kCopyKvRows,
  kCombineLogits,
  kProcessRows,
  kSampleRows,
  kGatherProbs,
  kLogprobs,
};
enum class DeviceField : int32_t {
  kIds = 0,
  kPos,
  kTokenSeq,
  kSlot,
  kBlockTable,
  kRows,
  kSrcRows,
  kDstRows,
  kCondRows,
  kUncondRows,
  kProbSlot,
  kMode,
  kParams,
  kHistoryRange,  // value: history_len
  kDrawSlot,
  kSlots,
  kTokens,
  kQueryRows,
  kQueryTokens,
  kMaskStart,         // value: slot[index] in the high 32 bits, mask_start[index] in the low 32
  kTreeMask,          // value: the token's own bit (slot - mask_start), which the mask leaves clear
  kRepeatedProbSlot,  // value: the slot an earlier row of the call already writes
  kScale,             // a guidance scale that is not finite; value unused
  kBias,  // a row's logit biases: out of range, unsorted, or not finite; value: n_biases
};

// The first bad argument kernels met since the last Synchronize. Lives in mapped pinned host
// memory, so the host reads it after the stream is idle with no copy; kernels claim it with an
// atomic, so the first report wins and later ones are dropped.
struct DeviceError {
  int32_t claimed = 0;
  int32_t op = 0;
  int32_t field = 0;
  int32_t pad = 0;
  int64_t index = 0;
  int64_t value = 0;
};

// "StoreKv: slot at index 3 is out of range (value 99); the kernel skipped it"; a tree mask's
// errors in the CPU's words (kernels/cpu/attention.cc), e.g. "Attention: tree_mask[3] must let
// the token see its own slot (bit 5); the kernel skipped it".
std::string DeviceErrorMessage(const DeviceError& error);

struct CudaContext {
  DeviceError* error = nullptr;  // device view of the mapped error record
  // Scratch that ops may use between their launch and the next op on the stream (attention's
  // per-chunk partials, logprob row statistics). Allocated once, so ops never allocate and a
  // captured CUDA graph keeps valid pointers.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  int sm_count = 0;
  // Attention's split over KV chunks: 0 = choose by occupancy, 1 = always split, -1 = never
  // (tests force both to show they give the same bits).
  int attention_split = 0;
  // Launch kernels as programmatic dependent launches (device_common.cuh's LaunchKernel).
  bool programmatic_launch = false;
};

// OK, or INTERNAL naming `what` and the CUDA error. A failed runtime call also leaves its error as
// the thread's last CUDA error, and every launcher checks cudaGetLastError after its launch: on
// failure this clears it, so that the next op does not report this failure as its own.
absl::Status CudaStatus(cudaError_t error, const char* what);

// Whether `error` leaves the process's CUDA context unusable: CUDA then returns it from every
// later call, and the process must exit and be relaunched to use the device again.
bool IsStickyError(cudaError_t error);

// cudaSuccess when this build holds machine code or PTX the current device can run.
cudaError_t ProbeKernelImage();

// OK when programmatic dependent launches (device_common.cuh's LaunchKernel) work on `stream`,
// eagerly and recorded in a CUDA graph: a kernel pair runs in order and the second sees the
// first's write. Else why not; the stream is idle either way.
absl::Status ProbeProgrammaticLaunch(cudaStream_t stream);

}  // namespace specd::kernels::cuda

#endif  // SPECD_KERNELS_CUDA_CUDA_CONTEXT_H_
