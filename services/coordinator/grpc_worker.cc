#include "services/coordinator/grpc_worker.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "services/common/grpc_status.h"

namespace specd {
namespace {

namespace pb = worker::v1;

void SamplingToProto(const SamplingParams& p, pb::SamplingParams* out) {
  out->set_temperature(p.temperature);
  out->set_top_k(p.top_k);
  out->set_top_p(p.top_p);
  out->set_min_p(p.min_p);
  out->set_repetition_penalty(p.repetition_penalty);
  out->set_presence_penalty(p.presence_penalty);
  out->set_frequency_penalty(p.frequency_penalty);
}

// The fields every DraftSequence and VerifySequence carries (worker_convert's FillSequence reads
// them back on the worker).
template <typename ProtoSequence>
void SequenceToProto(const SequenceRequest& r, ProtoSequence* s) {
  s->set_seq_id(r.seq);
  s->mutable_catch_up_tokens()->Add(r.catch_up.begin(), r.catch_up.end());
  s->set_expected_cached_len(r.expected_cached_len);
  SamplingToProto(r.sampling, s->mutable_sampling());
  s->set_seed(r.seed);
  s->set_prompt_len(r.prompt_len);
  s->set_drop_tail(r.drop_tail);
  s->set_sample(r.sample);
}

absl::Status StatusFromProto(const pb::SequenceStatus& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.code()), s.message());
}

}  // namespace

GrpcWorker::GrpcWorker(Role role, std::string address, std::shared_ptr<grpc::Channel> channel,
                       absl::Duration call_timeout)
    : role_(role),
      address_(std::move(address)),
      name_(absl::StrCat(role == Role::kDraft ? "draft" : "target", " worker at ", address_)),
      channel_(std::move(channel)),
      call_timeout_(call_timeout) {
  if (role_ == Role::kDraft) {
    draft_stub_ = pb::DraftWorker::NewStub(channel_);
  } else {
    target_stub_ = pb::TargetWorker::NewStub(channel_);
  }
}

grpc::Status GrpcWorker::CallInfo(grpc::ClientContext* context, pb::InfoResponse* response) const {
  return draft_stub_ ? draft_stub_->Info(context, pb::InfoRequest(), response)
                     : target_stub_->Info(context, pb::InfoRequest(), response);
}

absl::StatusOr<std::unique_ptr<GrpcWorker>> GrpcWorker::Connect(Role role,
                                                                const std::string& address,
                                                                absl::Duration wait,
                                                                absl::Duration call_timeout) {
  grpc::ChannelArguments args;
  // Info carries the tokenizer files (Llama 3's tokenizer.json is ~9 MB).
  args.SetMaxReceiveMessageSize(256 << 20);
  // gRPC's default reconnect backoff grows to two minutes; a worker restarted by its supervisor
  // is back within seconds and should be reached as soon as it listens. (The minimum backoff,
  // which is also the connect timeout, keeps its default.)
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  std::unique_ptr<GrpcWorker> w(new GrpcWorker(role, address, channel, call_timeout));
  const absl::Time give_up = absl::Now() + wait;
  grpc::Status last;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ctx.set_wait_for_ready(true);
    last = w->CallInfo(&ctx, &w->info_);
    if (last.ok() || absl::Now() >= give_up) break;
    if (last.error_code() == grpc::StatusCode::UNIMPLEMENTED) break;  // not a worker of this role
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (last.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    return absl::FailedPreconditionError(
        absl::StrCat(w->name_, " does not serve the ",
                     role == Role::kDraft ? "DraftWorker" : "TargetWorker", " service"));
  }
  if (!last.ok()) return w->Check(last, "Info");
  w->free_kv_tokens_ = w->info_.kv_free_blocks() * w->info_.kv_block_size();
  const pb::WorkerRole expected =
      role == Role::kDraft ? pb::WORKER_ROLE_DRAFT : pb::WORKER_ROLE_TARGET;
  if (w->info_.role() != expected) {
    return absl::FailedPreconditionError(
        absl::StrCat(w->name_, " reports role ", pb::WorkerRole_Name(w->info_.role())));
  }
  return w;
}

absl::StatusOr<WorkerProbe> GrpcWorker::Probe(absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + std::min(timeout, call_timeout_)));
  // Waits out a reconnect in progress instead of failing at once.
  ctx.set_wait_for_ready(true);
  pb::InfoResponse info;
  const absl::Time start = absl::Now();
  const grpc::Status st = CallInfo(&ctx, &info);
  RecordRpc(start, 0, info.ByteSizeLong());
  if (absl::Status s = Check(st, "Info"); !s.ok()) return s;
  free_kv_tokens_ = info.kv_free_blocks() * info.kv_block_size();
  return WorkerProbe{info.epoch()};
}

absl::Status GrpcWorker::Check(const grpc::Status& status, const char* rpc) const {
  if (status.ok()) return absl::OkStatus();
  const absl::Status st = FromGrpcStatus(status);
  switch (st.code()) {
    case absl::StatusCode::kDeadlineExceeded:
      return absl::UnavailableError(absl::StrCat(
          name_, ": ", rpc,
          " got no reply within its deadline (a hung worker, or a call that needs more than "
          "--worker-call-timeout-seconds)"));
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
      return absl::UnavailableError(absl::StrCat(name_, ": ", rpc, " failed: ", st.message()));
    default:
      return absl::Status(st.code(), absl::StrCat(name_, ": ", st.message()));
  }
}

