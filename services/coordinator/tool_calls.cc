#include "services/coordinator/tool_calls.h"

#include <algorithm>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/json_brackets.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/request_validation.h"

namespace specd {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kOpenTag = "<tool_call>";
constexpr std::string_view kCloseTag = "</tool_call>";
constexpr std::string_view kMistralTag = "[TOOL_CALLS]";
constexpr std::string_view kGraniteTag = "<|tool_call|>";

// The tag that may open a reply of calls, in the formats where calls are the whole reply.
std::string_view LeadingTag(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kLlama3Json:
      return kPythonTag;
    case ToolCallFormat::kMistral:
      return kMistralTag;
    case ToolCallFormat::kGranite:
      return kGraniteTag;
    case ToolCallFormat::kHermes:
      break;
  }
  return {};
}

bool IsSpace(char c) { return absl::ascii_isspace(static_cast<unsigned char>(c)); }

size_t SkipSpace(std::string_view s, size_t pos) {
  while (pos < s.size() && IsSpace(s[pos])) ++pos;
  return pos;
}

// The end of `text` without its trailing whitespace.
size_t TrimmedEnd(std::string_view text) {
  size_t end = text.size();
  while (end > 0 && IsSpace(text[end - 1])) --end;
  return end;
}

// Deeper arguments are not a tool call but a model writing braces; the bound also keeps the
// JSON parser's recursion shallow.
constexpr int kMaxDepth = 64;

// The end of the JSON object that starts at s[pos] ('{'), past its closing brace; npos when the
// text ends first or nests deeper than kMaxDepth. Braces inside strings do not count.
size_t ObjectEnd(std::string_view s, size_t pos) {
  size_t end = std::string_view::npos;
  WalkJsonBrackets(s, pos, [&](size_t i, int depth) {
    if (depth == 0) end = i + 1;
    return depth > 0 && depth <= kMaxDepth;
  });
  return end;
}

// Whether `text` nests no deeper than kMaxDepth (outside strings).
bool Shallow(std::string_view text) {
  bool shallow = true;
  WalkJsonBrackets(text, 0, [&](size_t, int depth) { return shallow = depth <= kMaxDepth; });
  return shallow;
}

// One call object at s[*pos]: {"name": a declared tool, "arguments" or "parameters": an object
// (or a string holding one; absent is no arguments)}. Advances *pos past it.
std::optional<ToolCall> ParseCall(std::string_view s, size_t* pos,
                                  const absl::flat_hash_set<std::string>& tools) {
  if (*pos >= s.size() || s[*pos] != '{') return std::nullopt;
  const size_t end = ObjectEnd(s, *pos);
  if (end == std::string_view::npos) return std::nullopt;
  const Json call = Json::parse(s.substr(*pos, end - *pos), nullptr, /*allow_exceptions=*/false);
  *pos = end;
  if (!call.is_object()) return std::nullopt;
  const auto name = call.find("name");
  if (name == call.end() || !name->is_string() || !tools.contains(name->get<std::string>())) {
    return std::nullopt;
  }
  auto args = call.find("arguments");
  if (args == call.end()) args = call.find("parameters");
  Json arguments = Json::object();
  if (args != call.end()) {
    if (args->is_string() && !Shallow(args->get<std::string>())) return std::nullopt;
    arguments = args->is_string()
                    ? Json::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false)
                    : *args;
    if (!arguments.is_object()) return std::nullopt;
  }
  return ToolCall{name->get<std::string>(),
                  arguments.dump(-1, ' ', false, Json::error_handler_t::replace)};
}

// The position after `text`'s leading whitespace and, when it opens with it, `tag` and the
// whitespace after that.
size_t SkipLeadingTag(std::string_view text, std::string_view tag) {
  size_t pos = SkipSpace(text, 0);
  if (!tag.empty() && text.substr(pos).starts_with(tag)) pos = SkipSpace(text, pos + tag.size());
  return pos;
}

