// Converts a llama2.c tokenizer.bin into Hugging Face tokenizer files (SentencePiece-style BPE
// with byte fallback, like Llama 2's), so a llama2.c model directory loads like any other.
#ifndef SPECD_COMMON_TOKENIZER_LLAMA2C_IMPORT_H_
#define SPECD_COMMON_TOKENIZER_LLAMA2C_IMPORT_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace specd {

// The texts of the three files a model directory holds.
struct HfTokenizerFiles {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  std::string generation_config_json;
};

// tokenizer.bin: int32 max_token_length, then per token float32 score, int32 length and the
// piece's bytes (little-endian). Ids 0, 1, 2 are <unk>, <s>, </s>; ids 3..258 are <0x00>..<0xFF>.
// Merges are recovered from the scores as transformers' SentencePieceExtractor does. Every
// inconsistency (truncation, bad lengths, a vocab_size that does not match) is INVALID_ARGUMENT
// naming the file.
absl::StatusOr<HfTokenizerFiles> ConvertLlama2cTokenizer(const std::filesystem::path& tokenizer_bin,
                                                         int32_t vocab_size);

// The same from the file's bytes; `name` is used in error messages.
absl::StatusOr<HfTokenizerFiles> ConvertLlama2cTokenizerBytes(std::string_view bytes,
                                                              int32_t vocab_size,
                                                              std::string_view name);

}  // namespace specd

#endif  // SPECD_COMMON_TOKENIZER_LLAMA2C_IMPORT_H_
