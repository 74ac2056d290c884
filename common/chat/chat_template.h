// Chat templates: renders a model's tokenizer_config.json `chat_template` (Jinja) into a prompt,
// byte for byte as Hugging Face's own JavaScript renderer, @huggingface/jinja, does (the one
// transformers.js uses). Where that renderer differs from Python's Jinja2 (transformers), specd
// follows it: `"" == false` is true, booleans print as "true", strip() removes JavaScript's
// whitespace set.
//
// The template is interpreted, not matched against known families, so any model's template
// works as long as it stays inside the supported subset. What is outside it fails loudly:
// unsupported syntax when the template is loaded, an unknown filter or a runtime error
// (including the template's own raise_exception) when a conversation is rendered. What specd
// cannot reproduce exactly (upper()/lower() of non-ASCII letters, tojson(sort_keys=true),
// printing a function) is an error rather than a different prompt.
//
// Typical use in a server:
//   auto tmpl = LoadChatTemplate(files.at("tokenizer_config.json"), override_file_text);
//   auto messages = NormalizeMessages(request["messages"]);
//   auto prompt = tmpl->Render(*messages, {.add_generation_prompt = true});
//   // Encode prompt->text with special tokens parsed; add BOS only when
//   // !prompt->starts_with_bos and the tokenizer would add one by default.
#ifndef SPECD_COMMON_CHAT_CHAT_TEMPLATE_H_
#define SPECD_COMMON_CHAT_CHAT_TEMPLATE_H_

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/civil_time.h"
#include "nlohmann/json.hpp"

namespace specd::chat {

// The special-token strings tokenizer_config.json names, passed to the template as variables
// (bos_token, eos_token...). Empty means absent: the variable is then undefined.
struct SpecialTokens {
  std::string bos_token;
  std::string eos_token;
  std::string unk_token;
  std::string sep_token;
  std::string pad_token;
  std::string cls_token;
  std::string mask_token;
};

// tokenizer_config.json's special tokens (each a string or an AddedToken {"content": ...}).
absl::StatusOr<SpecialTokens> ParseSpecialTokens(std::string_view tokenizer_config_json);

struct ChatMessage {
  std::string role;
  std::string content;
};

struct RenderOptions {
  // Ends the prompt with the header of the assistant's turn.
  bool add_generation_prompt = false;
  // OpenAI-style tool definitions (a JSON array), or null: the `tools` variable.
  nlohmann::ordered_json tools = nullptr;
  // Retrieval documents (a JSON array), or null: the `documents` variable.
  nlohmann::ordered_json documents = nullptr;
  // More template variables, e.g. {"date_string": "26 Jul 2024", "tools_in_user_message":
  // false} for Llama 3.1. They override the variables above, as keyword arguments of
  // apply_chat_template do; names of the builtins (true, range, strftime_now...) are rejected.
  nlohmann::ordered_json extra_context = nlohmann::ordered_json::object();
  // What strftime_now() formats (Llama 3.2's "Today Date"); unset: the current local time.
  std::optional<absl::CivilSecond> now;
};

struct RenderedPrompt {
  std::string text;
  // The text starts with the BOS token's text (the template wrote bos_token itself), so the
  // tokenizer must not prepend another BOS.
  bool starts_with_bos = false;
};

struct Program;  // the parsed template (private)

class ChatTemplate {
 public:
  // From tokenizer_config.json's text. `chat_template` may be a string, or a list of
  // {"name", "template"} from which `name` is picked ("default" when empty). No template is
  // NOT_FOUND; a template that does not parse is INVALID_ARGUMENT.
  static absl::StatusOr<ChatTemplate> FromTokenizerConfig(std::string_view tokenizer_config_json,
                                                          std::string_view name = "");
  // From a template's own text (e.g. `--chat-template FILE`), with the special tokens of
  // `tokenizer_config_json` (may be empty: no special-token variables).
  static absl::StatusOr<ChatTemplate> FromSource(std::string_view source,
                                                 std::string_view tokenizer_config_json);
  static absl::StatusOr<ChatTemplate> FromSource(std::string_view source, SpecialTokens tokens);

  // `messages` is a JSON array of message objects, passed to the template as they are (as
  // transformers does; see NormalizeMessages for OpenAI content parts). Errors are
  // INVALID_ARGUMENT: the template's raise_exception() message as written (e.g. "Conversation
  // roles must alternate user/assistant/user/assistant/..."), or "chat template error: ..." for
  // other failures.
  absl::StatusOr<RenderedPrompt> Render(const nlohmann::ordered_json& messages,
                                        const RenderOptions& options) const;
  absl::StatusOr<RenderedPrompt> Render(std::span<const ChatMessage> messages,
                                        const RenderOptions& options) const;

  const std::string& source() const { return *source_; }
  const SpecialTokens& special_tokens() const { return tokens_; }

 private:
  ChatTemplate(std::shared_ptr<const std::string> source, std::shared_ptr<const Program> program,
               SpecialTokens tokens);

  std::shared_ptr<const std::string> source_;
  std::shared_ptr<const Program> program_;
  SpecialTokens tokens_;
};

// What a server loads: the `--chat-template FILE` text when given, else the template in
// tokenizer_config.json (the target worker's InfoResponse.tokenizer_files carries that file, so
// the coordinator needs no model directory). Special tokens come from tokenizer_config.json in
// both cases; an empty config is allowed with an override only.
absl::StatusOr<ChatTemplate> LoadChatTemplate(
    std::string_view tokenizer_config_json,
    std::optional<std::string_view> override_source = std::nullopt);

// Checks an OpenAI-style `messages` array (objects with a string `role`) and flattens content
// given as a list of parts: the texts of {"type": "text", "text": ...} parts joined with "\n"
// (as vLLM does), since chat templates of text models expect a string. Other part types
// (images, audio) are INVALID_ARGUMENT. Other fields (tool_calls, name...) are kept, except that
// a tool call's `function.arguments` given as the text of a JSON object (OpenAI's form) becomes
// that object, which is what templates expect.
absl::StatusOr<nlohmann::ordered_json> NormalizeMessages(const nlohmann::ordered_json& messages);

}  // namespace specd::chat

#endif  // SPECD_COMMON_CHAT_CHAT_TEMPLATE_H_
