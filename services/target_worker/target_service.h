// specd.worker.v1.TargetWorker: step 2 of "One speculation round" (Verify, and K = 0 plain
// decoding) and the logprobs of the residual fallback's tokens (QueryLogprobs), over the shared
// Truncate, ReadRows, Release and Info of WorkerServiceBase. A thin layer: the model work is
// WorkerRuntime's, run on the engine thread.
#ifndef SPECD_SERVICES_TARGET_WORKER_TARGET_SERVICE_H_
#define SPECD_SERVICES_TARGET_WORKER_TARGET_SERVICE_H_

#include <utility>

#include "grpcpp/grpcpp.h"
#include "services/common/worker_rpcs.h"
#include "specd/worker/v1/worker.grpc.pb.h"

namespace specd {

class TargetWorkerService final : public WorkerServiceBase<worker::v1::TargetWorker> {
 public:
  using WorkerServiceBase::WorkerServiceBase;

  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* context,
                                   const worker::v1::VerifyRequest* request,
                                   worker::v1::VerifyResponse* response) override;
  grpc::ServerUnaryReactor* QueryLogprobs(grpc::CallbackServerContext* context,
                                          const worker::v1::QueryLogprobsRequest* request,
                                          worker::v1::QueryLogprobsResponse* response) override {
    return ServeUnary(context, [&](WorkerRpcs::Done done) {
      rpcs().QueryLogprobs(*request, response, std::move(done));
    });
  }
};

}  // namespace specd

#endif  // SPECD_SERVICES_TARGET_WORKER_TARGET_SERVICE_H_
