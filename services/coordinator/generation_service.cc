#include "services/coordinator/generation_service.h"

#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/common/grpc_status.h"
#include "services/common/stream_reactor.h"
#include "services/coordinator/request_metrics.h"

namespace specd {
namespace {

grpc::Status NotReady() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "the coordinator is not connected to its workers yet");
}

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kEosToken:
      return v1::FINISH_REASON_EOS_TOKEN;
    case FinishReason::kStopToken:
      return v1::FINISH_REASON_STOP_TOKEN;
    case FinishReason::kStopString:
      return v1::FINISH_REASON_STOP_STRING;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void ToolCallsToProto(ToolCallFormat format, std::string_view id_stem,
                      const std::vector<ToolCall>& calls, v1::GenerateResponse* out) {
  for (size_t k = 0; k < calls.size(); ++k) {
    v1::ToolCall* call = out->add_tool_calls();
    call->set_id(ToolCallId(format, id_stem, 0, k));
    call->set_name(calls[k].name);
    call->set_arguments(calls[k].arguments);
  }
}

void LogprobToProto(const TokenLogprobs& lp, v1::TokenLogprob* out) {
  out->set_logprob(lp.logprob);
  out->mutable_top_token_ids()->Add(lp.top_ids.begin(), lp.top_ids.end());
  out->mutable_top_logprobs()->Add(lp.top_logprobs.begin(), lp.top_logprobs.end());
}

void UsageToProto(const GenerationUsage& u, v1::Usage* out) {
  out->set_prompt_tokens(static_cast<uint32_t>(u.prompt_tokens));
  out->set_completion_tokens(static_cast<uint32_t>(u.completion_tokens));
  out->set_rounds(static_cast<uint32_t>(u.rounds));
  out->set_draft_tokens(static_cast<uint32_t>(u.draft_tokens));
  out->set_accepted_tokens(static_cast<uint32_t>(u.accepted_tokens));
  out->set_acceptance_rate(u.draft_tokens > 0 ? static_cast<double>(u.accepted_tokens) /
                                                    static_cast<double>(u.draft_tokens)
                                              : 0.0);
  for (const int64_t n : u.accepted_per_position) {
    out->add_accepted_per_position(static_cast<uint32_t>(n));
  }
  out->set_drafting_rounds(static_cast<uint32_t>(u.drafting_rounds));
  v1::RoundTimings* t = out->mutable_timings();
  t->set_rounds(static_cast<uint32_t>(u.timed_rounds));
  t->set_draft_steps(static_cast<uint32_t>(u.timed_draft_steps));
  t->set_draft_forward_ns(static_cast<uint64_t>(absl::ToInt64Nanoseconds(u.draft_forward)));
  t->set_verify_forward_ns(static_cast<uint64_t>(absl::ToInt64Nanoseconds(u.verify_forward)));
  t->set_round_ns(static_cast<uint64_t>(absl::ToInt64Nanoseconds(u.round_time)));
}

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context, grpc::Status status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

// A Generate call refused before it became a stream.
grpc::ServerWriteReactor<v1::GenerateResponse>* Refuse(grpc::Status status) {
  auto* reactor = new QueuedWriteReactor<v1::GenerateResponse>();
  reactor->Close(std::move(status));
  return reactor;
}

// The Tokenize and Detokenize RPCs, run on the work queue.
grpc::Status TokenizeCall(const ServingState& state, const v1::TokenizeRequest& request,
                          v1::TokenizeResponse* response) {
  if (state.tokenizer == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the served model has no tokenizer");
  }
  if (request.has_chat()) {
    if (!request.text().empty() || request.add_special_tokens() || request.parse_special()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "chat: give text or chat, not both (add_special_tokens "
                          "and parse_special apply to text only)");
    }
    absl::StatusOr<std::vector<int32_t>> ids =
        EncodeChat(request.chat(), state.Encoders(), state.limits);
    if (!ids.ok()) return ToGrpcStatus(ids.status());
    response->mutable_token_ids()->Add(ids->begin(), ids->end());
    return grpc::Status::OK;
  }
  if (static_cast<int64_t>(request.text().size()) > state.limits.max_prompt_bytes) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("text is ", request.text().size(),
                                     " bytes, over the limit of ", state.limits.max_prompt_bytes));
  }
  EncodeOptions options;
  options.add_bos = request.add_special_tokens();
  options.parse_special = request.parse_special();
  absl::StatusOr<std::vector<int32_t>> ids = state.tokenizer->Encode(request.text(), options);
  if (!ids.ok()) return ToGrpcStatus(ids.status());
  response->mutable_token_ids()->Add(ids->begin(), ids->end());
  return grpc::Status::OK;
}

