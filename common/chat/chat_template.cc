#include "common/chat/chat_template.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/absl_string.h"
#include "base/status_macros.h"
#include "common/chat/ast.h"
#include "common/chat/builtins.h"
#include "common/chat/interpreter.h"
#include "common/chat/lexer.h"
#include "common/chat/parser.h"
#include "common/chat/value.h"

namespace specd::chat {

struct Program {
  Block block;
};

namespace {

using Json = nlohmann::ordered_json;

constexpr char kConfigName[] = "tokenizer_config.json";

absl::StatusOr<Json> ParseConfig(std::string_view text) {
  Json config = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(kConfigName, " is not a JSON object"));
  }
  return config;
}

absl::StatusOr<std::string> TokenText(const Json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      kConfigName, ": ", key, " must be a string or an object with a string \"content\""));
}

absl::StatusOr<SpecialTokens> TokensFromConfig(const Json& config) {
  SpecialTokens t;
  SPECD_ASSIGN_OR_RETURN(t.bos_token, TokenText(config, "bos_token"));
  SPECD_ASSIGN_OR_RETURN(t.eos_token, TokenText(config, "eos_token"));
  SPECD_ASSIGN_OR_RETURN(t.unk_token, TokenText(config, "unk_token"));
  SPECD_ASSIGN_OR_RETURN(t.sep_token, TokenText(config, "sep_token"));
  SPECD_ASSIGN_OR_RETURN(t.pad_token, TokenText(config, "pad_token"));
  SPECD_ASSIGN_OR_RETURN(t.cls_token, TokenText(config, "cls_token"));
  SPECD_ASSIGN_OR_RETURN(t.mask_token, TokenText(config, "mask_token"));
  return t;
}

absl::StatusOr<std::string> TemplateFromConfig(const Json& config, std::string_view name) {
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return absl::NotFoundError(absl::StrCat(
        kConfigName, " has no chat_template; give the model's template with --chat-template FILE"));
  }
  if (it->is_string()) {
    if (!name.empty() && name != "default") {
      return absl::NotFoundError(absl::StrCat(
          kConfigName, " has a single chat_template, not one named '", ToAbsl(name), "'"));
    }
    return it->get<std::string>();
  }
  if (!it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kConfigName, ": chat_template must be a string or a list of templates"));
  }
  const std::string wanted = name.empty() ? "default" : std::string(name);
  std::vector<std::string> names;
  for (const Json& entry : *it) {
    const auto n = entry.is_object() ? entry.find("name") : entry.end();
    const auto t = entry.is_object() ? entry.find("template") : entry.end();
    if (n == entry.end() || t == entry.end() || !n->is_string() || !t->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          kConfigName, ": each chat_template entry needs a string \"name\" and \"template\""));
    }
    if (*n == wanted) return t->get<std::string>();
    names.push_back(n->get<std::string>());
  }
  return absl::NotFoundError(absl::StrCat(kConfigName, " has no chat template named '", wanted,
                                          "' (it has: ", absl::StrJoin(names, ", "), ")"));
}

// A render may do this much work (Interpreter::Charge) plus kWorkPerContextUnit for each value
// and string byte of its variables: a template does work in proportion to the conversation it
// renders, several times over (a message's text is read, concatenated and written), and the
// base, several times what the templates of real models take for a short conversation, covers
// the template's own.
constexpr int64_t kBaseWork = int64_t{1} << 20;
constexpr int64_t kWorkPerContextUnit = 64;

struct JsonShape {
  int depth = 0;       // of containers; 0 for a scalar
  int64_t values = 0;  // every value, and the bytes of strings
};

