// The CUDA emulator's stand-in for the toolkit's <cuda_runtime_api.h> (see ../emulated_runtime.h).
#ifndef SPECD_TESTS_KERNELS_CUDA_EMULATION_FAKE_CUDA_CUDA_RUNTIME_API_H_
#define SPECD_TESTS_KERNELS_CUDA_EMULATION_FAKE_CUDA_CUDA_RUNTIME_API_H_

#include "tests/kernels/cuda_emulation/emulated_runtime.h"

#endif  // SPECD_TESTS_KERNELS_CUDA_EMULATION_FAKE_CUDA_CUDA_RUNTIME_API_H_
