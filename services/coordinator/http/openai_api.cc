#include "services/coordinator/http/openai_api.h"

#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "services/coordinator/http/openai_response.h"
#include "services/coordinator/request_validation.h"

namespace specd::http {
namespace {

HttpResponse JsonResponse(int status, const Json& body) {
  HttpResponse r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, Json::error_handler_t::replace);
  return r;
}

HttpResponse ErrorResponse(const absl::Status& status) {
  HttpResponse r = JsonResponse(HttpStatusOf(status.code()), ErrorJson(status));
  if (status.code() == absl::StatusCode::kUnauthenticated) {
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
  }
  return r;
}

absl::Status NotReady() {
  return absl::UnavailableError("the coordinator is not connected to its workers yet");
}

// A URL path segment with its %XX escapes decoded (a malformed escape stays as written).
std::string PercentDecoded(absl::string_view segment) {
  std::string out;
  auto hex = [](char c) {
    return absl::ascii_isdigit(c) ? c - '0' : absl::ascii_tolower(c) - 'a' + 10;
  };
  for (size_t i = 0; i < segment.size(); ++i) {
    if (segment[i] == '%' && i + 2 < segment.size() && absl::ascii_isxdigit(segment[i + 1]) &&
        absl::ascii_isxdigit(segment[i + 2])) {
      out.push_back(static_cast<char>(hex(segment[i + 1]) * 16 + hex(segment[i + 2])));
      i += 2;
    } else {
      out.push_back(segment[i]);
    }
  }
  return out;
}

// An error encoding a conversation names `messages` unless it names another field.
absl::Status ConversationError(const absl::Status& status) {
  return FieldOf(status).empty() ? FieldError("messages", status.message(), status.code()) : status;
}

// A request may name the served model or none; another is 404, as OpenAI's API answers.
absl::Status CheckModel(const std::string& model, const ServingState& state) {
  const std::string& served = state.info.served_model_name();
  if (model.empty() || model == served) return absl::OkStatus();
  return FieldError(
      "model",
      absl::StrCat("the model '", model, "' does not exist; this server serves '", served, "'"),
      absl::StatusCode::kNotFound);
}

absl::StatusOr<Json> Tokenize(absl::string_view body, const ServingState& state) {
  SPECD_ASSIGN_OR_RETURN(const TokenizeRequest request, ParseTokenizeRequest(body));
  SPECD_RETURN_IF_ERROR(CheckModel(request.model, state));
  if (state.tokenizer == nullptr) {
    return absl::FailedPreconditionError("the served model has no tokenizer");
  }
  std::vector<int32_t> ids;
  if (request.chat) {
    if (state.chat == nullptr) {
      return FieldError("messages", "the served model has no chat template");
    }
    absl::StatusOr<std::vector<int32_t>> encoded =
        state.chat->Encode(request.messages, *state.tokenizer, request.chat_options);
    if (!encoded.ok()) return ConversationError(encoded.status());
    ids = *std::move(encoded);
  } else {
    if (static_cast<int64_t>(request.prompt.size()) > state.limits.max_prompt_bytes) {
      return FieldError(
          "prompt", absl::StrCat("prompt is ", request.prompt.size(), " bytes, over the limit of ",
                                 state.limits.max_prompt_bytes));
    }
    // As /v1/completions encodes a text prompt, or without the special tokens.
    EncodeOptions options;
    if (!request.add_special_tokens) options.add_bos = false;
    absl::StatusOr<std::vector<int32_t>> encoded = state.tokenizer->Encode(request.prompt, options);
    if (!encoded.ok()) return FieldError("prompt", encoded.status().message());
    ids = *std::move(encoded);
  }
  Json out = {{"count", ids.size()},
              {"max_model_len", state.limits.max_seq_len},
              {"tokens", ids},
              {"token_strs", nullptr}};
  if (request.return_token_strs) {
    Json strs = Json::array();
    for (const int32_t id : ids) {
      SPECD_ASSIGN_OR_RETURN(std::string piece, state.tokenizer->IdToPiece(id));
      strs.push_back(std::move(piece));
    }
    out["token_strs"] = std::move(strs);
  }
  return out;
}

absl::StatusOr<Json> Detokenize(absl::string_view body, const ServingState& state) {
  SPECD_ASSIGN_OR_RETURN(const DetokenizeRequest request, ParseDetokenizeRequest(body));
  SPECD_RETURN_IF_ERROR(CheckModel(request.model, state));
  if (state.tokenizer == nullptr) {
    return absl::FailedPreconditionError("the served model has no tokenizer");
  }
  absl::StatusOr<std::string> text = state.tokenizer->Decode(request.tokens);
  if (!text.ok()) return FieldError("tokens", text.status().message());
  return Json{{"prompt", *std::move(text)}};
}

}  // namespace

OpenAiApi::OpenAiApi(OpenAiApiOptions options, WorkQueue& prep)
    : options_(std::move(options)), prep_(prep) {}

void OpenAiApi::StopAdmitting() {
  absl::MutexLock lock(&mu_);
  admitting_ = false;
}

