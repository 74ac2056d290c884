#include "services/target_worker/target_service.h"

#include <utility>
#include <vector>

#include "services/common/grpc_status.h"
#include "services/common/stream_reactor.h"
#include "services/common/worker_convert.h"

namespace specd {

namespace pb = ::specd::worker::v1;

grpc::ServerUnaryReactor* TargetWorkerService::Info(grpc::CallbackServerContext* context,
                                                    const pb::InfoRequest* /*request*/,
                                                    pb::InfoResponse* response) {
  return rpcs_->Info(context, response);
}

grpc::ServerWriteReactor<pb::VerifyResponse>* TargetWorkerService::Verify(
    grpc::CallbackServerContext* /*context*/, const pb::VerifyRequest* request) {
  auto* reactor = new QueuedWriteReactor<pb::VerifyResponse>();
  if (const absl::Status st = ValidateVerifyRequest(*request); !st.ok()) {
    reactor->Close(ToGrpcStatus(st));
    return reactor;
  }
  std::vector<VerifySequenceRequest> batch;
  batch.reserve(static_cast<size_t>(request->sequences_size()));
  for (const pb::VerifySequence& s : request->sequences()) batch.push_back(VerifyFromProto(s));
  rpcs_->engine().Post([reactor, batch = std::move(batch)](WorkerRuntime& runtime) {
    // A call cancelled while queued costs nothing; one cancelled mid-way runs to the end, so the
    // cache and kept rows stay consistent with what the runtime reports next time.
    if (!reactor->cancelled()) {
      runtime.Verify(batch, [&](const VerifySequenceResult& result) {
        pb::VerifyResponse message;
        message.set_forward_ns(result.forward_ns);
        VerifyResultToProto(result, runtime.engine().kv(), message.add_results());
        reactor->Send(std::move(message));
      });
    }
    reactor->Close(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* TargetWorkerService::Truncate(grpc::CallbackServerContext* context,
                                                        const pb::TruncateRequest* request,
                                                        pb::TruncateResponse* response) {
  return rpcs_->Truncate(context, request, response);
}

grpc::ServerUnaryReactor* TargetWorkerService::ReadRows(grpc::CallbackServerContext* context,
                                                        const pb::ReadRowsRequest* request,
                                                        pb::ReadRowsResponse* response) {
  return rpcs_->ReadRows(context, request, response);
}

grpc::ServerUnaryReactor* TargetWorkerService::QueryLogprobs(
    grpc::CallbackServerContext* context, const pb::QueryLogprobsRequest* request,
    pb::QueryLogprobsResponse* response) {
  return rpcs_->QueryLogprobs(context, request, response);
}

grpc::ServerUnaryReactor* TargetWorkerService::Release(grpc::CallbackServerContext* context,
                                                       const pb::ReleaseRequest* request,
                                                       pb::ReleaseResponse* response) {
  return rpcs_->Release(context, request, response);
}

}  // namespace specd
