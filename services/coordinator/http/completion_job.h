// One /v1/completions or /v1/chat/completions request in flight: its choices (n per prompt) run
// as separate scheduler requests, and their events become one JSON response or one stream of
// server-sent events. The scheduler's sinks record metrics and post each event to the
// connection's strand, where it is encoded: the scheduler's thread takes no lock of the job and
// never waits for the network or for JSON.
#ifndef SPECD_SERVICES_COORDINATOR_HTTP_COMPLETION_JOB_H_
#define SPECD_SERVICES_COORDINATOR_HTTP_COMPLETION_JOB_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "services/coordinator/generation_service.h"
#include "services/coordinator/http/http_server.h"
#include "services/coordinator/http/openai_request.h"
#include "services/coordinator/http/openai_response.h"
#include "services/coordinator/request_metrics.h"
#include "services/coordinator/tool_call_stream.h"

namespace specd::http {

class CompletionJob : public std::enable_shared_from_this<CompletionJob> {
 public:
  // A choice: its scheduler request, and the text an echo puts before the completion.
  struct ChoiceInput {
    GenerationRequest request;
    std::string echo;
  };
  struct Meta {
    std::string id;     // "cmpl-..." or "chatcmpl-..."
    std::string model;  // the served name
    int64_t created = 0;
  };

  // `state` must outlive the job; `on_done` runs once when the response has ended (however).
  CompletionJob(std::shared_ptr<HttpExchange> exchange, const OpenAiRequest& request, Meta meta,
                const ServingState* state, std::function<void()> on_done);

  // Submits every choice. When one is refused (the queue is full, or the scheduler stops), the
  // ones already submitted are cancelled and the response is that error.
  void Start(std::vector<ChoiceInput> choices);
  // Ends the response now with `status` (the end of a drain), cancelling every choice.
  void End(const absl::Status& status);

 private:
  struct Choice {
    Scheduler::RequestHandle handle = 0;
    std::string echo;
    bool started = false;  // its first chunk is out (streaming)
    bool done = false;
    std::string text;  // the whole text, unless streamed as it comes (no tools to parse)
    std::vector<int32_t> prompt;
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> logprobs;
    std::optional<std::vector<TokenLogprobs>> prompt_logprobs;  // echo with logprobs
    int64_t text_offset = 0;                                    // bytes of text streamed so far
    FinishReason finish = FinishReason::kNone;
    GenerationUsage usage;
    // Streaming a reply that may be tool calls.
    std::optional<ToolCallStream> tool_stream;
  };

  // The scheduler's sink (its thread): metrics, then the event to the connection's strand.
  void OnEvent(size_t index, GenerationEvent event);
  // On the strand.
  void HandleEvent(size_t index, GenerationEvent event);
  // Locked helpers below.
  void Fail(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CancelAll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StreamChunk(size_t index, const GenerationEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Streaming with tool calls: after `event` was added to the choice, sends the events that are
  // surely content, and at the end either the rest of the content or the calls.
  void StreamToolAware(size_t index, const GenerationEvent& event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The echo of a prompt whose logprobs were asked: its text and logprobs, in one chunk before
  // the completion's.
  void StreamEcho(size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends one choice's chunk, starting the stream with the first.
  void SendChoiceChunk(Json choice) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Json EchoLogprobs(const Choice& c) const;
  // `previous`: the token before tokens[0]; `text_offset`: tokens[0]'s byte offset in the text.
  Json ChoiceLogprobs(int64_t text_offset, std::span<const int32_t> tokens,
                      std::span<const TokenLogprobs> logprobs, int32_t previous) const;
  Json ChunkEnvelope() const;
  Json WholeResponse() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Token `id`'s text after token `previous` (-1: none), as the logprobs show it.
  std::string TokenString(int32_t previous, int32_t id) const;

  const std::shared_ptr<HttpExchange> exchange_;
  const Endpoint endpoint_;
  const bool stream_;
  const bool include_usage_;
  const bool logprobs_;
  const int32_t top_logprobs_;
  const bool return_token_ids_;
  const ToolCallPolicy tool_policy_;
  const int64_t n_;
  const Meta meta_;
  const ServingState* const state_;
  const std::function<void()> on_done_;

  // The choices' clocks, read and written by their sinks only (the scheduler's thread).
  std::vector<RequestTiming> timings_;
  std::vector<GuidanceKind> guidance_;  // per choice, for the metrics
  // Set once the response has ended: the sinks stop recording and posting.
  std::atomic<bool> over_{false};

  absl::Mutex mu_;
  std::vector<Choice> choices_ ABSL_GUARDED_BY(mu_);
  int64_t finished_ ABSL_GUARDED_BY(mu_) = 0;
  bool stream_started_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace specd::http

#endif  // SPECD_SERVICES_COORDINATOR_HTTP_COMPLETION_JOB_H_
