// Tool calls in a chat reply (OpenAI's `tools`): the model writes a call as text in its family's
// format, and the server returns it as `tool_calls` instead of content. Four formats, told apart
// by the chat template that asked for them:
//  - Llama 3.1/3.2 JSON: the whole reply is {"name": ..., "parameters": {...}} (or "arguments";
//    several joined by ";"), optionally after <|python_tag|>, as Meta's templates instruct;
//  - Hermes (Qwen2.5, Hermes, many fine-tunes): <tool_call>{"name": ..., "arguments": {...}}
//    </tool_call> blocks at the end of the reply, after optional content;
//  - Mistral: the whole reply is [TOOL_CALLS] then a JSON list of {"name", "arguments"};
//  - Granite (IBM Granite 3): the same after <|tool_call|>.
// The last two tags, and <|python_tag|>, are special tokens, which the reply's text leaves out:
// the parsers take them as optional. A reply that does not parse as calls to the declared tools,
// completely, is content: a tool call is never guessed from part of the text.
#ifndef SPECD_SERVICES_COORDINATOR_TOOL_CALLS_H_
#define SPECD_SERVICES_COORDINATOR_TOOL_CALLS_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace specd {

enum class ToolCallFormat { kLlama3Json, kHermes, kMistral, kGranite };

// The format whose tag the template writes (<tool_call>, [TOOL_CALLS], <|tool_call|>), else
// Llama 3 JSON.
ToolCallFormat ToolCallFormatOf(std::string_view template_source);
// "llama3_json", "hermes", "mistral" or "granite", vLLM's names.
const char* ToolCallFormatName(ToolCallFormat format);

// The id of a reply's call `k` in choice `choice` of the response whose unique part is `stem`:
// "call_<stem>_<choice>_<k>", or for Mistral, whose templates refuse any other, 9 letters and
// digits derived from the same.
std::string ToolCallId(ToolCallFormat format, std::string_view stem, size_t choice, size_t k);

// OpenAI's limit on the tools of one request.
inline constexpr size_t kMaxTools = 128;

// Checks a request's tools in OpenAI's form, as both APIs take them: a JSON array of
// {"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}, at most
// kMaxTools, names of 1 to 64 letters, digits, '_' or '-', each once. Returns the names, or
// INVALID_ARGUMENT naming the field "tools" and the tool at fault.
absl::StatusOr<absl::flat_hash_set<std::string>> CheckTools(const nlohmann::ordered_json& tools);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object's text, as OpenAI sends it
};

struct ParsedReply {
  std::string content;  // the text before the calls, trimmed; empty when there is none
  std::vector<ToolCall> calls;
};

// The calls `text` makes in `format`, when all of it (but the leading content Hermes allows) is
// calls to tools named in `tools`; nullopt when it is content.
std::optional<ParsedReply> ParseToolCalls(std::string_view text, ToolCallFormat format,
                                          const absl::flat_hash_set<std::string>& tools);

// What a stream may send of a reply while it is written: the bytes of `text` before any point
// where a tool call may begin (text.size() when none can). The rest is held until more text shows
// it is content, or the reply ends and ParseToolCalls decides. `known`, this function's answer
// for a shorter prefix of `text` (or 0), is where the search starts, so that a stream's work is
// proportional to its new text rather than to all of it every event; the answer never falls
// below it.
size_t ReleasableContent(std::string_view text, ToolCallFormat format, size_t known = 0);

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_TOOL_CALLS_H_
