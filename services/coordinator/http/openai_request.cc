#include "services/coordinator/http/openai_request.h"

#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "services/coordinator/tool_calls.h"

namespace specd::http {
namespace {

using Json = nlohmann::ordered_json;

absl::StatusOr<std::optional<double>> Number(const Json& body, absl::string_view name, double lo,
                                             double hi, absl::string_view range) {
  const Json& v = JsonField(body, name);
  if (v.is_null()) return std::nullopt;
  if (!v.is_number()) return FieldError(name, absl::StrCat(name, " must be a number"));
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    return FieldError(name, absl::StrCat(name, " must be ", range, ", got ", v.dump()));
  }
  return d;
}

absl::StatusOr<std::optional<int64_t>> Integer(const Json& body, absl::string_view name, int64_t lo,
                                               int64_t hi) {
  const Json& v = JsonField(body, name);
  if (v.is_null()) return std::nullopt;
  if (!v.is_number_integer()) return FieldError(name, absl::StrCat(name, " must be an integer"));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return FieldError(name, absl::StrCat(name, " must be in [", lo, ", ", hi, "], got ", v.dump()));
  }
  const int64_t i = v.get<int64_t>();
  if (i < lo || i > hi) {
    return FieldError(name, absl::StrCat(name, " must be in [", lo, ", ", hi, "], got ", i));
  }
  return i;
}

absl::StatusOr<std::optional<bool>> Bool(const Json& body, absl::string_view name) {
  const Json& v = JsonField(body, name);
  if (v.is_null()) return std::nullopt;
  if (!v.is_boolean()) return FieldError(name, absl::StrCat(name, " must be true or false"));
  return v.get<bool>();
}

// An element of the token id list `field`; `where` names it in the message ("prompt[3]").
absl::StatusOr<int32_t> TokenId(const Json& v, absl::string_view field, absl::string_view where) {
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() && v.get<uint64_t>() > std::numeric_limits<int32_t>::max()) ||
      v.get<int64_t>() < std::numeric_limits<int32_t>::min() ||
      v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
    return FieldError(field, absl::StrCat(where, " must be a token id (an integer)"));
  }
  return static_cast<int32_t>(v.get<int64_t>());
}

absl::StatusOr<Json> ParseBody(absl::string_view body_text) {
  Json body = Json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return absl::InvalidArgumentError("the request body is not valid JSON");
  if (!body.is_object()) {
    return absl::InvalidArgumentError("the request body must be a JSON object");
  }
  return body;
}

absl::StatusOr<std::string> ModelName(const Json& body) {
  const Json& model = JsonField(body, "model");
  if (!model.is_null() && !model.is_string()) return FieldError("model", "model must be a string");
  return model.is_string() ? model.get<std::string>() : std::string();
}

// messages: a non-empty list (its messages are checked when the conversation is rendered).
absl::StatusOr<Json> Messages(const Json& body) {
  const Json& m = JsonField(body, "messages");
  if (m.is_null()) return FieldError("messages", "messages is required");
  if (!m.is_array() || m.empty()) {
    return FieldError("messages", "messages must be a non-empty list of message objects");
  }
  return m;
}

// The fields of a conversation only (vLLM's names).
constexpr const char* kChatOnlyFields[] = {"add_generation_prompt", "continue_final_message",
                                           "chat_template_kwargs",  "tools",
                                           "tool_choice",           "parallel_tool_calls"};

// tools: OpenAI's function tools (see CheckTools). Null or [] is none.
absl::Status ParseTools(const Json& body, ChatPromptOptions* options) {
  const Json& tools = JsonField(body, "tools");
  if (tools.is_null() || (tools.is_array() && tools.empty())) return absl::OkStatus();
  SPECD_RETURN_IF_ERROR(CheckTools(tools).status());
  options->tools = tools;
  return absl::OkStatus();
}

