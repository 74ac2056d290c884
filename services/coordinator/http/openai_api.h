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
#include <optional>
#include <random>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "services/common/work_queue.h"
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
  // Requests are parsed and tokenized on `prep`, not on the server's I/O threads, which carry
  // every other request's stream; `prep` must outlive the API, and be stopped before the server.
  OpenAiApi(OpenAiApiOptions options, WorkQueue& prep);

  // Makes the API serve; before this, every route but /health is 503. `state` must outlive the
  // server.
  void SetServing(const ServingState* state) { state_.store(state); }
  // The start of a graceful shutdown: new generation requests get 503, open ones go on.
  void StopAdmitting();
  // Generation requests whose response has not ended, those still being prepared included.
  int64_t open_requests() const;
  // The end of the drain period: ends every open request with `status` (cancelling its choices),
  // and refuses with it those still being prepared. Returns how many it ended.
  int64_t EndOpenRequests(const absl::Status& status);

  // The HttpServer's handler.
  void Handle(std::shared_ptr<HttpExchange> exchange);

 private:
  // On `prep_`, for a request admitted (and counted in preparing_) by Handle.
  void HandleGeneration(const std::shared_ptr<HttpExchange>& exchange, Endpoint endpoint,
                        const ServingState& state);
  // The scheduler requests of `request`'s choices, or the error that refuses it.
  absl::StatusOr<std::vector<CompletionJob::ChoiceInput>> BuildChoices(const OpenAiRequest& request,
                                                                       const ServingState& state);
  uint64_t RandomWord();

  const OpenAiApiOptions options_;
  WorkQueue& prep_;
  std::atomic<const ServingState*> state_{nullptr};
  mutable absl::Mutex mu_;
  bool admitting_ ABSL_GUARDED_BY(mu_) = true;
  // Admitted generation requests on their way through prep_, not yet in open_.
  int64_t preparing_ ABSL_GUARDED_BY(mu_) = 0;
  // Set by EndOpenRequests: the status of a request that comes out of prep_ after it.
  std::optional<absl::Status> ended_ ABSL_GUARDED_BY(mu_);
  uint64_t next_job_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<CompletionJob>> open_ ABSL_GUARDED_BY(mu_);
  absl::Mutex rng_mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(rng_mu_){std::random_device{}()};
};

}  // namespace specd::http

#endif  // SPECD_SERVICES_COORDINATOR_HTTP_OPENAI_API_H_
