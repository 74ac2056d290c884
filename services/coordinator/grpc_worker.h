// WorkerApi over gRPC: the coordinator's client of a draft or target worker. Every transport
// failure, and every call past its deadline (a hung worker), becomes UNAVAILABLE naming the
// worker ("draft worker at 127.0.0.1:7001: ..."). The channel reconnects on its own within about
// a second when a restarted worker listens again on the same address; Draft and Verify name the
// process they are meant for, so one that restarted unnoticed refuses them (UNAVAILABLE), and the
// coordinator probes it before it sends any sequence there.
#ifndef SPECD_SERVICES_COORDINATOR_GRPC_WORKER_H_
#define SPECD_SERVICES_COORDINATOR_GRPC_WORKER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"
#include "services/common/local_frame.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/local_channel.h"
#include "services/coordinator/worker_api.h"
#include "specd/worker/v1/worker.grpc.pb.h"

namespace specd {

class GrpcWorker final : public WorkerApi {
 public:
  enum class Role { kDraft, kTarget };

  // Connects and reads Info, retrying until `wait` has passed (workers may still be loading),
  // then claims the worker: it serves one coordinator, so the sequences it holds were left by
  // one that exited or crashed, and are released (ReleaseAll).
  // FAILED_PRECONDITION if the process at `address` has the other role. `call_timeout` bounds
  // every later call, so it must exceed the longest one: a full-length prompt's prefill.
  // With `use_local_socket`, the calls of a round (Draft, Verify, Truncate, ReadRows,
  // QueryLogprobs, Release) go over the Unix socket the worker's Info names when it answers there
  // as the same process (local_channel.h: a worker on this host), and over gRPC otherwise.
  static absl::StatusOr<std::unique_ptr<GrpcWorker>> Connect(Role role, const std::string& address,
                                                             absl::Duration wait,
                                                             absl::Duration call_timeout,
                                                             bool use_local_socket);

  absl::StatusOr<std::vector<SequenceOutcome>> Draft(
      std::span<const DraftSequenceRequest> batch,
      const std::function<void(const DraftStep&)>& on_step) override;
  absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest> batch) override;
  absl::StatusOr<std::vector<SequenceAnswer<TruncateResult>>> Truncate(
      std::span<const TruncateSequenceRequest> batch) override;
  absl::StatusOr<std::vector<SequenceAnswer<ProbRow>>> ReadRows(
      std::span<const RowQuery> batch) override;
  absl::StatusOr<std::vector<SequenceAnswer<std::vector<float>>>> QueryLogprobs(
      std::span<const LogprobQuery> batch) override;
  absl::Status Release(SeqId seq) override;
  int64_t FreeKvTokens() const override { return free_kv_tokens_.load(); }
  // Info, waiting for the channel to (re)connect within `timeout`. FAILED_PRECONDITION when the
  // worker came back computing something else than at Connect (worker_identity.h).
  absl::StatusOr<WorkerProbe> Probe(absl::Duration timeout) override;
  bool Connected() const override;
  std::string Name() const override { return name_; }

  const worker::v1::InfoResponse& info() const { return info_; }
  // Whether a round's calls go over the worker's local socket now (else gRPC).
  bool UsesLocalSocket() const;
  // Records each later RPC's bytes and duration under this worker's role; null turns it off.
  // `metrics` must outlive this worker.
  // Also publishes which transport a round's calls take (specd_worker_local_socket).
  void SetMetrics(CoordinatorMetrics* metrics);

 private:
  GrpcWorker(Role role, std::string address, std::shared_ptr<grpc::Channel> channel,
             absl::Duration call_timeout, bool use_local_socket);
  grpc::Status CallInfo(grpc::ClientContext* context, bool with_tokenizer_files,
                        worker::v1::InfoResponse* response) const;
  absl::Status ReleaseAll();
  // Fails with UNAVAILABLE (transport) or the worker's own status, naming the worker.
  absl::Status Check(const grpc::Status& status, const char* rpc) const;
  absl::Status Check(const absl::Status& status, const char* rpc) const;
  // One call of a round: over the local socket when there is one, else `grpc_call` with a
  // context whose deadline is set. Records the call's bytes and time.
  absl::Status Call(local::Method method, const google::protobuf::Message& request,
                    google::protobuf::Message* response,
                    const std::function<grpc::Status(grpc::ClientContext*)>& grpc_call);
  // (Re)opens the local socket `info` names for its epoch, or drops it: it is another process's,
  // or none listens there (a worker on another host).
  void OpenLocalSocket(const worker::v1::InfoResponse& info);
  void PublishTransport() const;
  void SetDeadline(grpc::ClientContext* context) const;
  void RecordRpc(absl::Time start, size_t request_bytes, size_t response_bytes) const;

  Role role_;
  std::string address_;
  std::string name_;  // "draft worker at ADDR"
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<worker::v1::DraftWorker::Stub> draft_stub_;
  std::unique_ptr<worker::v1::TargetWorker::Stub> target_stub_;
  worker::v1::InfoResponse info_;
  absl::Duration call_timeout_;
  std::atomic<int64_t> free_kv_tokens_{0};
  // The process Draft and Verify calls are meant for: Connect's, then each probe's that passed
  // CheckSameComputation. A process that restarted unnoticed refuses them (expected_epoch).
  std::atomic<uint64_t> epoch_{0};
  CoordinatorMetrics* metrics_ = nullptr;
  const bool use_local_socket_;
  mutable absl::Mutex local_mu_;
  std::shared_ptr<LocalChannel> local_ ABSL_GUARDED_BY(local_mu_);  // null: gRPC only
};

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_GRPC_WORKER_H_
