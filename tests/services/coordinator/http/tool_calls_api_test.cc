// Tool calls through the HTTP API in process: a real scheduler and engine whose target worker is
// made to reply with a scripted text (the tokens of a call), so the whole path runs — the chat
// template with the tools, the reply parsed in both formats, OpenAI's response and stream shapes —
// and the stream is checked by the official `openai` Node SDK's own accumulator
// (ChatCompletionStream), which refuses tool calls without an index, id, type, name or arguments.
#include <chrono>
#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
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
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
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
  explicit RecordingExchange(std::string body, std::string path = "/v1/chat/completions") {
    request_.method = "POST";
    request_.target = request_.path = std::move(path);
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

// A template that lists the tools, and the calls and answers of earlier turns, and asks for
// calls in `format` (by its tag; Llama 3's JSON has none).
std::string Template(ToolCallFormat format) {
  const char* ask = "";
  if (format == ToolCallFormat::kHermes) {
    ask = "Call one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>\n";
  } else if (format == ToolCallFormat::kMistral) {
    ask = "Call them as [TOOL_CALLS] [{\"name\": ..., \"arguments\": ...}]\n";
  }
  return absl::StrCat(
      "{% if tools %}Tools: {{ tools | tojson }}\n", ask,
      "{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}",
      "{% if m.tool_calls %}{% for c in m.tool_calls %}<call {{ c.id }} {{ c.function.name }} ",
      "{{ c.function.arguments | tojson }}>{% endfor %}{% endif %}",
      "{% if m.tool_call_id %} (answers {{ m.tool_call_id }}){% endif %}\n{% endfor %}assistant:");
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

  void Serve(ToolCallFormat format) {
    std::unique_ptr<LlamaEngine> engine = testing::MakeEngine(dir_->path(), 1, /*kv_tokens=*/8192);
    ASSERT_NE(engine, nullptr);
    worker_ = std::make_unique<LocalWorker>(
        std::make_unique<WorkerRuntime>(std::move(engine), WorkerRuntimeOptions{}));
    target_ = std::make_unique<ScriptedTarget>(*worker_);
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromDir(dir_->path());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
    absl::StatusOr<ChatPrompt> chat = ChatPrompt::Load("", Template(format));
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
    service_ = std::make_unique<GenerationService>(PublicApiOptions{}, queue_);
    service_->SetServing(&state_);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Generation::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
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

  // The gRPC API's form of kTools.
  static void AddTools(v1::Chat* chat) {
    for (const Json& tool : kTools) {
      v1::Tool* t = chat->add_tools();
      t->set_name(tool["function"]["name"].get<std::string>());
      t->set_description(tool["function"].value("description", ""));
      ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(tool["function"]["parameters"].dump(),
                                                              t->mutable_parameters())
                      .ok());
    }
  }

  // A whole Generate stream of a chat request: its messages and status.
  std::pair<std::vector<v1::GenerateResponse>, grpc::Status> Generate(
      const v1::GenerateRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
        stub_->Generate(&context, request);
    std::vector<v1::GenerateResponse> out;
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) out.push_back(msg);
    return {std::move(out), reader->Finish()};
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
  std::unique_ptr<GenerationService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

TEST_F(ToolCallsApiTest, Llama3JsonReplyIsAToolCall) {
  ASSERT_NO_FATAL_FAILURE(Serve(ToolCallFormat::kLlama3Json));
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
  ASSERT_NO_FATAL_FAILURE(Serve(ToolCallFormat::kHermes));
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
  ASSERT_NO_FATAL_FAILURE(Serve(ToolCallFormat::kHermes));
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

// Mistral's list of calls, whose ids its templates check: nine letters and digits, which the
// next turn sends back.
TEST_F(ToolCallsApiTest, MistralReplyIsAListOfCallsWithIdsItsTemplateTakes) {
  ASSERT_NO_FATAL_FAILURE(Serve(ToolCallFormat::kMistral));
  Reply(R"([TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo"}}, )"
        R"({"name": "calculate", "arguments": {"expr": "6*7"}}])");
  const auto [status, body] = Chat({});
  ASSERT_EQ(status, 200) << body;
  const Json choice = Json::parse(body)["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 2u);
  for (const Json& call : choice["message"]["tool_calls"]) {
    const std::string id = call["id"].get<std::string>();
    EXPECT_EQ(id.size(), 9u) << id;
    EXPECT_TRUE(absl::c_all_of(id, [](char c) { return absl::ascii_isalnum(c); })) << id;
  }
  EXPECT_EQ(choice["message"]["tool_calls"][1]["function"]["arguments"], R"({"expr":"6*7"})");

  const auto [stream_status, sse] = Chat({{"stream", true}});
  ASSERT_EQ(stream_status, 200) << sse;
  const std::vector<Json> events = Events(sse);
  ASSERT_EQ(events.size(), 1u) << "a reply that opens a list is held whole: " << sse;
  const Json sdk = SdkAssembled(events, dir_->path());
  EXPECT_EQ(sdk["choices"][0]["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(sdk["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
}

// The gRPC API: the same calls, in the last message of the stream, after the content.
TEST_F(ToolCallsApiTest, GrpcReplyStreamsItsContentThenItsCalls) {
  ASSERT_NO_FATAL_FAILURE(Serve(ToolCallFormat::kHermes));
  const std::string reply =
      "Let me look. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"calculate\", \"arguments\": "
      "{\"expr\": \"6*7\"}}\n</tool_call>";
  Reply(reply);
  v1::GenerateRequest g;
  v1::ChatMessage* m = g.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Weather in Oslo?");
  AddTools(g.mutable_chat());
  g.mutable_sampling()->set_temperature(0);
  const auto [messages, status] = Generate(g);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_GE(messages.size(), 2u) << "the content did not go out before the calls";
  std::string content;
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < messages.size(); ++i) {
    content += messages[i].text();
    tokens.insert(tokens.end(), messages[i].token_ids().begin(), messages[i].token_ids().end());
    if (i + 1 < messages.size()) {
      EXPECT_EQ(messages[i].tool_calls_size(), 0);
      EXPECT_EQ(messages[i].finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
    }
  }
  EXPECT_EQ(Visible(Json(content)), "Let me look.");
  const v1::GenerateResponse& last = messages.back();
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_TOOL_CALLS);
  EXPECT_EQ(static_cast<int64_t>(tokens.size()), last.usage().completion_tokens())
      << "every token is sent, the calls' too";
  ASSERT_EQ(last.tool_calls_size(), 2);
  EXPECT_EQ(last.tool_calls(0).name(), "get_weather");
  EXPECT_EQ(Json::parse(last.tool_calls(0).arguments()), Json::parse(R"({"city": "Oslo"})"));
  EXPECT_EQ(last.tool_calls(1).name(), "calculate");
  EXPECT_EQ(Json::parse(last.tool_calls(1).arguments()), Json::parse(R"({"expr": "6*7"})"));
  EXPECT_TRUE(absl::StartsWith(last.tool_calls(0).id(), "call_")) << last.tool_calls(0).id();
  EXPECT_NE(last.tool_calls(0).id(), last.tool_calls(1).id());

  // Only the first call without parallel calls; none with TOOL_CHOICE_NONE, where the same reply
  // is content.
  g.mutable_chat()->set_parallel_tool_calls(false);
  const auto [one, one_status] = Generate(g);
  ASSERT_TRUE(one_status.ok()) << one_status.error_message();
  EXPECT_EQ(one.back().tool_calls_size(), 1);
  g.mutable_chat()->set_tool_choice(v1::TOOL_CHOICE_NONE);
  const auto [none, none_status] = Generate(g);
  ASSERT_TRUE(none_status.ok()) << none_status.error_message();
  std::string text;
  for (const v1::GenerateResponse& r : none) {
    EXPECT_EQ(r.tool_calls_size(), 0);
    text += r.text();
  }
  EXPECT_EQ(Visible(Json(text)), reply);
  EXPECT_EQ(none.back().finish_reason(), v1::FINISH_REASON_EOS_TOKEN);
  const std::string metrics = metrics_.Text();
  EXPECT_THAT(metrics, HasSubstr("\nspecd_tool_call_replies_total 2\n")) << metrics;
  EXPECT_THAT(metrics, HasSubstr("\nspecd_tool_calls_total 3\n"));
}

// kTools with their parameters' keys sorted, as the gRPC API's Structs reach the template.
Json ToolsWithSortedParameters() {
  Json tools = kTools;
  for (Json& tool : tools) {
    Json& parameters = tool["function"]["parameters"];
    parameters = Json::parse(nlohmann::json::parse(parameters.dump()).dump());
  }
  return tools;
}

// A conversation that goes on after the calls: the assistant's calls and the tools' answers reach
// the template as the HTTP API's OpenAI messages do, so both APIs encode it to the same tokens.
TEST_F(ToolCallsApiTest, GrpcConversationWithCallsEncodesAsTheHttpApisDoes) {
  ASSERT_NO_FATAL_FAILURE(Serve(ToolCallFormat::kLlama3Json));
  v1::TokenizeRequest t;
  v1::Chat* chat = t.mutable_chat();
  AddTools(chat);
  v1::ChatMessage* user = chat->add_messages();
  user->set_role("user");
  user->set_content("Weather in Oslo?");
  v1::ChatMessage* assistant = chat->add_messages();
  assistant->set_role("assistant");
  v1::ToolCall* call = assistant->add_tool_calls();
  call->set_id("call_1");
  call->set_name("get_weather");
  call->set_arguments(R"({"city": "Oslo"})");
  v1::ChatMessage* answer = chat->add_messages();
  answer->set_role("tool");
  answer->set_content("12 C");
  answer->set_tool_call_id("call_1");

  grpc::ClientContext context;
  v1::TokenizeResponse ids;
  const grpc::Status st = stub_->Tokenize(&context, t, &ids);
  ASSERT_TRUE(st.ok()) << st.error_message();
  grpc::ClientContext detok_context;
  v1::DetokenizeRequest d;
  *d.mutable_token_ids() = ids.token_ids();
  v1::DetokenizeResponse text;
  ASSERT_TRUE(stub_->Detokenize(&detok_context, d, &text).ok());
  EXPECT_THAT(text.text(), HasSubstr(R"(<call call_1 get_weather {"city": "Oslo"}>)"))
      << "the arguments reach the template parsed, as an object";
  EXPECT_THAT(text.text(), HasSubstr("tool: 12 C (answers call_1)"));
  EXPECT_THAT(text.text(), HasSubstr(R"("name": "get_weather")"));

  const Json body = {
      {"messages",
       {{{"role", "user"}, {"content", "Weather in Oslo?"}},
        {{"role", "assistant"},
         {"content", nullptr},
         {"tool_calls",
          {{{"id", "call_1"},
            {"type", "function"},
            {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Oslo"})"}}}}}}},
        {{"role", "tool"}, {"content", "12 C"}, {"tool_call_id", "call_1"}}}},
      {"tools", ToolsWithSortedParameters()}};
  auto exchange = std::make_shared<RecordingExchange>(body.dump(), "/tokenize");
  api_->Handle(exchange);
  const auto [http_status, http_body] = exchange->Wait();
  ASSERT_EQ(http_status, 200) << http_body;
  EXPECT_EQ(Json::parse(http_body)["tokens"],
            Json(std::vector<int32_t>(ids.token_ids().begin(), ids.token_ids().end())));
}