// Walked iteratively (the value may be hostile); stops counting once deeper than kMaxValueDepth
// (the render is refused then).
JsonShape ShapeOf(const Json& root) {
  JsonShape shape;
  std::vector<std::pair<const Json*, int>> stack = {{&root, 1}};
  while (!stack.empty()) {
    const auto [json, depth] = stack.back();
    stack.pop_back();
    ++shape.values;
    if (json->is_string()) {
      shape.values += static_cast<int64_t>(json->get_ref<const std::string&>().size());
    }
    if (!json->is_array() && !json->is_object()) continue;
    shape.depth = std::max(shape.depth, depth);
    if (shape.depth > kMaxValueDepth) break;
    if (json->is_object()) {
      for (const auto& [key, child] : json->items()) {
        shape.values += static_cast<int64_t>(key.size());
        stack.emplace_back(&child, depth + 1);
      }
    } else {
      for (const Json& child : *json) stack.emplace_back(&child, depth + 1);
    }
  }
  return shape;
}

// Declares a caller variable; the reference refuses to redeclare its globals.
absl::Status Declare(Scope& global, const std::string& name, Value value) {
  if (global.HasOwn(name) || name == "namespace") {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template variable '", name, "' would replace a builtin"));
  }
  global.Set(name, std::move(value));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SpecialTokens> ParseSpecialTokens(std::string_view tokenizer_config_json) {
  SPECD_ASSIGN_OR_RETURN(const Json config, ParseConfig(tokenizer_config_json));
  return TokensFromConfig(config);
}

ChatTemplate::ChatTemplate(std::shared_ptr<const std::string> source,
                           std::shared_ptr<const Program> program, SpecialTokens tokens)
    : source_(std::move(source)), program_(std::move(program)), tokens_(std::move(tokens)) {}

absl::StatusOr<ChatTemplate> ChatTemplate::FromTokenizerConfig(
    std::string_view tokenizer_config_json, std::string_view name) {
  SPECD_ASSIGN_OR_RETURN(const Json config, ParseConfig(tokenizer_config_json));
  SPECD_ASSIGN_OR_RETURN(const std::string source, TemplateFromConfig(config, name));
  SPECD_ASSIGN_OR_RETURN(SpecialTokens tokens, TokensFromConfig(config));
  return FromSource(source, std::move(tokens));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromSource(std::string_view source,
                                                      std::string_view tokenizer_config_json) {
  SpecialTokens tokens;
  if (!tokenizer_config_json.empty()) {
    SPECD_ASSIGN_OR_RETURN(tokens, ParseSpecialTokens(tokenizer_config_json));
  }
  return FromSource(source, std::move(tokens));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromSource(std::string_view source,
                                                      SpecialTokens tokens) {
  SPECD_ASSIGN_OR_RETURN(const std::vector<Token> token_list, Tokenize(source));
  auto program = std::make_shared<Program>();
  SPECD_ASSIGN_OR_RETURN(program->block, Parse(token_list));
  return ChatTemplate(std::make_shared<const std::string>(source), std::move(program),
                      std::move(tokens));
}

absl::StatusOr<RenderedPrompt> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                                    const RenderOptions& options) const {
  if (!messages.is_array()) {
    return absl::InvalidArgumentError("messages must be a list of message objects");
  }
  if (!options.extra_context.is_object()) {
    return absl::InvalidArgumentError("extra chat template variables must be a JSON object");
  }
  // The variables as transformers passes them: later ones override earlier ones.
  Json context = Json::object();
  context["messages"] = messages;
  context["add_generation_prompt"] = options.add_generation_prompt;
  context["tools"] = options.tools;
  context["documents"] = options.documents;
  const std::pair<const char*, const std::string*> tokens[] = {
      {"bos_token", &tokens_.bos_token},  {"eos_token", &tokens_.eos_token},
      {"unk_token", &tokens_.unk_token},  {"sep_token", &tokens_.sep_token},
      {"pad_token", &tokens_.pad_token},  {"cls_token", &tokens_.cls_token},
      {"mask_token", &tokens_.mask_token}};
  for (const auto& [key, text] : tokens) {
    if (!text->empty()) context[key] = *text;
  }
  for (const auto& [key, value] : options.extra_context.items()) context[key] = value;

  Scope global;
  AddGlobals(global);
  const JsonShape shape = ShapeOf(context);
  if (shape.depth > kMaxValueDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chat messages, tools or variables nest deeper than ", kMaxValueDepth, " levels"));
  }
  for (const auto& [key, value] : context.items()) {
    SPECD_RETURN_IF_ERROR(Declare(global, key, Value::FromJson(value)));
  }
  const absl::CivilSecond now =
      options.now.value_or(absl::ToCivilSecond(absl::Now(), absl::LocalTimeZone()));
  Interpreter interpreter(now, kBaseWork + kWorkPerContextUnit * shape.values);
  RenderedPrompt out;
  SPECD_ASSIGN_OR_RETURN(out.text, interpreter.Run(program_->block, global));
  out.starts_with_bos = !tokens_.bos_token.empty() && out.text.starts_with(tokens_.bos_token);
  return out;
}

absl::StatusOr<RenderedPrompt> ChatTemplate::Render(std::span<const ChatMessage> messages,
                                                    const RenderOptions& options) const {
  Json list = Json::array();
  for (const ChatMessage& m : messages) {
    list.push_back(Json{{"role", m.role}, {"content", m.content}});
  }
  return Render(list, options);
}

absl::StatusOr<ChatTemplate> LoadChatTemplate(std::string_view tokenizer_config_json,
                                              std::optional<std::string_view> override_source) {
  if (override_source.has_value()) {
    return ChatTemplate::FromSource(*override_source, tokenizer_config_json);
  }
  if (tokenizer_config_json.empty()) {
    return absl::NotFoundError(
        absl::StrCat("the model has no ", kConfigName,
                     ", so no chat template; give one with --chat-template FILE"));
  }
  return ChatTemplate::FromTokenizerConfig(tokenizer_config_json);
}

absl::StatusOr<nlohmann::ordered_json> NormalizeMessages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) {
    return absl::InvalidArgumentError("messages must be a list of message objects");
  }
  Json out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    Json& m = out[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, " is not an object"));
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " needs a string \"role\""));
    }
    if (const auto calls = m.find("tool_calls"); calls != m.end() && calls->is_array()) {
      // OpenAI sends a call's arguments as JSON text; templates write them with tojson, which
      // would quote that text a second time. As vLLM does, they reach the template parsed.
      for (Json& call : *calls) {
        if (!call.is_object()) continue;
        const auto function = call.find("function");
        if (function == call.end() || !function->is_object()) continue;
        const auto arguments = function->find("arguments");
        if (arguments == function->end() || !arguments->is_string()) continue;
        Json parsed = Json::parse(arguments->get<std::string>(), nullptr,
                                  /*allow_exceptions=*/false);
        if (parsed.is_object()) *arguments = std::move(parsed);
      }
    }
    const auto content = m.find("content");
    if (content == m.end() || content->is_string() || content->is_null()) continue;
    if (!content->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".content must be a string, null or a list of content parts"));
    }
    std::vector<std::string> texts;
    for (size_t k = 0; k < content->size(); ++k) {
      const Json& part = (*content)[k];
      const std::string part_where = absl::StrCat(where, ".content[", k, "]");
      const auto type = part.is_object() ? part.find("type") : part.end();
      const auto text = part.is_object() ? part.find("text") : part.end();
      if (type == part.end() || !type->is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(part_where, " needs a string \"type\""));
      }
      if (*type != "text") {
        return absl::InvalidArgumentError(
            absl::StrCat(part_where, " has type \"", type->get<std::string>(),
                         "\"; only text content parts are supported"));
      }
      if (text == part.end() || !text->is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(part_where, " needs a string \"text\""));
      }
      texts.push_back(text->get<std::string>());
    }
    m["content"] = absl::StrJoin(texts, "\n");
  }
  return out;
}

}  // namespace specd::chat