// tool_choice: "auto" (the default with tools: the reply may be calls) or "none" (it is content).
// "required" and a named function would need decoding constrained to a call's JSON.
absl::Status ParseToolChoice(const Json& body, OpenAiRequest* out) {
  const Json& tools = out->chat_options.tools;
  const Json& choice = JsonField(body, "tool_choice");
  if (choice == "required" || choice.is_object()) {
    return FieldError("tool_choice",
                      "tool_choice \"required\" and a named function are not supported: they need "
                      "decoding constrained to a call's JSON, which this server does not do; use "
                      "\"auto\" (the default with tools) or \"none\"");
  }
  if (!choice.is_null() && choice != "auto" && choice != "none") {
    return FieldError("tool_choice",
                      "tool_choice must be \"auto\", \"none\", \"required\" or a named function");
  }
  if (choice == "auto" && tools.is_null()) {
    return FieldError("tool_choice", "tool_choice \"auto\" needs tools");
  }
  SPECD_ASSIGN_OR_RETURN(const std::optional<bool> parallel, Bool(body, "parallel_tool_calls"));
  out->parallel_tool_calls = parallel.value_or(true);
  if (choice != "none" && tools.is_array()) {
    for (const Json& tool : tools)
      out->tool_names.insert(tool["function"]["name"].get<std::string>());
  }
  return absl::OkStatus();
}

// add_generation_prompt, continue_final_message and chat_template_kwargs: the assistant's header
// by default, none when the last message is continued. Their combination and the variables are
// checked where the conversation is encoded (ChatPrompt::Encode), for both APIs.
absl::StatusOr<ChatPromptOptions> ChatOptions(const Json& body) {
  SPECD_ASSIGN_OR_RETURN(const std::optional<bool> add, Bool(body, "add_generation_prompt"));
  SPECD_ASSIGN_OR_RETURN(const std::optional<bool> cont, Bool(body, "continue_final_message"));
  ChatPromptOptions options;
  options.continue_final_message = cont.value_or(false);
  options.add_generation_prompt = add.value_or(!options.continue_final_message);
  if (const Json& kwargs = JsonField(body, "chat_template_kwargs"); !kwargs.is_null()) {
    options.template_kwargs = kwargs;
  }
  SPECD_RETURN_IF_ERROR(ParseTools(body, &options));
  return options;
}

// prompt: a string, a list of strings, a list of token ids, or a list of token-id lists.
absl::Status ParsePrompt(const Json& body, OpenAiRequest* out) {
  const Json& p = JsonField(body, "prompt");
  const char* kShape =
      "prompt must be a string, a list of strings, a list of token ids or a list of token-id "
      "lists";
  if (p.is_null()) return FieldError("prompt", "prompt is required");
  if (p.is_string()) {
    out->prompts.push_back({true, p.get<std::string>(), {}});
    return absl::OkStatus();
  }
  if (!p.is_array()) return FieldError("prompt", kShape);
  if (p.empty()) return FieldError("prompt", "prompt is an empty list");
  if (p.front().is_number_integer()) {
    OpenAiRequest::Prompt ids{false, "", {}};
    for (size_t i = 0; i < p.size(); ++i) {
      SPECD_ASSIGN_OR_RETURN(const int32_t id,
                             TokenId(p[i], "prompt", absl::StrCat("prompt[", i, "]")));
      ids.ids.push_back(id);
    }
    out->prompts.push_back(std::move(ids));
    return absl::OkStatus();
  }
  for (size_t i = 0; i < p.size(); ++i) {
    const Json& e = p[i];
    if (e.is_string()) {
      out->prompts.push_back({true, e.get<std::string>(), {}});
    } else if (e.is_array()) {
      OpenAiRequest::Prompt ids{false, "", {}};
      for (size_t j = 0; j < e.size(); ++j) {
        SPECD_ASSIGN_OR_RETURN(const int32_t id,
                               TokenId(e[j], "prompt", absl::StrCat("prompt[", i, "][", j, "]")));
        ids.ids.push_back(id);
      }
      out->prompts.push_back(std::move(ids));
    } else {
      return FieldError("prompt", kShape);
    }
    if (out->prompts.back().is_text != out->prompts.front().is_text) {
      return FieldError("prompt", "prompt mixes strings and token-id lists");
    }
  }
  return absl::OkStatus();
}

