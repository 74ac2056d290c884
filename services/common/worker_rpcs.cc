#include "services/common/worker_rpcs.h"

#include <utility>

#include "services/common/grpc_status.h"
#include "services/common/worker_convert.h"

namespace specd {

grpc::ServerUnaryReactor* WorkerRpcs::Info(grpc::CallbackServerContext* context,
                                           worker::v1::InfoResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  engine_->Post([this, reactor, response](WorkerRuntime& runtime) {
    *response = info_;
    response->set_kv_free_blocks(runtime.engine().kv().free_blocks());
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerRpcs::Truncate(grpc::CallbackServerContext* context,
                                               const worker::v1::TruncateRequest* request,
                                               worker::v1::TruncateResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  engine_->Post([reactor, request, response](WorkerRuntime& runtime) {
    const std::span<const int32_t> queries(request->query_tokens().data(),
                                           static_cast<size_t>(request->query_tokens_size()));
    absl::StatusOr<TruncateResult> result =
        runtime.Truncate(request->seq_id(), request->new_len(), request->query_step(), queries);
    if (result.ok()) {
      CacheStateToProto(result->cached_len, runtime.engine().kv(), response->mutable_cache());
      response->mutable_q_probs()->Assign(result->q_probs.begin(), result->q_probs.end());
    }
    reactor->Finish(ToGrpcStatus(result.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerRpcs::ReadRows(grpc::CallbackServerContext* context,
                                               const worker::v1::ReadRowsRequest* request,
                                               worker::v1::ReadRowsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  engine_->Post([reactor, request, response](WorkerRuntime& runtime) {
    absl::StatusOr<ProbRow> kept = runtime.ReadRow(request->seq_id(), request->step());
    if (kept.ok()) {
      response->set_dense(kept->dense());
      response->mutable_ids()->Assign(kept->ids.begin(), kept->ids.end());
      response->mutable_probs()->Assign(kept->probs.begin(), kept->probs.end());
      CacheStateToProto(*runtime.CachedLength(request->seq_id()), runtime.engine().kv(),
                        response->mutable_cache());
    }
    reactor->Finish(ToGrpcStatus(kept.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerRpcs::QueryLogprobs(grpc::CallbackServerContext* context,
                                                    const worker::v1::QueryLogprobsRequest* request,
                                                    worker::v1::QueryLogprobsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  engine_->Post([reactor, request, response](WorkerRuntime& runtime) {
    const std::span<const int32_t> tokens(request->tokens().data(),
                                          static_cast<size_t>(request->tokens_size()));
    absl::StatusOr<std::vector<float>> lps =
        runtime.QueryLogprobs(request->seq_id(), request->step(), tokens);
    if (lps.ok()) response->mutable_logprobs()->Assign(lps->begin(), lps->end());
    reactor->Finish(ToGrpcStatus(lps.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerRpcs::Release(grpc::CallbackServerContext* context,
                                              const worker::v1::ReleaseRequest* request,
                                              worker::v1::ReleaseResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  engine_->Post([reactor, request, response](WorkerRuntime& runtime) {
    const absl::Status status = runtime.Release(request->seq_id());
    if (status.ok()) {
      response->set_free_kv_blocks(runtime.engine().kv().free_blocks());
      CacheStateToProto(0, runtime.engine().kv(), response->mutable_cache());
    }
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

}  // namespace specd
