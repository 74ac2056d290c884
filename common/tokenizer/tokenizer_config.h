// BOS/EOS settings from tokenizer_config.json and generation_config.json.
#ifndef SPECD_COMMON_TOKENIZER_TOKENIZER_CONFIG_H_
#define SPECD_COMMON_TOKENIZER_TOKENIZER_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specd::tokenizer {

struct SpecialTokenConfig {
  // tokenizer_config.json
  std::optional<bool> add_bos_token;
  std::optional<std::string> bos_token;  // token content; the file may give a string or an
  std::optional<std::string> eos_token;  // AddedToken object with "content"
  // generation_config.json
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // eos_token_id as one id or a list
};

// Either text may be empty (the file is absent).
absl::StatusOr<SpecialTokenConfig> ParseSpecialTokenConfig(std::string_view tokenizer_config_json,
                                                           std::string_view generation_config_json);

}  // namespace specd::tokenizer

#endif  // SPECD_COMMON_TOKENIZER_TOKENIZER_CONFIG_H_
