// Tool calls through the HTTP API in process: a real scheduler and engine whose target worker is
// made to reply with a scripted text (the tokens of a call), so the whole path runs — the chat
// template with the tools, the reply parsed in both formats, OpenAI's response and stream shapes —
// and the stream is checked by the official `openai` Node SDK's own accumulator
// (ChatCompletionStream), which refuses tool calls without an index, id, type, name or arguments.
#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/synth/synth.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/common/work_queue.h"
#include "services/coordinator/chat_prompt.h"
#include "services/coordinator/coordinator_metrics.h"
#include "services/coordinator/generation_service.h"
#include "services/coordinator/http/openai_api.h"
#include "services/coordinator/local_worker.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/services/coordinator/forwarding_worker.h"
#include "tests/test_util.h"

namespace specd::http {
namespace {

using Json = nlohmann::ordered_json;
using ::testing::HasSubstr;
using testing::ScopedTempDir;

constexpr int32_t kEos = 2;

// The target worker, whose every plain-decoding token (K = 0) is replaced by the next of the
// script, then EOS: the coordinator commits it and feeds it back, as it would a sampled one.
class ScriptedTarget final : public testing::ForwardingWorker {
 public:
  explicit ScriptedTarget(WorkerApi& inner) : ForwardingWorker(inner) {}

  void SetReply(std::vector<int32_t> reply) {
    absl::MutexLock lock(&mu_);
    reply_ = std::move(reply);
    next_.clear();
  }

  absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest> batch) override {
    absl::StatusOr<std::vector<VerifySequenceResult>> out = ForwardingWorker::Verify(batch);
    if (!out.ok()) return out;
    absl::MutexLock lock(&mu_);
    for (VerifySequenceResult& r : *out) {
      if (!r.status.ok() || r.prefilling) continue;
      size_t& i = next_[r.seq];
      const int32_t token = i < reply_.size() ? reply_[i] : kEos;
      ++i;
      r.bonus_token = token;
      if (!r.argmax.empty()) r.argmax[0] = token;
    }
    return out;
  }

 private:
  absl::Mutex mu_;
  std::vector<int32_t> reply_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SeqId, size_t> next_ ABSL_GUARDED_BY(mu_);
};

// An exchange that records a whole response or a stream's events.
class RecordingExchange final : public HttpExchange {
 public:
  explicit RecordingExchange(std::string body) {
    request_.method = "POST";
    request_.target = request_.path = "/v1/chat/completions";
    request_.body = std::move(body);
  }
  const HttpRequest& request() const override { return request_; }
  void Respond(HttpResponse response) override {
    absl::MutexLock lock(&mu_);
    status_ = response.status;
    body_ = std::move(response.body);
    done_.Notify();
  }
  void StartStream(std::string, std::vector<std::pair<std::string, std::string>>) override {
    absl::MutexLock lock(&mu_);
    status_ = 200;
  }
  void Send(std::string data) override {
    absl::MutexLock lock(&mu_);
    body_ += data;
  }
  void End() override { done_.Notify(); }
  void Post(std::function<void()> work) override { work(); }
  void OnClientGone(std::function<void()>) override {}

  // The status and body (a stream's server-sent events, concatenated) once answered.
  std::pair<int, std::string> Wait() {
    EXPECT_TRUE(done_.WaitForNotificationWithTimeout(absl::Seconds(60)));
    absl::MutexLock lock(&mu_);
    return {status_, body_};
  }