grpc::Status DetokenizeCall(const ServingState& state, const v1::DetokenizeRequest& request,
                            v1::DetokenizeResponse* response) {
  if (state.tokenizer == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the served model has no tokenizer");
  }
  const std::vector<int32_t> ids(request.token_ids().begin(), request.token_ids().end());
  absl::StatusOr<std::string> text = state.tokenizer->Decode(ids, request.skip_special_tokens());
  if (!text.ok()) return ToGrpcStatus(text.status());
  response->set_text(*std::move(text));
  return grpc::Status::OK;
}

// A reply to a chat request with tools: its events are held while they may be a call's
// beginning, then sent together (tool_call_stream.h).
class HeldToolReply {
 public:
  HeldToolReply(ToolCallPolicy policy, std::string id_stem)
      : policy_(std::move(policy)), stream_(policy_), id_stem_(std::move(id_stem)) {}
  HeldToolReply(const HeldToolReply&) = delete;
  HeldToolReply& operator=(const HeldToolReply&) = delete;

  // Adds `event` to the reply; the message to send now, or nullopt while it is held. The last
  // event's message carries the calls when the reply is calls.
  std::optional<v1::GenerateResponse> Add(const GenerationEvent& event,
                                          CoordinatorMetrics* metrics) {
    text_ += event.text;
    tokens_.insert(tokens_.end(), event.tokens.begin(), event.tokens.end());
    logprobs_.insert(logprobs_.end(), event.logprobs.begin(), event.logprobs.end());
    const bool last = event.finish != FinishReason::kNone;
    std::optional<ToolCallStream::Chunk> chunk = stream_.Next(text_, tokens_.size(), last);
    if (!chunk.has_value()) return std::nullopt;
    v1::GenerateResponse msg;
    msg.mutable_token_ids()->Add(tokens_.begin() + static_cast<std::ptrdiff_t>(chunk->begin_token),
                                 tokens_.begin() + static_cast<std::ptrdiff_t>(chunk->end_token));
    if (logprobs_.size() >= chunk->end_token) {
      for (size_t i = chunk->begin_token; i < chunk->end_token; ++i) {
        LogprobToProto(logprobs_[i], msg.add_logprobs());
      }
    }
    msg.set_text(std::move(chunk->content));
    if (chunk->calls.has_value()) {
      ToolCallsToProto(policy_.format, id_stem_, *chunk->calls, &msg);
      if (metrics != nullptr) metrics->OnToolCallReply(static_cast<int64_t>(chunk->calls->size()));
    }
    return msg;
  }

 private:
  const ToolCallPolicy policy_;
  ToolCallStream stream_;
  const std::string id_stem_;
  std::string text_;
  std::vector<int32_t> tokens_;
  std::vector<TokenLogprobs> logprobs_;
};

}  // namespace

PromptEncoders ServingState::Encoders() const {
  PromptEncoders e;
  e.tokenizer = tokenizer;
  if (tokenizer != nullptr && chat != nullptr) {
    e.chat = [chat = chat, tokenizer = tokenizer](const nlohmann::ordered_json& messages,
                                                  const ChatPromptOptions& options) {
      return chat->Encode(messages, *tokenizer, options);
    };
  }
  return e;
}

