// specd.v1.Generation: the public API. Handlers validate, tokenize and hand requests to the
// scheduler; events stream back through a queued write reactor. Before the workers are connected
// every call is UNAVAILABLE.
#ifndef SPECD_SERVICES_COORDINATOR_GENERATION_SERVICE_H_
#define SPECD_SERVICES_COORDINATOR_GENERATION_SERVICE_H_

#include <atomic>
#include <memory>
#include <random>

#include "absl/synchronization/mutex.h"
#include "common/tokenizer/tokenizer.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/request_validation.h"
#include "services/coordinator/scheduler.h"
#include "specd/v1/generation.grpc.pb.h"

namespace specd {

// What the service needs once the workers are up; owned by the coordinator's main.
struct ServingState {
  Scheduler* scheduler = nullptr;
  const Tokenizer* tokenizer = nullptr;   // null for token-id-only models
  CoordinatorMetrics* metrics = nullptr;  // null when /metrics is off
  ServerLimits limits;
  v1::GetServerInfoResponse info;
};

class GenerationService final : public v1::Generation::CallbackService {
 public:
  // Makes the service serve; before this, calls are UNAVAILABLE. `state` must outlive the server.
  void SetServing(const ServingState* state) { state_.store(state); }

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
  uint64_t RandomSeed();

  std::atomic<const ServingState*> state_{nullptr};
  absl::Mutex rng_mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(rng_mu_){std::random_device{}()};
};

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_GENERATION_SERVICE_H_