// Calls separated by `separator` from s[*pos], into reply->calls; *pos ends past the last one and
// the whitespace after it. False when one is not a call.
bool ParseCallSequence(std::string_view s, size_t* pos, char separator,
                       const absl::flat_hash_set<std::string>& tools, ParsedReply* reply) {
  while (true) {
    std::optional<ToolCall> call = ParseCall(s, pos, tools);
    if (!call.has_value()) return false;
    reply->calls.push_back(*std::move(call));
    *pos = SkipSpace(s, *pos);
    if (*pos == s.size() || s[*pos] != separator) return true;
    *pos = SkipSpace(s, *pos + 1);
  }
}

// Llama 3's: [<|python_tag|>] call; call; ..., the whole reply.
std::optional<ParsedReply> ParseLlama3(std::string_view text,
                                       const absl::flat_hash_set<std::string>& tools) {
  size_t pos = SkipLeadingTag(text, kPythonTag);
  ParsedReply reply;
  if (!ParseCallSequence(text, &pos, ';', tools, &reply) || pos != text.size()) {
    return std::nullopt;
  }
  return reply;
}

// Mistral's and Granite's: [tag] [call, call, ...], the whole reply.
std::optional<ParsedReply> ParseTaggedList(std::string_view text, std::string_view tag,
                                           const absl::flat_hash_set<std::string>& tools) {
  size_t pos = SkipLeadingTag(text, tag);
  if (pos == text.size() || text[pos] != '[') return std::nullopt;
  pos = SkipSpace(text, pos + 1);
  ParsedReply reply;
  if (!ParseCallSequence(text, &pos, ',', tools, &reply) || pos == text.size() ||
      text[pos] != ']' || SkipSpace(text, pos + 1) != text.size()) {
    return std::nullopt;
  }
  return reply;
}

std::optional<ParsedReply> ParseHermes(std::string_view text,
                                       const absl::flat_hash_set<std::string>& tools) {
  size_t pos = text.find(kOpenTag);
  if (pos == std::string_view::npos) return std::nullopt;
  ParsedReply reply;
  reply.content = std::string(text.substr(0, TrimmedEnd(text.substr(0, pos))));
  while (pos < text.size()) {
    if (!text.substr(pos).starts_with(kOpenTag)) return std::nullopt;
    pos = SkipSpace(text, pos + kOpenTag.size());
    std::optional<ToolCall> call = ParseCall(text, &pos, tools);
    if (!call.has_value()) return std::nullopt;
    reply.calls.push_back(*std::move(call));
    pos = SkipSpace(text, pos);
    if (!text.substr(pos).starts_with(kCloseTag)) return std::nullopt;
    pos = SkipSpace(text, pos + kCloseTag.size());
  }
  return reply;
}

// The first position from which `text` may still become `tag`: where it starts in full, or
// where a proper prefix of it ends the text; npos when neither.
size_t TagStart(std::string_view text, std::string_view tag) {
  const size_t full = text.find(tag);
  if (full != std::string_view::npos) return full;
  for (size_t i = text.size() > tag.size() ? text.size() - tag.size() : 0; i < text.size(); ++i) {
    if (tag.starts_with(text.substr(i))) return i;
  }
  return std::string_view::npos;
}

