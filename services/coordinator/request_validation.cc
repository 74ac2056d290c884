#include "services/coordinator/request_validation.h"

#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "base/sampling_params.h"
#include "base/status_macros.h"
#include "base/utf8.h"
#include "common/tokenizer/tokenizer.h"
#include "google/protobuf/util/json_util.h"
#include "services/coordinator/tool_calls.h"

namespace specd {
namespace {

constexpr char kFieldPayload[] = "type.specd/request.field";

// A Struct field as a JSON object, with its keys sorted: a Struct's fields are a map, which
// protobuf writes out in no fixed order, and the same request must render the same prompt. Its
// text counts toward `bytes` when given.
absl::StatusOr<nlohmann::ordered_json> StructJson(const google::protobuf::Struct& value,
                                                  const std::string& what, absl::string_view field,
                                                  int64_t* bytes) {
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(value, &json).ok()) {
    return FieldError(field, absl::StrCat(what, " cannot be read as JSON"));
  }
  if (bytes != nullptr) *bytes += static_cast<int64_t>(json.size());
  // nlohmann::json keeps its objects' keys sorted.
  const nlohmann::json sorted = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!sorted.is_object()) {
    return FieldError(field, absl::StrCat(what, " cannot be read as a JSON object"));
  }
  return nlohmann::ordered_json(sorted);
}

absl::Status Invalid(absl::string_view field, const std::string& message) {
  return FieldError(field, message);
}

// The text of request field `field` in tokens: within --max-prompt-bytes, valid UTF-8, and only
// when the model has a tokenizer (otherwise the error points to `ids_field`, which takes ids).
absl::StatusOr<std::vector<int32_t>> EncodeFieldText(
    const std::string& text, const Tokenizer* tokenizer, const ServerLimits& limits,
    absl::string_view field, absl::string_view ids_field, const EncodeOptions& options) {
  if (static_cast<int64_t>(text.size()) > limits.max_prompt_bytes) {
    return Invalid(field, absl::StrCat(field, " is ", text.size(), " bytes, over the limit of ",
                                       limits.max_prompt_bytes));
  }
  if (tokenizer == nullptr) {
    return Invalid(field, absl::StrCat("the served model has no tokenizer; send ", ids_field,
                                       " as token ids instead of text"));
  }
  if (FindInvalidUtf8(text)) return Invalid(field, absl::StrCat(field, " is not valid UTF-8"));
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(text, options);
  if (!ids.ok()) return Invalid(field, absl::StrCat(field, ": ", ids.status().message()));
  return ids;
}

