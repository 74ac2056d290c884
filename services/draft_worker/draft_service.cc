#include "services/draft_worker/draft_service.h"

#include <utility>
#include <vector>

#include "services/common/grpc_status.h"
#include "services/common/stream_reactor.h"
#include "services/common/worker_convert.h"

namespace specd {

namespace pb = ::specd::worker::v1;

grpc::ServerUnaryReactor* DraftWorkerService::Info(grpc::CallbackServerContext* context,
                                                   const pb::InfoRequest* /*request*/,
                                                   pb::InfoResponse* response) {
  return rpcs_->Info(context, response);
}

grpc::ServerWriteReactor<pb::DraftResponse>* DraftWorkerService::Draft(
    grpc::CallbackServerContext* /*context*/, const pb::DraftRequest* request) {
  auto* reactor = new QueuedWriteReactor<pb::DraftResponse>();
  if (const absl::Status st = ValidateDraftRequest(*request); !st.ok()) {
    reactor->Close(ToGrpcStatus(st));
    return reactor;
  }
  std::vector<DraftSequenceRequest> batch;
  batch.reserve(static_cast<size_t>(request->sequences_size()));
  for (const pb::DraftSequence& s : request->sequences()) batch.push_back(DraftFromProto(s));
  rpcs_->engine().Post([reactor, batch = std::move(batch)](WorkerRuntime& runtime) {
    // A call cancelled while queued costs nothing; one cancelled mid-way runs to the end, so the
    // cache and kept rows stay consistent with what the runtime reports next time.
    // The steps go out together at the end: the coordinator uses none before the last, and one
    // flush costs one hand-off to the gRPC threads instead of K (DESIGN.md streams per step; see
    // docs/architecture.md).
    if (!reactor->cancelled()) {
      std::vector<pb::DraftResponse> messages;
      runtime.Draft(batch, [&](const DraftStep& step) {
        DraftStepToProto(step, runtime.engine().kv(), &messages.emplace_back());
      });
      reactor->SendAll(std::move(messages));
    }
    reactor->Close(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* DraftWorkerService::Truncate(grpc::CallbackServerContext* context,
                                                       const pb::TruncateRequest* request,
                                                       pb::TruncateResponse* response) {
  return rpcs_->Truncate(context, request, response);
}

grpc::ServerUnaryReactor* DraftWorkerService::ReadRows(grpc::CallbackServerContext* context,
                                                       const pb::ReadRowsRequest* request,
                                                       pb::ReadRowsResponse* response) {
  return rpcs_->ReadRows(context, request, response);
}

grpc::ServerUnaryReactor* DraftWorkerService::Release(grpc::CallbackServerContext* context,
                                                      const pb::ReleaseRequest* request,
                                                      pb::ReleaseResponse* response) {
  return rpcs_->Release(context, request, response);
}

}  // namespace specd
