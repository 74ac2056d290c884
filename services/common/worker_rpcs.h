// The unary RPCs of the workers (Info, Truncate, ReadRows, Release; QueryLogprobs on the target):
// each hands its work to the engine thread and returns at once; the job finishes the call.
#ifndef SPECD_SERVICES_COMMON_WORKER_RPCS_H_
#define SPECD_SERVICES_COMMON_WORKER_RPCS_H_

#include "grpcpp/grpcpp.h"
#include "services/common/engine_thread.h"
#include "specd/worker/v1/worker.pb.h"

namespace specd {

class WorkerRpcs {
 public:
  // `info` holds everything Info reports that never changes; the KV counts are filled per call.
  WorkerRpcs(EngineThread* engine, worker::v1::InfoResponse info)
      : engine_(engine), info_(std::move(info)) {}

  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 worker::v1::InfoResponse* response);
  grpc::ServerUnaryReactor* Truncate(grpc::CallbackServerContext* context,
                                     const worker::v1::TruncateRequest* request,
                                     worker::v1::TruncateResponse* response);
  grpc::ServerUnaryReactor* ReadRows(grpc::CallbackServerContext* context,
                                     const worker::v1::ReadRowsRequest* request,
                                     worker::v1::ReadRowsResponse* response);
  grpc::ServerUnaryReactor* QueryLogprobs(grpc::CallbackServerContext* context,
                                          const worker::v1::QueryLogprobsRequest* request,
                                          worker::v1::QueryLogprobsResponse* response);
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const worker::v1::ReleaseRequest* request,
                                    worker::v1::ReleaseResponse* response);

  EngineThread& engine() { return *engine_; }

 private:
  EngineThread* engine_;  // not owned
  const worker::v1::InfoResponse info_;
};

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_WORKER_RPCS_H_