// stop: a string or a list of strings.
absl::Status ParseStop(const Json& body, v1::StoppingCriteria* stopping) {
  const Json& s = JsonField(body, "stop");
  if (s.is_null()) return absl::OkStatus();
  if (s.is_string()) {
    stopping->add_stop(s.get<std::string>());
    return absl::OkStatus();
  }
  if (!s.is_array()) return FieldError("stop", "stop must be a string or a list of strings");
  for (const Json& e : s) {
    if (!e.is_string()) return FieldError("stop", "stop must be a string or a list of strings");
    stopping->add_stop(e.get<std::string>());
  }
  return absl::OkStatus();
}

// specd's extension: {"guidance": {"scale": S, "unconditional_prompt": TEXT or [ids], "draft":
// B}}, classifier-free guidance as in the gRPC API's Guidance (the scale's range and the ids are
// checked there). The unconditional prompt is tokenized as plain text, for chat too.
absl::Status ParseGuidance(const Json& body, v1::GenerateRequest* out) {
  const Json& g = JsonField(body, "guidance");
  if (g.is_null()) return absl::OkStatus();
  if (!g.is_object()) {
    return FieldError("guidance",
                      "guidance must be an object: {\"scale\": S, \"unconditional_prompt\": "
                      "text or token ids, \"draft\": false}");
  }
  for (const auto& [key, value] : g.items()) {
    if (key != "scale" && key != "unconditional_prompt" && key != "draft") {
      return FieldError("guidance", absl::StrCat("guidance has no field \"", key,
                                                 "\" (scale, unconditional_prompt, draft)"));
    }
  }
  v1::Guidance* guidance = out->mutable_guidance();
  const Json& scale = JsonField(g, "scale");
  if (!scale.is_number()) return FieldError("guidance.scale", "guidance.scale must be a number");
  const double s = scale.get<double>();
  // Out of float range counts as out of range, which the request's validation reports.
  guidance->set_scale(std::isfinite(s) && std::fabs(s) < 3e38 ? static_cast<float>(s) : -1.0f);
  const Json& uncond = JsonField(g, "unconditional_prompt");
  constexpr char kShape[] = "guidance.unconditional_prompt must be a string or a list of token ids";
  if (uncond.is_string()) {
    guidance->set_unconditional_text(uncond.get<std::string>());
  } else if (uncond.is_array()) {
    v1::TokenIds* ids = guidance->mutable_unconditional_token_ids();
    for (size_t i = 0; i < uncond.size(); ++i) {
      const Json& id = uncond[i];
      if (!id.is_number_integer() ||
          (id.is_number_unsigned() && id.get<uint64_t>() > std::numeric_limits<int32_t>::max()) ||
          id.get<int64_t>() < std::numeric_limits<int32_t>::min()) {
        return FieldError("guidance.unconditional_prompt", kShape);
      }
      ids->add_ids(static_cast<int32_t>(id.get<int64_t>()));
    }
  } else if (!uncond.is_null()) {
    return FieldError("guidance.unconditional_prompt", kShape);
  }
  const Json& draft = JsonField(g, "draft");
  if (!draft.is_null() && !draft.is_boolean()) {
    return FieldError("guidance.draft", "guidance.draft must be true or false");
  }
  guidance->set_draft(draft.is_boolean() && draft.get<bool>());
  return absl::OkStatus();
}

// OpenAI's logit_bias: {"token id": bias}. The ids and ranges are checked where every request
// is (BuildGenerationRequest), against the model's vocabulary; here only the shape.
absl::Status ParseLogitBias(const Json& body, v1::SamplingParameters* s) {
  const Json& bias = JsonField(body, "logit_bias");
  if (bias.is_null()) return absl::OkStatus();
  constexpr absl::string_view kShape =
      "logit_bias must be an object mapping token ids (as strings) to numbers in [-100, 100]";
  if (!bias.is_object()) return FieldError("logit_bias", kShape);
  for (const auto& [key, value] : bias.items()) {
    int32_t token = 0;
    if (key.empty() || key.size() > 10 || !absl::SimpleAtoi(key, &token) ||
        absl::StrCat(token) != key) {
      return FieldError("logit_bias", absl::StrCat("logit_bias key \"", key.substr(0, 20),
                                                   "\" is not a token id"));
    }
    if (!value.is_number()) return FieldError("logit_bias", kShape);
    (*s->mutable_logit_bias())[token] = static_cast<float>(value.get<double>());
  }
  return absl::OkStatus();
}

