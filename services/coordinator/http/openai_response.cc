#include "services/coordinator/http/openai_response.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_set.h"

namespace specd::http {
namespace {

Json Bytes(const std::string& s) {
  Json out = Json::array();
  for (const char c : s) out.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return out;
}

// The alternatives of one position, by logprob descending (id ascending on ties), with the
// emitted token added when it is not among the top `top_n` (as vLLM does): sorted still, since
// a token outside the top has a logprob no higher than the last one in it. With top_n 0 that is
// the emitted token alone, unless `none_at_zero` (chat's top_logprobs 0: an empty list).
std::vector<std::pair<int32_t, float>> Alternatives(int32_t token, const TokenLogprobs& lp,
                                                    int32_t top_n, bool none_at_zero) {
  std::vector<std::pair<int32_t, float>> out;
  if (top_n <= 0 && none_at_zero) return out;
  const size_t n = std::min(lp.top_ids.size(), static_cast<size_t>(top_n));
  bool has_token = false;
  for (size_t i = 0; i < n && i < lp.top_logprobs.size(); ++i) {
    out.emplace_back(lp.top_ids[i], lp.top_logprobs[i]);
    has_token = has_token || lp.top_ids[i] == token;
  }
  if (!has_token) out.emplace_back(token, lp.logprob);
  return out;
}

}  // namespace

double LogprobValue(float logprob) {
  const double v = static_cast<double>(logprob);
  return std::isnan(v) || v < kLogprobFloor ? kLogprobFloor : v;
}

Json CompletionLogprobs(std::span<const int32_t> tokens, std::span<const TokenLogprobs> logprobs,
                        const TokenText& text, int32_t previous, int64_t text_offset,
                        int32_t top_n) {
  Json out = {{"tokens", Json::array()},
              {"token_logprobs", Json::array()},
              {"top_logprobs", Json::array()},
              {"text_offset", Json::array()}};
  int64_t offset = text_offset;
  for (size_t i = 0; i < tokens.size() && i < logprobs.size(); ++i) {
    const int32_t before = i > 0 ? tokens[i - 1] : previous;
    const std::string t = text(before, tokens[i]);
    out["tokens"].push_back(t);
    out["token_logprobs"].push_back(LogprobValue(logprobs[i].logprob));
    Json top = Json::object();
    // Legacy logprobs N lists up to N + 1 entries, the emitted token always among them.
    for (const auto& [id, lp] : Alternatives(tokens[i], logprobs[i], top_n, false)) {
      // Keyed by text, as OpenAI's legacy shape is; two ids with one text keep the first.
      const std::string key = text(before, id);
      if (!top.contains(key)) top[key] = LogprobValue(lp);
    }
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(offset);
    offset += static_cast<int64_t>(t.size());
  }
  return out;
}

Json EchoedPromptLogprobs(std::span<const int32_t> prompt, std::span<const TokenLogprobs> logprobs,
                          const TokenText& text, int32_t top_n) {
  if (prompt.empty()) return CompletionLogprobs({}, {}, text, -1, 0, top_n);
  // The first token has no context: OpenAI and vLLM report null for it.
  const std::string first = text(-1, prompt[0]);
  Json out = CompletionLogprobs(prompt.subspan(1), logprobs, text, prompt[0],
                                static_cast<int64_t>(first.size()), top_n);
  out["tokens"].insert(out["tokens"].begin(), first);
  out["token_logprobs"].insert(out["token_logprobs"].begin(), nullptr);
  out["top_logprobs"].insert(out["top_logprobs"].begin(), nullptr);
  out["text_offset"].insert(out["text_offset"].begin(), 0);
  return out;
}

int64_t EndOffset(const Json& logprobs) {
  const Json& offsets = logprobs["text_offset"];
  if (offsets.empty()) return 0;
  return offsets.back().get<int64_t>() +
         static_cast<int64_t>(logprobs["tokens"].back().get<std::string>().size());
}

void AppendCompletionLogprobs(Json& into, const Json& more) {
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (const Json& v : more[key]) into[key].push_back(v);
  }
}

