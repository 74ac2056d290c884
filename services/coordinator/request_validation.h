// Checks a public GenerateRequest and turns it into the scheduler's GenerationRequest. Every
// rejection is INVALID_ARGUMENT with a message that names the field and the allowed range.
#ifndef SPECD_SERVICES_COORDINATOR_REQUEST_VALIDATION_H_
#define SPECD_SERVICES_COORDINATOR_REQUEST_VALIDATION_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/chat_prompt.h"
#include "services/coordinator/scheduler.h"
#include "services/coordinator/tool_call_stream.h"
#include "specd/v1/generation.pb.h"

namespace specd {

struct ServerLimits {
  int64_t vocab_size = 0;
  int64_t max_seq_len = 0;
  int64_t default_max_new_tokens = 256;
  int32_t default_num_speculative_tokens = 4;
  int32_t max_num_speculative_tokens = 16;
  int64_t max_prompt_bytes = 1 << 20;
  // The operator's caps (--max-prompt-tokens, --max-new-tokens-limit); 0 = only max_seq_len.
  int64_t max_prompt_tokens = 0;
  int64_t max_new_tokens_limit = 0;
  int64_t max_stop_strings = 16;
  int64_t max_stop_string_bytes = 256;
  bool has_draft = true;  // a draft worker serves DRAFT_METHOD_MODEL
  // What DRAFT_METHOD_UNSPECIFIED means (--draft-method): kModel needs a draft worker; without
  // one and with kModel, K is always 0.
  DraftMethod default_draft_method = DraftMethod::kModel;
  bool default_egag = false;  // what an unset speculation.egag means (--egag)
};

// How error messages name the fields whose names differ between the two public APIs: the gRPC
// API's by default; the HTTP API builds its requests through here with OpenAI's names.
struct FieldNames {
  absl::string_view prompt = "prompt";
  absl::string_view max_new_tokens = "max_new_tokens";
  absl::string_view stop = "stop";
  absl::string_view top_logprobs = "logprobs.top_logprobs";
  absl::string_view prompt_logprobs = "logprobs.prompt";
  absl::string_view draft_method = "speculation.draft_method";
  absl::string_view tree = "speculation.tree";
  absl::string_view egag = "speculation.egag";
  absl::string_view prediction = "speculation.prediction";
  absl::string_view guidance_text = "guidance.unconditional_text";
  absl::string_view guidance_ids = "guidance.unconditional_token_ids";
};

// An error that names the request field it is about (the OpenAI error's "param").
absl::Status FieldError(absl::string_view field, absl::string_view message,
                        absl::StatusCode code = absl::StatusCode::kInvalidArgument);
// The field an error names, or "" when it names none.
std::string FieldOf(const absl::Status& status);

// A JSON request's field: its value, or null when it is absent (OpenAI treats null as not given)
// or `object` is not an object.
const nlohmann::ordered_json& JsonField(const nlohmann::ordered_json& object,
                                        absl::string_view name);

// What turns a request's prompt into tokens. `tokenizer` may be null for token-id-only models
// (then text prompts are refused); `chat` renders and encodes a conversation (an OpenAI-style
// messages array; see ChatPrompt::Encode), and may be empty (then chat prompts are refused).
struct PromptEncoders {
  const Tokenizer* tokenizer = nullptr;
  std::function<absl::StatusOr<std::vector<int32_t>>(const nlohmann::ordered_json& messages,
                                                     const ChatPromptOptions& options)>
      chat;
};

// A conversation's prompt ids, as Generate and Tokenize encode the gRPC API's `chat`:
// INVALID_ARGUMENT naming "messages" for text that is not UTF-8 or a conversation over
// max_prompt_bytes (or the template's own error), FAILED_PRECONDITION without a chat template.
absl::StatusOr<std::vector<int32_t>> EncodeChat(const v1::Chat& chat,
                                                const PromptEncoders& encoders,
                                                const ServerLimits& limits);

// What a Generate request with chat tools asks of its reply (nothing without them, with
// TOOL_CHOICE_NONE or without a chat template); for a request BuildGenerationRequest took.
ToolCallPolicy ToolCallPolicyOf(const v1::GenerateRequest& request, const ChatPrompt* chat);

// `random_seed` is used when the request has no seed. Errors are INVALID_ARGUMENT naming their
// field (FieldOf), or FAILED_PRECONDITION for chat input the server cannot render.
absl::StatusOr<GenerationRequest> BuildGenerationRequest(const v1::GenerateRequest& request,
                                                         const PromptEncoders& encoders,
                                                         const ServerLimits& limits,
                                                         uint64_t random_seed,
                                                         const FieldNames& names = {});

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_REQUEST_VALIDATION_H_
