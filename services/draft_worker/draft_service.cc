#include "services/draft_worker/draft_service.h"

#include <utility>
#include <vector>

#include "services/common/grpc_status.h"
#include "services/common/worker_codec.h"

namespace specd {

namespace pb = ::specd::worker::v1;

grpc::ServerUnaryReactor* DraftWorkerService::Draft(grpc::CallbackServerContext* context,
                                                    const pb::DraftRequest* request,
                                                    pb::DraftResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status st = codec::Validate(*request);
      !st.ok() || !(st = rpcs().CheckEpoch(request->expected_epoch())).ok()) {
    reactor->Finish(ToGrpcStatus(st));
    return reactor;
  }
  std::vector<DraftSequenceRequest> batch;
  batch.reserve(static_cast<size_t>(request->sequences_size()));
  for (const pb::DraftSequence& s : request->sequences()) batch.push_back(codec::Decode(s));
  rpcs().engine().Post([context, reactor, response,
                        batch = std::move(batch)](WorkerRuntime& runtime) {
    // A call cancelled while queued costs nothing; one cancelled mid-way runs to the end, so
    // the cache and kept rows stay consistent with what the runtime reports next time.
    if (context->IsCancelled()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled"));
      return;
    }
    runtime.Draft(batch,
                  [&](const DraftStep& step) { codec::Encode(step, runtime.kv_free(), response); });
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

}  // namespace specd
