// Imports Karpathy's llama2.c checkpoints (legacy "version 0" .bin) into the Hugging Face
// directory format the engine loads.
#ifndef SPECD_COMMON_CONVERT_LLAMA2C_H_
#define SPECD_COMMON_CONVERT_LLAMA2C_H_

#include <filesystem>
#include <optional>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace specd {

struct Llama2cConvertOptions {
  std::filesystem::path checkpoint;                // llama2.c model .bin
  std::optional<std::filesystem::path> tokenizer;  // llama2.c tokenizer .bin (e.g. tok512.bin)
  std::filesystem::path out_dir;
  kernels::DType dtype = kernels::DType::kF32;  // dtype of the written weights
};

// Writes config.json, generation_config.json, model.safetensors and, with a tokenizer,
// tokenizer.json + tokenizer_config.json. The q/k projections are permuted from llama2.c's
// interleaved RoPE pairs to the Hugging Face rotate_half layout, as transformers'
// convert_llama_weights_to_hf.py does. Truncated or inconsistent files are INVALID_ARGUMENT
// naming what is wrong.
absl::Status ConvertLlama2c(const Llama2cConvertOptions& options);

}  // namespace specd

#endif  // SPECD_COMMON_CONVERT_LLAMA2C_H_
