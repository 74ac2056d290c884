#include "services/coordinator/grpc_worker.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "services/common/grpc_status.h"
#include "services/common/worker_codec.h"
#include "services/coordinator/worker_identity.h"

namespace specd {
namespace {

namespace pb = worker::v1;

}  // namespace

GrpcWorker::GrpcWorker(Role role, std::string address, std::shared_ptr<grpc::Channel> channel,
                       absl::Duration call_timeout, bool use_local_socket)
    : role_(role),
      address_(std::move(address)),
      name_(absl::StrCat(role == Role::kDraft ? "draft" : "target", " worker at ", address_)),
      channel_(std::move(channel)),
      call_timeout_(call_timeout),
      use_local_socket_(use_local_socket) {
  if (role_ == Role::kDraft) {
    draft_stub_ = pb::DraftWorker::NewStub(channel_);
  } else {
    target_stub_ = pb::TargetWorker::NewStub(channel_);
  }
}

grpc::Status GrpcWorker::CallInfo(grpc::ClientContext* context, bool with_tokenizer_files,
                                  pb::InfoResponse* response) const {
  pb::InfoRequest request;
  request.set_omit_tokenizer_files(!with_tokenizer_files);
  return draft_stub_ ? draft_stub_->Info(context, request, response)
                     : target_stub_->Info(context, request, response);
}

absl::StatusOr<std::unique_ptr<GrpcWorker>> GrpcWorker::Connect(Role role,
                                                                const std::string& address,
                                                                absl::Duration wait,
                                                                absl::Duration call_timeout,
                                                                bool use_local_socket) {
  grpc::ChannelArguments args;
  // Info carries the tokenizer files (Llama 3's tokenizer.json is ~9 MB).
  args.SetMaxReceiveMessageSize(256 << 20);
  // gRPC's default reconnect backoff grows to two minutes; a worker restarted by its supervisor
  // is back within seconds and should be reached as soon as it listens. (The minimum backoff,
  // which is also the connect timeout, keeps its default.)
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  std::unique_ptr<GrpcWorker> w(
      new GrpcWorker(role, address, channel, call_timeout, use_local_socket));
  const absl::Time give_up = absl::Now() + wait;
  grpc::Status last;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ctx.set_wait_for_ready(true);
    last = w->CallInfo(&ctx, /*with_tokenizer_files=*/true, &w->info_);
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
  w->epoch_ = w->info_.epoch();
  const pb::WorkerRole expected =
      role == Role::kDraft ? pb::WORKER_ROLE_DRAFT : pb::WORKER_ROLE_TARGET;
  if (w->info_.role() != expected) {
    return absl::FailedPreconditionError(
        absl::StrCat(w->name_, " reports role ", pb::WorkerRole_Name(w->info_.role())));
  }
  if (absl::Status v = CheckProtocolVersion(w->info_); !v.ok()) {
    return absl::Status(v.code(), absl::StrCat(w->name_, ": ", v.message()));
  }
  SPECD_RETURN_IF_ERROR(w->ReleaseAll());
  w->OpenLocalSocket(w->info_);
  return w;
}

void GrpcWorker::OpenLocalSocket(const pb::InfoResponse& info) {
  {
    absl::MutexLock lock(&local_mu_);
    if (local_ != nullptr && local_->path() == info.local_socket() &&
        local_->epoch() == info.epoch()) {
      return;  // still the same process's
    }
  }
  std::shared_ptr<LocalChannel> opened;
  if (use_local_socket_ && !info.local_socket().empty()) {
    // Refused or unreachable: this worker is then served over gRPC, as one on another host.
    absl::StatusOr<std::unique_ptr<LocalChannel>> channel = LocalChannel::Open(
        info.local_socket(), info.epoch(), std::min(call_timeout_, absl::Seconds(5)));
    if (channel.ok()) opened = *std::move(channel);
  }
  {
    absl::MutexLock lock(&local_mu_);
    local_ = std::move(opened);
  }
  PublishTransport();
}

void GrpcWorker::SetMetrics(CoordinatorMetrics* metrics) {
  metrics_ = metrics;
  PublishTransport();
}

void GrpcWorker::PublishTransport() const {
  if (metrics_ == nullptr) return;
  metrics_->SetWorkerLocalSocket(role_ == Role::kDraft ? CoordinatorMetrics::Worker::kDraft
                                                       : CoordinatorMetrics::Worker::kTarget,
                                 UsesLocalSocket());
}

bool GrpcWorker::UsesLocalSocket() const {
  absl::MutexLock lock(&local_mu_);
  return local_ != nullptr;
}

absl::Status GrpcWorker::ReleaseAll() {
  pb::ReleaseAllResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);  // a call the last coordinator left may still be running there
  ctx.set_wait_for_ready(true);
  const grpc::Status st = draft_stub_ ? draft_stub_->ReleaseAll(&ctx, {}, &resp)
                                      : target_stub_->ReleaseAll(&ctx, {}, &resp);
  if (st.ok()) free_kv_tokens_ = resp.free_kv_blocks() * info_.kv_block_size();
  return Check(st, "ReleaseAll");
}

