// A worker's calls, whatever carries them: each hands its work to the engine thread and returns
// at once; the job finishes the call. WorkerServiceBase serves the ones both workers share (Info,
// Truncate, ReadRows, Release, ReleaseAll) for either worker's gRPC service, which adds only its
// own (Draft, or Verify and QueryLogprobs); LocalSocketServer serves a round's calls on the same
// host.
#ifndef SPECD_SERVICES_COMMON_WORKER_RPCS_H_
#define SPECD_SERVICES_COMMON_WORKER_RPCS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "services/common/engine_thread.h"
#include "services/common/grpc_status.h"
#include "specd/worker/v1/worker.grpc.pb.h"
#include "specd/worker/v1/worker.pb.h"

namespace specd {

class WorkerRpcs {
 public:
  // Finishes a call: the response is complete when the status is OK.
  using Done = absl::AnyInvocable<void(absl::Status) &&>;
  // Whether the caller has given up on a call (gRPC's cancellation); asked on the engine thread.
  using Cancelled = absl::AnyInvocable<bool() const>;

  // `info` holds everything Info reports that never changes; the KV counts are filled per call.
  // `program` names the worker in its log lines.
  WorkerRpcs(EngineThread* engine, worker::v1::InfoResponse info, std::string program)
      : engine_(engine),
        info_(std::move(info)),
        info_without_files_(WithoutFiles(info_)),
        program_(std::move(program)) {}

  // Each checks what it can at once, hands the work to the engine thread and returns; the job
  // fills `response` and calls `done`. `request` and `response` must live until then. gRPC
  // (WorkerServiceBase and the role services) and the same-host socket (LocalSocketServer)
  // serve the same calls through these.
  void Info(const worker::v1::InfoRequest& request, worker::v1::InfoResponse* response, Done done);
  // Draft worker only.
  void Draft(const worker::v1::DraftRequest& request, worker::v1::DraftResponse* response,
             Cancelled cancelled, Done done);
  // Target worker only.
  void Verify(const worker::v1::VerifyRequest& request, worker::v1::VerifyResponse* response,
              Cancelled cancelled, Done done);
  void QueryLogprobs(const worker::v1::QueryLogprobsRequest& request,
                     worker::v1::QueryLogprobsResponse* response, Done done);
  void Truncate(const worker::v1::TruncateRequest& request, worker::v1::TruncateResponse* response,
                Done done);
  void ReadRows(const worker::v1::ReadRowsRequest& request, worker::v1::ReadRowsResponse* response,
                Done done);
  void Release(const worker::v1::ReleaseRequest& request, worker::v1::ReleaseResponse* response,
               Done done);
  void ReleaseAll(worker::v1::ReleaseAllResponse* response, Done done);

  worker::v1::WorkerRole role() const { return info_.role(); }
  uint64_t epoch() const { return info_.epoch(); }

 private:
  static worker::v1::InfoResponse WithoutFiles(worker::v1::InfoResponse info) {
    info.clear_tokenizer_files();
    return info;
  }
  // OK unless the caller expects another process: `expected` is a request's expected_epoch, and
  // 0 checks nothing.
  absl::Status CheckEpoch(uint64_t expected) const;
  // Draft and Verify: checks the request and decodes its sequences, then runs
  // `pass(runtime, batch)` on the engine thread and finishes the call.
  template <typename Request, typename Pass>
  void PostPass(const Request& request, Cancelled cancelled, Done done, Pass pass);
  // Truncate, ReadRows and QueryLogprobs: checks the request, then on the engine thread calls
  // `answer(runtime, query)` for each of its queries in order and finishes the call.
  template <typename Request, typename Answer>
  void PostQueries(const Request& request, Done done, Answer answer);

  EngineThread* engine_;  // not owned
  const worker::v1::InfoResponse info_;
  const worker::v1::InfoResponse info_without_files_;  // for InfoRequest.omit_tokenizer_files
  const std::string program_;
};

// A gRPC unary call served by one of WorkerRpcs' calls: `call(done)` starts it.
template <typename Call>
grpc::ServerUnaryReactor* ServeUnary(grpc::CallbackServerContext* context, Call&& call) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  call([reactor](absl::Status status) { reactor->Finish(ToGrpcStatus(status)); });
  return reactor;
}

// `Service` is worker::v1::DraftWorker or worker::v1::TargetWorker.
template <typename Service>
class WorkerServiceBase : public Service::CallbackService {
 public:
  explicit WorkerServiceBase(WorkerRpcs* rpcs) : rpcs_(rpcs) {}

  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 const worker::v1::InfoRequest* request,
                                 worker::v1::InfoResponse* response) override {
    return ServeUnary(
        context, [&](WorkerRpcs::Done done) { rpcs_->Info(*request, response, std::move(done)); });
  }
  grpc::ServerUnaryReactor* Truncate(grpc::CallbackServerContext* context,
                                     const worker::v1::TruncateRequest* request,
                                     worker::v1::TruncateResponse* response) override {
    return ServeUnary(context, [&](WorkerRpcs::Done done) {
      rpcs_->Truncate(*request, response, std::move(done));
    });
  }
  grpc::ServerUnaryReactor* ReadRows(grpc::CallbackServerContext* context,
                                     const worker::v1::ReadRowsRequest* request,
                                     worker::v1::ReadRowsResponse* response) override {
    return ServeUnary(context, [&](WorkerRpcs::Done done) {
      rpcs_->ReadRows(*request, response, std::move(done));
    });
  }
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const worker::v1::ReleaseRequest* request,
                                    worker::v1::ReleaseResponse* response) override {
    return ServeUnary(context, [&](WorkerRpcs::Done done) {
      rpcs_->Release(*request, response, std::move(done));
    });
  }
  grpc::ServerUnaryReactor* ReleaseAll(grpc::CallbackServerContext* context,
                                       const worker::v1::ReleaseAllRequest* /*request*/,
                                       worker::v1::ReleaseAllResponse* response) override {
    return ServeUnary(context,
                      [&](WorkerRpcs::Done done) { rpcs_->ReleaseAll(response, std::move(done)); });
  }

 protected:
  WorkerRpcs& rpcs() { return *rpcs_; }

 private:
  WorkerRpcs* rpcs_;  // not owned
};

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_WORKER_RPCS_H_
