// Parsing and validation of a Hugging Face tokenizer.json (the older and newer `tokenizers`
// serialisations) into the tokenizer's components. Anything declared that specd does not
// implement is INVALID_ARGUMENT naming the component, never silently ignored.
#ifndef SPECD_COMMON_TOKENIZER_TOKENIZER_JSON_H_
#define SPECD_COMMON_TOKENIZER_TOKENIZER_JSON_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/bpe.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"

namespace specd::tokenizer {

struct TokenizerDefinition {
  std::unique_ptr<BpeModel> model;
  // Token strings by id (model vocabulary and added tokens); ids without a token are absent.
  std::vector<std::optional<std::string>> pieces;
  absl::flat_hash_map<std::string, int32_t> piece_to_id;
  std::vector<AddedToken> added_tokens;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  Decoder decoder;
  // The model takes raw bytes (the last pre-tokenizer is ByteLevel; see BpeOptions).
  bool raw_byte_input = false;
  // TemplateProcessing's special tokens before $A in the single template, when one is declared.
  std::optional<std::vector<int32_t>> template_prefix;
  // Canonical text of every component and option, for the fingerprint.
  std::string description;
};

absl::StatusOr<TokenizerDefinition> ParseTokenizerJson(std::string_view text);

}  // namespace specd::tokenizer

#endif  // SPECD_COMMON_TOKENIZER_TOKENIZER_JSON_H_