void GrpcWorker::SetDeadline(grpc::ClientContext* context) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + call_timeout_));
}

void GrpcWorker::RecordRpc(absl::Time start, size_t request_bytes, size_t response_bytes) const {
  if (metrics_ == nullptr) return;
  metrics_->OnRpc(role_ == Role::kDraft ? CoordinatorMetrics::Worker::kDraft
                                        : CoordinatorMetrics::Worker::kTarget,
                  static_cast<int64_t>(request_bytes), static_cast<int64_t>(response_bytes),
                  absl::Now() - start);
}

absl::StatusOr<std::vector<SequenceOutcome>> GrpcWorker::Draft(
    std::span<const DraftSequenceRequest> batch,
    const std::function<void(const DraftStep&)>& on_step) {
  if (draft_stub_ == nullptr) return absl::FailedPreconditionError(name_ + " cannot Draft");
  pb::DraftRequest req;
  for (const DraftSequenceRequest& r : batch) {
    pb::DraftSequence* s = req.add_sequences();
    SequenceToProto(r, s);
    s->set_num_draft_tokens(r.num_draft_tokens);
    s->set_mode(r.mode == DraftMode::kGreedy ? pb::DRAFT_MODE_GREEDY
                                             : pb::DRAFT_MODE_PROBABILISTIC);
  }
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  const absl::Time start = absl::Now();
  size_t response_bytes = 0;
  std::unique_ptr<grpc::ClientReader<pb::DraftResponse>> reader = draft_stub_->Draft(&ctx, req);
  absl::flat_hash_map<uint64_t, SequenceOutcome> outcomes;
  for (const DraftSequenceRequest& r : batch) outcomes[r.seq].seq = r.seq;
  pb::DraftResponse msg;
  std::vector<DraftToken> tokens;
  std::vector<SequenceOutcome> failed;
  while (reader->Read(&msg)) {
    response_bytes += msg.ByteSizeLong();
    tokens.clear();
    failed.clear();
    for (const pb::DraftToken& t : msg.tokens()) {
      if (t.has_status() && t.status().code() != 0) {
        SequenceOutcome& o = outcomes[t.seq_id()];
        o.status = StatusFromProto(t.status());
        failed.push_back(o);
        continue;
      }
      tokens.push_back({t.seq_id(), t.token(), t.q_prob()});
    }
    for (const pb::CacheStateEntry& c : msg.cache()) {
      outcomes[c.seq_id()].cached_len = c.state().cached_len();
      free_kv_tokens_ = c.state().free_kv_tokens();
    }
    if (on_step) {
      DraftStep step;
      step.step = msg.step();
      step.tokens = tokens;
      step.failed = failed;
      step.forward_ns = msg.forward_ns();
      on_step(step);
    }
  }
  const grpc::Status finished = reader->Finish();
  RecordRpc(start, req.ByteSizeLong(), response_bytes);
  if (absl::Status st = Check(finished, "Draft"); !st.ok()) return st;
  std::vector<SequenceOutcome> out;
  for (const DraftSequenceRequest& r : batch) out.push_back(outcomes[r.seq]);
  return out;
}

absl::StatusOr<std::vector<VerifySequenceResult>> GrpcWorker::Verify(
    std::span<const VerifySequenceRequest> batch) {
  if (target_stub_ == nullptr) return absl::FailedPreconditionError(name_ + " cannot Verify");
  pb::VerifyRequest req;
  for (const VerifySequenceRequest& r : batch) {
    pb::VerifySequence* s = req.add_sequences();
    SequenceToProto(r, s);
    s->mutable_draft_tokens()->Add(r.drafts.begin(), r.drafts.end());
    s->set_num_candidates(r.num_candidates);
    if (r.logprobs.mode != LogprobsMode::kOff) {
      s->mutable_logprobs()->set_mode(r.logprobs.mode == LogprobsMode::kRaw
                                          ? pb::LOGPROBS_MODE_RAW
                                          : pb::LOGPROBS_MODE_PROCESSED);
      s->mutable_logprobs()->set_top_n(r.logprobs.top_n);
    }
  }
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  const absl::Time start = absl::Now();
  size_t response_bytes = 0;
  std::unique_ptr<grpc::ClientReader<pb::VerifyResponse>> reader = target_stub_->Verify(&ctx, req);
  absl::flat_hash_map<uint64_t, VerifySequenceResult> results;
  pb::VerifyResponse msg;
  while (reader->Read(&msg)) {
    response_bytes += msg.ByteSizeLong();
    for (const pb::VerifyResult& v : msg.results()) {
      VerifySequenceResult& r = results[v.seq_id()];
      r.seq = v.seq_id();
      r.status = StatusFromProto(v.status());
      r.position = v.position();
      r.p_draft.assign(v.p_draft().begin(), v.p_draft().end());
      r.argmax.assign(v.argmax().begin(), v.argmax().end());
      r.bonus_token = v.bonus_token();
      for (const pb::Candidates& c : v.candidates()) {
        r.candidate_tokens.emplace_back(c.tokens().begin(), c.tokens().end());
        r.candidate_probs.emplace_back(c.p_probs().begin(), c.p_probs().end());
      }
      for (const pb::PositionLogprobs& p : v.logprobs()) {
        PositionLogprobs& lp = r.logprobs.emplace_back();
        lp.top_ids.assign(p.top_ids().begin(), p.top_ids().end());
        lp.top_logprobs.assign(p.top_logprobs().begin(), p.top_logprobs().end());
        lp.token_ids.assign(p.token_ids().begin(), p.token_ids().end());
        lp.token_logprobs.assign(p.token_logprobs().begin(), p.token_logprobs().end());
      }
      r.cached_len = v.cache().cached_len();
      free_kv_tokens_ = v.cache().free_kv_tokens();
      r.forward_ns = msg.forward_ns();
    }
  }
  const grpc::Status finished = reader->Finish();
  RecordRpc(start, req.ByteSizeLong(), response_bytes);
  if (absl::Status st = Check(finished, "Verify"); !st.ok()) return st;
  std::vector<VerifySequenceResult> out;
  for (const VerifySequenceRequest& r : batch) {
    auto it = results.find(r.seq);
    if (it == results.end()) {
      return absl::UnavailableError(
          absl::StrCat(name_, ": Verify returned no result for sequence ", r.seq));
    }
    out.push_back(std::move(it->second));
  }
  return out;
}

