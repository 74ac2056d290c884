// The CPU back end's memory: anonymous mappings, 2 MiB aligned with transparent huge pages
// requested when large. Decode streams every weight once per token, and on 4 KiB pages the TLB
// misses cost a large share of the memory bandwidth (measured on the development VM: about
// 19 GB/s from 4 KiB file pages against about 33 GB/s from huge pages).
#ifndef SPECD_KERNELS_CPU_HOST_MEMORY_H_
#define SPECD_KERNELS_CPU_HOST_MEMORY_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace specd::kernels::cpu {

// `bytes` of zeroed memory, 64-byte aligned; 2 MiB aligned with huge pages requested from
// 2 MiB up. Every page is resident on return, so no later write pays for its first touch.
// RESOURCE_EXHAUSTED when the memory cannot be had, or when a large allocation is more than the
// process can commit (memory_headroom.h): then the message names the limit.
absl::StatusOr<void*> AllocateHostMemory(int64_t bytes);

// Frees what AllocateHostMemory(bytes) returned.
void FreeHostMemory(void* data, int64_t bytes);

}  // namespace specd::kernels::cpu

#endif  // SPECD_KERNELS_CPU_HOST_MEMORY_H_
