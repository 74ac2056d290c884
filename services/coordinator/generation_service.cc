#include "services/coordinator/generation_service.h"

#include "absl/strings/str_cat.h"
#include "services/common/grpc_status.h"
#include "services/common/stream_reactor.h"

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

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kEosToken:
      return "eos_token";
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kNone:
      break;
  }
  return "none";
}

// A streamed request's clock: latencies are measured where the events leave the scheduler.
struct RequestTiming {
  absl::Time arrival = absl::Now();
  absl::Time last_tokens = absl::InfinitePast();
};

void RecordEvent(CoordinatorMetrics& metrics, RequestTiming& timing, const GenerationEvent& e) {
  const absl::Time now = absl::Now();
  if (!e.tokens.empty()) {
    if (timing.last_tokens == absl::InfinitePast()) {
      metrics.OnFirstToken(now - timing.arrival);
    } else {
      metrics.OnTokens(static_cast<int64_t>(e.tokens.size()), now - timing.last_tokens);
    }
    timing.last_tokens = now;
  }
  if (!e.error.ok()) {
    metrics.OnRequestError(e.error.code());
  } else if (e.finish != FinishReason::kNone) {
    RequestMetrics r;
    r.finish_reason = FinishReasonName(e.finish);
    r.prompt_tokens = e.usage.prompt_tokens;
    r.completion_tokens = e.usage.completion_tokens;
    r.drafting_rounds = e.usage.drafting_rounds;
    r.draft_tokens = e.usage.draft_tokens;
    r.accepted_tokens = e.usage.accepted_tokens;
    r.accepted_per_position = e.usage.accepted_per_position;
    r.duration = now - timing.arrival;
    metrics.OnRequestFinished(r);
  }
}

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* context, grpc::Status status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

}  // namespace

uint64_t GenerationService::RandomSeed() {
  absl::MutexLock lock(&rng_mu_);
  return rng_();
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto* reactor = new QueuedWriteReactor<v1::GenerateResponse>();
  const ServingState* state = state_.load();
  if (state == nullptr) {
    reactor->Close(NotReady());
    return reactor;
  }
  absl::StatusOr<GenerationRequest> req =
      BuildGenerationRequest(*request, state->tokenizer, state->limits, RandomSeed());
  CoordinatorMetrics* const metrics = state->metrics;
  if (!req.ok()) {
    if (metrics != nullptr) metrics->OnRequestError(req.status().code());
    reactor->Close(ToGrpcStatus(req.status()));
    return reactor;
  }
  const uint64_t seed = req->seed;
  const std::string request_id = request->request_id();
  Scheduler* scheduler = state->scheduler;
  // The handle becomes known after Submit returns, but events may start before that.
  auto handle = std::make_shared<std::atomic<Scheduler::RequestHandle>>(0);
  auto first = std::make_shared<bool>(true);
  auto timing = std::make_shared<RequestTiming>();
  auto sink = [reactor, scheduler, handle, first, seed, request_id, metrics,
               timing](GenerationEvent event) {
    const bool last = event.finish != FinishReason::kNone || !event.error.ok();
    if (!last && reactor->cancelled()) {
      // The client went away or its deadline passed: free the sequence within a round.
      if (const Scheduler::RequestHandle h = handle->load(); h != 0) scheduler->Cancel(h);
      return;
    }
    if (metrics != nullptr) RecordEvent(*metrics, *timing, event);
    if (!event.error.ok()) {
      reactor->Close(ToGrpcStatus(event.error));
      return;
    }
    v1::GenerateResponse msg;
    msg.mutable_token_ids()->Add(event.tokens.begin(), event.tokens.end());
    msg.set_text(std::move(event.text));
    msg.set_request_id(request_id);
    if (*first) {
      msg.set_seed(seed);
      *first = false;
    }
    if (last) {
      msg.set_finish_reason(ToProto(event.finish));
      UsageToProto(event.usage, msg.mutable_usage());
    }
    reactor->Send(std::move(msg));
    if (last) reactor->Close(grpc::Status::OK);
  };
  absl::StatusOr<Scheduler::RequestHandle> h = scheduler->Submit(*std::move(req), sink);
  if (!h.ok()) {
    if (metrics != nullptr) metrics->OnRequestError(h.status().code());
    reactor->Close(ToGrpcStatus(h.status()));
    return reactor;
  }
  handle->store(*h);
  (void)context;
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                      const v1::TokenizeRequest* request,
                                                      v1::TokenizeResponse* response) {
  const ServingState* state = state_.load();
  if (state == nullptr) return Reply(context, NotReady());
  if (state->tokenizer == nullptr) {
    return Reply(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                       "the served model has no tokenizer"));
  }
  if (static_cast<int64_t>(request->text().size()) > state->limits.max_prompt_bytes) {
    return Reply(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                       absl::StrCat("text is ", request->text().size(),
                                                    " bytes, over the limit of ",
                                                    state->limits.max_prompt_bytes)));
  }
  EncodeOptions options;
  options.add_bos = request->add_special_tokens();
  options.parse_special = request->parse_special();
  absl::StatusOr<std::vector<int32_t>> ids = state->tokenizer->Encode(request->text(), options);
  if (!ids.ok()) return Reply(context, ToGrpcStatus(ids.status()));
  response->mutable_token_ids()->Add(ids->begin(), ids->end());
  return Reply(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GenerationService::Detokenize(grpc::CallbackServerContext* context,
                                                        const v1::DetokenizeRequest* request,
                                                        v1::DetokenizeResponse* response) {
  const ServingState* state = state_.load();
  if (state == nullptr) return Reply(context, NotReady());
  if (state->tokenizer == nullptr) {
    return Reply(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                       "the served model has no tokenizer"));
  }
  const std::vector<int32_t> ids(request->token_ids().begin(), request->token_ids().end());
  absl::StatusOr<std::string> text = state->tokenizer->Decode(ids, request->skip_special_tokens());
  if (!text.ok()) return Reply(context, ToGrpcStatus(text.status()));
  response->set_text(*std::move(text));
  return Reply(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GenerationService::GetServerInfo(grpc::CallbackServerContext* context,
                                                           const v1::GetServerInfoRequest* request,
                                                           v1::GetServerInfoResponse* response) {
  (void)request;
  const ServingState* state = state_.load();
  if (state == nullptr) return Reply(context, NotReady());
  *response = state->info;
  return Reply(context, grpc::Status::OK);
}

}  // namespace specd