// A counted Generate stream: its bookkeeping is undone as it finishes, the one point every
// stream passes however it ended (finished, failed, cancelled or ended by a drain), and before
// the client has the status: a client that starts its next call then finds its slot free.
class GenerationService::GenerateReactor final : public QueuedWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(GenerationService* service, std::string peer)
      : service_(service), peer_(std::move(peer)) {}
  // Set when the stream is counted, under the lock that also makes it visible to the drain, so
  // nothing can finish the reactor before.
  void set_id(uint64_t id) { id_ = id; }
  const std::string& peer() const { return peer_; }

 private:
  void OnFinishing() override {
    if (id_ != 0) service_->CloseStream(id_, peer_);
  }

  GenerationService* const service_;
  const std::string peer_;
  uint64_t id_ = 0;
};

// One Generate stream, shared by its scheduler sink and the drain: whichever ends the stream
// first closes the reactor, and every later Send or Close is dropped, so nothing touches the
// reactor after its Close (which may delete it).
class GenerationService::GenerateCall {
 public:
  explicit GenerateCall(QueuedWriteReactor<v1::GenerateResponse>* reactor) : reactor_(reactor) {}

  // False, dropping `message`, once the stream is closed.
  bool Send(v1::GenerateResponse message) {
    absl::MutexLock lock(&mu_);
    if (reactor_ == nullptr) return false;
    reactor_->Send(std::move(message));
    return true;
  }

  // True when this closed the stream, false when it was closed already.
  bool Close(grpc::Status status) {
    QueuedWriteReactor<v1::GenerateResponse>* reactor = nullptr;
    {
      absl::MutexLock lock(&mu_);
      reactor = std::exchange(reactor_, nullptr);
    }
    // No Send can be under way: it would hold mu_ and see the reactor.
    if (reactor == nullptr) return false;
    reactor->Close(std::move(status));
    return true;
  }

  // True when the client went away or the stream was ended here: the request is wasted work.
  bool abandoned() const {
    absl::MutexLock lock(&mu_);
    return reactor_ == nullptr || reactor_->cancelled();
  }

  // Known once Submit returns; events may start before that.
  std::atomic<Scheduler::RequestHandle> handle{0};
  // Set once CancelAbandoned has cancelled the request, so it does so once.
  std::atomic<bool> cancel_sent{false};

 private:
  mutable absl::Mutex mu_;
  QueuedWriteReactor<v1::GenerateResponse>* reactor_ ABSL_GUARDED_BY(mu_);  // null once closed
};

grpc::Status GenerationService::OpenStream(GenerateReactor* reactor,
                                           std::shared_ptr<GenerateCall> call) {
  const std::string& peer = reactor->peer();
  absl::MutexLock lock(&streams_mu_);
  if (!admitting_) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the coordinator is shutting down and admits no new requests; retry on "
                        "another replica");
  }
  int64_t& count = streams_per_peer_[peer];
  if (options_.max_streams_per_connection > 0 && count >= options_.max_streams_per_connection) {
    if (count == 0) streams_per_peer_.erase(peer);
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("this connection already has ", count,
                     " Generate streams open, the server's limit per connection "
                     "(--max-streams-per-connection); wait for one to finish or open another "
                     "connection"));
  }
  ++count;
  const uint64_t id = next_stream_id_++;
  reactor->set_id(id);
  open_streams_.emplace(id, std::move(call));
  return grpc::Status::OK;
}

void GenerationService::CloseStream(uint64_t id, const std::string& peer) {
  absl::MutexLock lock(&streams_mu_);
  open_streams_.erase(id);
  const auto it = streams_per_peer_.find(peer);
  if (it != streams_per_peer_.end() && --it->second <= 0) streams_per_peer_.erase(it);
}

void GenerationService::StopAdmitting() {
  absl::MutexLock lock(&streams_mu_);
  admitting_ = false;
}

int64_t GenerationService::open_streams() const {
  absl::MutexLock lock(&streams_mu_);
  return static_cast<int64_t>(open_streams_.size());
}

void GenerationService::CancelAbandoned() {
  const ServingState* state = state_.load();
  if (state == nullptr) return;
  std::vector<std::shared_ptr<GenerateCall>> calls;
  {
    absl::MutexLock lock(&streams_mu_);
    for (const auto& [id, call] : open_streams_) calls.push_back(call);
  }
  for (const std::shared_ptr<GenerateCall>& call : calls) {
    const Scheduler::RequestHandle h = call->handle.load();
    if (h != 0 && !call->cancel_sent.load() && call->abandoned()) {
      call->cancel_sent.store(true);
      state->scheduler->Cancel(h);
    }
  }
}