 private:
  HttpRequest request_;
  absl::Mutex mu_;
  int status_ ABSL_GUARDED_BY(mu_) = 0;
  std::string body_ ABSL_GUARDED_BY(mu_);
  absl::Notification done_;
};

// The JSON of each "data:" event of a stream, [DONE] left out.
std::vector<Json> Events(const std::string& sse) {
  std::vector<Json> out;
  for (absl::string_view line : absl::StrSplit(sse, '\n')) {
    if (!absl::ConsumePrefix(&line, "data: ") || line == "[DONE]") continue;
    out.push_back(Json::parse(line));
  }
  return out;
}

// What the `openai` SDK's ChatCompletionStream assembles from the stream's chunks.
Json SdkAssembled(const std::vector<Json>& events, const std::filesystem::path& dir) {
  std::string ndjson;
  for (const Json& e : events) ndjson += e.dump() + "\n";
  const std::filesystem::path in = dir / "chunks.ndjson";
  std::ofstream(in) << ndjson;
  const std::string src = testing::SourceDir().string();
  const std::string cmd = absl::StrCat("node ", src, "/tests/clients/openai_stream_assembly.mjs ",
                                       src, " < ", in.string());
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while (pipe != nullptr && (n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  EXPECT_EQ(pipe != nullptr ? pclose(pipe) : -1, 0) << cmd << "\n" << out;
  const Json parsed = Json::parse(out, nullptr, false);
  EXPECT_FALSE(parsed.is_discarded()) << out;
  return parsed;
}

// A reply's text without the space the synthetic SentencePiece tokenizer puts before its first
// word (its pieces carry their leading space, as Llama 2's do).
std::string Visible(const Json& text) {
  return text.is_string() ? std::string(absl::StripLeadingAsciiWhitespace(text.get<std::string>()))
                          : "(not a string: " + text.dump() + ")";
}

// A template that lists the tools; with `hermes`, it asks for <tool_call> tags.
std::string Template(bool hermes) {
  return absl::StrCat(
      "{% if tools %}Tools: {{ tools | tojson }}\n",
      hermes ? "Call one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>\n" : "",
      "{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:");
}

const Json kTools = Json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
  {"type": "function", "function": {"name": "calculate",
   "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}])");

class ToolCallsApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    SynthSpec spec;
    spec.config = testing::SmallConfig();
    spec.config.vocab_size = 1000;  // a synthetic tokenizer with byte fallback for JSON's marks
    spec.config.num_layers = 2;
    spec.config.max_position_embeddings = 2048;
    testing::WriteSynth(spec, dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }

  void Serve(bool hermes) {
    std::unique_ptr<LlamaEngine> engine = testing::MakeEngine(dir_->path(), 1, /*kv_tokens=*/8192);
    ASSERT_NE(engine, nullptr);
    worker_ = std::make_unique<LocalWorker>(
        std::make_unique<WorkerRuntime>(std::move(engine), WorkerRuntimeOptions{}));
    target_ = std::make_unique<ScriptedTarget>(*worker_);
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromDir(dir_->path());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
    absl::StatusOr<ChatPrompt> chat = ChatPrompt::Load("", Template(hermes));
    ASSERT_TRUE(chat.ok()) << chat.status();
    chat_ = std::make_unique<ChatPrompt>(*std::move(chat));
    SchedulerOptions o;
    o.max_seq_len = 2048;
    o.eos_token_ids = {kEos};
    scheduler_ = std::make_unique<Scheduler>(*target_, *target_, tokenizer_.get(), o);
    state_.scheduler = scheduler_.get();
    state_.tokenizer = tokenizer_.get();
    state_.chat = chat_.get();
    state_.limits.vocab_size = 1000;
    state_.limits.max_seq_len = 2048;
    state_.limits.has_draft = false;
    state_.limits.default_num_speculative_tokens = 0;
    state_.info.set_served_model_name("m");
    state_.metrics = &metrics_;
    api_ = std::make_unique<OpenAiApi>(OpenAiApiOptions{}, queue_);
    api_->SetServing(&state_);
  }

  void TearDown() override {
    queue_.Stop();
    api_.reset();
    scheduler_.reset();
  }

  // The model's reply will be `text`, token for token.
  void Reply(const std::string& text) {
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer_->Encode(text, {.add_bos = false});
    ASSERT_TRUE(ids.ok()) << ids.status();
    ASSERT_EQ(*tokenizer_->Decode(*ids), text) << "the synthetic tokenizer cannot spell it";
    target_->SetReply(*std::move(ids));
  }

  std::pair<int, std::string> Chat(Json body) {
    body["messages"] = {{{"role", "user"}, {"content", "Weather in Oslo?"}}};
    body["tools"] = kTools;
    body["temperature"] = 0;
    auto exchange = std::make_shared<RecordingExchange>(body.dump());
    api_->Handle(exchange);
    return exchange->Wait();
  }

  static inline ScopedTempDir* dir_ = nullptr;
  std::unique_ptr<LocalWorker> worker_;
  std::unique_ptr<ScriptedTarget> target_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatPrompt> chat_;
  std::unique_ptr<Scheduler> scheduler_;
  CoordinatorMetrics metrics_;
  ServingState state_;
  WorkQueue queue_{1};
  std::unique_ptr<OpenAiApi> api_;
};

TEST_F(ToolCallsApiTest, Llama3JsonReplyIsAToolCall) {
  ASSERT_NO_FATAL_FAILURE(Serve(/*hermes=*/false));
  Reply(R"({"name": "get_weather", "parameters": {"city": "Oslo"}})");
  const auto [status, body] = Chat({});
  ASSERT_EQ(status, 200) << body;
  const Json r = Json::parse(body);
  const Json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const Json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(Json::parse(call["function"]["arguments"].get<std::string>()),
            Json::parse(R"({"city": "Oslo"})"));
  const std::string id = r["id"].get<std::string>();
  EXPECT_EQ(call["id"], "call_" + id.substr(id.find('-') + 1) + "_0_0");
  EXPECT_FALSE(call.contains("index")) << "index belongs to stream deltas";

  // Streamed: nothing is sent while the reply may be a call, then the call whole.
  const auto [stream_status, sse] = Chat({{"stream", true}});
  ASSERT_EQ(stream_status, 200) << sse;
  const std::vector<Json> events = Events(sse);
  ASSERT_EQ(events.size(), 1u) << sse;
  const Json& delta = events[0]["choices"][0]["delta"];
  EXPECT_EQ(delta["role"], "assistant");
  EXPECT_FALSE(delta.contains("content"));
  EXPECT_EQ(delta["tool_calls"][0]["index"], 0);
  EXPECT_EQ(events[0]["choices"][0]["finish_reason"], "tool_calls");
  const Json sdk = SdkAssembled(events, dir_->path());
  EXPECT_EQ(sdk["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(sdk["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(sdk["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            call["function"]["arguments"]);

  // tool_choice "none": the same reply is content.
  const auto [none_status, none_body] = Chat({{"tool_choice", "none"}});
  ASSERT_EQ(none_status, 200) << none_body;
  const Json none = Json::parse(none_body)["choices"][0];
  EXPECT_EQ(none["finish_reason"], "stop");
  EXPECT_EQ(Visible(none["message"]["content"]),
            R"({"name": "get_weather", "parameters": {"city": "Oslo"}})");
  EXPECT_FALSE(none["message"].contains("tool_calls"));
  // Two replies were calls (whole and streamed), one call each; the third was content.
  const std::string metrics = metrics_.Text();
  EXPECT_THAT(metrics, HasSubstr("\nspecd_tool_call_replies_total 2\n")) << metrics;
  EXPECT_THAT(metrics, HasSubstr("\nspecd_tool_calls_total 2\n"));
}

TEST_F(ToolCallsApiTest, HermesReplyStreamsItsContentThenItsCalls) {
  ASSERT_NO_FATAL_FAILURE(Serve(/*hermes=*/true));
  Reply(
      "Let me look. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"
      "\n</tool_call>\n<tool_call>\n{\"name\": \"calculate\", \"arguments\": {\"expr\": "
      "\"6*7\"}}\n</tool_call>");
  const auto [status, body] = Chat({});
  ASSERT_EQ(status, 200) << body;
  const Json r = Json::parse(body);
  const Json& message = r["choices"][0]["message"];
  EXPECT_EQ(Visible(message["content"]), "Let me look.");
  ASSERT_EQ(message["tool_calls"].size(), 2u);
  EXPECT_EQ(message["tool_calls"][1]["function"]["name"], "calculate");
  EXPECT_EQ(message["tool_calls"][1]["function"]["arguments"], R"({"expr":"6*7"})");
  EXPECT_NE(message["tool_calls"][0]["id"], message["tool_calls"][1]["id"]);

  const auto [stream_status, sse] = Chat({{"stream", true}});
  ASSERT_EQ(stream_status, 200) << sse;
  const std::vector<Json> events = Events(sse);
  ASSERT_GE(events.size(), 2u) << "the content did not go out before the calls: " << sse;
  std::string content;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const Json& delta = events[i]["choices"][0]["delta"];
    EXPECT_FALSE(delta.contains("tool_calls"));
    content += delta.value("content", "");
  }
  EXPECT_EQ(Visible(content), "Let me look.");
  const Json sdk = SdkAssembled(events, dir_->path());
  EXPECT_EQ(Visible(sdk["choices"][0]["message"]["content"]), "Let me look.");
  ASSERT_EQ(sdk["choices"][0]["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(sdk["choices"][0]["message"]["tool_calls"][1]["function"]["arguments"],
            R"({"expr":"6*7"})");

  // parallel_tool_calls false: only the first call.
  const auto [one_status, one_body] = Chat({{"parallel_tool_calls", false}});
  ASSERT_EQ(one_status, 200) << one_body;
  EXPECT_EQ(Json::parse(one_body)["choices"][0]["message"]["tool_calls"].size(), 1u);
}

TEST_F(ToolCallsApiTest, ACallToAnUndeclaredToolOrBrokenJsonIsContent) {
  ASSERT_NO_FATAL_FAILURE(Serve(/*hermes=*/true));
  for (const std::string& reply : {
           std::string("<tool_call>\n{\"name\": \"send_email\", \"arguments\": {}}\n</tool_call>"),
           std::string("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "),
       }) {
    Reply(reply);
    const auto [status, body] = Chat({});
    ASSERT_EQ(status, 200) << body;
    const Json r = Json::parse(body);
    const Json& choice = r["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "stop");
    EXPECT_EQ(Visible(choice["message"]["content"]), reply);
    const auto [stream_status, sse] = Chat({{"stream", true}});
    std::string streamed;
    for (const Json& e : Events(sse)) streamed += e["choices"][0]["delta"].value("content", "");
    EXPECT_EQ(Visible(streamed), reply);
  }
}

}  // namespace
}  // namespace specd::http