bool IsToolName(const Json& name) {
  if (!name.is_string()) return false;
  const std::string& s = name.get_ref<const std::string&>();
  return !s.empty() && s.size() <= 64 && absl::c_all_of(s, [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

absl::Status ToolError(size_t index, absl::string_view what) {
  return FieldError("tools", absl::StrCat("tools[", index, "]", what));
}

}  // namespace

absl::StatusOr<absl::flat_hash_set<std::string>> CheckTools(const Json& tools) {
  if (!tools.is_array()) return FieldError("tools", "tools must be a list of tool objects");
  if (tools.size() > kMaxTools) {
    return FieldError("tools", absl::StrCat("tools has ", tools.size(), " tools; at most ",
                                            kMaxTools, " per request"));
  }
  absl::flat_hash_set<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& tool = tools[i];
    if (!tool.is_object() || JsonField(tool, "type") != "function") {
      return ToolError(i, R"( must be {"type": "function", "function": {...}})");
    }
    const Json& function = JsonField(tool, "function");
    if (!function.is_object()) return ToolError(i, ".function must be an object");
    const Json& name = JsonField(function, "name");
    if (!IsToolName(name)) {
      return ToolError(i, ".function.name must be 1 to 64 letters, digits, underscores or dashes");
    }
    if (!names.insert(name.get<std::string>()).second) {
      return ToolError(i, absl::StrCat(".function.name \"", name.get<std::string>(),
                                       "\" is already the name of another tool"));
    }
    const Json& description = JsonField(function, "description");
    if (!description.is_null() && !description.is_string()) {
      return ToolError(i, ".function.description must be a string");
    }
    const Json& parameters = JsonField(function, "parameters");
    if (!parameters.is_null() && !parameters.is_object()) {
      return ToolError(i, ".function.parameters must be a JSON Schema object");
    }
    const Json& strict = JsonField(function, "strict");
    if (!strict.is_null() && !strict.is_boolean()) {
      return ToolError(i, ".function.strict must be true or false");
    }
  }
  return names;
}

ToolCallFormat ToolCallFormatOf(std::string_view template_source) {
  if (template_source.find(kOpenTag) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (template_source.find(kMistralTag) != std::string_view::npos) return ToolCallFormat::kMistral;
  if (template_source.find(kGraniteTag) != std::string_view::npos) return ToolCallFormat::kGranite;
  return ToolCallFormat::kLlama3Json;
}

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kMistral:
      return "mistral";
    case ToolCallFormat::kGranite:
      return "granite";
    case ToolCallFormat::kLlama3Json:
      break;
  }
  return "llama3_json";
}

std::string ToolCallId(ToolCallFormat format, std::string_view stem, size_t choice, size_t k) {
  std::string id =
      absl::StrCat("call_", absl::string_view(stem.data(), stem.size()), "_", choice, "_", k);
  if (format != ToolCallFormat::kMistral) return id;
  // FNV-1a of the long id, written in base 62: 62^9 < 2^64, so the nine digits keep 53 bits.
  uint64_t h = 14695981039346656037u;
  for (const char c : id) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211u;
  constexpr std::string_view kDigits =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::string out(9, '0');
  for (char& c : out) {
    c = kDigits[h % kDigits.size()];
    h /= kDigits.size();
  }
  return out;
}

std::optional<ParsedReply> ParseToolCalls(std::string_view text, ToolCallFormat format,
                                          const absl::flat_hash_set<std::string>& tools) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return ParseHermes(text, tools);
    case ToolCallFormat::kMistral:
    case ToolCallFormat::kGranite:
      return ParseTaggedList(text, LeadingTag(format), tools);
    case ToolCallFormat::kLlama3Json:
      break;
  }
  return ParseLlama3(text, tools);
}

size_t ReleasableContent(std::string_view text, ToolCallFormat format, size_t known) {
  if (format != ToolCallFormat::kHermes) {
    if (known > 0) return text.size();
    // Calls are the whole reply: its first visible character decides.
    const std::string_view rest = text.substr(SkipSpace(text, 0));
    const std::string_view tag = LeadingTag(format);
    const char opener = format == ToolCallFormat::kLlama3Json ? '{' : '[';
    if (rest.empty() || rest.front() == opener || rest.starts_with(tag) || tag.starts_with(rest)) {
      return 0;
    }
    return text.size();
  }
  // Content until the first tag, without the whitespace before it (which a reply with calls
  // drops); trailing whitespace waits, since a tag may follow it. No tag starts before `known`.
  const size_t from = std::min(known, text.size());
  const std::string_view rest = text.substr(from);
  const size_t tag = TagStart(rest, kOpenTag);
  return from + TrimmedEnd(rest.substr(0, tag == std::string_view::npos ? rest.size() : tag));
}

}  // namespace specd