int64_t GenerationService::EndOpenStreams(const grpc::Status& status) {
  std::vector<std::shared_ptr<GenerateCall>> calls;
  {
    // Closing under streams_mu_ could deadlock: a reactor deleted at once takes it again.
    absl::MutexLock lock(&streams_mu_);
    for (const auto& [id, call] : open_streams_) calls.push_back(call);
  }
  const ServingState* state = state_.load();
  int64_t ended = 0;
  for (const std::shared_ptr<GenerateCall>& call : calls) {
    // Frees the sequence on the workers; the scheduler's own CANCELLED event is then dropped.
    if (const Scheduler::RequestHandle h = call->handle.load(); h != 0 && state != nullptr) {
      state->scheduler->Cancel(h);
    }
    if (!call->Close(status)) continue;
    ++ended;
    if (state != nullptr && state->metrics != nullptr) {
      state->metrics->OnRequestError(FromGrpcStatus(status).code());
    }
  }
  return ended;
}

uint64_t GenerationService::RandomSeed() {
  absl::MutexLock lock(&rng_mu_);
  return rng_();
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  const ServingState* state = state_.load();
  CoordinatorMetrics* const metrics = state != nullptr ? state->metrics : nullptr;
  auto refuse = [metrics](grpc::Status status) {
    if (metrics != nullptr) metrics->OnRequestError(FromGrpcStatus(status).code());
    return Refuse(std::move(status));
  };
  if (grpc::Status st = options_.auth.Check(*context); !st.ok()) return refuse(std::move(st));
  if (state == nullptr) return Refuse(NotReady());

  auto* reactor = new GenerateReactor(this, context->peer());
  auto call = std::make_shared<GenerateCall>(reactor);
  if (grpc::Status st = OpenStream(reactor, call); !st.ok()) {
    if (metrics != nullptr) metrics->OnRequestError(FromGrpcStatus(st).code());
    call->Close(std::move(st));
    return reactor;
  }
  // A prompt of up to --max-request-bytes is tens of milliseconds of tokenizer: not on the
  // callback thread. The request is copied, as gRPC frees it once the stream is closed, which a
  // drain may do before the task runs.
  prep_.Post([this, state, call, request = *request] { StartGeneration(*state, call, request); });
  return reactor;
}