absl::StatusOr<WorkerProbe> GrpcWorker::Probe(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + std::min(timeout, call_timeout_);
  pb::InfoResponse info;
  grpc::Status st;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    // Waits out a reconnect in progress instead of failing at once.
    ctx.set_wait_for_ready(true);
    const absl::Time start = absl::Now();
    st = CallInfo(&ctx, /*with_tokenizer_files=*/false, &info);
    RecordRpc(start, 0, info.ByteSizeLong());
    // A call sent on a connection to a process that has just gone fails at once: when the round's
    // calls took the local socket, this probe may be the first gRPC call to see it. The channel
    // then reconnects, which wait_for_ready waits for.
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE ||
        absl::Now() + absl::Milliseconds(20) >= deadline) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (absl::Status s = Check(st, "Info"); !s.ok()) return s;
  // A restarted process may be of another release, or run other flags or files than the one
  // the coordinator started with.
  if (absl::Status v = CheckProtocolVersion(info); !v.ok()) {
    return absl::Status(v.code(), absl::StrCat(name_, ": ", v.message()));
  }
  if (absl::Status same = CheckSameComputation(info_, info); !same.ok()) {
    return absl::Status(same.code(), absl::StrCat(name_, ": ", same.message()));
  }
  free_kv_tokens_ = info.kv_free_blocks() * info.kv_block_size();
  epoch_ = info.epoch();
  OpenLocalSocket(info);
  return WorkerProbe{
      info.epoch(), info.max_pass_tokens(),
      PrefixCacheShape{info.prefix_caching() ? info.kv_block_size() : 0, info.kv_total_blocks()}};
}

bool GrpcWorker::Connected() const {
  return channel_->GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY;
}

absl::Status GrpcWorker::Check(const grpc::Status& status, const char* rpc) const {
  return Check(FromGrpcStatus(status), rpc);
}