absl::StatusOr<TruncateResult> GrpcWorker::Truncate(SeqId seq, int64_t new_len, int32_t query_step,
                                                    std::span<const int32_t> query_tokens) {
  pb::TruncateRequest req;
  req.set_seq_id(seq);
  req.set_new_len(new_len);
  req.set_query_step(query_step);
  req.mutable_query_tokens()->Add(query_tokens.begin(), query_tokens.end());
  pb::TruncateResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  const absl::Time start = absl::Now();
  const grpc::Status st = draft_stub_ ? draft_stub_->Truncate(&ctx, req, &resp)
                                      : target_stub_->Truncate(&ctx, req, &resp);
  RecordRpc(start, req.ByteSizeLong(), resp.ByteSizeLong());
  if (absl::Status s = Check(st, "Truncate"); !s.ok()) return s;
  TruncateResult out;
  out.cached_len = resp.cache().cached_len();
  free_kv_tokens_ = resp.cache().free_kv_tokens();
  out.q_probs.assign(resp.q_probs().begin(), resp.q_probs().end());
  return out;
}

absl::StatusOr<ProbRow> GrpcWorker::ReadRow(SeqId seq, int32_t step) {
  pb::ReadRowsRequest req;
  req.set_seq_id(seq);
  req.set_step(step);
  pb::ReadRowsResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  const absl::Time start = absl::Now();
  const grpc::Status st = draft_stub_ ? draft_stub_->ReadRows(&ctx, req, &resp)
                                      : target_stub_->ReadRows(&ctx, req, &resp);
  RecordRpc(start, req.ByteSizeLong(), resp.ByteSizeLong());
  if (absl::Status s = Check(st, "ReadRows"); !s.ok()) return s;
  ProbRow row;
  if (!resp.dense()) row.ids.assign(resp.ids().begin(), resp.ids().end());
  row.probs.assign(resp.probs().begin(), resp.probs().end());
  return row;
}

absl::StatusOr<std::vector<float>> GrpcWorker::QueryLogprobs(SeqId seq, int32_t step,
                                                             std::span<const int32_t> tokens) {
  if (target_stub_ == nullptr) {
    return absl::FailedPreconditionError(name_ + " has no logprobs (only the target has)");
  }
  pb::QueryLogprobsRequest req;
  req.set_seq_id(seq);
  req.set_step(step);
  req.mutable_tokens()->Add(tokens.begin(), tokens.end());
  pb::QueryLogprobsResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  const absl::Time start = absl::Now();
  const grpc::Status st = target_stub_->QueryLogprobs(&ctx, req, &resp);
  RecordRpc(start, req.ByteSizeLong(), resp.ByteSizeLong());
  if (absl::Status s = Check(st, "QueryLogprobs"); !s.ok()) return s;
  return std::vector<float>(resp.logprobs().begin(), resp.logprobs().end());
}

absl::Status GrpcWorker::Release(SeqId seq) {
  pb::ReleaseRequest req;
  req.set_seq_id(seq);
  pb::ReleaseResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  const absl::Time start = absl::Now();
  const grpc::Status st = draft_stub_ ? draft_stub_->Release(&ctx, req, &resp)
                                      : target_stub_->Release(&ctx, req, &resp);
  RecordRpc(start, req.ByteSizeLong(), resp.ByteSizeLong());
  if (st.ok()) free_kv_tokens_ = resp.cache().free_kv_tokens();
  return Check(st, "Release");
}

}  // namespace specd
