// The coordinator's OpenAI-compatible HTTP API (issue 15): the routes POST /v1/completions,
// POST /v1/chat/completions, GET /v1/models[/ID], vLLM's POST /tokenize and /detokenize, and
// GET /health over the same scheduler, tokenizer,
// chat template, limits and bearer token as the gRPC API (GenerationService): two doors to one
// server. Requests are checked with the gRPC API's own validation (BuildGenerationRequest), so
// the two reject the same things.
#ifndef SPECD_SERVICES_COORDINATOR_HTTP_OPENAI_API_H_
#define SPECD_SERVICES_COORDINATOR_HTTP_OPENAI_API_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "services/coordinator/auth.h"
#include "services/coordinator/generation_service.h"
#include "services/coordinator/http/completion_job.h"
#include "services/coordinator/http/http_server.h"

namespace specd::http {

// The model name requests may give is the serving state's info.served_model_name() (others are
// 404); it is known only once the target worker has answered.
struct OpenAiApiOptions {
  BearerTokenAuth auth;  // no token: requests need no credentials
};

class OpenAiApi {
 public:
  explicit OpenAiApi(OpenAiApiOptions options);

  // Makes the API serve; before this, every route but /health is 503. `state` must outlive the
  // server.
  void SetServing(const ServingState* state) { state_.store(state); }
  // The start of a graceful shutdown: new generation requests get 503, open ones go on.
  void StopAdmitting();
  // Generation requests whose response has not ended.
  int64_t open_requests() const;
  // The end of the drain period: ends every open request with `status` (cancelling its choices).
  // Returns how many it ended.
  int64_t EndOpenRequests(const absl::Status& status);

  // The HttpServer's handler.
  void Handle(std::shared_ptr<HttpExchange> exchange);

 private:
  void HandleGeneration(const std::shared_ptr<HttpExchange>& exchange, Endpoint endpoint,
                        const ServingState& state);
  // The scheduler requests of `request`'s choices, or the error that refuses it.
  absl::StatusOr<std::vector<CompletionJob::ChoiceInput>> BuildChoices(const OpenAiRequest& request,
                                                                       const ServingState& state);
  uint64_t RandomWord();

  const OpenAiApiOptions options_;
  std::atomic<const ServingState*> state_{nullptr};
  mutable absl::Mutex mu_;
  bool admitting_ ABSL_GUARDED_BY(mu_) = true;
  uint64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<CompletionJob>> open_ ABSL_GUARDED_BY(mu_);
  absl::Mutex rng_mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(rng_mu_){std::random_device{}()};
};

}  // namespace specd::http

#endif  // SPECD_SERVICES_COORDINATOR_HTTP_OPENAI_API_H_