absl::Status GrpcWorker::Check(const absl::Status& st, const char* rpc) const {
  if (st.ok()) return absl::OkStatus();
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

absl::Status GrpcWorker::Call(local::Method method, const google::protobuf::Message& request,
                              google::protobuf::Message* response,
                              const std::function<grpc::Status(grpc::ClientContext*)>& grpc_call) {
  std::shared_ptr<LocalChannel> same_host;
  {
    absl::MutexLock lock(&local_mu_);
    same_host = local_;
  }
  const absl::Time start = absl::Now();
  absl::Status status;
  if (same_host != nullptr) {
    status = same_host->Call(method, request, response, start + call_timeout_);
  } else {
    grpc::ClientContext context;
    SetDeadline(&context);
    status = FromGrpcStatus(grpc_call(&context));
  }
  RecordRpc(start, request.ByteSizeLong(), response->ByteSizeLong());
  return Check(status, local::MethodName(method));
}

absl::StatusOr<std::vector<SequenceOutcome>> GrpcWorker::Draft(
    std::span<const DraftSequenceRequest> batch,
    const std::function<void(const DraftStep&)>& on_step) {
  if (draft_stub_ == nullptr) return absl::FailedPreconditionError(name_ + " cannot Draft");
  pb::DraftRequest req;
  req.set_expected_epoch(epoch_.load());
  for (const DraftSequenceRequest& r : batch) {
    codec::Encode(r, req.add_sequences());
  }
  pb::DraftResponse resp;
  SPECD_RETURN_IF_ERROR(Call(local::Method::kDraft, req, &resp, [&](grpc::ClientContext* ctx) {
    return draft_stub_->Draft(ctx, req, &resp);
  }));
  absl::flat_hash_map<uint64_t, SequenceOutcome> outcomes;
  for (const DraftSequenceRequest& r : batch) outcomes[r.seq].seq = r.seq;
  for (const codec::DecodedDraftStep& decoded : codec::Decode(resp)) {
    for (const SequenceOutcome& f : decoded.failed) outcomes[f.seq].status = f.status;
    for (const SequenceOutcome& o : decoded.outcomes) {
      outcomes[o.seq].cached_len = o.cached_len;
      outcomes[o.seq].prefilling = o.prefilling;
      outcomes[o.seq].companion_cached_len = o.companion_cached_len;
    }
    if (decoded.has_free) free_kv_tokens_ = decoded.free.tokens;
    if (on_step) {
      DraftStep step;
      step.step = decoded.step;
      step.tokens = decoded.tokens;
      step.failed = decoded.failed;
      step.forward_ns = decoded.forward_ns;
      on_step(step);
    }
  }
  std::vector<SequenceOutcome> out;
  for (const DraftSequenceRequest& r : batch) out.push_back(outcomes[r.seq]);
  return out;
}

absl::StatusOr<std::vector<VerifySequenceResult>> GrpcWorker::Verify(
    std::span<const VerifySequenceRequest> batch) {
  if (target_stub_ == nullptr) return absl::FailedPreconditionError(name_ + " cannot Verify");
  pb::VerifyRequest req;
  req.set_expected_epoch(epoch_.load());
  for (const VerifySequenceRequest& r : batch) {
    codec::Encode(r, req.add_sequences());
  }
  pb::VerifyResponse resp;
  SPECD_RETURN_IF_ERROR(Call(local::Method::kVerify, req, &resp, [&](grpc::ClientContext* ctx) {
    return target_stub_->Verify(ctx, req, &resp);
  }));
  absl::flat_hash_map<uint64_t, VerifySequenceResult> results;
  for (const pb::VerifyResult& v : resp.results()) {
    results[v.seq_id()] = codec::Decode(v, resp.forward_ns());
    free_kv_tokens_ = v.cache().free_kv_tokens();
  }
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

absl::StatusOr<std::vector<SequenceAnswer<TruncateResult>>> GrpcWorker::Truncate(
    std::span<const TruncateSequenceRequest> batch) {
  pb::TruncateRequest req;
  codec::Encode(batch, &req);
  pb::TruncateResponse resp;
  SPECD_RETURN_IF_ERROR(Call(local::Method::kTruncate, req, &resp, [&](grpc::ClientContext* ctx) {
    return draft_stub_ ? draft_stub_->Truncate(ctx, req, &resp)
                       : target_stub_->Truncate(ctx, req, &resp);
  }));
  if (resp.results_size() != static_cast<int>(batch.size())) {
    return absl::UnavailableError(absl::StrCat(name_, ": Truncate answered ", resp.results_size(),
                                               " of ", batch.size(), " sequences"));
  }
  std::vector<SequenceAnswer<TruncateResult>> out;
  for (const pb::TruncateResult& r : resp.results()) {
    out.push_back(codec::Decode(r));
    if (out.back().value.ok()) free_kv_tokens_ = r.cache().free_kv_tokens();
  }
  return out;
}

absl::StatusOr<std::vector<SequenceAnswer<ProbRow>>> GrpcWorker::ReadRows(
    std::span<const RowQuery> batch) {
  pb::ReadRowsRequest req;
  codec::Encode(batch, &req);
  pb::ReadRowsResponse resp;
  SPECD_RETURN_IF_ERROR(Call(local::Method::kReadRows, req, &resp, [&](grpc::ClientContext* ctx) {
    return draft_stub_ ? draft_stub_->ReadRows(ctx, req, &resp)
                       : target_stub_->ReadRows(ctx, req, &resp);
  }));
  if (resp.rows_size() != static_cast<int>(batch.size())) {
    return absl::UnavailableError(absl::StrCat(name_, ": ReadRows answered ", resp.rows_size(),
                                               " of ", batch.size(), " rows"));
  }
  std::vector<SequenceAnswer<ProbRow>> out;
  for (const pb::KeptRow& r : resp.rows()) out.push_back(codec::Decode(r));
  return out;
}

absl::StatusOr<std::vector<SequenceAnswer<std::vector<float>>>> GrpcWorker::QueryLogprobs(
    std::span<const LogprobQuery> batch) {
  if (target_stub_ == nullptr) {
    return absl::FailedPreconditionError(name_ + " has no logprobs (only the target has)");
  }
  pb::QueryLogprobsRequest req;
  codec::Encode(batch, &req);
  pb::QueryLogprobsResponse resp;
  SPECD_RETURN_IF_ERROR(
      Call(local::Method::kQueryLogprobs, req, &resp,
           [&](grpc::ClientContext* ctx) { return target_stub_->QueryLogprobs(ctx, req, &resp); }));
  if (resp.answers_size() != static_cast<int>(batch.size())) {
    return absl::UnavailableError(absl::StrCat(
        name_, ": QueryLogprobs answered ", resp.answers_size(), " of ", batch.size(), " queries"));
  }
  std::vector<SequenceAnswer<std::vector<float>>> out;
  for (const pb::LogprobAnswer& a : resp.answers()) out.push_back(codec::Decode(a));
  return out;
}

absl::Status GrpcWorker::Release(SeqId seq) {
  pb::ReleaseRequest req;
  req.set_seq_id(seq);
  pb::ReleaseResponse resp;
  const absl::Status st = Call(local::Method::kRelease, req, &resp, [&](grpc::ClientContext* ctx) {
    return draft_stub_ ? draft_stub_->Release(ctx, req, &resp)
                       : target_stub_->Release(ctx, req, &resp);
  });
  if (st.ok()) free_kv_tokens_ = resp.cache().free_kv_tokens();
  return st;
}

}  // namespace specd