TEST_F(ToolCallsApiTest, GrpcToolsAreCheckedAsTheHttpApiChecksThem) {
  ASSERT_NO_FATAL_FAILURE(Serve(ToolCallFormat::kHermes));
  v1::GenerateRequest g;
  v1::ChatMessage* m = g.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Hi");
  const auto expect_invalid = [&](const std::string& why) {
    const auto [messages, status] = Generate(g);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << why;
    EXPECT_THAT(status.error_message(), HasSubstr(why));
    EXPECT_TRUE(messages.empty());
  };
  g.mutable_chat()->set_tool_choice(v1::TOOL_CHOICE_AUTO);
  expect_invalid("tool_choice AUTO needs tools");
  g.mutable_chat()->set_tool_choice(static_cast<v1::ToolChoice>(7));
  expect_invalid("tool_choice 7 is not a ToolChoice this server knows");
  g.mutable_chat()->set_tool_choice(v1::TOOL_CHOICE_AUTO);
  g.mutable_chat()->add_tools()->set_name("get_weather");
  g.mutable_chat()->add_tools()->set_name("get_weather");
  expect_invalid("tools[1].function.name \"get_weather\" is already the name of another tool");
  g.mutable_chat()->mutable_tools(1)->set_name("get weather");
  expect_invalid("tools[1].function.name must be 1 to 64 letters");
  // The server is unharmed: the same request with good tools is served.
  g.mutable_chat()->mutable_tools(1)->set_name("get_time");
  Reply("Hello");
  const auto [messages, status] = Generate(g);
  EXPECT_TRUE(status.ok()) << status.error_message();
  ASSERT_FALSE(messages.empty());
  EXPECT_EQ(messages.back().finish_reason(), v1::FINISH_REASON_EOS_TOKEN);
}

}  // namespace
}  // namespace specd::http
