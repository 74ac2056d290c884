// Chat input for both public APIs (issue 15): a conversation rendered with the served model's
// chat template and tokenized as Hugging Face's apply_chat_template(tokenize=True) does, with the
// special tokens the template writes recognised, and BOS added by the tokenizer only when the
// template did not write it (Llama 3's writes {{ bos_token }}; a second BOS would change the
// model's input).
#ifndef SPECD_SERVICES_COORDINATOR_CHAT_PROMPT_H_
#define SPECD_SERVICES_COORDINATOR_CHAT_PROMPT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/chat/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/tool_calls.h"

namespace specd {

// How a conversation ends, as transformers' apply_chat_template and vLLM take it.
struct ChatPromptOptions {
  // Ends the prompt with the header of the assistant's turn, for a reply.
  bool add_generation_prompt = true;
  // Leaves the last message open, without the text the template writes after its content (an
  // end-of-turn token), so that the model continues it: a reply the client has begun. Excludes
  // add_generation_prompt.
  bool continue_final_message = false;
  // More variables for the template (vLLM's chat_template_kwargs), a JSON object: e.g.
  // {"date_string": "26 Jul 2024"}, which fixes the date Llama 3.1 and 3.2 templates write (by
  // default today's, so a prompt would change every day). Not the variables that have their own
  // fields or come from the model: messages, add_generation_prompt, tools, the special tokens.
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  // OpenAI's tool definitions (a JSON array, checked by the API that took them), or null: the
  // template's `tools` variable.
  nlohmann::ordered_json tools = nullptr;
};

class ChatPrompt {
 public:
  // No chat template: every conversation is refused with `why`.
  explicit ChatPrompt(absl::Status why) : unavailable_(std::move(why)) {}

  // The template of `--chat-template` (`override_source`) when given, else tokenizer_config.json's.
  // An override that does not load is an error (the operator asked for it). The model's own
  // template that does not load (unsupported syntax, or none) is not: the server still serves
  // text and token prompts, and a conversation gets the reason.
  static absl::StatusOr<ChatPrompt> Load(std::string_view tokenizer_config_json,
                                         const std::optional<std::string>& override_source);

  bool available() const { return tmpl_.has_value(); }
  // Why there is no template (OK when there is one).
  const absl::Status& unavailable_reason() const { return unavailable_; }
  // Whether the template can show the model tools (it mentions them); a request with tools is
  // refused otherwise, rather than silently answered by a model that never saw them.
  bool takes_tools() const { return takes_tools_; }
  // How the model writes its tool calls, as its template asks (see tool_calls.h).
  ToolCallFormat tool_call_format() const { return tool_call_format_; }

  // `messages`: an OpenAI-style array of {"role", "content"} objects (content may be a list of
  // text parts). Rendered as `options` ask (by default with the assistant's generation prompt),
  // then encoded. Errors are INVALID_ARGUMENT naming the message or option, or quoting the
  // template's own raise_exception, or FAILED_PRECONDITION when there is no template.
  absl::StatusOr<std::vector<int32_t>> Encode(const nlohmann::ordered_json& messages,
                                              const Tokenizer& tokenizer,
                                              const ChatPromptOptions& options = {}) const;

 private:
  explicit ChatPrompt(chat::ChatTemplate tmpl);

  std::optional<chat::ChatTemplate> tmpl_;
  absl::Status unavailable_;
  // Read off the template's source once, not per request.
  bool takes_tools_ = false;
  ToolCallFormat tool_call_format_ = ToolCallFormat::kLlama3Json;
};

// Encodes a rendered prompt: special tokens parsed; BOS as the tokenizer declares unless the
// text already starts with it.
absl::StatusOr<std::vector<int32_t>> EncodeRenderedPrompt(const chat::RenderedPrompt& prompt,
                                                          const Tokenizer& tokenizer);

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_CHAT_PROMPT_H_
