// specd.worker.v1.DraftWorker: step 1 of "One speculation round" (Draft) plus the shared
// Truncate (with q_r(y) queries), ReadRows, Release and Info. A thin layer: the model work is
// WorkerRuntime's, run on the engine thread.
#ifndef SPECD_SERVICES_DRAFT_WORKER_DRAFT_SERVICE_H_
#define SPECD_SERVICES_DRAFT_WORKER_DRAFT_SERVICE_H_

#include "grpcpp/grpcpp.h"
#include "services/common/worker_rpcs.h"
#include "specd/worker/v1/worker.grpc.pb.h"

namespace specd {

class DraftWorkerService final : public worker::v1::DraftWorker::CallbackService {
 public:
  explicit DraftWorkerService(WorkerRpcs* rpcs) : rpcs_(rpcs) {}

  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 const worker::v1::InfoRequest* request,
                                 worker::v1::InfoResponse* response) override;
  grpc::ServerWriteReactor<worker::v1::DraftResponse>* Draft(
      grpc::CallbackServerContext* context, const worker::v1::DraftRequest* request) override;
  grpc::ServerUnaryReactor* Truncate(grpc::CallbackServerContext* context,
                                     const worker::v1::TruncateRequest* request,
                                     worker::v1::TruncateResponse* response) override;
  grpc::ServerUnaryReactor* ReadRows(grpc::CallbackServerContext* context,
                                     const worker::v1::ReadRowsRequest* request,
                                     worker::v1::ReadRowsResponse* response) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const worker::v1::ReleaseRequest* request,
                                    worker::v1::ReleaseResponse* response) override;

 private:
  WorkerRpcs* rpcs_;  // not owned
};

}  // namespace specd

#endif  // SPECD_SERVICES_DRAFT_WORKER_DRAFT_SERVICE_H_
