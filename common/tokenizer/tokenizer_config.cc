#include "common/tokenizer/tokenizer_config.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "common/tokenizer/json_fields.h"
#include "common/tokenizer/string_util.h"

namespace specd::tokenizer {
namespace {

constexpr std::string_view kTokenizerConfig = "tokenizer_config.json";
constexpr std::string_view kGenerationConfig = "generation_config.json";

// bos_token/eos_token: a plain string, or an AddedToken object {"content": ..., ...}.
absl::StatusOr<std::optional<std::string>> TokenContent(const Json& config, std::string_view key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    SPECD_ASSIGN_OR_RETURN(
        std::string content,
        RequiredString(*it, "content", absl::StrCat(ToAbsl(kTokenizerConfig), ": ", ToAbsl(key))));
    return content;
  }
  return absl::InvalidArgumentError(absl::StrCat(ToAbsl(kTokenizerConfig), ": field '", ToAbsl(key),
                                                 "' must be a string or an object with "
                                                 "\"content\", got ",
                                                 it->type_name()));
}

absl::Status ParseTokenizerConfig(std::string_view text, SpecialTokenConfig* out) {
  SPECD_ASSIGN_OR_RETURN(const Json config, ParseJson(text, kTokenizerConfig));
  if (!config.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(kTokenizerConfig), ": must be a JSON object"));
  }
  SPECD_ASSIGN_OR_RETURN(out->add_bos_token,
                         OptionalBool(config, "add_bos_token", kTokenizerConfig));
  SPECD_ASSIGN_OR_RETURN(const std::optional<bool> add_eos,
                         OptionalBool(config, "add_eos_token", kTokenizerConfig));
  if (add_eos.value_or(false)) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(kTokenizerConfig),
                     ": add_eos_token true is not supported (specd never appends EOS to a "
                     "prompt)"));
  }
  SPECD_ASSIGN_OR_RETURN(out->bos_token, TokenContent(config, "bos_token"));
  SPECD_ASSIGN_OR_RETURN(out->eos_token, TokenContent(config, "eos_token"));
  return absl::OkStatus();
}

absl::Status ParseGenerationConfig(std::string_view text, SpecialTokenConfig* out) {
  SPECD_ASSIGN_OR_RETURN(const Json config, ParseJson(text, kGenerationConfig));
  if (!config.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(kGenerationConfig), ": must be a JSON object"));
  }
  SPECD_ASSIGN_OR_RETURN(out->bos_token_id, OptionalInt(config, "bos_token_id", kGenerationConfig));
  const auto eos = config.find("eos_token_id");
  if (eos == config.end() || eos->is_null()) return absl::OkStatus();
  if (eos->is_array()) {
    for (size_t i = 0; i < eos->size(); ++i) {
      const Json& v = (*eos)[i];
      if (!v.is_number_integer()) {
        return absl::InvalidArgumentError(absl::StrCat(ToAbsl(kGenerationConfig), ": eos_token_id[",
                                                       i, "] must be an integer, got ",
                                                       v.type_name()));
      }
      out->eos_token_ids.push_back(v.get<int64_t>());
    }
    return absl::OkStatus();
  }
  SPECD_ASSIGN_OR_RETURN(const std::optional<int64_t> id,
                         OptionalInt(config, "eos_token_id", kGenerationConfig));
  out->eos_token_ids.push_back(*id);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SpecialTokenConfig> ParseSpecialTokenConfig(
    std::string_view tokenizer_config_json, std::string_view generation_config_json) {
  SpecialTokenConfig config;
  if (!tokenizer_config_json.empty()) {
    SPECD_RETURN_IF_ERROR(ParseTokenizerConfig(tokenizer_config_json, &config));
  }
  if (!generation_config_json.empty()) {
    SPECD_RETURN_IF_ERROR(ParseGenerationConfig(generation_config_json, &config));
  }
  return config;
}

}  // namespace specd::tokenizer
