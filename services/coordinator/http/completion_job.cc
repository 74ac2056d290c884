#include "services/coordinator/http/completion_job.h"

#include <span>
#include <utility>

#include "absl/strings/str_cat.h"

namespace specd::http {
namespace {

ToolCallPolicy ToolPolicyOf(const OpenAiRequest& request, const ServingState& state) {
  ToolCallPolicy policy;
  if (state.chat == nullptr) return policy;
  policy.format = state.chat->tool_call_format();
  policy.tools = request.tool_names;
  policy.parallel_tool_calls = request.parallel_tool_calls;
  return policy;
}

}  // namespace

CompletionJob::CompletionJob(std::shared_ptr<HttpExchange> exchange, const OpenAiRequest& request,
                             Meta meta, const ServingState* state, std::function<void()> on_done)
    : exchange_(std::move(exchange)),
      endpoint_(request.endpoint),
      stream_(request.stream),
      include_usage_(request.include_usage),
      logprobs_(request.logprobs),
      top_logprobs_(request.top_logprobs),
      return_token_ids_(request.return_token_ids),
      tool_policy_(ToolPolicyOf(request, *state)),
      n_(request.n),
      meta_(std::move(meta)),
      state_(state),
      on_done_(std::move(on_done)) {}

void CompletionJob::Start(std::vector<ChoiceInput> inputs) {
  // A client that leaves frees its sequences within a round: the transport notices the closed
  // connection at once (its read fails) and this cancels every choice still running.
  exchange_->OnClientGone([weak = weak_from_this()] {
    if (std::shared_ptr<CompletionJob> job = weak.lock()) {
      job->End(absl::CancelledError("the client closed its connection"));
    }
  });
  timings_.resize(inputs.size());
  for (const ChoiceInput& in : inputs) guidance_.push_back(GuidanceOf(in.request));
  absl::MutexLock lock(&mu_);
  choices_.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    choices_[i].echo = std::move(inputs[i].echo);
    choices_[i].prompt = inputs[i].request.prompt;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto sink = [self = shared_from_this(), i](GenerationEvent event) {
      self->OnEvent(i, std::move(event));
    };
    absl::StatusOr<Scheduler::RequestHandle> h =
        state_->scheduler->Submit(std::move(inputs[i].request), std::move(sink));
    if (!h.ok()) {
      if (state_->metrics != nullptr) state_->metrics->OnRequestError(h.status().code());
      Fail(h.status());
      return;
    }
    choices_[i].handle = *h;
    if (state_->metrics != nullptr) state_->metrics->OnGuidedRequest(guidance_[i]);
  }
}

void CompletionJob::End(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (ended_) return;
  if (state_->metrics != nullptr) state_->metrics->OnRequestError(status.code());
  Fail(status);
}

void CompletionJob::CancelAll() {
  for (const Choice& c : choices_) {
    if (!c.done && c.handle != 0) state_->scheduler->Cancel(c.handle);
  }
}

void CompletionJob::Fail(const absl::Status& status) {
  if (ended_) return;
  ended_ = true;
  over_ = true;
  CancelAll();
  if (!stream_started_) {
    HttpResponse r;
    r.status = HttpStatusOf(status.code());
    r.body = ErrorJson(status).dump(-1, ' ', false, Json::error_handler_t::replace);
    exchange_->Respond(std::move(r));
  } else {
    // The status line is out: the error travels as an event, and the stream still ends.
    exchange_->Send(SseEvent(ErrorJson(status)));
    exchange_->Send(std::string(kSseDone));
    exchange_->End();
  }
  on_done_();
}

void CompletionJob::OnEvent(size_t index, GenerationEvent event) {
  if (over_) return;  // cancelled here, or failed: nothing more is sent
  if (state_->metrics != nullptr)
    RecordEvent(*state_->metrics, timings_[index], guidance_[index], event);
  exchange_->Post([self = shared_from_this(), index, event = std::move(event)]() mutable {
    self->HandleEvent(index, std::move(event));
  });
}

void CompletionJob::HandleEvent(size_t index, GenerationEvent event) {
  absl::MutexLock lock(&mu_);
  Choice& c = choices_[index];
  if (ended_) return;
  if (!event.error.ok()) {
    Fail(event.error);
    return;
  }
  if (event.prompt_logprobs.has_value()) {
    c.prompt_logprobs = std::move(event.prompt_logprobs);
    if (stream_) StreamEcho(index);
    return;
  }
  if (stream_ && !tool_policy_.parses()) {
    StreamChunk(index, event);
  } else {
    c.text += event.text;
  }
  c.tokens.insert(c.tokens.end(), event.tokens.begin(), event.tokens.end());
  c.logprobs.insert(c.logprobs.end(), event.logprobs.begin(), event.logprobs.end());
  if (stream_ && tool_policy_.parses()) StreamToolAware(index, event);
  if (event.finish == FinishReason::kNone) return;
  c.done = true;
  c.finish = event.finish;
  c.usage = event.usage;
  if (++finished_ == static_cast<int64_t>(choices_.size())) Finish();
}

