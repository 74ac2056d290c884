#include "services/target_worker/target_service.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "services/common/grpc_status.h"
#include "services/common/worker_codec.h"

namespace specd {

namespace pb = ::specd::worker::v1;

grpc::ServerUnaryReactor* TargetWorkerService::Verify(grpc::CallbackServerContext* context,
                                                      const pb::VerifyRequest* request,
                                                      pb::VerifyResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status st = codec::Validate(*request);
      !st.ok() || !(st = rpcs().CheckEpoch(request->expected_epoch())).ok()) {
    reactor->Finish(ToGrpcStatus(st));
    return reactor;
  }
  std::vector<VerifySequenceRequest> batch;
  batch.reserve(static_cast<size_t>(request->sequences_size()));
  for (const pb::VerifySequence& s : request->sequences()) batch.push_back(codec::Decode(s));
  rpcs().engine().Post(
      [context, reactor, response, batch = std::move(batch)](WorkerRuntime& runtime) {
        // As in Draft: a call cancelled while queued costs nothing, one cancelled mid-way runs
        // to the end.
        if (context->IsCancelled()) {
          reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled"));
          return;
        }
        int64_t forward_ns = 0;
        for (const VerifySequenceResult& result : runtime.Verify(batch)) {
          forward_ns = std::max(forward_ns, result.forward_ns);
          codec::Encode(result, runtime.kv_free(), response->add_results());
        }
        response->set_forward_ns(forward_ns);
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

}  // namespace specd
