// The unary RPCs both workers share (Info, Truncate, ReadRows, Release, ReleaseAll), and the
// target's QueryLogprobs: each hands its work to the engine thread and returns at once; the job
// finishes the call. WorkerServiceBase serves the shared ones for either worker's gRPC service,
// which adds only its own calls (Draft, or Verify and QueryLogprobs).
#ifndef SPECD_SERVICES_COMMON_WORKER_RPCS_H_
#define SPECD_SERVICES_COMMON_WORKER_RPCS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "services/common/engine_thread.h"
#include "specd/worker/v1/worker.grpc.pb.h"
#include "specd/worker/v1/worker.pb.h"

namespace specd {

class WorkerRpcs {
 public:
  // `info` holds everything Info reports that never changes; the KV counts are filled per call.
  // `program` names the worker in its log lines.
  WorkerRpcs(EngineThread* engine, worker::v1::InfoResponse info, std::string program)
      : engine_(engine),
        info_(std::move(info)),
        info_without_files_(WithoutFiles(info_)),
        program_(std::move(program)) {}

  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 const worker::v1::InfoRequest* request,
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
  grpc::ServerUnaryReactor* ReleaseAll(grpc::CallbackServerContext* context,
                                       const worker::v1::ReleaseAllRequest* request,
                                       worker::v1::ReleaseAllResponse* response);

  EngineThread& engine() { return *engine_; }
  // OK unless the caller expects another process: `expected` is a request's expected_epoch, and
  // 0 checks nothing.
  absl::Status CheckEpoch(uint64_t expected) const;

 private:
  static worker::v1::InfoResponse WithoutFiles(worker::v1::InfoResponse info) {
    info.clear_tokenizer_files();
    return info;
  }

  EngineThread* engine_;  // not owned
  const worker::v1::InfoResponse info_;
  const worker::v1::InfoResponse info_without_files_;  // for InfoRequest.omit_tokenizer_files
  const std::string program_;
};

// `Service` is worker::v1::DraftWorker or worker::v1::TargetWorker.
template <typename Service>
class WorkerServiceBase : public Service::CallbackService {
 public:
  explicit WorkerServiceBase(WorkerRpcs* rpcs) : rpcs_(rpcs) {}

  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 const worker::v1::InfoRequest* request,
                                 worker::v1::InfoResponse* response) override {
    return rpcs_->Info(context, request, response);
  }
  grpc::ServerUnaryReactor* Truncate(grpc::CallbackServerContext* context,
                                     const worker::v1::TruncateRequest* request,
                                     worker::v1::TruncateResponse* response) override {
    return rpcs_->Truncate(context, request, response);
  }
  grpc::ServerUnaryReactor* ReadRows(grpc::CallbackServerContext* context,
                                     const worker::v1::ReadRowsRequest* request,
                                     worker::v1::ReadRowsResponse* response) override {
    return rpcs_->ReadRows(context, request, response);
  }
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const worker::v1::ReleaseRequest* request,
                                    worker::v1::ReleaseResponse* response) override {
    return rpcs_->Release(context, request, response);
  }
  grpc::ServerUnaryReactor* ReleaseAll(grpc::CallbackServerContext* context,
                                       const worker::v1::ReleaseAllRequest* request,
                                       worker::v1::ReleaseAllResponse* response) override {
    return rpcs_->ReleaseAll(context, request, response);
  }

 protected:
  WorkerRpcs& rpcs() { return *rpcs_; }

 private:
  WorkerRpcs* rpcs_;  // not owned
};

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_WORKER_RPCS_H_