std::string CompletionJob::TokenString(int32_t previous, int32_t id) const {
  if (state_->tokenizer == nullptr) return absl::StrCat("token_id:", id);
  const Tokenizer& tok = *state_->tokenizer;
  if (previous >= 0) {
    // What the token adds after its predecessor: a SentencePiece "▁the" keeps its space there.
    const int32_t both[] = {previous, id};
    absl::StatusOr<std::string> before = tok.Decode(std::span<const int32_t>(both, 1));
    absl::StatusOr<std::string> after = tok.Decode(both);
    if (before.ok() && after.ok() && after->starts_with(*before)) {
      return after->substr(before->size());
    }
  }
  const int32_t one[] = {id};
  absl::StatusOr<std::string> text = tok.Decode(one);
  return text.ok() ? *std::move(text) : absl::StrCat("token_id:", id);
}

Json CompletionJob::ChoiceLogprobs(int64_t text_offset, std::span<const int32_t> tokens,
                                   std::span<const TokenLogprobs> logprobs,
                                   int32_t previous) const {
  if (!logprobs_) return nullptr;
  const TokenText text = [this](int32_t before, int32_t id) { return TokenString(before, id); };
  if (endpoint_ == Endpoint::kChatCompletions) {
    return ChatLogprobs(tokens, logprobs, text, previous, top_logprobs_);
  }
  return CompletionLogprobs(tokens, logprobs, text, previous, text_offset, top_logprobs_);
}

