// The OpenAI JSON the HTTP API answers with: completion and chat objects, their stream chunks
// (server-sent events), logprobs in both endpoints' shapes, usage with specd's `speculative`
// extension, and errors. Pure functions of their inputs, so the shapes are unit-tested.
//
// JSON has no -inf: a token outside the distribution's support (a processed logprob of a token
// that top-k, top-p, min-p or temperature 0 removed) is reported as -9999.0, vLLM's convention,
// so every logprob stays a number that OpenAI's SDKs accept. No finite logprob reaches -9999 in
// practice (it would take a logit gap of about 9999 nats), so the value is unambiguous.
#ifndef SPECD_SERVICES_COORDINATOR_HTTP_OPENAI_RESPONSE_H_
#define SPECD_SERVICES_COORDINATOR_HTTP_OPENAI_RESPONSE_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/http/openai_request.h"
#include "services/coordinator/scheduler.h"
#include "services/coordinator/tool_calls.h"

namespace specd::http {

using Json = nlohmann::ordered_json;

inline constexpr double kLogprobFloor = -9999.0;

// A logprob as JSON: the value, or kLogprobFloor for -inf (and anything below it).
double LogprobValue(float logprob);

// The text of token `id` as the logprobs show it, following token `previous` (-1: none). The
// context matters: SentencePiece drops the leading space of a text's first token.
using TokenText = std::function<std::string(int32_t previous, int32_t id)>;

// /v1/completions' logprobs object: tokens, token_logprobs, top_logprobs (one object per token,
// the alternatives by logprob, with the emitted token added when it is not among them) and
// text_offset (byte offsets in the choice's text, counting from `text_offset`). `previous` is
// the token before tokens[0] (the prompt's last, or the previous chunk's).
Json CompletionLogprobs(std::span<const int32_t> tokens, std::span<const TokenLogprobs> logprobs,
                        const TokenText& text, int32_t previous, int64_t text_offset,
                        int32_t top_n);
// The same object for an echoed prompt: its first token with null logprobs (it has no context),
// then prompt[1:] with `logprobs`, offsets from 0. As in vLLM, offsets count the token strings
// (a BOS shows as its text, "<s>", which the echoed prompt text lacks), and the completion's
// continue from EndOffset().
Json EchoedPromptLogprobs(std::span<const int32_t> prompt, std::span<const TokenLogprobs> logprobs,
                          const TokenText& text, int32_t top_n);
// The offset after the last token of a CompletionLogprobs object (0 when it has none).
int64_t EndOffset(const Json& logprobs);
// Appends `more`'s entries to `into` (two CompletionLogprobs objects).
void AppendCompletionLogprobs(Json& into, const Json& more);
// /v1/chat/completions' logprobs object: {"content": [{token, logprob, bytes, top_logprobs}]}.
Json ChatLogprobs(std::span<const int32_t> tokens, std::span<const TokenLogprobs> logprobs,
                  const TokenText& text, int32_t previous, int32_t top_n);

// OpenAI's usage, plus "speculative": {rounds, drafting_rounds, drafted_tokens, accepted_tokens,
// acceptance_rate, accepted_per_position}.
Json UsageJson(const GenerationUsage& usage);
// Several choices together: prompt tokens once per distinct prompt, the rest summed.
Json TotalUsage(std::span<const GenerationUsage> choices, int64_t n);

// OpenAI's tool_calls array of choice `choice` of response `response_id` ("chatcmpl-HEX"): each
// {"id", "type": "function", "function": {"name", "arguments"}}, and in a stream's delta its
// "index" too. Ids are ToolCallId's for the model's `format` ("call_HEX_CHOICE_K", or nine
// letters and digits for Mistral): unique within a conversation, which sends them back.
Json ToolCallsJson(absl::string_view response_id, size_t choice, std::span<const ToolCall> calls,
                   ToolCallFormat format, bool stream);

// "stop" (EOS, stop token or stop string) or "length".
const char* FinishReasonJson(FinishReason reason);

// One server-sent event: "data: <json>\n\n".
std::string SseEvent(const Json& data);
inline constexpr absl::string_view kSseDone = "data: [DONE]\n\n";

// The HTTP status of a failed request's status: 400 for bad input, 401, 404, 429 when the queue
// is full, 503 when workers are unavailable or the server drains, 500 otherwise.
int HttpStatusOf(absl::StatusCode code);
// {"error": {"message", "type", "param", "code"}}; the param is the field the status names.
Json ErrorJson(const absl::Status& status);

}  // namespace specd::http

#endif  // SPECD_SERVICES_COORDINATOR_HTTP_OPENAI_RESPONSE_H_
