#include "services/coordinator/chat_prompt.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace specd {

absl::StatusOr<ChatPrompt> ChatPrompt::Load(std::string_view tokenizer_config_json,
                                            const std::optional<std::string>& override_source) {
  if (override_source.has_value()) {
    absl::StatusOr<chat::ChatTemplate> t =
        chat::LoadChatTemplate(tokenizer_config_json, std::string_view(*override_source));
    if (!t.ok()) {
      return absl::Status(t.status().code(),
                          absl::StrCat("--chat-template: ", t.status().message()));
    }
    return ChatPrompt(*std::move(t));
  }
  absl::StatusOr<chat::ChatTemplate> t = chat::LoadChatTemplate(tokenizer_config_json);
  if (!t.ok()) {
    return ChatPrompt(absl::FailedPreconditionError(
        absl::StrCat("the served model has no usable chat template (", t.status().message(),
                     "); send a text prompt, or restart the server with --chat-template FILE")));
  }
  return ChatPrompt(*std::move(t));
}

absl::StatusOr<std::vector<int32_t>> EncodeRenderedPrompt(const chat::RenderedPrompt& prompt,
                                                          const Tokenizer& tokenizer) {
  EncodeOptions options;
  options.parse_special = true;
  if (prompt.starts_with_bos) options.add_bos = false;
  return tokenizer.Encode(prompt.text, options);
}

absl::StatusOr<std::vector<int32_t>> ChatPrompt::Encode(const nlohmann::ordered_json& messages,
                                                        const Tokenizer& tokenizer) const {
  if (!tmpl_.has_value()) return unavailable_;
  SPECD_ASSIGN_OR_RETURN(const nlohmann::ordered_json normalized,
                         chat::NormalizeMessages(messages));
  if (normalized.empty()) return absl::InvalidArgumentError("messages is empty");
  chat::RenderOptions options;
  options.add_generation_prompt = true;
  SPECD_ASSIGN_OR_RETURN(const chat::RenderedPrompt prompt, tmpl_->Render(normalized, options));
  absl::StatusOr<std::vector<int32_t>> ids = EncodeRenderedPrompt(prompt, tokenizer);
  if (!ids.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages: the rendered conversation: ", ids.status().message()));
  }
  return ids;
}

}  // namespace specd