Json CompletionJob::ChunkEnvelope() const {
  const bool chat = endpoint_ == Endpoint::kChatCompletions;
  return {{"id", meta_.id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", meta_.created},
          {"model", meta_.model}};
}

Json CompletionJob::EchoLogprobs(const Choice& c) const {
  const TokenText text = [this](int32_t before, int32_t id) { return TokenString(before, id); };
  return EchoedPromptLogprobs(c.prompt, *c.prompt_logprobs, text, top_logprobs_);
}

void CompletionJob::SendChoiceChunk(Json choice) {
  if (!stream_started_) {
    stream_started_ = true;
    exchange_->StartStream("text/event-stream", {});
  }
  Json chunk = ChunkEnvelope();
  chunk["choices"] = Json::array({std::move(choice)});
  if (include_usage_) chunk["usage"] = nullptr;
  exchange_->Send(SseEvent(chunk));
}

void CompletionJob::StreamEcho(size_t index) {
  Choice& c = choices_[index];
  Json logprobs = EchoLogprobs(c);
  c.text_offset = EndOffset(logprobs);
  Json choice = {{"index", index}, {"text", c.echo}, {"logprobs", std::move(logprobs)}};
  choice["finish_reason"] = nullptr;
  if (return_token_ids_) choice["token_ids"] = Json::array();
  c.started = true;
  SendChoiceChunk(std::move(choice));
}

void CompletionJob::StreamChunk(size_t index, const GenerationEvent& event) {
  Choice& c = choices_[index];
  const bool chat = endpoint_ == Endpoint::kChatCompletions;
  Json choice = {{"index", index}};
  if (chat) {
    Json delta = Json::object();
    if (!c.started) delta["role"] = "assistant";
    delta["content"] = event.text;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = c.started ? event.text : c.echo + event.text;
  }
  const int32_t previous = !c.tokens.empty()   ? c.tokens.back()
                           : !c.prompt.empty() ? c.prompt.back()
                                               : -1;
  choice["logprobs"] = ChoiceLogprobs(c.text_offset, event.tokens, event.logprobs, previous);
  choice["finish_reason"] =
      event.finish == FinishReason::kNone ? Json(nullptr) : Json(FinishReasonJson(event.finish));
  if (return_token_ids_) choice["token_ids"] = event.tokens;
  if (event.finish != FinishReason::kNone) choice["usage"] = UsageJson(event.usage);
  c.started = true;
  if (logprobs_ && endpoint_ == Endpoint::kCompletions) {
    int32_t before = previous;
    for (const int32_t t : event.tokens) {
      c.text_offset += static_cast<int64_t>(TokenString(before, t).size());
      before = t;
    }
  }
  SendChoiceChunk(std::move(choice));
}

void CompletionJob::StreamToolAware(size_t index, const GenerationEvent& event) {
  Choice& c = choices_[index];
  if (!c.tool_stream.has_value()) c.tool_stream.emplace(tool_policy_);
  const bool last = event.finish != FinishReason::kNone;
  std::optional<ToolCallStream::Chunk> chunk = c.tool_stream->Next(c.text, c.tokens.size(), last);
  if (!chunk.has_value()) return;
  Json delta = Json::object();
  if (!c.started) delta["role"] = "assistant";
  if (chunk->calls.has_value()) {
    if (state_->metrics != nullptr) {
      state_->metrics->OnToolCallReply(static_cast<int64_t>(chunk->calls->size()));
    }
    if (!chunk->content.empty()) delta["content"] = std::move(chunk->content);
    delta["tool_calls"] =
        ToolCallsJson(meta_.id, index, *chunk->calls, tool_policy_.format, /*stream=*/true);
  } else {
    delta["content"] = std::move(chunk->content);
  }
  const size_t begin = chunk->begin_token;
  const size_t count = chunk->end_token - begin;
  const std::span<const int32_t> chunk_tokens(c.tokens.data() + begin, count);
  const std::span<const TokenLogprobs> chunk_logprobs =
      c.logprobs.size() >= chunk->end_token
          ? std::span<const TokenLogprobs>(c.logprobs.data() + begin, count)
          : std::span<const TokenLogprobs>();
  const int32_t previous = begin > 0           ? c.tokens[begin - 1]
                           : !c.prompt.empty() ? c.prompt.back()
                                               : -1;
  Json choice = {{"index", index}, {"delta", std::move(delta)}};
  choice["logprobs"] = ChoiceLogprobs(0, chunk_tokens, chunk_logprobs, previous);
  choice["finish_reason"] = !last                      ? Json(nullptr)
                            : chunk->calls.has_value() ? Json("tool_calls")
                                                       : Json(FinishReasonJson(event.finish));
  if (return_token_ids_) choice["token_ids"] = chunk_tokens;
  if (last) choice["usage"] = UsageJson(event.usage);
  c.started = true;
  SendChoiceChunk(std::move(choice));
}

Json CompletionJob::WholeResponse() const {
  const bool chat = endpoint_ == Endpoint::kChatCompletions;
  Json out = {{"id", meta_.id},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"created", meta_.created},
              {"model", meta_.model}};
  Json choices = Json::array();
  std::vector<GenerationUsage> usages;
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    Json choice = {{"index", i}};
    std::optional<ParsedReply> reply;
    if (chat) reply = tool_policy_.Parse(c.text);
    if (reply.has_value()) {
      if (state_->metrics != nullptr) {
        state_->metrics->OnToolCallReply(static_cast<int64_t>(reply->calls.size()));
      }
      choice["message"] = {
          {"role", "assistant"},
          {"content", reply->content.empty() ? Json(nullptr) : Json(reply->content)},
          {"tool_calls",
           ToolCallsJson(meta_.id, i, reply->calls, tool_policy_.format, /*stream=*/false)}};
    } else if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.echo + c.text;
    }
    const int32_t previous = c.prompt.empty() ? -1 : c.prompt.back();
    if (c.prompt_logprobs.has_value()) {
      // The echoed prompt's entries first; the completion's offsets continue from them.
      Json all = EchoLogprobs(c);
      AppendCompletionLogprobs(all, ChoiceLogprobs(EndOffset(all), c.tokens, c.logprobs, previous));
      choice["logprobs"] = std::move(all);
    } else {
      choice["logprobs"] = ChoiceLogprobs(0, c.tokens, c.logprobs, previous);
    }
    choice["finish_reason"] = reply.has_value() ? "tool_calls" : FinishReasonJson(c.finish);
    if (return_token_ids_) {
      choice["prompt_token_ids"] = c.prompt;
      choice["token_ids"] = c.tokens;
    }
    choice["usage"] = UsageJson(c.usage);
    choices.push_back(std::move(choice));
    usages.push_back(c.usage);
  }
  out["choices"] = std::move(choices);
  out["usage"] = TotalUsage(usages, n_);
  return out;
}

void CompletionJob::Finish() {
  ended_ = true;
  over_ = true;
  if (stream_) {
    if (include_usage_) {
      std::vector<GenerationUsage> usages;
      for (const Choice& c : choices_) usages.push_back(c.usage);
      Json chunk = ChunkEnvelope();
      chunk["choices"] = Json::array();
      chunk["usage"] = TotalUsage(usages, n_);
      exchange_->Send(SseEvent(chunk));
    }
    exchange_->Send(std::string(kSseDone));
    exchange_->End();
  } else {
    HttpResponse r;
    r.body = WholeResponse().dump(-1, ' ', false, Json::error_handler_t::replace);
    exchange_->Respond(std::move(r));
  }
  on_done_();
}

}  // namespace specd::http