int64_t OpenAiApi::open_requests() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(open_.size()) + preparing_;
}

int64_t OpenAiApi::EndOpenRequests(const absl::Status& status) {
  std::vector<std::shared_ptr<CompletionJob>> jobs;
  {
    // Ending a job takes mu_ again (its on_done), so not under the lock.
    absl::MutexLock lock(&mu_);
    ended_ = status;
    for (const auto& [id, job] : open_) jobs.push_back(job);
  }
  for (const std::shared_ptr<CompletionJob>& job : jobs) job->End(status);
  return static_cast<int64_t>(jobs.size());
}

uint64_t OpenAiApi::RandomWord() {
  absl::MutexLock lock(&rng_mu_);
  return rng_();
}

void OpenAiApi::Handle(std::shared_ptr<HttpExchange> exchange) {
  const HttpRequest& req = exchange->request();
  const ServingState* state = state_.load();
  CoordinatorMetrics* const metrics = state != nullptr ? state->metrics : nullptr;
  auto refuse = [&](const absl::Status& st) {
    if (metrics != nullptr) metrics->OnRequestError(st.code());
    exchange->Respond(ErrorResponse(st));
  };
  const std::string& path = req.path;
  const bool completions = path == "/v1/completions";
  const bool chat = path == "/v1/chat/completions";
  const bool models = path == "/v1/models";
  // GET /v1/models/{id} (the SDKs' models.retrieve); an id may hold '/' ("meta-llama/...").
  constexpr absl::string_view kModelPrefix = "/v1/models/";
  const bool one_model = absl::StartsWith(path, kModelPrefix) && path.size() > kModelPrefix.size();
  const bool tokenize = path == "/tokenize";
  const bool detokenize = path == "/detokenize";
  if (path == "/health") {
    // Open without a token, like the gRPC health service: load balancers probe it.
    bool admitting = true;
    {
      absl::MutexLock lock(&mu_);
      admitting = admitting_;
    }
    const absl::Status target = state != nullptr && state->scheduler != nullptr
                                    ? state->scheduler->TargetStatus()
                                    : absl::OkStatus();
    if (state == nullptr || !admitting) {
      exchange->Respond(ErrorResponse(
          state == nullptr ? NotReady()
                           : absl::UnavailableError("the coordinator is shutting down")));
    } else if (!target.ok()) {
      exchange->Respond(ErrorResponse(target));
    } else {
      exchange->Respond(JsonResponse(200, {{"status", "ok"}}));
    }
    return;
  }
  if (!completions && !chat && !models && !one_model && !tokenize && !detokenize) {
    exchange->Respond(ErrorResponse(absl::NotFoundError(
        absl::StrCat("no route ", req.method, " ", path,
                     "; this server has POST /v1/completions, POST /v1/chat/completions, "
                     "GET /v1/models[/ID], POST /tokenize, POST /detokenize and GET /health"))));
    return;
  }
  const char* method = models || one_model ? "GET" : "POST";
  if (req.method != method) {
    HttpResponse r = JsonResponse(405, ErrorJson(absl::InvalidArgumentError(absl::StrCat(
                                           path, " takes ", method, ", not ", req.method))));
    r.headers.emplace_back("Allow", method);
    exchange->Respond(std::move(r));
    return;
  }
  std::optional<absl::string_view> authorization;
  if (req.headers.contains("authorization")) authorization = req.Header("authorization");
  if (absl::Status st = options_.auth.CheckAuthorization(authorization); !st.ok()) {
    refuse(st);
    return;
  }
  if (state == nullptr) {
    exchange->Respond(ErrorResponse(NotReady()));
    return;
  }
  if (tokenize || detokenize) {
    // Not generation requests: their errors are not counted with those.
    prep_.Post([exchange, state, tokenize] {
      const std::string& body = exchange->request().body;
      absl::StatusOr<Json> out = tokenize ? Tokenize(body, *state) : Detokenize(body, *state);
      exchange->Respond(out.ok() ? JsonResponse(200, *out) : ErrorResponse(out.status()));
    });
    return;
  }
  if (models || one_model) {
    Json model = {{"id", state->info.served_model_name()},
                  {"object", "model"},
                  {"created", absl::ToUnixSeconds(absl::Now())},
                  {"owned_by", "specd"},
                  {"max_model_len", state->limits.max_seq_len}};
    if (models) {
      exchange->Respond(JsonResponse(200, {{"object", "list"}, {"data", Json::array({model})}}));
      return;
    }
    const absl::Status known = CheckModel(PercentDecoded(path.substr(kModelPrefix.size())), *state);
    exchange->Respond(known.ok() ? JsonResponse(200, model) : ErrorResponse(known));
    return;
  }
  bool admitted = false;
  {
    // Admitted here, in arrival order, so that a request that arrived before a drain began is
    // served even if it is still being prepared when it does.
    absl::MutexLock lock(&mu_);
    admitted = admitting_;
    if (admitted) ++preparing_;
  }
  if (!admitted) {
    refuse(absl::UnavailableError(
        "the coordinator is shutting down and admits no new requests; retry on another "
        "replica"));
    return;
  }
  const Endpoint endpoint = completions ? Endpoint::kCompletions : Endpoint::kChatCompletions;
  prep_.Post([this, exchange, endpoint, state] { HandleGeneration(exchange, endpoint, *state); });
}