// INVALID_ARGUMENT naming `field` for the first id outside the vocabulary; `what` starts the
// message ("prompt ").
absl::Status CheckVocabulary(std::span<const int32_t> ids, const ServerLimits& limits,
                             absl::string_view field, absl::string_view what) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= limits.vocab_size) {
      return Invalid(field,
                     absl::StrCat(what, "token id ", ids[i], " at index ", i,
                                  " is outside the vocabulary [0, ", limits.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

// Guidance scales up to this amplify the difference of two logit rows tenfold: beyond it the
// guided distribution is a near point mass whatever the model says.
constexpr float kMaxGuidanceScale = 10.0f;

// The request's guidance, or nullopt when it has none or a scale of 1 (which is the conditional
// distribution itself, so no companion is run).
absl::StatusOr<std::optional<Guidance>> BuildGuidance(const v1::GenerateRequest& request,
                                                      const Tokenizer* tokenizer,
                                                      const ServerLimits& limits,
                                                      const FieldNames& names) {
  if (!request.has_guidance()) return std::nullopt;
  const v1::Guidance& g = request.guidance();
  if (!(g.scale() > 0.0f && g.scale() <= kMaxGuidanceScale)) {
    return Invalid("guidance.scale",
                   absl::StrCat("guidance.scale must be in (0, ", kMaxGuidanceScale, "], got ",
                                g.scale(), " (1 is no guidance)"));
  }
  Guidance out;
  out.scale = g.scale();
  out.draft = g.draft();
  const absl::string_view text_field = names.guidance_text;
  switch (g.unconditional_case()) {
    case v1::Guidance::kUnconditionalText:
      if (!g.unconditional_text().empty()) {
        SPECD_ASSIGN_OR_RETURN(out.uncond_prompt,
                               EncodeFieldText(g.unconditional_text(), tokenizer, limits,
                                               text_field, names.guidance_ids, EncodeOptions()));
      }
      break;
    case v1::Guidance::kUnconditionalTokenIds:
      out.uncond_prompt.assign(g.unconditional_token_ids().ids().begin(),
                               g.unconditional_token_ids().ids().end());
      break;
    case v1::Guidance::UNCONDITIONAL_NOT_SET:
      break;
  }
  if (out.uncond_prompt.empty()) {
    // Unset or empty: BOS alone.
    const std::optional<int32_t> bos =
        tokenizer != nullptr ? tokenizer->bos_id() : std::optional<int32_t>();
    if (!bos.has_value()) {
      return Invalid(names.guidance_ids,
                     absl::StrCat("guidance: the unconditional prompt is empty and the served "
                                  "model has no BOS token to stand for it; send ",
                                  names.guidance_ids));
    }
    out.uncond_prompt = {*bos};
  }
  if (limits.max_prompt_tokens > 0 &&
      static_cast<int64_t>(out.uncond_prompt.size()) > limits.max_prompt_tokens) {
    return Invalid(
        names.guidance_ids,
        absl::StrCat("the guidance's unconditional prompt has ", out.uncond_prompt.size(),
                     " tokens; this server accepts at most ", limits.max_prompt_tokens));
  }
  SPECD_RETURN_IF_ERROR(CheckVocabulary(out.uncond_prompt, limits, names.guidance_ids,
                                        absl::StrCat(names.guidance_ids, ": ")));
  if (out.scale == 1.0f) return std::nullopt;
  return out;
}

// The tokens of speculation.prediction: text as a continuation (no BOS), or ids; at most
// max_seq_len of them, as no output can use more.
absl::StatusOr<std::vector<int32_t>> PredictionTokens(const v1::Prediction& prediction,
                                                      const Tokenizer* tokenizer,
                                                      const ServerLimits& limits,
                                                      absl::string_view field) {
  std::vector<int32_t> ids;
  switch (prediction.content_case()) {
    case v1::Prediction::kText:
      if (!prediction.text().empty()) {
        EncodeOptions options;
        options.add_bos = false;
        options.continuation = true;
        SPECD_ASSIGN_OR_RETURN(
            ids, EncodeFieldText(prediction.text(), tokenizer, limits, field, field, options));
      }
      break;
    case v1::Prediction::kTokenIds:
      ids.assign(prediction.token_ids().ids().begin(), prediction.token_ids().ids().end());
      SPECD_RETURN_IF_ERROR(CheckVocabulary(ids, limits, field, absl::StrCat(field, " ")));
      break;
    case v1::Prediction::CONTENT_NOT_SET:
      break;
  }
  if (limits.max_seq_len > 0 && static_cast<int64_t>(ids.size()) > limits.max_seq_len) {
    return Invalid(field,
                   absl::StrCat(field, " has ", ids.size(),
                                " tokens, more than the model's context of ", limits.max_seq_len));
  }
  return ids;
}

}  // namespace

absl::Status FieldError(absl::string_view field, absl::string_view message, absl::StatusCode code) {
  absl::Status st(code, message);
  st.SetPayload(kFieldPayload, absl::Cord(field));
  return st;
}

const nlohmann::ordered_json& JsonField(const nlohmann::ordered_json& object,
                                        absl::string_view name) {
  static const nlohmann::ordered_json kNull;
  if (!object.is_object()) return kNull;
  const auto it = object.find(std::string(name));
  return it == object.end() ? kNull : *it;
}

std::string FieldOf(const absl::Status& status) {
  const absl::optional<absl::Cord> field = status.GetPayload(kFieldPayload);
  return field.has_value() ? std::string(*field) : std::string();
}

absl::StatusOr<std::vector<int32_t>> EncodeChat(const v1::Chat& chat,
                                                const PromptEncoders& encoders,
                                                const ServerLimits& limits) {
  if (!encoders.chat) {
    return absl::FailedPreconditionError(
        "the served model has no tokenizer or chat template; send token_ids instead");
  }
  int64_t bytes = 0;
  // Counts a string toward the conversation's size; false when it is not UTF-8.
  auto take = [&bytes](const std::string& s) {
    bytes += static_cast<int64_t>(s.size());
    return !FindInvalidUtf8(s).has_value();
  };
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  for (int i = 0; i < chat.messages_size(); ++i) {
    const v1::ChatMessage& m = chat.messages(i);
    bool utf8 = take(m.role()) && take(m.content()) && take(m.tool_call_id());
    // OpenAI's form, which the templates are written for: an assistant's calls have null content
    // when it wrote none.
    nlohmann::ordered_json message = {{"role", m.role()}, {"content", m.content()}};
    if (m.tool_calls_size() > 0) {
      if (m.content().empty()) message["content"] = nullptr;
      nlohmann::ordered_json calls = nlohmann::ordered_json::array();
      for (const v1::ToolCall& call : m.tool_calls()) {
        utf8 = utf8 && take(call.id()) && take(call.name()) && take(call.arguments());
        calls.push_back({{"id", call.id()},
                         {"type", "function"},
                         {"function", {{"name", call.name()}, {"arguments", call.arguments()}}}});
      }
      message["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id().empty()) message["tool_call_id"] = m.tool_call_id();
    if (!utf8) return Invalid("messages", absl::StrCat("messages[", i, "] is not valid UTF-8"));
    messages.push_back(std::move(message));
  }
  if (!v1::ToolChoice_IsValid(chat.tool_choice())) {
    return Invalid("tool_choice", absl::StrCat("tool_choice ", chat.tool_choice(),
                                               " is not a ToolChoice this server knows"));
  }
  ChatPromptOptions options;
  if (chat.tools_size() > 0) {
    nlohmann::ordered_json tools = nlohmann::ordered_json::array();
    for (int i = 0; i < chat.tools_size(); ++i) {
      const v1::Tool& tool = chat.tools(i);
      if (!take(tool.name()) || !take(tool.description())) {
        return Invalid("tools", absl::StrCat("tools[", i, "] is not valid UTF-8"));
      }
      nlohmann::ordered_json function = {{"name", tool.name()}};
      if (!tool.description().empty()) function["description"] = tool.description();
      if (tool.has_parameters()) {
        SPECD_ASSIGN_OR_RETURN(
            function["parameters"],
            StructJson(tool.parameters(), absl::StrCat("tools[", i, "]"), "tools", &bytes));
      }
      tools.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
    SPECD_RETURN_IF_ERROR(CheckTools(tools).status());
    options.tools = std::move(tools);
  } else if (chat.tool_choice() == v1::TOOL_CHOICE_AUTO) {
    return Invalid("tool_choice", "tool_choice AUTO needs tools");
  }
  if (bytes > limits.max_prompt_bytes) {
    return Invalid("messages", absl::StrCat("the conversation is ", bytes,
                                            " bytes, over the limit of ", limits.max_prompt_bytes));
  }
  if (chat.has_chat_template_kwargs()) {
    SPECD_ASSIGN_OR_RETURN(options.template_kwargs,
                           StructJson(chat.chat_template_kwargs(), "chat_template_kwargs",
                                      "chat_template_kwargs", nullptr));
  }
  options.continue_final_message = chat.continue_final_message();
  options.add_generation_prompt = chat.has_add_generation_prompt()
                                      ? chat.add_generation_prompt()
                                      : !options.continue_final_message;
  return encoders.chat(messages, options);
}

ToolCallPolicy ToolCallPolicyOf(const v1::GenerateRequest& request, const ChatPrompt* chat) {
  ToolCallPolicy policy;
  if (chat == nullptr || !request.has_chat() ||
      request.chat().tool_choice() == v1::TOOL_CHOICE_NONE) {
    return policy;
  }
  policy.format = chat->tool_call_format();
  for (const v1::Tool& tool : request.chat().tools()) policy.tools.insert(tool.name());
  policy.parallel_tool_calls =
      !request.chat().has_parallel_tool_calls() || request.chat().parallel_tool_calls();
  return policy;
}

absl::StatusOr<GenerationRequest> BuildGenerationRequest(const v1::GenerateRequest& request,
                                                         const PromptEncoders& encoders,
                                                         const ServerLimits& limits,
                                                         uint64_t random_seed,
                                                         const FieldNames& names) {
  const Tokenizer* const tokenizer = encoders.tokenizer;
  GenerationRequest out;
  // Prompt.
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText: {
      const std::string& text = request.text();
      if (static_cast<int64_t>(text.size()) > limits.max_prompt_bytes) {
        return Invalid(names.prompt,
                       absl::StrCat("prompt text is ", text.size(), " bytes, over the limit of ",
                                    limits.max_prompt_bytes));
      }
      if (tokenizer == nullptr) {
        return Invalid(names.prompt,
                       "the served model has no tokenizer; send prompt token_ids instead of text");
      }
      if (FindInvalidUtf8(text)) return Invalid(names.prompt, "prompt text is not valid UTF-8");
      absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(text);
      if (!ids.ok()) {
        return Invalid(names.prompt, absl::StrCat("prompt text: ", ids.status().message()));
      }
      out.prompt = *std::move(ids);
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      out.prompt.assign(request.token_ids().ids().begin(), request.token_ids().ids().end());
      break;
    case v1::GenerateRequest::kChat: {
      SPECD_ASSIGN_OR_RETURN(out.prompt, EncodeChat(request.chat(), encoders, limits));
      break;
    }
    case v1::GenerateRequest::PROMPT_NOT_SET:
      return Invalid(names.prompt, "the request has no prompt: set text, token_ids or chat");
  }
  // Empty text is a prompt of BOS alone (as in vLLM and llama.cpp); with no BOS to add, or an
  // empty list of ids, there is nothing to continue from.
  if (out.prompt.empty()) {
    return Invalid(
        names.prompt,
        request.prompt_case() == v1::GenerateRequest::kText
            ? "the prompt text is empty and the tokenizer adds no BOS token to start from"
            : "token_ids is empty: send at least one token (or empty text, which "
              "starts from BOS)");
  }
  if (limits.max_prompt_tokens > 0 &&
      static_cast<int64_t>(out.prompt.size()) > limits.max_prompt_tokens) {
    return Invalid(names.prompt,
                   absl::StrCat("the prompt has ", out.prompt.size(),
                                " tokens; this server accepts at most ", limits.max_prompt_tokens));
  }
  SPECD_RETURN_IF_ERROR(CheckVocabulary(out.prompt, limits, names.prompt, "prompt "));

  absl::StatusOr<std::optional<Guidance>> guidance =
      BuildGuidance(request, tokenizer, limits, names);
  if (!guidance.ok()) return guidance.status();
  out.guidance = *std::move(guidance);
  // A guided request's companion holds the unconditional prompt and the same output: both must
  // fit in max_seq_len.
  const int64_t longest_prompt = std::max<int64_t>(
      static_cast<int64_t>(out.prompt.size()),
      out.guidance.has_value() ? static_cast<int64_t>(out.guidance->uncond_prompt.size()) : 0);

  // Sampling. The fields whose neutral value is not zero are optional: unset means neutral.
  const v1::SamplingParameters& s = request.sampling();
  out.sampling.temperature = s.temperature();
  out.sampling.top_k = s.top_k();
  out.sampling.top_p = s.has_top_p() ? s.top_p() : 1.0f;
  out.sampling.min_p = s.min_p();
  out.sampling.repetition_penalty = s.has_repetition_penalty() ? s.repetition_penalty() : 1.0f;
  out.sampling.presence_penalty = s.presence_penalty();
  out.sampling.frequency_penalty = s.frequency_penalty();
  if (absl::Status st = ValidateSamplingParams(out.sampling, limits.vocab_size); !st.ok()) {
    // Its messages read "sampling parameter NAME must ...".
    const absl::string_view m = st.message();
    constexpr absl::string_view kPrefix = "sampling parameter ";
    const size_t at = m.find(kPrefix);
    if (at == absl::string_view::npos) return st;
    const size_t begin = at + kPrefix.size();
    return FieldError(m.substr(begin, m.find(' ', begin) - begin), m);
  }
  out.logit_bias.clear();
  for (const auto& [token, bias] : s.logit_bias()) out.logit_bias.push_back({token, bias});
  std::sort(out.logit_bias.begin(), out.logit_bias.end(),
            [](const TokenBias& a, const TokenBias& b) { return a.token < b.token; });
  if (absl::Status st = ValidateLogitBias(out.logit_bias, limits.vocab_size); !st.ok()) {
    return FieldError("logit_bias", st.message());
  }
  out.seed = s.has_seed() ? s.seed() : random_seed;
  out.sample = s.sample();

  // Logprobs: always the target's (the draft's distribution never reaches the client).
  const v1::LogprobsParameters& lp = request.logprobs();
  if (lp.enabled() || lp.prompt()) {
    if (lp.top_logprobs() > static_cast<uint32_t>(kMaxLogprobs)) {
      return Invalid(names.top_logprobs, absl::StrCat(names.top_logprobs, " must be in [0, ",
                                                      kMaxLogprobs, "], got ", lp.top_logprobs()));
    }
    if (!v1::LogprobsMode_IsValid(lp.mode())) {
      return Invalid("logprobs.mode",
                     absl::StrCat("logprobs.mode ", lp.mode(), " is not a LogprobsMode"));
    }
    LogprobsRequest asked;
    asked.mode =
        lp.mode() == v1::LOGPROBS_MODE_PROCESSED ? LogprobsMode::kProcessed : LogprobsMode::kRaw;
    asked.top_n = static_cast<int32_t>(lp.top_logprobs());
    if (lp.enabled()) out.logprobs = asked;
    if (lp.prompt()) {
      if (out.guidance.has_value()) {
        // Scoring reads the prompt without the companion, so its numbers would not be the guided
        // distribution the request samples from.
        return Invalid(names.prompt_logprobs,
                       absl::StrCat(names.prompt_logprobs, " is not supported with guidance"));
      }
      out.prompt_logprobs = asked;
    }
  }

  // Stopping.
  const v1::StoppingCriteria& stop = request.stopping();
  if (limits.max_new_tokens_limit > 0 && stop.max_new_tokens() > limits.max_new_tokens_limit) {
    return Invalid(names.max_new_tokens,
                   absl::StrCat(names.max_new_tokens, " is ", stop.max_new_tokens(),
                                "; this server allows at most ", limits.max_new_tokens_limit));
  }
  out.max_new_tokens =
      stop.max_new_tokens() == 0 ? limits.default_max_new_tokens : stop.max_new_tokens();
  const int64_t room = limits.max_seq_len - longest_prompt;
  const bool uncond_longest = longest_prompt > static_cast<int64_t>(out.prompt.size());
  const char* const longest = uncond_longest ? "the guidance's unconditional prompt" : "the prompt";
  if (room < 1) {
    return Invalid(uncond_longest ? names.guidance_ids : names.prompt,
                   absl::StrCat(longest, " has ", longest_prompt, " tokens; the model's limit is ",
                                limits.max_seq_len, " tokens including the output"));
  }
  if (out.max_new_tokens > room) {
    if (stop.max_new_tokens() != 0) {
      return Invalid(
          names.max_new_tokens,
          absl::StrCat(longest, " (", longest_prompt, " tokens) + ", names.max_new_tokens, " (",
                       out.max_new_tokens, ") exceeds the model's limit of ", limits.max_seq_len,
                       " tokens"));
    }
    out.max_new_tokens = room;  // the default shrinks to fit; an explicit value does not
  }
  if (stop.stop_size() > limits.max_stop_strings) {
    return Invalid(names.stop, absl::StrCat(stop.stop_size(), " stop strings in ", names.stop,
                                            "; at most ", limits.max_stop_strings, " are allowed"));
  }
  for (int i = 0; i < stop.stop_size(); ++i) {
    const std::string& st = stop.stop(i);
    if (st.empty()) return Invalid(names.stop, absl::StrCat(names.stop, "[", i, "] is empty"));
    if (static_cast<int64_t>(st.size()) > limits.max_stop_string_bytes) {
      return Invalid(names.stop,
                     absl::StrCat(names.stop, "[", i, "] is ", st.size(), " bytes; at most ",
                                  limits.max_stop_string_bytes, " are allowed"));
    }
    if (FindInvalidUtf8(st)) {
      return Invalid(names.stop, absl::StrCat(names.stop, "[", i, "] is not valid UTF-8"));
    }
    if (tokenizer == nullptr) {
      return Invalid(names.stop, "stop strings need a tokenizer, and the served model has none");
    }
    out.stop_strings.push_back(st);
  }
  for (const int32_t id : stop.stop_token_ids()) {
    if (id < 0 || id >= limits.vocab_size) {
      return Invalid("stop_token_ids",
                     absl::StrCat("stop token id ", id, " is outside the vocabulary [0, ",
                                  limits.vocab_size, ")"));
    }
    out.stop_token_ids.push_back(id);
  }
  // A request may list a vocabulary's worth of ids (or one id a million times); the scheduler
  // looks every token up in them.
  std::sort(out.stop_token_ids.begin(), out.stop_token_ids.end());
  out.stop_token_ids.erase(std::unique(out.stop_token_ids.begin(), out.stop_token_ids.end()),
                           out.stop_token_ids.end());
  out.ignore_eos = stop.ignore_eos();

  // Speculation.
  const v1::SpeculationParameters& spec = request.speculation();
  const int64_t k = spec.has_num_speculative_tokens() ? spec.num_speculative_tokens()
                                                      : limits.default_num_speculative_tokens;
  if (k > limits.max_num_speculative_tokens) {
    return Invalid("num_speculative_tokens",
                   absl::StrCat("num_speculative_tokens must be in [0, ",
                                limits.max_num_speculative_tokens, "], got ", k));
  }
  if (!v1::DraftMethod_IsValid(spec.draft_method())) {
    return Invalid(names.draft_method, absl::StrCat(names.draft_method, " ", spec.draft_method(),
                                                    " is not a DraftMethod"));
  }
  if (spec.has_prediction()) {
    SPECD_ASSIGN_OR_RETURN(
        out.prediction, PredictionTokens(spec.prediction(), tokenizer, limits, names.prediction));
  }
  if (!out.prediction.empty() && spec.draft_method() == v1::DRAFT_METHOD_MODEL) {
    return Invalid(names.prediction,
                   absl::StrCat(names.prediction, " is drafted from by lookup (ngram), and ",
                                names.draft_method, " asks for the draft model: leave ",
                                names.draft_method, " unset or make it ngram"));
  }
  switch (out.prediction.empty() ? spec.draft_method() : v1::DRAFT_METHOD_NGRAM) {
    case v1::DRAFT_METHOD_MODEL:
      if (!limits.has_draft) {
        return Invalid(names.draft_method,
                       absl::StrCat(names.draft_method,
                                    ": model drafting needs a draft worker, and this server has "
                                    "none (it drafts by prompt lookup, ngram)"));
      }
      out.draft_method = DraftMethod::kModel;
      break;
    case v1::DRAFT_METHOD_NGRAM:
      out.draft_method = DraftMethod::kNgram;
      break;
    default:
      out.draft_method = limits.default_draft_method;
      break;
  }
  // A server without a draft worker whose default is model drafting decodes plainly.
  const bool can_draft = out.draft_method == DraftMethod::kNgram || limits.has_draft;
  out.num_speculative_tokens = can_draft ? static_cast<int32_t>(k) : 0;
  if (spec.has_tree()) {
    if (out.draft_method != DraftMethod::kModel) {
      return Invalid(names.tree, absl::StrCat(names.tree,
                                              " needs model drafting: prompt lookup (ngram) "
                                              "proposes one chain"));
    }
    out.tree = {static_cast<int32_t>(std::min<uint32_t>(spec.tree().branching(), 1u << 20)),
                static_cast<int32_t>(std::min<uint32_t>(spec.tree().depth(), 1u << 20))};
    if (absl::Status st =
            ValidateTreeShape(out.tree, static_cast<int32_t>(k), std::string(names.tree).c_str());
        !st.ok()) {
      return Invalid(names.tree, std::string(st.message()));
    }
    if (out.guidance.has_value()) {
      // The companion would have to be fed the same tree, with its masks and compaction.
      return Invalid(names.tree, absl::StrCat(names.tree,
                                              " cannot be combined with guidance: a guided "
                                              "request drafts one chain (leave ",
                                              names.tree, " unset)"));
    }
  }
  if (spec.has_egag() && spec.egag()) {
    if (out.draft_method != DraftMethod::kModel || out.tree.is_tree()) {
      return Invalid(names.egag,
                     absl::StrCat(names.egag,
                                  " needs a chain of model drafts (model drafting "
                                  "without ",
                                  names.tree, "): it follows the draft model's entropy"));
    }
  }
  out.egag = (spec.has_egag() ? spec.egag() : limits.default_egag) &&
             out.draft_method == DraftMethod::kModel && !out.tree.is_tree();
  if (out.guidance.has_value() && out.guidance->draft && out.draft_method != DraftMethod::kModel) {
    return Invalid("guidance.draft",
                   "guidance.draft guides the draft model, and prompt lookup (ngram) drafts "
                   "without one");
  }
  if (!v1::DraftSampling_IsValid(spec.draft_sampling())) {
    return Invalid("speculation.draft_sampling",
                   absl::StrCat("speculation.draft_sampling ", spec.draft_sampling(),
                                " is not a DraftSampling"));
  }
  if (!v1::KPolicy_IsValid(spec.k_policy())) {
    return Invalid("speculation.k_policy",
                   absl::StrCat("speculation.k_policy ", spec.k_policy(), " is not a KPolicy"));
  }
  // Greedy output is the same for every K, and so is a sampled request's distribution, but a
  // sampled request's tokens for a given seed depend on the K of each round (DESIGN.md,
  // "Randomness"): a client that chose the seed gets a fixed K, so that its tokens reproduce
  // whatever the load, unless it asks for ADAPTIVE.
  switch (spec.k_policy()) {
    case v1::K_POLICY_FIXED:
      out.adaptive_k = false;
      break;
    case v1::K_POLICY_ADAPTIVE:
      out.adaptive_k = true;
      break;
    default:
      out.adaptive_k = out.sampling.greedy() || !s.has_seed();
      break;
  }
  out.draft_sampling = spec.draft_sampling() == v1::DRAFT_SAMPLING_GREEDY
                           ? DraftSampling::kGreedy
                           : DraftSampling::kProbabilistic;
  if (request.request_id().size() > 256) {
    return Invalid("request_id", absl::StrCat("request_id is ", request.request_id().size(),
                                              " bytes; at most 256 are allowed"));
  }
  return out;
}

}  // namespace specd