Json ChatLogprobs(std::span<const int32_t> tokens, std::span<const TokenLogprobs> logprobs,
                  const TokenText& text, int32_t previous, int32_t top_n) {
  Json content = Json::array();
  for (size_t i = 0; i < tokens.size() && i < logprobs.size(); ++i) {
    const int32_t before = i > 0 ? tokens[i - 1] : previous;
    const std::string t = text(before, tokens[i]);
    Json top = Json::array();
    for (const auto& [id, lp] : Alternatives(tokens[i], logprobs[i], top_n, true)) {
      const std::string alt = text(before, id);
      top.push_back({{"token", alt}, {"logprob", LogprobValue(lp)}, {"bytes", Bytes(alt)}});
    }
    content.push_back({{"token", t},
                       {"logprob", LogprobValue(logprobs[i].logprob)},
                       {"bytes", Bytes(t)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

Json UsageJson(const GenerationUsage& u) {
  const double rate = u.draft_tokens > 0 ? static_cast<double>(u.accepted_tokens) /
                                               static_cast<double>(u.draft_tokens)
                                         : 0.0;
  Json out = {{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"speculative",
               {{"rounds", u.rounds},
                {"drafting_rounds", u.drafting_rounds},
                {"drafted_tokens", u.draft_tokens},
                {"accepted_tokens", u.accepted_tokens},
                {"acceptance_rate", rate},
                {"accepted_per_position", u.accepted_per_position}}}};
  if (u.predicted) {
    // Every draft came from the prediction; OpenAI bills the rejected ones as output.
    out["completion_tokens_details"] = {
        {"accepted_prediction_tokens", u.accepted_tokens},
        {"rejected_prediction_tokens", u.draft_tokens - u.accepted_tokens}};
  }
  return out;
}

Json TotalUsage(std::span<const GenerationUsage> choices, int64_t n) {
  GenerationUsage total;
  for (size_t i = 0; i < choices.size(); ++i) {
    const GenerationUsage& u = choices[i];
    // Choices i*n .. i*n+n-1 share prompt i.
    if (n <= 1 || i % static_cast<size_t>(n) == 0) total.prompt_tokens += u.prompt_tokens;
    total.completion_tokens += u.completion_tokens;
    total.rounds += u.rounds;
    total.drafting_rounds += u.drafting_rounds;
    total.draft_tokens += u.draft_tokens;
    total.accepted_tokens += u.accepted_tokens;
    total.predicted = total.predicted || u.predicted;
    if (total.accepted_per_position.size() < u.accepted_per_position.size()) {
      total.accepted_per_position.resize(u.accepted_per_position.size(), 0);
    }
    for (size_t k = 0; k < u.accepted_per_position.size(); ++k) {
      total.accepted_per_position[k] += u.accepted_per_position[k];
    }
  }
  return UsageJson(total);
}

Json ToolCallsJson(absl::string_view response_id, size_t choice, std::span<const ToolCall> calls,
                   ToolCallFormat format, bool stream) {
  const absl::string_view stem = response_id.substr(response_id.find('-') + 1);
  Json out = Json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    Json call = Json::object();
    if (stream) call["index"] = k;
    call["id"] = ToolCallId(format, std::string_view(stem.data(), stem.size()), choice, k);
    call["type"] = "function";
    call["function"] = {{"name", calls[k].name}, {"arguments", calls[k].arguments}};
    out.push_back(std::move(call));
  }
  return out;
}

const char* FinishReasonJson(FinishReason reason) {
  return reason == FinishReason::kLength ? "length" : "stop";
}

std::string SseEvent(const Json& data) {
  std::string out = "data: ";
  out += data.dump(-1, ' ', false, Json::error_handler_t::replace);
  out += "\n\n";
  return out;
}

int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

Json ErrorJson(const absl::Status& status) {
  const int http = HttpStatusOf(status.code());
  const char* type = http == 400   ? "invalid_request_error"
                     : http == 401 ? "authentication_error"
                     : http == 404 ? "not_found_error"
                     : http == 429 ? "rate_limit_error"
                     : http == 503 ? "service_unavailable_error"
                                   : "server_error";
  const std::string param = FieldOf(status);
  return {{"error",
           {{"message", std::string(status.message())},
            {"type", type},
            {"param", param.empty() ? Json(nullptr) : Json(param)},
            {"code", http}}}};
}

}  // namespace specd::http