absl::StatusOr<std::vector<CompletionJob::ChoiceInput>> OpenAiApi::BuildChoices(
    const OpenAiRequest& request, const ServingState& state) {
  const PromptEncoders encoders = state.Encoders();
  const bool chat = request.endpoint == Endpoint::kChatCompletions;
  // How the HTTP API names the fields whose gRPC names differ.
  FieldNames names;
  names.prompt = chat ? "messages" : "prompt";
  names.max_new_tokens = "max_tokens";
  names.top_logprobs = chat ? "top_logprobs" : "logprobs";
  names.prompt_logprobs = "echo";
  names.draft_method = "draft_method";
  names.tree = "speculation_tree";
  names.egag = "egag";
  names.prediction = "prediction";
  names.guidance_text = "guidance.unconditional_prompt";
  names.guidance_ids = "guidance.unconditional_prompt";
  // One seed for every choice when the client gives none: the choices differ by their sample
  // number, as a seeded request's do.
  const uint64_t seed = RandomWord();
  std::vector<v1::GenerateRequest> prompts;
  std::vector<std::string> echoes;
  if (chat) {
    if (state.tokenizer == nullptr || state.chat == nullptr) {
      return FieldError("messages", "the served model has no tokenizer, so no chat template");
    }
    absl::StatusOr<std::vector<int32_t>> ids =
        state.chat->Encode(request.messages, *state.tokenizer, request.chat_options);
    if (!ids.ok()) return ConversationError(ids.status());
    v1::GenerateRequest r = request.base;
    r.mutable_token_ids()->mutable_ids()->Add(ids->begin(), ids->end());
    prompts.push_back(std::move(r));
    echoes.emplace_back();
  } else {
    for (const OpenAiRequest::Prompt& p : request.prompts) {
      v1::GenerateRequest r = request.base;
      std::string echo;
      if (p.is_text) {
        r.set_text(p.text);
        echo = p.text;
      } else {
        r.mutable_token_ids()->mutable_ids()->Add(p.ids.begin(), p.ids.end());
        if (request.echo && state.tokenizer != nullptr) {
          absl::StatusOr<std::string> text = state.tokenizer->Decode(p.ids);
          if (text.ok()) echo = *std::move(text);
        }
      }
      prompts.push_back(std::move(r));
      echoes.push_back(request.echo ? std::move(echo) : std::string());
    }
  }
  std::vector<CompletionJob::ChoiceInput> out;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int64_t j = 0; j < request.n; ++j) {
      v1::GenerateRequest r = prompts[p];
      r.mutable_sampling()->set_sample(static_cast<uint32_t>(j));
      absl::StatusOr<GenerationRequest> built =
          BuildGenerationRequest(r, encoders, state.limits, seed, names);
      if (!built.ok()) return built.status();
      out.push_back({*std::move(built), echoes[p]});
    }
  }
  return out;
}

void OpenAiApi::HandleGeneration(const std::shared_ptr<HttpExchange>& exchange, Endpoint endpoint,
                                 const ServingState& state) {
  CoordinatorMetrics* const metrics = state.metrics;
  auto refuse = [&](const absl::Status& st) {
    {
      absl::MutexLock lock(&mu_);
      --preparing_;
    }
    if (metrics != nullptr) metrics->OnRequestError(st.code());
    exchange->Respond(ErrorResponse(st));
  };
  absl::StatusOr<OpenAiRequest> request = ParseOpenAiRequest(endpoint, exchange->request().body);
  if (!request.ok()) {
    refuse(request.status());
    return;
  }
  if (absl::Status model = CheckModel(request->model, state); !model.ok()) {
    refuse(model);
    return;
  }
  absl::StatusOr<std::vector<CompletionJob::ChoiceInput>> choices = BuildChoices(*request, state);
  if (!choices.ok()) {
    refuse(choices.status());
    return;
  }
  CompletionJob::Meta meta;
  meta.id =
      absl::StrFormat("%s-%016x%08x", endpoint == Endpoint::kChatCompletions ? "chatcmpl" : "cmpl",
                      RandomWord(), static_cast<uint32_t>(RandomWord()));
  meta.model = state.info.served_model_name();
  meta.created = absl::ToUnixSeconds(absl::Now());
  std::optional<absl::Status> ended;
  std::shared_ptr<CompletionJob> job;
  {
    absl::MutexLock lock(&mu_);
    ended = ended_;
    if (!ended.has_value()) {
      --preparing_;
      const uint64_t id = next_job_++;
      job =
          std::make_shared<CompletionJob>(exchange, *request, std::move(meta), &state, [this, id] {
            absl::MutexLock lock(&mu_);
            open_.erase(id);
          });
      open_.emplace(id, job);
    }
  }
  if (ended.has_value()) {
    // The drain ended the open requests while this one was being prepared.
    refuse(*ended);
    return;
  }
  job->Start(*std::move(choices));
}

}  // namespace specd::http