// Fields OpenAI defines that specd does not implement: refused rather than silently ignored.
absl::Status RefuseUnsupported(const Json& body, Endpoint endpoint) {
  for (const char* name : {"functions", "function_call", "suffix", "audio", "modalities"}) {
    const Json& v = JsonField(body, name);
    const bool empty =
        v.is_null() || ((v.is_object() || v.is_array() || v.is_string()) && v.empty());
    if (!empty) return FieldError(name, absl::StrCat(name, " is not supported by this server"));
  }
  const Json& format = JsonField(body, "response_format");
  if (!format.is_null() && !(format.is_object() && format.value("type", "") == "text")) {
    return FieldError(
        "response_format",
        "response_format is not supported by this server (only {\"type\": \"text\"})");
  }
  if (endpoint == Endpoint::kChatCompletions && !JsonField(body, "echo").is_null()) {
    return FieldError("echo", "echo is a field of /v1/completions only");
  }
  if (endpoint == Endpoint::kCompletions) {
    for (const char* name : kChatOnlyFields) {
      if (!JsonField(body, name).is_null()) {
        return FieldError(name, absl::StrCat(name, " is a field of /v1/chat/completions only"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(Endpoint endpoint, absl::string_view body_text) {
  SPECD_ASSIGN_OR_RETURN(const Json body, ParseBody(body_text));
  OpenAiRequest out;
  out.endpoint = endpoint;
  const bool chat = endpoint == Endpoint::kChatCompletions;
  SPECD_RETURN_IF_ERROR(RefuseUnsupported(body, endpoint));
  SPECD_ASSIGN_OR_RETURN(out.model, ModelName(body));

  if (chat) {
    SPECD_ASSIGN_OR_RETURN(out.messages, Messages(body));
    SPECD_ASSIGN_OR_RETURN(out.chat_options, ChatOptions(body));
    SPECD_RETURN_IF_ERROR(ParseToolChoice(body, &out));
  } else {
    SPECD_RETURN_IF_ERROR(ParsePrompt(body, &out));
  }

  SPECD_ASSIGN_OR_RETURN(const std::optional<int64_t> n, Integer(body, "n", 1, kMaxN));
  out.n = n.value_or(1);
  const Json& best_of = JsonField(body, "best_of");
  if (!best_of.is_null() && !(best_of.is_number_integer() && best_of.get<int64_t>() == out.n)) {
    return FieldError("best_of", "best_of is not supported (it may only equal n)");
  }
  if (static_cast<int64_t>(std::max<size_t>(1, out.prompts.size())) * out.n > kMaxChoices) {
    return FieldError("n", absl::StrCat(out.prompts.size(), " prompts x n = ", out.n,
                                        " completions; at most ", kMaxChoices, " per request"));
  }
  SPECD_ASSIGN_OR_RETURN(const std::optional<bool> stream, Bool(body, "stream"));
  out.stream = stream.value_or(false);
  const Json& options = JsonField(body, "stream_options");
  if (!options.is_null()) {
    if (!options.is_object()) {
      return FieldError("stream_options", "stream_options must be an object");
    }
    if (!out.stream) {
      return FieldError("stream_options", "stream_options is only allowed when stream is true");
    }
    SPECD_ASSIGN_OR_RETURN(const std::optional<bool> usage, Bool(options, "include_usage"));
    out.include_usage = usage.value_or(false);
  }
  if (!chat) {
    SPECD_ASSIGN_OR_RETURN(const std::optional<bool> echo, Bool(body, "echo"));
    out.echo = echo.value_or(false);
  }
  SPECD_ASSIGN_OR_RETURN(const std::optional<bool> ids, Bool(body, "return_token_ids"));
  out.return_token_ids = ids.value_or(false);

  // Sampling.
  v1::SamplingParameters* s = out.base.mutable_sampling();
  SPECD_ASSIGN_OR_RETURN(const std::optional<double> temperature,
                         Number(body, "temperature", 0.0, 2.0, "in [0, 2]"));
  // OpenAI's default temperature is 1 (sampling); specd's gRPC default is greedy.
  s->set_temperature(static_cast<float>(temperature.value_or(1.0)));
  SPECD_ASSIGN_OR_RETURN(const std::optional<double> top_p,
                         Number(body, "top_p", 0.0, 1.0, "in (0, 1]"));
  if (top_p.has_value() && *top_p <= 0.0) {
    return FieldError("top_p", absl::StrCat("top_p must be in (0, 1], got ", *top_p));
  }
  s->set_top_p(static_cast<float>(top_p.value_or(1.0)));
  SPECD_ASSIGN_OR_RETURN(const std::optional<int64_t> top_k,
                         Integer(body, "top_k", -1, std::numeric_limits<int32_t>::max()));
  s->set_top_k(static_cast<int32_t>(std::max<int64_t>(0, top_k.value_or(0))));  // -1 = off
  SPECD_ASSIGN_OR_RETURN(const std::optional<double> min_p,
                         Number(body, "min_p", 0.0, 1.0, "in [0, 1]"));
  s->set_min_p(static_cast<float>(min_p.value_or(0.0)));
  SPECD_ASSIGN_OR_RETURN(const std::optional<double> repetition,
                         Number(body, "repetition_penalty", 0.0, 1e6, "> 0"));
  if (repetition.has_value() && *repetition <= 0.0) {
    return FieldError("repetition_penalty",
                      absl::StrCat("repetition_penalty must be > 0, got ", *repetition));
  }
  s->set_repetition_penalty(static_cast<float>(repetition.value_or(1.0)));
  SPECD_ASSIGN_OR_RETURN(const std::optional<double> presence,
                         Number(body, "presence_penalty", -2.0, 2.0, "in [-2, 2]"));
  s->set_presence_penalty(static_cast<float>(presence.value_or(0.0)));
  SPECD_ASSIGN_OR_RETURN(const std::optional<double> frequency,
                         Number(body, "frequency_penalty", -2.0, 2.0, "in [-2, 2]"));
  s->set_frequency_penalty(static_cast<float>(frequency.value_or(0.0)));
  SPECD_RETURN_IF_ERROR(ParseLogitBias(body, s));
  const Json& seed = JsonField(body, "seed");
  if (!seed.is_null()) {
    // Any 64-bit integer; a negative one is taken as its two's complement.
    if (!seed.is_number_integer()) return FieldError("seed", "seed must be an integer");
    s->set_seed(seed.is_number_unsigned() ? seed.get<uint64_t>()
                                          : static_cast<uint64_t>(seed.get<int64_t>()));
  }

  // Stopping.
  v1::StoppingCriteria* stopping = out.base.mutable_stopping();
  SPECD_ASSIGN_OR_RETURN(const std::optional<int64_t> max_tokens,
                         Integer(body, "max_tokens", 1, std::numeric_limits<uint32_t>::max()));
  SPECD_ASSIGN_OR_RETURN(
      const std::optional<int64_t> max_completion,
      Integer(body, "max_completion_tokens", 1, std::numeric_limits<uint32_t>::max()));
  if (max_completion.has_value()) {
    stopping->set_max_new_tokens(static_cast<uint32_t>(*max_completion));
  } else if (max_tokens.has_value()) {
    stopping->set_max_new_tokens(static_cast<uint32_t>(*max_tokens));
  }
  SPECD_RETURN_IF_ERROR(ParseStop(body, stopping));
  const Json& stop_ids = JsonField(body, "stop_token_ids");
  if (!stop_ids.is_null()) {
    if (!stop_ids.is_array()) {
      return FieldError("stop_token_ids", "stop_token_ids must be a list of token ids");
    }
    for (const Json& id : stop_ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return FieldError("stop_token_ids", "stop_token_ids must be a list of token ids");
      }
      stopping->add_stop_token_ids(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  SPECD_ASSIGN_OR_RETURN(const std::optional<bool> ignore_eos, Bool(body, "ignore_eos"));
  stopping->set_ignore_eos(ignore_eos.value_or(false));

  // Speculation.
  SPECD_ASSIGN_OR_RETURN(const std::optional<int64_t> k,
                         Integer(body, "num_speculative_tokens", 0, 64));
  if (k.has_value()) {
    out.base.mutable_speculation()->set_num_speculative_tokens(static_cast<uint32_t>(*k));
  }
  // Whether the server may lower K under load (v1::KPolicy); `specd bench --http` asks for
  // "fixed", as its gRPC arms do.
  const Json& policy = JsonField(body, "k_policy");
  if (!policy.is_null()) {
    if (policy == "fixed") {
      out.base.mutable_speculation()->set_k_policy(v1::K_POLICY_FIXED);
    } else if (policy == "adaptive") {
      out.base.mutable_speculation()->set_k_policy(v1::K_POLICY_ADAPTIVE);
    } else {
      return FieldError("k_policy", "k_policy must be \"fixed\" or \"adaptive\"");
    }
  }
  // Who drafts (v1::DraftMethod): the draft model, or prompt lookup by the coordinator.
  const Json& method = JsonField(body, "draft_method");
  if (!method.is_null()) {
    if (method == "model") {
      out.base.mutable_speculation()->set_draft_method(v1::DRAFT_METHOD_MODEL);
    } else if (method == "ngram") {
      out.base.mutable_speculation()->set_draft_method(v1::DRAFT_METHOD_NGRAM);
    } else {
      return FieldError("draft_method", "draft_method must be \"model\" or \"ngram\"");
    }
  }
  // OpenAI's predicted outputs: {"type": "content", "content": text or [{"type": "text",
  // "text": ...}, ...]}, drafted from by lookup (v1::Prediction).
  const Json& prediction = JsonField(body, "prediction");
  if (!prediction.is_null()) {
    constexpr char kShape[] =
        "prediction must be {\"type\": \"content\", \"content\": a string or an array of "
        "{\"type\": \"text\", \"text\": ...} parts}";
    if (!prediction.is_object() || JsonField(prediction, "type") != "content") {
      return FieldError("prediction", kShape);
    }
    const Json& content = JsonField(prediction, "content");
    std::string text;
    if (content.is_string()) {
      text = content.get<std::string>();
    } else if (content.is_array()) {
      for (const Json& part : content) {
        if (!part.is_object() || JsonField(part, "type") != "text" ||
            !JsonField(part, "text").is_string()) {
          return FieldError("prediction", kShape);
        }
        text += JsonField(part, "text").get<std::string>();
      }
    } else {
      return FieldError("prediction", kShape);
    }
    out.base.mutable_speculation()->mutable_prediction()->set_text(std::move(text));
  }
  // A draft tree verified in one target pass (v1::TreeShape); its limits are checked with K's.
  const Json& tree = JsonField(body, "speculation_tree");
  if (!tree.is_null()) {
    if (!tree.is_object()) {
      return FieldError("speculation_tree",
                        "speculation_tree must be an object {\"branching\": B, \"depth\": D}");
    }
    for (const char* part : {"branching", "depth"}) {
      const Json& v = JsonField(tree, part);
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 64) {
        return FieldError("speculation_tree", absl::StrCat("speculation_tree.", part,
                                                           " must be an integer in [0, 64]"));
      }
    }
    v1::TreeShape* shape = out.base.mutable_speculation()->mutable_tree();
    shape->set_branching(static_cast<uint32_t>(tree["branching"].get<int64_t>()));
    shape->set_depth(static_cast<uint32_t>(tree["depth"].get<int64_t>()));
  }
  SPECD_ASSIGN_OR_RETURN(const std::optional<bool> egag, Bool(body, "egag"));
  if (egag.has_value()) out.base.mutable_speculation()->set_egag(*egag);

  // Logprobs: completions take an integer (the number of alternatives), chat a boolean plus
  // top_logprobs.
  if (chat) {
    SPECD_ASSIGN_OR_RETURN(const std::optional<bool> lp, Bool(body, "logprobs"));
    out.logprobs = lp.value_or(false);
    SPECD_ASSIGN_OR_RETURN(const std::optional<int64_t> top, Integer(body, "top_logprobs", 0, 20));
    if (top.has_value() && !out.logprobs) {
      return FieldError("top_logprobs", "top_logprobs needs logprobs set to true");
    }
    out.top_logprobs = static_cast<int32_t>(top.value_or(0));
  } else {
    SPECD_ASSIGN_OR_RETURN(const std::optional<int64_t> lp, Integer(body, "logprobs", 0, 20));
    out.logprobs = lp.has_value();
    out.top_logprobs = static_cast<int32_t>(lp.value_or(0));
  }
  const Json& mode = JsonField(body, "logprobs_mode");
  v1::LogprobsMode logprobs_mode = v1::LOGPROBS_MODE_RAW;
  if (!mode.is_null()) {
    if (mode == "processed_logprobs") {
      logprobs_mode = v1::LOGPROBS_MODE_PROCESSED;
    } else if (mode != "raw_logprobs") {
      return FieldError("logprobs_mode",
                        "logprobs_mode must be \"raw_logprobs\" or \"processed_logprobs\"");
    }
  }
  SPECD_RETURN_IF_ERROR(ParseGuidance(body, &out.base));
  if (out.logprobs) {
    v1::LogprobsParameters* lp = out.base.mutable_logprobs();
    lp->set_enabled(true);
    lp->set_top_logprobs(static_cast<uint32_t>(out.top_logprobs));
    lp->set_mode(logprobs_mode);
    // An echoed prompt reports its tokens' logprobs too (what evaluation harnesses score).
    lp->set_prompt(out.echo);
  }
  return out;
}

absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(absl::string_view body_text) {
  SPECD_ASSIGN_OR_RETURN(const Json body, ParseBody(body_text));
  TokenizeRequest out;
  SPECD_ASSIGN_OR_RETURN(out.model, ModelName(body));
  SPECD_ASSIGN_OR_RETURN(const std::optional<bool> strs, Bool(body, "return_token_strs"));
  out.return_token_strs = strs.value_or(false);
  const Json& prompt = JsonField(body, "prompt");
  out.chat = !JsonField(body, "messages").is_null();
  if (out.chat && !prompt.is_null()) {
    return FieldError("prompt", "give prompt or messages, not both");
  }
  if (!out.chat && prompt.is_null()) {
    return FieldError("prompt", "prompt (a string) or messages (a conversation) is required");
  }
  SPECD_ASSIGN_OR_RETURN(const std::optional<bool> special, Bool(body, "add_special_tokens"));
  if (!out.chat) {
    if (!prompt.is_string()) return FieldError("prompt", "prompt must be a string");
    out.prompt = prompt.get<std::string>();
    out.add_special_tokens = special.value_or(true);
    for (const char* name : kChatOnlyFields) {
      if (!JsonField(body, name).is_null()) {
        return FieldError(name, absl::StrCat(name, " applies to messages, not to a prompt"));
      }
    }
    return out;
  }
  // The ids are what /v1/chat/completions feeds: the special tokens the template writes, and the
  // tokenizer's BOS where it writes none. More on top would be another prompt.
  if (special.value_or(false)) {
    return FieldError("add_special_tokens",
                      "add_special_tokens applies to a prompt; a conversation gets the special "
                      "tokens its chat template writes (and BOS where the template writes none)");
  }
  SPECD_ASSIGN_OR_RETURN(out.messages, Messages(body));
  SPECD_ASSIGN_OR_RETURN(out.chat_options, ChatOptions(body));
  return out;
}

absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(absl::string_view body_text) {
  SPECD_ASSIGN_OR_RETURN(const Json body, ParseBody(body_text));
  DetokenizeRequest out;
  SPECD_ASSIGN_OR_RETURN(out.model, ModelName(body));
  const Json& tokens = JsonField(body, "tokens");
  if (tokens.is_null()) return FieldError("tokens", "tokens is required");
  if (!tokens.is_array()) return FieldError("tokens", "tokens must be a list of token ids");
  for (size_t i = 0; i < tokens.size(); ++i) {
    SPECD_ASSIGN_OR_RETURN(const int32_t id,
                           TokenId(tokens[i], "tokens", absl::StrCat("tokens[", i, "]")));
    out.tokens.push_back(id);
  }
  return out;
}

}  // namespace specd::http
