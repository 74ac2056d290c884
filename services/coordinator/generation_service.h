// specd.v1.Generation: the public API. Handlers check the caller's bearer token; a work queue
// off gRPC's threads validates and tokenizes requests and hands them to the scheduler; events
// stream back through a queued write reactor.
// Before the workers are connected every call is UNAVAILABLE. The service also keeps the books a
// graceful shutdown and the per-connection stream limit need: which Generate streams are open,
// and how many per client connection.
#ifndef SPECD_SERVICES_COORDINATOR_GENERATION_SERVICE_H_
#define SPECD_SERVICES_COORDINATOR_GENERATION_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/tokenizer/tokenizer.h"
#include "services/common/work_queue.h"
#include "services/coordinator/auth.h"
#include "services/coordinator/chat_prompt.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/request_validation.h"
#include "services/coordinator/scheduler.h"
#include "specd/v1/generation.grpc.pb.h"

namespace specd {

// What the service needs once the workers are up; owned by the coordinator's main.
struct ServingState {
  Scheduler* scheduler = nullptr;
  const Tokenizer* tokenizer = nullptr;  // null for token-id-only models
  const ChatPrompt* chat = nullptr;      // null: no chat input

  // The prompt encoders of both APIs' requests (chat needs the tokenizer and the template).
  PromptEncoders Encoders() const;
  CoordinatorMetrics* metrics = nullptr;  // null when /metrics is off
  ServerLimits limits;
  v1::GetServerInfoResponse info;  // also names the served model (served_model_name)
};

// What the service enforces on every call, fixed at start-up.
struct PublicApiOptions {
  BearerTokenAuth auth;  // no token: calls need no credentials
  // Concurrent Generate streams one client connection (gRPC peer) may hold; 0 = no limit.
  int64_t max_streams_per_connection = 0;
};

class GenerationService final : public v1::Generation::CallbackService {
 public:
  // Requests are validated and tokenized on `prep`, not on gRPC's callback threads, which serve
  // every other stream; `prep` must outlive the service, and be stopped once the server is.
  GenerationService(PublicApiOptions options, WorkQueue& prep)
      : options_(std::move(options)), prep_(prep) {}

  // Makes the service serve; before this, calls are UNAVAILABLE. `state` must outlive the server.
  void SetServing(const ServingState* state) { state_.store(state); }

  // The start of a graceful shutdown: from now on Generate answers UNAVAILABLE, while the
  // streams already open go on. Streams opened before this returns are all counted in
  // open_streams().
  void StopAdmitting();
  // Generate streams that gRPC has not finished with yet (including their last messages).
  int64_t open_streams() const;
  // The end of the drain period: cancels every open stream's request in the scheduler and ends
  // the stream with `status` at once (whatever the scheduler is doing). Returns how many it ended.
  int64_t EndOpenStreams(const grpc::Status& status);
  // Cancels the requests of streams whose client went away. A running request notices that by
  // itself at its next event, but a queued one gets no events, and would keep its queue place
  // and its connection's stream count until admitted. The coordinator calls this periodically.
  void CancelAbandoned();

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::GetServerInfoResponse* response) override;

 private:
  class GenerateCall;
  class GenerateReactor;

  uint64_t RandomSeed();
  // On prep_: validates and tokenizes `request`, then submits it, streaming its events to `call`
  // (or closes `call` with the refusal).
  void StartGeneration(const ServingState& state, const std::shared_ptr<GenerateCall>& call,
                       const v1::GenerateRequest& request);
  // Counts a new stream on `reactor`'s connection and registers `call`; UNAVAILABLE while
  // draining and RESOURCE_EXHAUSTED over the per-connection limit (then nothing is counted).
  grpc::Status OpenStream(GenerateReactor* reactor, std::shared_ptr<GenerateCall> call);
  // Undoes OpenStream when gRPC is done with the stream, whichever way it ended.
  void CloseStream(uint64_t id, const std::string& peer);

  const PublicApiOptions options_;
  WorkQueue& prep_;
  std::atomic<const ServingState*> state_{nullptr};
  mutable absl::Mutex streams_mu_;
  bool admitting_ ABSL_GUARDED_BY(streams_mu_) = true;
  uint64_t next_stream_id_ ABSL_GUARDED_BY(streams_mu_) = 1;
  absl::flat_hash_map<std::string, int64_t> streams_per_peer_ ABSL_GUARDED_BY(streams_mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<GenerateCall>> open_streams_
      ABSL_GUARDED_BY(streams_mu_);
  absl::Mutex rng_mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(rng_mu_){std::random_device{}()};
};

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_GENERATION_SERVICE_H_