void GenerationService::StartGeneration(const ServingState& state,
                                        const std::shared_ptr<GenerateCall>& call,
                                        const v1::GenerateRequest& request) {
  CoordinatorMetrics* const metrics = state.metrics;
  if (call->abandoned()) {
    // The client went away or a drain ended the stream while it waited for the queue.
    if (call->Close(grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled")) &&
        metrics != nullptr) {
      metrics->OnRequestError(absl::StatusCode::kCancelled);
    }
    return;
  }
  absl::StatusOr<GenerationRequest> req =
      BuildGenerationRequest(request, state.Encoders(), state.limits, RandomSeed());
  if (!req.ok()) {
    if (metrics != nullptr) metrics->OnRequestError(req.status().code());
    call->Close(ToGrpcStatus(req.status()));
    return;
  }
  const uint64_t seed = req->seed;
  const GuidanceKind guidance = GuidanceOf(*req);
  const std::string request_id = request.request_id();
  Scheduler* scheduler = state.scheduler;
  auto first = std::make_shared<bool>(true);
  auto timing = std::make_shared<RequestTiming>();
  // Sent back with the prompt's logprobs: a text prompt's ids are the server's to tell.
  auto prompt = std::make_shared<const std::vector<int32_t>>(
      req->prompt_logprobs.mode != LogprobsMode::kOff ? req->prompt : std::vector<int32_t>());
  std::shared_ptr<HeldToolReply> tools;
  if (ToolCallPolicy policy = ToolCallPolicyOf(request, state.chat); policy.parses()) {
    tools =
        std::make_shared<HeldToolReply>(std::move(policy), absl::StrFormat("%016x", RandomSeed()));
  }
  auto sink = [call, scheduler, first, seed, guidance, request_id, metrics, timing, prompt,
               tools](GenerationEvent event) {
    const bool last = event.finish != FinishReason::kNone || !event.error.ok();
    if (!last && call->abandoned()) {
      // The client went away, its deadline passed or a drain ended the stream: free the
      // sequence within a round.
      if (const Scheduler::RequestHandle h = call->handle.load(); h != 0) scheduler->Cancel(h);
      return;
    }
    if (!event.error.ok()) {
      if (call->Close(ToGrpcStatus(event.error)) && metrics != nullptr) {
        RecordEvent(*metrics, *timing, guidance, event);
      }
      return;
    }
    v1::GenerateResponse msg;
    if (tools != nullptr && !event.prompt_logprobs.has_value()) {
      std::optional<v1::GenerateResponse> released = tools->Add(event, metrics);
      if (!released.has_value()) {
        if (metrics != nullptr) RecordEvent(*metrics, *timing, guidance, event);
        return;
      }
      msg = *std::move(released);
    } else {
      msg.mutable_token_ids()->Add(event.tokens.begin(), event.tokens.end());
      for (const TokenLogprobs& lp : event.logprobs) LogprobToProto(lp, msg.add_logprobs());
      if (event.prompt_logprobs.has_value()) {
        msg.mutable_prompt_token_ids()->Add(prompt->begin(), prompt->end());
        for (const TokenLogprobs& lp : *event.prompt_logprobs) {
          LogprobToProto(lp, msg.add_prompt_logprobs());
        }
      }
      msg.set_text(std::move(event.text));
    }
    msg.set_request_id(request_id);
    if (*first) {
      msg.set_seed(seed);
      *first = false;
    }
    if (last) {
      msg.set_finish_reason(msg.tool_calls_size() > 0 ? v1::FINISH_REASON_TOOL_CALLS
                                                      : ToProto(event.finish));
      UsageToProto(event.usage, msg.mutable_usage());
    }
    // A stream the drain already ended gets nothing more, and is not counted twice.
    if (!call->Send(std::move(msg))) return;
    if (metrics != nullptr) RecordEvent(*metrics, *timing, guidance, event);
    if (last) call->Close(grpc::Status::OK);
  };
  absl::StatusOr<Scheduler::RequestHandle> h = scheduler->Submit(*std::move(req), sink);
  if (!h.ok()) {
    if (metrics != nullptr) metrics->OnRequestError(h.status().code());
    call->Close(ToGrpcStatus(h.status()));
    return;
  }
  call->handle.store(*h);
  if (metrics != nullptr) metrics->OnGuidedRequest(guidance);
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                      const v1::TokenizeRequest* request,
                                                      v1::TokenizeResponse* response) {
  if (grpc::Status st = options_.auth.Check(*context); !st.ok()) return Reply(context, st);
  const ServingState* state = state_.load();
  if (state == nullptr) return Reply(context, NotReady());
  // gRPC keeps the request and response until the reactor finishes.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  prep_.Post([state, request, response, reactor] {
    reactor->Finish(TokenizeCall(*state, *request, response));
  });
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::Detokenize(grpc::CallbackServerContext* context,
                                                        const v1::DetokenizeRequest* request,
                                                        v1::DetokenizeResponse* response) {
  if (grpc::Status st = options_.auth.Check(*context); !st.ok()) return Reply(context, st);
  const ServingState* state = state_.load();
  if (state == nullptr) return Reply(context, NotReady());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  prep_.Post([state, request, response, reactor] {
    reactor->Finish(DetokenizeCall(*state, *request, response));
  });
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::GetServerInfo(grpc::CallbackServerContext* context,
                                                           const v1::GetServerInfoRequest* request,
                                                           v1::GetServerInfoResponse* response) {
  (void)request;
  if (grpc::Status st = options_.auth.Check(*context); !st.ok()) return Reply(context, st);
  const ServingState* state = state_.load();
  if (state == nullptr) return Reply(context, NotReady());
  *response = state->info;
  return Reply(context, grpc::Status::OK);
}

}  // namespace specd
