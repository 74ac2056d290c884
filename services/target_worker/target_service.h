// specd.worker.v1.TargetWorker: step 2 of "One speculation round" (Verify, and K = 0 plain
// decoding) plus the shared Truncate, ReadRows, Release and Info. A thin layer: the model work is
// WorkerRuntime's, run on the engine thread.
#ifndef SPECD_SERVICES_TARGET_WORKER_TARGET_SERVICE_H_
#define SPECD_SERVICES_TARGET_WORKER_TARGET_SERVICE_H_

#include "grpcpp/grpcpp.h"
#include "services/common/worker_rpcs.h"
#include "specd/worker/v1/worker.grpc.pb.h"

namespace specd {

class TargetWorkerService final : public worker::v1::TargetWorker::CallbackService {
 public:
  explicit TargetWorkerService(WorkerRpcs* rpcs) : rpcs_(rpcs) {}

  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 const worker::v1::InfoRequest* request,
                                 worker::v1::InfoResponse* response) override;
  grpc::ServerWriteReactor<worker::v1::VerifyResponse>* Verify(
      grpc::CallbackServerContext* context, const worker::v1::VerifyRequest* request) override;
  grpc::ServerUnaryReactor* Truncate(grpc::CallbackServerContext* context,
                                     const worker::v1::TruncateRequest* request,
                                     worker::v1::TruncateResponse* response) override;
  grpc::ServerUnaryReactor* ReadRows(grpc::CallbackServerContext* context,
                                     const worker::v1::ReadRowsRequest* request,
                                     worker::v1::ReadRowsResponse* response) override;
  grpc::ServerUnaryReactor* QueryLogprobs(grpc::CallbackServerContext* context,
                                          const worker::v1::QueryLogprobsRequest* request,
                                          worker::v1::QueryLogprobsResponse* response) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const worker::v1::ReleaseRequest* request,
                                    worker::v1::ReleaseResponse* response) override;

 private:
  WorkerRpcs* rpcs_;  // not owned
};

}  // namespace specd

#endif  // SPECD_SERVICES_TARGET_WORKER_TARGET_SERVICE_H_
