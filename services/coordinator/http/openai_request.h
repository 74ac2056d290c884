// Parsing and checking the bodies of POST /v1/completions and /v1/chat/completions (OpenAI's
// names, plus the llama.cpp/vLLM extensions top_k, min_p, repetition_penalty, ignore_eos,
// stop_token_ids, num_speculative_tokens, and specd's k_policy, draft_method, speculation_tree,
// egag, logprobs_mode and return_token_ids; chat's tools, tool_choice and parallel_tool_calls).
// Every rejection is INVALID_ARGUMENT naming the field (see FieldOf); limits that depend on the
// model (vocabulary, max_seq_len, the operator's caps) are checked afterwards by
// BuildGenerationRequest, the same code the gRPC API uses. Also the bodies of vLLM's POST
// /tokenize and /detokenize.
#ifndef SPECD_SERVICES_COORDINATOR_HTTP_OPENAI_REQUEST_H_
#define SPECD_SERVICES_COORDINATOR_HTTP_OPENAI_REQUEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/chat_prompt.h"
#include "services/coordinator/request_validation.h"
#include "specd/v1/generation.pb.h"

namespace specd::http {

enum class Endpoint { kCompletions, kChatCompletions };

// Completion prompts per request, times n; far above real use, low enough that one request
// cannot queue thousands of sequences.
inline constexpr int64_t kMaxChoices = 256;
inline constexpr int64_t kMaxN = 128;

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // empty when not given
  // Completions: one or more prompts, each text or token ids.
  struct Prompt {
    bool is_text = true;
    std::string text;
    std::vector<int32_t> ids;
  };
  std::vector<Prompt> prompts;
  nlohmann::ordered_json messages;  // chat: the conversation, as sent
  ChatPromptOptions chat_options;   // chat: how the conversation ends
  int64_t n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool return_token_ids = false;
  // Chat with tools and tool_choice "auto": each reply is parsed for calls to these tools (see
  // tool_calls.h); empty otherwise. With parallel_tool_calls false, only a reply's first call is
  // returned.
  absl::flat_hash_set<std::string> tool_names;
  bool parallel_tool_calls = true;
  // Sampling, stopping, speculation and logprobs, ready for BuildGenerationRequest; the prompt
  // and the sample number are set per choice.
  v1::GenerateRequest base;
};

// Parses `body` for `endpoint`. INVALID_ARGUMENT, with the field as its param (FieldOf), for bad
// JSON, a wrong type or a value out of range.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(Endpoint endpoint, absl::string_view body);

// POST /tokenize, as vLLM serves it: a prompt {"prompt", "add_special_tokens" (default true)}, or
// a conversation {"messages", "add_generation_prompt", "continue_final_message"} encoded exactly
// as /v1/chat/completions encodes it; either may ask for "return_token_strs".
struct TokenizeRequest {
  std::string model;  // empty when not given
  bool chat = false;
  std::string prompt;
  bool add_special_tokens = true;
  nlohmann::ordered_json messages;
  ChatPromptOptions chat_options;
  bool return_token_strs = false;
};
absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(absl::string_view body);

// POST /detokenize: {"tokens": [ids]}.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(absl::string_view body);

}  // namespace specd::http

#endif  // SPECD_SERVICES_COORDINATOR_HTTP_OPENAI_REQUEST_H_
