#include "services/coordinator/chat_prompt.h"

#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "services/coordinator/request_validation.h"

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

namespace {

// continue_final_message: cuts `text` right after the last occurrence of the final message's
// content, as transformers does, so that what the template writes after it (an end-of-turn
// token, a newline) is gone. Templates that trim messages (Llama 3's) write the content stripped
// of surrounding whitespace, so that is looked for next.
absl::Status CutAfterFinalMessage(const nlohmann::ordered_json& final_message, std::string& text) {
  const auto content = final_message.find("content");
  if (content == final_message.end() || !content->is_string() ||
      content->get_ref<const std::string&>().empty()) {
    return absl::InvalidArgumentError(
        "continue_final_message: the last message has no text content to continue");
  }
  std::string_view wanted = content->get_ref<const std::string&>();
  size_t at = text.rfind(wanted);
  if (at == std::string::npos) {
    constexpr std::string_view kSpace = " \t\n\r\f\v";
    const size_t first = wanted.find_first_not_of(kSpace);
    wanted = first == std::string_view::npos
                 ? std::string_view()
                 : wanted.substr(first, wanted.find_last_not_of(kSpace) - first + 1);
    if (!wanted.empty()) at = text.rfind(wanted);
  }
  if (at == std::string::npos || wanted.empty()) {
    return absl::InvalidArgumentError(
        "continue_final_message: the chat template does not write the last message's content, "
        "so there is nothing to continue");
  }
  text.resize(at + wanted.size());
  return absl::OkStatus();
}

// The request's template variables may not stand in for its own fields or the model's tokens.
absl::Status CheckTemplateKwargs(const nlohmann::ordered_json& kwargs) {
  if (!kwargs.is_object()) {
    return FieldError("chat_template_kwargs", "chat_template_kwargs must be an object");
  }
  for (const auto& [key, value] : kwargs.items()) {
    const bool own_field = key == "messages" || key == "add_generation_prompt" || key == "tools";
    const bool model_token = key == "bos_token" || key == "eos_token" || key == "unk_token" ||
                             key == "sep_token" || key == "pad_token" || key == "cls_token" ||
                             key == "mask_token";
    if (own_field || model_token) {
      return FieldError(
          "chat_template_kwargs",
          absl::StrCat("chat_template_kwargs may not set ", key,
                       own_field ? ": it is a field of the request"
                                 : ": it comes from the model's tokenizer_config.json"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> EncodeRenderedPrompt(const chat::RenderedPrompt& prompt,
                                                          const Tokenizer& tokenizer) {
  EncodeOptions options;
  options.parse_special = true;
  if (prompt.starts_with_bos) options.add_bos = false;
  return tokenizer.Encode(prompt.text, options);
}

ChatPrompt::ChatPrompt(chat::ChatTemplate tmpl)
    : tmpl_(std::move(tmpl)),
      takes_tools_(absl::StrContains(tmpl_->source(), "tools")),
      tool_call_format_(ToolCallFormatOf(tmpl_->source())) {}

absl::StatusOr<std::vector<int32_t>> ChatPrompt::Encode(const nlohmann::ordered_json& messages,
                                                        const Tokenizer& tokenizer,
                                                        const ChatPromptOptions& options) const {
  if (!tmpl_.has_value()) return unavailable_;
  if (options.add_generation_prompt && options.continue_final_message) {
    return FieldError("continue_final_message",
                      "continue_final_message and add_generation_prompt cannot both be true: "
                      "continuing the last message adds no new turn");
  }
  SPECD_RETURN_IF_ERROR(CheckTemplateKwargs(options.template_kwargs));
  SPECD_ASSIGN_OR_RETURN(const nlohmann::ordered_json normalized,
                         chat::NormalizeMessages(messages));
  if (normalized.empty()) return absl::InvalidArgumentError("messages is empty");
  if (!options.tools.is_null() && !takes_tools()) {
    return FieldError("tools",
                      "the served model's chat template never mentions tools, so the model would "
                      "not see them (--chat-template can give one that does)");
  }
  chat::RenderOptions render;
  render.add_generation_prompt = options.add_generation_prompt;
  render.tools = options.tools;
  render.extra_context = options.template_kwargs;
  SPECD_ASSIGN_OR_RETURN(chat::RenderedPrompt prompt, tmpl_->Render(normalized, render));
  if (options.continue_final_message) {
    SPECD_RETURN_IF_ERROR(CutAfterFinalMessage(normalized.back(), prompt.text));
  }
  absl::StatusOr<std::vector<int32_t>> ids = EncodeRenderedPrompt(prompt, tokenizer);
  if (!ids.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("messages: the rendered conversation: ", ids.status().message()));
  }
  return ids;
}

}  // namespace specd
