// specd.worker.v1.DraftWorker: step 1 of "One speculation round" (Draft) over the shared
// Truncate (with q_r(y) queries), ReadRows, Release and Info of WorkerServiceBase. A thin layer:
// the model work is WorkerRuntime's, run on the engine thread.
#ifndef SPECD_SERVICES_DRAFT_WORKER_DRAFT_SERVICE_H_
#define SPECD_SERVICES_DRAFT_WORKER_DRAFT_SERVICE_H_

#include "grpcpp/grpcpp.h"
#include "services/common/worker_rpcs.h"
#include "specd/worker/v1/worker.grpc.pb.h"

namespace specd {

class DraftWorkerService final : public WorkerServiceBase<worker::v1::DraftWorker> {
 public:
  using WorkerServiceBase::WorkerServiceBase;

  grpc::ServerUnaryReactor* Draft(grpc::CallbackServerContext* context,
                                  const worker::v1::DraftRequest* request,
                                  worker::v1::DraftResponse* response) override;
};

}  // namespace specd

#endif  // SPECD_SERVICES_DRAFT_WORKER_DRAFT_SERVICE_H_
