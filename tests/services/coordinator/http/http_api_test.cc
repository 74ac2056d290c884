// The OpenAI-compatible HTTP API (issue 15) over `specd serve --http-listen`, three real processes
// on loopback:
//  * greedy text over HTTP equals the gRPC API's, token for token, for K = 0 and K = 4, for
//    completions and chat, streamed and not;
//  * 128 concurrent event streams each equal the same request run alone;
//  * n = 4 with a seed gives the same 4 completions every time, under load too, and completion j
//    is the gRPC request with sample number j;
//  * logprobs over HTTP are the gRPC API's numbers, the same for every K, sorted, and -9999 for
//    tokens outside the processed distribution's support;
//  * a client that drops its event stream has its request cancelled and its KV freed;
//  * POST /tokenize gives the ids generation feeds, for prompts and conversations (each way of
//    ending one, continue_final_message too, as the gRPC API's chat input does), and
//    /detokenize undoes it;
//  * real clients: the `openai` npm package, curl and Python's standard library;
//  * every error status (400, 401, 404, 405, 413, 429, 503), after which the server still serves
//    and every KV block is free.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/synth/synth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "specd/v1/generation.grpc.pb.h"
#include "tests/services/serve_process.h"
#include "tests/services/worker_process.h"
#include "tests/test_util.h"
#include "tools/specd/bench/http_client.h"

namespace specd {
namespace {

using Json = nlohmann::json;
using bench::HttpCall;
using bench::HttpConnection;
using bench::HttpReply;
using bench::HttpStream;
using bench::SseReply;
using ::testing::HasSubstr;
using testing::ScopedTempDir;
using testing::ServeProcess;
using testing::StopProcess;

// A ChatML template that writes BOS itself (as Llama 3's does): the prompt must hold one BOS.
// Given tools, it lists them first and asks for Hermes-style calls, as Qwen2.5's does.
constexpr char kTemplate[] =
    "{{ bos_token }}{% if tools %}{{ '<|im_start|>system\\nCall tools as <tool_call>{\\\"name\\\": "
    "..., \\\"arguments\\\": {...}}</tool_call>: ' + tools | tojson + '<|im_end|>\\n' }}{% endif %}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

void WriteText(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

// Runs a shell command; its exit code, with stdout in `*output` (stderr is the test's).
int Shell(const std::string& command, std::string* output) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  output->clear();
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) output->append(buf, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The tiny synthetic pair: a 4-layer target and its first layer as the draft, with the
// synthetic SentencePiece tokenizer.
void WriteModel(const std::filesystem::path& dir) {
  SynthSpec spec;
  absl::StatusOr<ModelConfig> c = ShapePreset("tiny");
  ASSERT_TRUE(c.ok());
  spec.config = *c;
  spec.residual_scale = 0.1;
  ASSERT_TRUE(WriteSyntheticModel(spec, dir).ok());
}

// One choice's text, token ids and logprobs, from a whole response or a stream's chunks.
struct Choice {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<int32_t> prompt_tokens;
  Json logprobs = Json::array();  // chat: the content items; completions: the logprobs object
  std::string finish_reason;
  Json usage;
};

std::vector<Choice> ChoicesOf(const Json& response, bool chat) {
  std::vector<Choice> out;
  for (const Json& c : response["choices"]) {
    Choice choice;
    choice.text = chat ? c["message"]["content"].get<std::string>() : c["text"].get<std::string>();
    if (c.contains("token_ids")) choice.tokens = c["token_ids"].get<std::vector<int32_t>>();
    if (c.contains("prompt_token_ids")) {
      choice.prompt_tokens = c["prompt_token_ids"].get<std::vector<int32_t>>();
    }
    if (!c["logprobs"].is_null()) choice.logprobs = chat ? c["logprobs"]["content"] : c["logprobs"];
    choice.finish_reason = c["finish_reason"].get<std::string>();
    choice.usage = c["usage"];
    out.push_back(std::move(choice));
  }
  return out;
}

std::vector<Choice> ChoicesOf(const SseReply& reply, bool chat) {
  std::vector<Choice> out;
  for (const Json& event : reply.events) {
    for (const Json& c : event["choices"]) {
      const size_t i = c["index"].get<size_t>();
      if (out.size() <= i) out.resize(i + 1);
      Choice& choice = out[i];
      choice.text += chat ? c["delta"].value("content", "") : c["text"].get<std::string>();
      if (c.contains("token_ids")) {
        for (const Json& t : c["token_ids"]) choice.tokens.push_back(t.get<int32_t>());
      }
      if (chat && !c["logprobs"].is_null()) {
        for (const Json& item : c["logprobs"]["content"]) choice.logprobs.push_back(item);
      }
      if (!c["finish_reason"].is_null()) {
        choice.finish_reason = c["finish_reason"].get<std::string>();
        choice.usage = c["usage"];
      }
    }
  }
  return out;
}

class HttpApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    WriteModel(dir_->path() / "tinymodel");
    WriteText(dir_->path() / "chatml.jinja", kTemplate);
    serve_ = ServeProcess::Start({"--target", (dir_->path() / "tinymodel").string(),
                                  "--draft-exit-layer", "1", "--threads", "1", "--http-listen",
                                  "127.0.0.1:0", "--chat-template",
                                  (dir_->path() / "chatml.jinja").string(), "--metrics"})
                 .release();
    ASSERT_NE(serve_, nullptr);
    ASSERT_GT(serve_->http_port(), 0) << "serve printed no `http on` line";
  }
  static void TearDownTestSuite() {
    delete serve_;
    serve_ = nullptr;
    delete dir_;
  }

  static int port() { return serve_->http_port(); }

  static Json Post(const std::string& path, const Json& body) {
    absl::StatusOr<HttpReply> r = HttpCall(port(), "POST", path, body.dump());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return nullptr;
    EXPECT_EQ(r->status, 200) << r->body;
    return r->Json();
  }

  static SseReply Stream(const std::string& path, const Json& body) {
    absl::StatusOr<SseReply> r = HttpStream(port(), path, body);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_TRUE(r->done) << "no [DONE] at the end of the stream";
    return *r;
  }

  static ServeProcess::Stream Grpc(const v1::GenerateRequest& r) {
    std::vector<ServeProcess::Stream> out = serve_->Generate({r});
    EXPECT_TRUE(out[0].status.ok()) << out[0].status.error_message();
    return out[0];
  }

  static v1::GenerateRequest GrpcRequest(uint32_t max_new, uint32_t k) {
    v1::GenerateRequest r;
    r.mutable_stopping()->set_max_new_tokens(max_new);
    r.mutable_stopping()->set_ignore_eos(true);
    r.mutable_speculation()->set_num_speculative_tokens(k);
    return r;
  }

  static inline ScopedTempDir* dir_ = nullptr;
  static inline ServeProcess* serve_ = nullptr;
};

TEST_F(HttpApiTest, ModelsAndHealthAnswer) {
  absl::StatusOr<HttpReply> health = HttpCall(port(), "GET", "/health");
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->status, 200);
  absl::StatusOr<HttpReply> models = HttpCall(port(), "GET", "/v1/models");
  ASSERT_TRUE(models.ok());
  EXPECT_EQ(models->status, 200);
  const Json j = models->Json();
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tinymodel");  // the target directory's name
  EXPECT_EQ(j["data"][0]["max_model_len"], 512);
  // One model by its id (escapes decoded); another is 404.
  for (const std::string id : {"tinymodel", "tiny%6dodel"}) {
    absl::StatusOr<HttpReply> one = HttpCall(port(), "GET", "/v1/models/" + id);
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(one->status, 200) << one->body;
    EXPECT_EQ(one->Json()["id"], "tinymodel");
    EXPECT_EQ(one->Json()["object"], "model");
  }
  absl::StatusOr<HttpReply> other = HttpCall(port(), "GET", "/v1/models/meta-llama/Llama-3-8B");
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->status, 404);
  EXPECT_THAT(other->body, HasSubstr("meta-llama/Llama-3-8B"));
  // The gRPC API describes the same server.
  grpc::ClientContext ctx;
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(serve_->stub().GetServerInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.served_model_name(), "tinymodel");
  EXPECT_TRUE(info.has_chat_template());
  EXPECT_TRUE(info.takes_tools());
  EXPECT_EQ(info.tool_call_format(), "hermes") << "the template asks for <tool_call> tags";
}

TEST_F(HttpApiTest, GreedyTextEqualsTheGrpcApiTokenForToken) {
  const std::vector<std::string> prompts = {"Once upon a time", "The cat sat", "A"};
  for (const uint32_t k : {0u, 4u}) {
    for (const std::string& prompt : prompts) {
      v1::GenerateRequest g = GrpcRequest(24, k);
      g.set_text(prompt);
      const ServeProcess::Stream want = Grpc(g);
      const Json body = {{"model", "tinymodel"},       {"prompt", prompt},
                         {"max_tokens", 24},           {"temperature", 0},
                         {"ignore_eos", true},         {"return_token_ids", true},
                         {"num_speculative_tokens", k}};
      const std::vector<Choice> whole = ChoicesOf(Post("/v1/completions", body), false);
      Json streamed = body;
      streamed["stream"] = true;
      const std::vector<Choice> parts = ChoicesOf(Stream("/v1/completions", streamed), false);
      for (const std::vector<Choice>* got : {&whole, &parts}) {
        ASSERT_EQ(got->size(), 1u);
        EXPECT_EQ(got->front().tokens, want.tokens) << "K = " << k << ", '" << prompt << "'";
        EXPECT_EQ(got->front().text, want.text) << "K = " << k << ", '" << prompt << "'";
        EXPECT_EQ(got->front().finish_reason, "length");
      }
    }
    // Token-id prompts, and chat against the gRPC API's chat input.
    v1::GenerateRequest g = GrpcRequest(20, k);
    for (const int32_t id : {1, 300, 301, 302}) g.mutable_token_ids()->add_ids(id);
    const ServeProcess::Stream want_ids = Grpc(g);
    const std::vector<Choice> ids =
        ChoicesOf(Post("/v1/completions", {{"prompt", {1, 300, 301, 302}},
                                           {"max_tokens", 20},
                                           {"temperature", 0},
                                           {"ignore_eos", true},
                                           {"return_token_ids", true},
                                           {"num_speculative_tokens", k}}),
                  false);
    EXPECT_EQ(ids.at(0).tokens, want_ids.tokens);

    v1::GenerateRequest chat = GrpcRequest(20, k);
    v1::ChatMessage* system = chat.mutable_chat()->add_messages();
    system->set_role("system");
    system->set_content("Be brief.");
    v1::ChatMessage* user = chat.mutable_chat()->add_messages();
    user->set_role("user");
    user->set_content("Tell me a story.");
    const ServeProcess::Stream want_chat = Grpc(chat);
    const Json messages = {{{"role", "system"}, {"content", "Be brief."}},
                           {{"role", "user"}, {"content", "Tell me a story."}}};
    const Json body = {{"messages", messages},     {"max_tokens", 20},
                       {"temperature", 0},         {"ignore_eos", true},
                       {"return_token_ids", true}, {"num_speculative_tokens", k}};
    const std::vector<Choice> whole = ChoicesOf(Post("/v1/chat/completions", body), true);
    Json streamed = body;
    streamed["stream"] = true;
    const std::vector<Choice> parts = ChoicesOf(Stream("/v1/chat/completions", streamed), true);
    for (const std::vector<Choice>* got : {&whole, &parts}) {
      EXPECT_EQ(got->at(0).tokens, want_chat.tokens) << "chat, K = " << k;
      EXPECT_EQ(got->at(0).text, want_chat.text) << "chat, K = " << k;
    }
    EXPECT_EQ(want_chat.messages.back().usage().prompt_tokens(),
              whole.at(0).usage["prompt_tokens"].get<uint32_t>());
  }
}

TEST_F(HttpApiTest, EchoStopStringsAndUsageBehaveAsOpenAis) {
  const Json base = {{"prompt", "The cat sat"},
                     {"max_tokens", 20},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"return_token_ids", true}};
  const Choice plain = ChoicesOf(Post("/v1/completions", base), false).at(0);
  ASSERT_GE(plain.text.size(), 8u);
  // echo puts the prompt before the completion, streamed or not.
  Json echo = base;
  echo["echo"] = true;
  EXPECT_EQ(ChoicesOf(Post("/v1/completions", echo), false).at(0).text, "The cat sat" + plain.text);
  echo["stream"] = true;
  EXPECT_EQ(ChoicesOf(Stream("/v1/completions", echo), false).at(0).text,
            "The cat sat" + plain.text);
  // A stop string ends the text right before it, with finish_reason "stop".
  // Three ASCII characters past the start (the synthetic model also writes byte tokens).
  std::string stop;
  for (size_t i = 2; i + 3 <= plain.text.size() && stop.empty(); ++i) {
    const std::string candidate = plain.text.substr(i, 3);
    if (std::all_of(candidate.begin(), candidate.end(),
                    [](char c) { return c > ' ' && c < 127; })) {
      stop = candidate;
    }
  }
  ASSERT_FALSE(stop.empty()) << plain.text;
  Json stopped = base;
  stopped["stop"] = {stop, "never appears"};
  const Choice cut = ChoicesOf(Post("/v1/completions", stopped), false).at(0);
  EXPECT_EQ(cut.text, plain.text.substr(0, plain.text.find(stop)));
  EXPECT_EQ(cut.finish_reason, "stop");
  EXPECT_LT(cut.tokens.size(), plain.tokens.size());
  // Usage: prompt + completion = total, and the speculative extension.
  const Json& u = plain.usage;
  EXPECT_EQ(u["completion_tokens"], 20);
  EXPECT_EQ(u["prompt_tokens"].get<int>() + 20, u["total_tokens"].get<int>());
  EXPECT_GT(u["speculative"]["rounds"].get<int>(), 0);
  EXPECT_TRUE(u["speculative"]["acceptance_rate"].is_number());
}

// Tools over HTTP: the template shows them to the model (/tokenize counts them as chat feeds
// them), and a reply that is no call streams as content: what a stream holds back while a call
// could still begin adds up to the whole response's content, tokens and logprobs.
TEST_F(HttpApiTest, ToolsReachThePromptAndContentRepliesStreamWhole) {
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const Json messages = {{{"role", "user"}, {"content", "Weather in Oslo?"}}};
  const Json with = Post("/tokenize", {{"messages", messages}, {"tools", tools}});
  const Json without = Post("/tokenize", {{"messages", messages}});
  ASSERT_TRUE(with.is_object() && without.is_object());
  EXPECT_GT(with["count"].get<int64_t>(), without["count"].get<int64_t>());
  const Json text = Post("/detokenize", {{"tokens", with["tokens"]}});
  EXPECT_THAT(text["prompt"].get<std::string>(), HasSubstr("\"name\": \"get_weather\""));

  for (const int k : {0, 3}) {
    Json body = {{"messages", messages}, {"tools", tools},           {"max_tokens", 24},
                 {"temperature", 0},     {"ignore_eos", true},       {"logprobs", true},
                 {"top_logprobs", 2},    {"return_token_ids", true}, {"num_speculative_tokens", k}};
    const std::vector<Choice> whole = ChoicesOf(Post("/v1/chat/completions", body), true);
    ASSERT_EQ(whole.size(), 1u);
    EXPECT_EQ(whole[0].prompt_tokens, with["tokens"].get<std::vector<int32_t>>());
    EXPECT_EQ(whole[0].tokens.size(), 24u);
    EXPECT_EQ(whole[0].finish_reason, "length");
    body["stream"] = true;
    const std::vector<Choice> streamed = ChoicesOf(Stream("/v1/chat/completions", body), true);
    ASSERT_EQ(streamed.size(), 1u);
    EXPECT_EQ(streamed[0].text, whole[0].text) << "K = " << k;
    EXPECT_EQ(streamed[0].tokens, whole[0].tokens);
    EXPECT_EQ(streamed[0].logprobs, whole[0].logprobs);
    EXPECT_EQ(streamed[0].finish_reason, "length");
    // tool_choice "none": the same prompt and reply, never parsed.
    body["tool_choice"] = "none";
    body["stream"] = false;
    EXPECT_EQ(ChoicesOf(Post("/v1/chat/completions", body), true)[0].tokens, whole[0].tokens);
  }
}

TEST_F(HttpApiTest, ChatTemplateThatWritesBosGetsNoSecondBos) {
  const Json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                     {"max_tokens", 2},
                     {"return_token_ids", true}};
  const std::vector<Choice> got = ChoicesOf(Post("/v1/chat/completions", body), true);
  ASSERT_EQ(got.size(), 1u);
  const std::vector<int32_t>& ids = got[0].prompt_tokens;
  // The rendered text, tokenized with special tokens parsed and no BOS added: one BOS, the one
  // the template wrote.
  grpc::ClientContext ctx;
  v1::TokenizeRequest tr;
  tr.set_text("<s><|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  tr.set_parse_special(true);
  v1::TokenizeResponse tokenized;
  ASSERT_TRUE(serve_->stub().Tokenize(&ctx, tr, &tokenized).ok());
  EXPECT_EQ(ids, std::vector<int32_t>(tokenized.token_ids().begin(), tokenized.token_ids().end()));
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], 1);  // BOS
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 1) << "a second BOS";
  // The reply is only what follows the prompt.
  EXPECT_THAT(got[0].text, ::testing::Not(HasSubstr("im_start")));
}

TEST_F(HttpApiTest, HundredTwentyEightConcurrentStreamsEachEqualItsSoloRun) {
  constexpr int kStreams = 128;
  std::vector<Json> bodies;
  for (int i = 0; i < kStreams; ++i) {
    Json b = {{"prompt", absl::StrCat("Story ", i, ":")},
              {"max_tokens", 12},
              {"ignore_eos", true},
              {"stream", true},
              {"return_token_ids", true},
              {"num_speculative_tokens", i % 5}};
    // Even streams greedy, odd ones sampled with a seed.
    b["temperature"] = i % 2 == 0 ? 0.0 : 1.0;
    if (i % 2 == 1) b["seed"] = 1000 + i;
    bodies.push_back(std::move(b));
  }
  std::vector<Choice> solo(kStreams);
  for (int i = 0; i < kStreams; ++i)
    solo[i] = ChoicesOf(Stream("/v1/completions", bodies[i]), false).at(0);
  std::vector<Choice> together(kStreams);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      absl::StatusOr<SseReply> r = HttpStream(port(), "/v1/completions", bodies[i]);
      if (!r.ok() || r->status != 200 || !r->done) {
        ++failures;
        return;
      }
      together[i] = ChoicesOf(*r, false).at(0);
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(failures.load(), 0);
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_EQ(together[i].tokens, solo[i].tokens) << "stream " << i;
    EXPECT_EQ(together[i].text, solo[i].text) << "stream " << i;
    EXPECT_EQ(together[i].tokens.size(), 12u);
  }
  serve_->ExpectNoBlocksUsed();
}

// echo with logprobs (what evaluation harnesses send to score a text): the echoed prompt's tokens
// come first, the first with null logprobs, then the completion's, which are the numbers of the
// same request without echo. The prompt's numbers are the gRPC API's logprobs.prompt, and a
// stream sends the echo and its logprobs in the first chunk.
TEST_F(HttpApiTest, EchoWithLogprobsScoresThePromptAsTheGrpcApiDoes) {
  const std::string prompt = "The cat sat on the mat";
  const Json base = {{"prompt", prompt},           {"max_tokens", 8},          {"temperature", 0},
                     {"ignore_eos", true},         {"return_token_ids", true}, {"logprobs", 2},
                     {"num_speculative_tokens", 4}};
  const Choice plain = ChoicesOf(Post("/v1/completions", base), false).at(0);
  Json echo = base;
  echo["echo"] = true;
  const Choice echoed = ChoicesOf(Post("/v1/completions", echo), false).at(0);
  ASSERT_EQ(echoed.tokens, plain.tokens);
  EXPECT_EQ(echoed.text, prompt + plain.text);
  const size_t p = echoed.prompt_tokens.size();
  ASSERT_GE(p, 3u);
  const Json& lp = echoed.logprobs;
  ASSERT_EQ(lp["tokens"].size(), p + plain.tokens.size()) << lp.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["text_offset"][0], 0);
  // Offsets count the token strings, the prompt's (a BOS's "<s>" included) then the completion's.
  for (size_t i = 1; i < lp["text_offset"].size(); ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), lp["text_offset"][i - 1].get<size_t>() +
                                                      lp["tokens"][i - 1].get<std::string>().size())
        << i;
  }
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs"}) {
    for (size_t j = 0; j < plain.tokens.size(); ++j) {
      EXPECT_EQ(lp[key][p + j], plain.logprobs[key][j]) << key << " of completion token " << j;
    }
  }
  v1::GenerateRequest g = GrpcRequest(8, 4);
  g.set_text(prompt);
  g.mutable_sampling()->set_temperature(0.0f);
  g.mutable_logprobs()->set_prompt(true);
  g.mutable_logprobs()->set_top_logprobs(2);
  const ServeProcess::Stream grpc = Grpc(g);
  ASSERT_FALSE(grpc.messages.empty());
  const v1::GenerateResponse& first = grpc.messages.front();
  EXPECT_TRUE(first.token_ids().empty()) << "the prompt's logprobs come before any token";
  EXPECT_EQ(std::vector<int32_t>(first.prompt_token_ids().begin(), first.prompt_token_ids().end()),
            echoed.prompt_tokens);
  ASSERT_EQ(static_cast<size_t>(first.prompt_logprobs_size()), p - 1);
  for (size_t j = 1; j < p; ++j) {
    const v1::TokenLogprob& want = first.prompt_logprobs(static_cast<int>(j - 1));
    EXPECT_EQ(lp["token_logprobs"][j].get<double>(), static_cast<double>(want.logprob()));
    EXPECT_LE(want.logprob(), 0.0f);
    EXPECT_EQ(want.top_token_ids_size(), 2);
  }
  EXPECT_EQ(grpc.tokens, plain.tokens);
  for (size_t m = 1; m < grpc.messages.size(); ++m) {
    EXPECT_EQ(grpc.messages[m].prompt_logprobs_size(), 0);
  }

  echo["stream"] = true;
  const SseReply streamed = Stream("/v1/completions", echo);
  ASSERT_FALSE(streamed.events.empty());
  const Json& head = streamed.events.front()["choices"][0];
  EXPECT_EQ(head["text"], prompt);
  ASSERT_EQ(head["logprobs"]["tokens"].size(), p);
  for (size_t j = 0; j < p; ++j) {
    EXPECT_EQ(head["logprobs"]["tokens"][j], lp["tokens"][j]) << j;
    EXPECT_EQ(head["logprobs"]["token_logprobs"][j], lp["token_logprobs"][j]) << j;
    EXPECT_EQ(head["logprobs"]["text_offset"][j], lp["text_offset"][j]) << j;
  }
  EXPECT_EQ(ChoicesOf(streamed, false).at(0).text, prompt + plain.text);
}

TEST_F(HttpApiTest, NCompletionsWithASeedReproduceUnderLoadAndAreTheGrpcSamples) {
  const Json body = {{"prompt", "In a land far away"},
                     {"n", 4},
                     {"seed", 99},
                     {"temperature", 1.0},
                     {"max_tokens", 12},
                     {"ignore_eos", true},
                     {"logprobs", 1},
                     {"num_speculative_tokens", 3},
                     {"return_token_ids", true}};
  const std::vector<Choice> first = ChoicesOf(Post("/v1/completions", body), false);
  ASSERT_EQ(first.size(), 4u);
  const std::vector<Choice> second = ChoicesOf(Post("/v1/completions", body), false);
  // Under load: the same request while 16 other streams run.
  std::vector<std::thread> load;
  for (int i = 0; i < 16; ++i) {
    load.emplace_back([i] {
      (void)HttpStream(port(), "/v1/completions",
                       {{"prompt", absl::StrCat("load ", i)},
                        {"max_tokens", 40},
                        {"ignore_eos", true},
                        {"stream", true},
                        {"seed", i}});
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::vector<Choice> loaded = ChoicesOf(Stream("/v1/completions",
                                                      [&] {
                                                        Json b = body;
                                                        b["stream"] = true;
                                                        return b;
                                                      }()),
                                               false);
  for (std::thread& t : load) t.join();
  ASSERT_EQ(loaded.size(), 4u);
  int distinct_pairs = 0;
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_EQ(second[j].tokens, first[j].tokens) << "choice " << j;
    EXPECT_EQ(loaded[j].tokens, first[j].tokens) << "choice " << j << " under load";
    EXPECT_EQ(loaded[j].text, first[j].text);
    for (size_t i = 0; i < j; ++i) distinct_pairs += first[i].tokens != first[j].tokens;
    // Choice j is the gRPC request with sample number j.
    v1::GenerateRequest g = GrpcRequest(12, 3);
    g.set_text("In a land far away");
    g.mutable_sampling()->set_temperature(1.0f);
    g.mutable_sampling()->set_seed(99);
    g.mutable_sampling()->set_sample(static_cast<uint32_t>(j));
    EXPECT_EQ(Grpc(g).tokens, first[j].tokens) << "choice " << j;
    // Per-choice logprobs and usage.
    EXPECT_EQ(first[j].logprobs["token_logprobs"].size(), 12u);
    EXPECT_EQ(first[j].usage["completion_tokens"], 12);
  }
  EXPECT_EQ(distinct_pairs, 6) << "completions of one seed must differ";
}

TEST_F(HttpApiTest, LogprobsAreTheGrpcNumbersTheSameForEveryKAndSorted) {
  const Json messages = {{{"role", "user"}, {"content", "Count with me."}}};
  std::vector<Json> by_k;
  for (const int k : {0, 4}) {
    const Json body = {{"messages", messages},       {"max_tokens", 16}, {"temperature", 0},
                       {"ignore_eos", true},         {"logprobs", true}, {"top_logprobs", 3},
                       {"num_speculative_tokens", k}};
    const std::vector<Choice> got = ChoicesOf(Post("/v1/chat/completions", body), true);
    ASSERT_EQ(got.at(0).logprobs.size(), 16u);
    by_k.push_back(got[0].logprobs);
    for (const Json& item : got[0].logprobs) {
      const Json& top = item["top_logprobs"];
      ASSERT_EQ(top.size(), 3u);
      // Greedy: the emitted token is the most likely one, first in the list.
      EXPECT_EQ(top[0]["token"], item["token"]);
      EXPECT_EQ(top[0]["logprob"], item["logprob"]);
      EXPECT_LT(item["logprob"].get<double>(), 0.0);  // a real value, not a one-hot row's 0
      for (size_t r = 1; r < top.size(); ++r) {
        EXPECT_GE(top[r - 1]["logprob"].get<double>(), top[r]["logprob"].get<double>());
      }
    }
    // The gRPC API reports the same floats.
    v1::GenerateRequest g = GrpcRequest(16, static_cast<uint32_t>(k));
    v1::ChatMessage* m = g.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content("Count with me.");
    g.mutable_logprobs()->set_enabled(true);
    g.mutable_logprobs()->set_top_logprobs(3);
    std::vector<float> grpc_logprobs;
    for (const v1::GenerateResponse& msg : Grpc(g).messages) {
      for (const v1::TokenLogprob& lp : msg.logprobs()) grpc_logprobs.push_back(lp.logprob());
    }
    ASSERT_EQ(grpc_logprobs.size(), 16u);
    for (size_t i = 0; i < 16; ++i) {
      EXPECT_EQ(got[0].logprobs[i]["logprob"].get<double>(), static_cast<double>(grpc_logprobs[i]));
    }
  }
  EXPECT_EQ(by_k[0], by_k[1]) << "greedy logprobs differ between K = 0 and K = 4";
}

// Issue 17 over HTTP: prompt lookup, EGAG and draft trees give plain decoding's greedy tokens and
// its logprobs (a tree's come from the rows of the accepted path), and a tree whose shape does not
// fit K is refused naming the HTTP field.
TEST_F(HttpApiTest, EveryDraftingMethodEqualsPlainDecodingWithItsLogprobs) {
  const Json messages = {
      {{"role", "user"}, {"content", "The cat sat on the mat. The cat sat on the mat."}}};
  const Json plain_body = {{"messages", messages}, {"max_tokens", 24},           {"temperature", 0},
                           {"ignore_eos", true},   {"return_token_ids", true},   {"logprobs", true},
                           {"top_logprobs", 2},    {"num_speculative_tokens", 0}};
  const std::vector<Choice> plain = ChoicesOf(Post("/v1/chat/completions", plain_body), true);
  ASSERT_EQ(plain.at(0).logprobs.size(), 24u);
  const std::vector<std::pair<std::string, Json>> arms = {
      {"ngram", {{"draft_method", "ngram"}, {"num_speculative_tokens", 4}}},
      {"egag", {{"egag", true}, {"num_speculative_tokens", 6}}},
      {"tree 2x2",
       {{"speculation_tree", {{"branching", 2}, {"depth", 2}}}, {"num_speculative_tokens", 4}}},
      {"tree 3x1",
       {{"speculation_tree", {{"branching", 3}, {"depth", 1}}}, {"num_speculative_tokens", 3}}},
  };
  for (const auto& [name, fields] : arms) {
    Json body = plain_body;
    body["k_policy"] = "fixed";
    for (const auto& [key, value] : fields.items()) body[key] = value;
    const std::vector<Choice> whole = ChoicesOf(Post("/v1/chat/completions", body), true);
    ASSERT_EQ(whole.size(), 1u) << name;
    EXPECT_GT(whole[0].usage["speculative"]["drafted_tokens"].get<int64_t>(), 0)
        << name << " never drafted";
    body["stream"] = true;
    const std::vector<Choice> parts = ChoicesOf(Stream("/v1/chat/completions", body), true);
    for (const std::vector<Choice>* got : {&whole, &parts}) {
      ASSERT_EQ(got->size(), 1u) << name;
      EXPECT_EQ(got->front().tokens, plain[0].tokens) << name;
      EXPECT_EQ(got->front().logprobs, plain[0].logprobs) << name;
    }
  }
  const Json bad = {{"prompt", "a"},
                    {"num_speculative_tokens", 2},
                    {"speculation_tree", {{"branching", 2}, {"depth", 3}}}};
  absl::StatusOr<HttpReply> refused = HttpCall(port(), "POST", "/v1/completions", bad.dump());
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->status, 400);
  EXPECT_EQ(refused->Json()["error"]["param"], "speculation_tree") << refused->body;
}

// OpenAI's predicted outputs: the prediction, as text or as text parts, on both endpoints, drafts
// without changing the greedy tokens, and usage says how much of it was accepted.
TEST_F(HttpApiTest, PredictedOutputsDraftAndChangeNothingElse) {
  for (const bool chat : {false, true}) {
    SCOPED_TRACE(chat ? "chat" : "completions");
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    Json plain_body = {{"max_tokens", 32},
                       {"temperature", 0},
                       {"ignore_eos", true},
                       {"return_token_ids", true},
                       {"num_speculative_tokens", 0}};
    if (chat) {
      plain_body["messages"] = {{{"role", "user"}, {"content", "Tell me about the dog."}}};
    } else {
      plain_body["prompt"] = "Once upon a time, the dog";
    }
    const Json plain_reply = Post(path, plain_body);
    const std::vector<Choice> plain = ChoicesOf(plain_reply, chat);
    ASSERT_EQ(plain.size(), 1u);
    EXPECT_FALSE(plain_reply["usage"].contains("completion_tokens_details"));
    const std::string text = plain[0].text;
    ASSERT_GT(text.size(), 8u);
    const Json parts = {{{"type", "text"}, {"text", text.substr(0, text.size() / 2)}},
                        {{"type", "text"}, {"text", text.substr(text.size() / 2)}}};
    for (const Json& content : {Json(text), parts, Json("something else entirely")}) {
      Json body = plain_body;
      body["num_speculative_tokens"] = 4;
      body["k_policy"] = "fixed";
      body["prediction"] = {{"type", "content"}, {"content", content}};
      const Json reply = Post(path, body);
      const std::vector<Choice> got = ChoicesOf(reply, chat);
      ASSERT_EQ(got.size(), 1u);
      EXPECT_EQ(got[0].tokens, plain[0].tokens) << content;
      const Json& usage = reply["usage"];
      ASSERT_TRUE(usage.contains("completion_tokens_details")) << usage;
      const int64_t accepted =
          usage["completion_tokens_details"]["accepted_prediction_tokens"].get<int64_t>();
      const int64_t rejected =
          usage["completion_tokens_details"]["rejected_prediction_tokens"].get<int64_t>();
      EXPECT_EQ(accepted + rejected, usage["speculative"]["drafted_tokens"].get<int64_t>());
      if (!content.is_string() || content.get<std::string>() == text) {
        // The output's own text. A random model's tokens are seldom the ones its text encodes to
        // again, so only some drafts match (the gRPC case below predicts the very tokens).
        EXPECT_GT(accepted, 0) << usage;
      }
      body["stream"] = true;
      const std::vector<Choice> streamed = ChoicesOf(Stream(path, body), chat);
      ASSERT_EQ(streamed.size(), 1u);
      EXPECT_EQ(streamed[0].tokens, plain[0].tokens) << content;
    }
  }
  // Over gRPC a prediction may be token ids: the output's own tokens have every draft accepted.
  v1::GenerateRequest r = GrpcRequest(32, 4);
  r.set_text("Once upon a time, the dog");
  r.mutable_speculation()->set_k_policy(v1::K_POLICY_FIXED);
  const ServeProcess::Stream plain_grpc = Grpc(r);
  ASSERT_EQ(plain_grpc.tokens.size(), 32u);
  r.mutable_speculation()->mutable_prediction()->mutable_token_ids()->mutable_ids()->Add(
      plain_grpc.tokens.begin(), plain_grpc.tokens.end());
  const ServeProcess::Stream predicted = Grpc(r);
  EXPECT_EQ(predicted.tokens, plain_grpc.tokens);
  ASSERT_FALSE(predicted.messages.empty());
  const v1::Usage& usage = predicted.messages.back().usage();
  EXPECT_EQ(usage.accepted_tokens(), usage.draft_tokens());
  EXPECT_GE(usage.accepted_tokens(), 24u);
  EXPECT_LE(usage.rounds(), 1u + (32u + 4u) / 5u);
  r.mutable_speculation()->mutable_prediction()->mutable_token_ids()->add_ids(1 << 20);
  const std::vector<ServeProcess::Stream> bad_ids = serve_->Generate({r});
  EXPECT_EQ(bad_ids[0].status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad_ids[0].status.error_message(),
              HasSubstr("speculation.prediction token id 1048576 at index 32"));

  // Shapes OpenAI does not define, and a prediction with the draft model, are refused.
  for (const Json& prediction :
       {Json("text"), Json({{"type", "content"}, {"content", 5}}),
        Json({{"type", "text"}, {"content", "x"}}),
        Json({{"type", "content"}, {"content", {{{"type", "image_url"}}}}})}) {
    const Json body = {{"prompt", "a"}, {"prediction", prediction}};
    absl::StatusOr<HttpReply> refused = HttpCall(port(), "POST", "/v1/completions", body.dump());
    ASSERT_TRUE(refused.ok());
    EXPECT_EQ(refused->status, 400) << prediction;
    EXPECT_EQ(refused->Json()["error"]["param"], "prediction") << refused->body;
  }
  const Json with_model = {{"prompt", "a"},
                           {"draft_method", "model"},
                           {"prediction", {{"type", "content"}, {"content", "b"}}}};
  absl::StatusOr<HttpReply> refused =
      HttpCall(port(), "POST", "/v1/completions", with_model.dump());
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->status, 400);
  EXPECT_EQ(refused->Json()["error"]["param"], "prediction") << refused->body;
  EXPECT_THAT(refused->body, HasSubstr("leave draft_method unset or make it ngram"));
}

// specd's guidance extension on both endpoints: the same tokens and logprobs as the gRPC API's
// guidance, for K = 0 and K = 4 with a guided draft, and not those of the unguided request.
TEST_F(HttpApiTest, GuidanceEqualsTheGrpcApisOnBothEndpoints) {
  const Json messages = {{{"role", "user"}, {"content", "Tell me a story."}}};
  for (const bool chat : {false, true}) {
    for (const int k : {0, 4}) {
      SCOPED_TRACE(absl::StrCat(chat ? "chat" : "completions", ", K = ", k));
      Json body = {{"max_tokens", 16},
                   {"temperature", 0},
                   {"ignore_eos", true},
                   {"return_token_ids", true},
                   {"num_speculative_tokens", k},
                   {"k_policy", "fixed"}};
      if (chat) {
        body["messages"] = messages;
        body["logprobs"] = true;
      } else {
        body["prompt"] = "Once upon a time";
        body["logprobs"] = 0;
      }
      const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
      const Choice unguided = ChoicesOf(Post(path, body), chat).at(0);
      body["guidance"] = {{"scale", 3}, {"unconditional_prompt", "The end."}, {"draft", k > 0}};
      const Choice guided = ChoicesOf(Post(path, body), chat).at(0);
      EXPECT_NE(guided.tokens, unguided.tokens);

      v1::GenerateRequest g = GrpcRequest(16, static_cast<uint32_t>(k));
      g.mutable_speculation()->set_k_policy(v1::K_POLICY_FIXED);
      if (chat) {
        v1::ChatMessage* m = g.mutable_chat()->add_messages();
        m->set_role("user");
        m->set_content("Tell me a story.");
      } else {
        g.set_text("Once upon a time");
      }
      g.mutable_guidance()->set_scale(3.0f);
      g.mutable_guidance()->set_unconditional_text("The end.");
      g.mutable_guidance()->set_draft(k > 0);
      g.mutable_logprobs()->set_enabled(true);
      const ServeProcess::Stream want = Grpc(g);
      EXPECT_EQ(guided.tokens, want.tokens);
      std::vector<double> grpc_logprobs;
      for (const v1::GenerateResponse& msg : want.messages) {
        for (const v1::TokenLogprob& lp : msg.logprobs()) grpc_logprobs.push_back(lp.logprob());
      }
      std::vector<double> http_logprobs;
      if (chat) {
        for (const Json& item : guided.logprobs) http_logprobs.push_back(item["logprob"]);
      } else {
        http_logprobs = guided.logprobs["token_logprobs"].get<std::vector<double>>();
      }
      ASSERT_EQ(http_logprobs.size(), 16u);
      for (size_t i = 0; i < 16; ++i) {
        EXPECT_EQ(http_logprobs[i], static_cast<double>(static_cast<float>(grpc_logprobs[i])));
      }
    }
  }
}

TEST_F(HttpApiTest, ProcessedLogprobsOutsideTheSupportAreMinus9999) {
  const Json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                     {"max_tokens", 10},
                     {"temperature", 0.8},
                     {"top_k", 2},
                     {"seed", 5},
                     {"logprobs", true},
                     {"top_logprobs", 5},
                     {"logprobs_mode", "processed_logprobs"}};
  const std::vector<Choice> got = ChoicesOf(Post("/v1/chat/completions", body), true);
  ASSERT_EQ(got.at(0).logprobs.size(), 10u);
  for (const Json& item : got[0].logprobs) {
    EXPECT_GT(item["logprob"].get<double>(), -9999.0);  // the emitted token is in the support
    const Json& top = item["top_logprobs"];
    ASSERT_EQ(top.size(), 5u);  // top_k = 2 keeps the first two; the rest are outside
    double mass = 0.0;
    for (size_t r = 0; r < 2; ++r) mass += std::exp(top[r]["logprob"].get<double>());
    EXPECT_NEAR(mass, 1.0, 1e-5);  // processed values: the two kept tokens carry all the mass
    for (size_t r = 2; r < 5; ++r) EXPECT_EQ(top[r]["logprob"].get<double>(), -9999.0);
  }
}

// vLLM's POST /tokenize and /detokenize: the ids are those generation feeds for the same prompt
// or conversation (the completion's prompt_token_ids), the token strings those of the model's
// tokenizer.json, and detokenize undoes tokenize.
TEST_F(HttpApiTest, TokenizeGivesTheIdsGenerationFeeds) {
  // The vocabulary as tokenizer.json writes it, read independently of specd's tokenizer.
  std::map<int32_t, std::string> pieces;
  {
    std::ifstream in(dir_->path() / "tinymodel" / "tokenizer.json");
    const Json tokenizer = Json::parse(in);
    for (const auto& [piece, id] : tokenizer["model"]["vocab"].items()) {
      pieces[id.get<int32_t>()] = piece;
    }
    for (const Json& added : tokenizer["added_tokens"]) {
      pieces[added["id"].get<int32_t>()] = added["content"].get<std::string>();
    }
  }
  auto fed = [&](const std::string& path, Json body) {
    body["max_tokens"] = 1;
    body["return_token_ids"] = true;
    const std::vector<Choice> c = ChoicesOf(Post(path, body), path != "/v1/completions");
    return c.empty() ? std::vector<int32_t>() : c[0].prompt_tokens;
  };
  for (const std::string prompt : {"Once upon a time", "A", "", "tab\there <s> and </s>"}) {
    SCOPED_TRACE(prompt);
    const Json t = Post("/tokenize",
                        {{"model", "tinymodel"}, {"prompt", prompt}, {"return_token_strs", true}});
    const std::vector<int32_t> ids = t["tokens"].get<std::vector<int32_t>>();
    EXPECT_EQ(ids, fed("/v1/completions", {{"prompt", prompt}}));
    EXPECT_EQ(t["count"], ids.size());
    EXPECT_EQ(t["max_model_len"], 512);
    ASSERT_EQ(t["token_strs"].size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(t["token_strs"][i], pieces.at(ids[i]));
    // Without special tokens: no BOS, as the gRPC API's Tokenize gives.
    const Json bare = Post("/tokenize", {{"prompt", prompt}, {"add_special_tokens", false}});
    EXPECT_TRUE(bare["token_strs"].is_null());
    grpc::ClientContext ctx;
    v1::TokenizeRequest req;
    req.set_text(prompt);
    v1::TokenizeResponse grpc_ids;
    ASSERT_TRUE(serve_->stub().Tokenize(&ctx, req, &grpc_ids).ok());
    EXPECT_EQ(bare["tokens"].get<std::vector<int32_t>>(),
              std::vector<int32_t>(grpc_ids.token_ids().begin(), grpc_ids.token_ids().end()));
    EXPECT_EQ(Post("/detokenize", {{"tokens", bare["tokens"]}})["prompt"], prompt);
  }
  // A conversation: what /v1/chat/completions feeds, with each way of ending it.
  const Json conversation = {{{"role", "user"}, {"content", "Tell me a story."}},
                             {{"role", "assistant"}, {"content", "Once upon"}}};
  const std::vector<int32_t> reply =
      Post("/tokenize", {{"messages", conversation}})["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(reply, fed("/v1/chat/completions", {{"messages", conversation}}));
  const Json continued_body = {{"messages", conversation}, {"continue_final_message", true}};
  const std::vector<int32_t> continued =
      Post("/tokenize", continued_body)["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(continued, fed("/v1/chat/completions", continued_body));
  const Json closed_body = {{"messages", conversation}, {"add_generation_prompt", false}};
  const std::vector<int32_t> closed =
      Post("/tokenize", closed_body)["tokens"].get<std::vector<int32_t>>();
  EXPECT_EQ(closed, fed("/v1/chat/completions", closed_body));
  // The texts they stand for, from the template (kTemplate): the continued one stops inside the
  // last turn, the closed one after it, and the reply opens a new assistant turn.
  auto text = [&](const std::vector<int32_t>& ids) {
    return Post("/detokenize", {{"tokens", ids}})["prompt"].get<std::string>();
  };
  EXPECT_THAT(
      text(continued),
      ::testing::EndsWith(
          "<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\nOnce upon"));
  EXPECT_EQ(text(closed), text(continued) + "<|im_end|>\n");
  EXPECT_EQ(text(reply), text(closed) + "<|im_start|>assistant\n");
  // The gRPC API's chat input continues the same message from the same ids.
  v1::GenerateRequest g = GrpcRequest(8, 2);
  for (const Json& m : conversation) {
    v1::ChatMessage* message = g.mutable_chat()->add_messages();
    message->set_role(m["role"].get<std::string>());
    message->set_content(m["content"].get<std::string>());
  }
  g.mutable_chat()->set_continue_final_message(true);
  {
    // gRPC's Tokenize encodes the same conversation to the same ids, and refuses text with it.
    grpc::ClientContext ctx;
    v1::TokenizeRequest req;
    *req.mutable_chat() = g.chat();
    v1::TokenizeResponse grpc_ids;
    ASSERT_TRUE(serve_->stub().Tokenize(&ctx, req, &grpc_ids).ok());
    EXPECT_EQ(continued,
              std::vector<int32_t>(grpc_ids.token_ids().begin(), grpc_ids.token_ids().end()));
    // Template variables arrive as a Struct: unused ones change nothing, reserved ones are
    // refused naming the field.
    grpc::ClientContext ctx2;
    (*req.mutable_chat()->mutable_chat_template_kwargs()->mutable_fields())["unused"]
        .set_string_value("x");
    ASSERT_TRUE(serve_->stub().Tokenize(&ctx2, req, &grpc_ids).ok());
    EXPECT_EQ(continued,
              std::vector<int32_t>(grpc_ids.token_ids().begin(), grpc_ids.token_ids().end()));
    grpc::ClientContext ctx3;
    (*req.mutable_chat()->mutable_chat_template_kwargs()->mutable_fields())["eos_token"]
        .set_bool_value(true);
    const grpc::Status reserved = serve_->stub().Tokenize(&ctx3, req, &grpc_ids);
    EXPECT_EQ(reserved.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(reserved.error_message(), HasSubstr("chat_template_kwargs may not set eos_token"));
    grpc::ClientContext ctx4;
    req.mutable_chat()->clear_chat_template_kwargs();
    req.set_text("and text");
    EXPECT_EQ(serve_->stub().Tokenize(&ctx4, req, &grpc_ids).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  const ServeProcess::Stream grpc_continued = Grpc(g);
  Json http_continued = continued_body;
  http_continued["max_tokens"] = 8;
  http_continued["temperature"] = 0;
  http_continued["ignore_eos"] = true;
  http_continued["num_speculative_tokens"] = 2;
  http_continued["return_token_ids"] = true;
  const std::vector<Choice> http_choice =
      ChoicesOf(Post("/v1/chat/completions", http_continued), true);
  ASSERT_EQ(http_choice.size(), 1u);
  EXPECT_EQ(http_choice[0].tokens, grpc_continued.tokens);
}

TEST_F(HttpApiTest, BadTokenizeRequestsAreClearErrors) {
  auto error = [&](const std::string& path, const std::string& body) {
    absl::StatusOr<HttpReply> r = HttpCall(port(), "POST", path, body);
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : HttpReply();
  };
  const Json conversation = {{{"role", "user"}, {"content", "Hi"}}};
  struct Case {
    std::string path;
    std::string body;
    int status;
    std::string param;
  };
  const std::vector<Case> cases = {
      {"/tokenize", "{", 400, ""},
      {"/tokenize", "{}", 400, "prompt"},
      {"/tokenize", R"({"prompt": 7})", 400, "prompt"},
      {"/tokenize", Json({{"prompt", "x"}, {"messages", conversation}}).dump(), 400, "prompt"},
      {"/tokenize", R"({"prompt": "x", "continue_final_message": true})", 400,
       "continue_final_message"},
      {"/tokenize", R"({"prompt": "x", "add_special_tokens": "yes"})", 400, "add_special_tokens"},
      {"/tokenize", R"({"prompt": "x", "model": "gpt-4"})", 404, "model"},
      {"/tokenize", Json({{"messages", conversation}, {"add_special_tokens", true}}).dump(), 400,
       "add_special_tokens"},
      {"/tokenize",
       Json({{"messages", conversation},
             {"add_generation_prompt", true},
             {"continue_final_message", true}})
           .dump(),
       400, "continue_final_message"},
      {"/tokenize", Json({{"messages", {{{"role", "user"}}}}}).dump(), 400, "messages"},
      {"/tokenize", Json({{"messages", conversation}, {"chat_template_kwargs", {1, 2}}}).dump(),
       400, "chat_template_kwargs"},
      {"/tokenize",
       Json({{"messages", conversation}, {"chat_template_kwargs", {{"messages", "x"}}}}).dump(),
       400, "chat_template_kwargs"},
      {"/v1/chat/completions",
       Json({{"messages", conversation}, {"chat_template_kwargs", {{"bos_token", ""}}}}).dump(),
       400, "chat_template_kwargs"},
      {"/detokenize", "{}", 400, "tokens"},
      {"/detokenize", R"({"tokens": "1 2"})", 400, "tokens"},
      {"/detokenize", R"({"tokens": [1, 1.5]})", 400, "tokens"},
      {"/detokenize", R"({"tokens": [1, 99999]})", 400, "tokens"},
      {"/detokenize", R"({"tokens": [-1]})", 400, "tokens"},
      {"/v1/completions", R"({"prompt": "x", "continue_final_message": true})", 400,
       "continue_final_message"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path + " " + c.body);
    const HttpReply r = error(c.path, c.body);
    EXPECT_EQ(r.status, c.status) << r.body;
    const Json body = Json::parse(r.body, nullptr, false);
    ASSERT_TRUE(body.is_object()) << r.body;
    EXPECT_FALSE(body["error"]["message"].get<std::string>().empty());
    if (!c.param.empty()) {
      EXPECT_EQ(body["error"]["param"], c.param) << r.body;
    }
  }
  absl::StatusOr<HttpReply> get = HttpCall(port(), "GET", "/tokenize");
  ASSERT_TRUE(get.ok());
  EXPECT_EQ(get->status, 405);
  // Still serving.
  EXPECT_GT(Post("/tokenize", {{"prompt", "fine"}})["count"].get<int>(), 0);
}

TEST_F(HttpApiTest, DroppedStreamIsCancelledAndFreesItsKv) {
  const int metrics = serve_->MetricsPort("coordinator");
  ASSERT_GT(metrics, 0);
  auto count = [&](const std::string& series) {
    absl::StatusOr<std::string> text = testing::HttpGet(metrics, "/metrics");
    EXPECT_TRUE(text.ok());
    double total = 0.0;
    for (absl::string_view line : absl::StrSplit(text.ok() ? *text : "", '\n')) {
      if (absl::StartsWith(line, series))
        total += std::stod(std::string(line.substr(line.rfind(' ') + 1)));
    }
    return total;
  };
  const double cancelled = count("specd_request_errors_total{code=\"CANCELLED\"}");
  const double succeeded = count("specd_request_success_total");
  // Plain decoding of 480 tokens takes many rounds: the disconnect comes long before the end.
  absl::StatusOr<std::unique_ptr<HttpConnection>> c = HttpConnection::Connect(port());
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Send("POST", "/v1/completions",
                         Json({{"prompt", "Long"},
                               {"max_tokens", 480},
                               {"ignore_eos", true},
                               {"temperature", 0},
                               {"num_speculative_tokens", 0},
                               {"stream", true}})
                             .dump())
                  .ok());
  absl::StatusOr<HttpReply> head = (*c)->ReadHead();
  ASSERT_TRUE(head.ok());
  ASSERT_EQ(head->status, 200);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*c)->NextEvent().ok());
  EXPECT_GT(serve_->UsedKvBlocks("target worker"), 0);
  (*c)->Close();
  serve_->ExpectNoBlocksUsed();
  EXPECT_EQ(count("specd_request_errors_total{code=\"CANCELLED\"}"), cancelled + 1);
  EXPECT_EQ(count("specd_request_success_total"), succeeded) << "the request ran to its end";
}

TEST_F(HttpApiTest, RealClientsAgreeWithTheGrpcApi) {
  const std::string prompt = "The little robot";
  v1::GenerateRequest g = GrpcRequest(16, 4);
  g.set_text(prompt);
  const std::string want = Grpc(g).text;
  v1::GenerateRequest gc = GrpcRequest(16, 4);
  v1::ChatMessage* m = gc.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content(prompt);
  const std::string want_chat = Grpc(gc).text;
  const std::string src = testing::SourceDir().string();
  const std::string base = absl::StrCat("http://127.0.0.1:", port(), "/v1");

  // The official openai package (Node).
  std::string out;
  ASSERT_EQ(Shell(absl::StrCat("node ", src, "/tests/clients/openai_client.mjs ", src, " ", base,
                               " tinymodel '", prompt, "'"),
                  &out),
            0)
      << out;
  const Json node = Json::parse(out);
  EXPECT_EQ(node["completion"]["text"], want);
  EXPECT_EQ(node["completion"]["finish_reason"], "length");
  EXPECT_EQ(node["completion"]["usage"]["completion_tokens"], 16);
  EXPECT_EQ(node["completion_stream"]["text"], want);
  EXPECT_EQ(node["completion_stream"]["usage"]["completion_tokens"], 16);
  EXPECT_EQ(node["chat"]["text"], want_chat);
  EXPECT_EQ(node["chat"]["role"], "assistant");
  EXPECT_EQ(node["chat"]["logprobs"].size(), 16u);
  EXPECT_EQ(node["chat_stream"]["text"], want_chat);
  EXPECT_EQ(node["chat_stream"]["role"], "assistant");
  EXPECT_EQ(node["chat_stream"]["usage"]["total_tokens"], node["chat"]["usage"]["total_tokens"]);
  EXPECT_EQ(node["models"], Json::array({"tinymodel"}));
  EXPECT_EQ(node["retrieved"], "tinymodel");

  // Python's standard library.
  ASSERT_EQ(Shell(absl::StrCat(testing::Python(), " ", src, "/tests/clients/http_client.py ",
                               port(), " tinymodel '", prompt, "'"),
                  &out),
            0)
      << out;
  const Json py = Json::parse(out);
  EXPECT_EQ(py["completion"], want);
  EXPECT_EQ(py["chat"], want_chat);
  EXPECT_EQ(py["stream"], want);
  EXPECT_TRUE(py["done"].get<bool>());
  EXPECT_GE(py["events"].get<int>(), 2);
  EXPECT_EQ(py["stream_usage"]["completion_tokens"], 16);
  EXPECT_EQ(py["error_status"], 400);
  EXPECT_EQ(py["error"]["param"], "temperature");

  // curl, reading the event stream as it comes (-N).
  const Json body = {{"prompt", prompt},   {"max_tokens", 16}, {"temperature", 0},
                     {"ignore_eos", true}, {"stream", true},   {"num_speculative_tokens", 4}};
  ASSERT_EQ(Shell(absl::StrCat("curl -sSN --max-time 60 -H 'Content-Type: application/json' "
                               "-d '",
                               body.dump(), "' ", base, "/completions"),
                  &out),
            0)
      << out;
  std::string text;
  bool done = false;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (!absl::StartsWith(line, "data: ")) continue;
    line.remove_prefix(6);
    if (line == "[DONE]") {
      done = true;
      continue;
    }
    text += Json::parse(line)["choices"][0]["text"].get<std::string>();
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(text, want);
}

// Every error, on a server with a token, one running and one queued request: the right status
// and OpenAI's error shape, and the server serves normally afterwards with every KV block free.
class HttpErrorsTest : public ::testing::Test {
 protected:
  static constexpr char kToken[] = "0123456789abcdef-http-test-token";

  void SetUp() override {
    WriteModel(tmp_.path() / "tinymodel");
    pids_ = tmp_.path() / "pids";
    std::filesystem::create_directories(pids_);
    // The coordinator reads the token from the environment it inherits through serve.
    setenv("SPECD_AUTH_TOKEN", kToken, 1);
    serve_ = ServeProcess::Start(
        {"--target", (tmp_.path() / "tinymodel").string(), "--draft-exit-layer", "1", "--threads",
         "1", "--http-listen", "127.0.0.1:0", "--max-running", "1", "--max-queued", "1",
         "--worker-call-timeout-seconds", "1", "--worker-unavailable-seconds", "2", "--metrics"},
        pids_);
    unsetenv("SPECD_AUTH_TOKEN");
    ASSERT_NE(serve_, nullptr);
  }

  HttpReply Call(const std::string& method, const std::string& path, const std::string& body,
                 bool with_token = true) {
    std::vector<std::string> headers;
    if (with_token) headers.push_back(absl::StrCat("Authorization: Bearer ", kToken));
    absl::StatusOr<HttpReply> r = HttpCall(serve_->http_port(), method, path, body, headers);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : HttpReply();
  }

  // The status, and the error object's shape.
  void ExpectError(const HttpReply& r, int status, const std::string& param = "") {
    EXPECT_EQ(r.status, status) << r.body;
    const Json j = r.Json();
    ASSERT_TRUE(j.contains("error")) << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"]["type"].is_string());
    if (!param.empty()) {
      EXPECT_EQ(j["error"]["param"], param) << r.body;
    }
  }

  void ExpectServing() {
    const HttpReply ok =
        Call("POST", "/v1/completions", R"({"prompt": "ok", "max_tokens": 4, "temperature": 0})");
    EXPECT_EQ(ok.status, 200) << ok.body;
  }

  ScopedTempDir tmp_;
  std::filesystem::path pids_;
  std::unique_ptr<ServeProcess> serve_;
};

TEST_F(HttpErrorsTest, EveryErrorHasItsStatusAndHarmsNothing) {
  const std::string ok_body = R"({"prompt": "hi", "max_tokens": 4})";
  // 401.
  ExpectError(Call("POST", "/v1/completions", ok_body, /*with_token=*/false), 401);
  {
    absl::StatusOr<HttpReply> r = HttpCall(serve_->http_port(), "POST", "/v1/completions", ok_body,
                                           {"Authorization: Bearer not-the-token-at-all-0000"});
    ASSERT_TRUE(r.ok());
    ExpectError(*r, 401);
  }
  ExpectError(Call("GET", "/v1/models", "", false), 401);
  EXPECT_EQ(Call("GET", "/health", "", false).status, 200);  // open, like gRPC health
  // 400: bad JSON, a wrong type, out of range, and limits only the model knows.
  ExpectError(Call("POST", "/v1/completions", "{\"prompt\": "), 400);
  ExpectError(Call("POST", "/v1/completions", R"({"prompt": "hi", "temperature": "hot"})"), 400,
              "temperature");
  ExpectError(Call("POST", "/v1/completions", R"({"prompt": "hi", "top_p": 7})"), 400, "top_p");
  ExpectError(Call("POST", "/v1/completions", R"({"prompt": "hi", "max_tokens": 100000})"), 400,
              "max_tokens");
  ExpectError(Call("POST", "/v1/completions", R"({"prompt": [1, 99999]})"), 400, "prompt");
  ExpectError(Call("POST", "/v1/completions", R"({"prompt": "hi", "stop": ["", "x"]})"), 400,
              "stop");
  ExpectError(Call("POST", "/v1/completions", R"({"prompt": "hi", "num_speculative_tokens": 40})"),
              400, "num_speculative_tokens");
  ExpectError(Call("POST", "/v1/completions", R"({"prompt": "hi", "guidance": {"scale": 11}})"),
              400, "guidance.scale");
  ExpectError(Call("POST", "/v1/completions", R"({"prompt": "hi", "guidance": {"scale": 0}})"), 400,
              "guidance.scale");
  ExpectError(
      Call("POST", "/v1/completions",
           R"({"prompt": "hi", "guidance": {"scale": 2, "unconditional_prompt": [99999]}})"),
      400, "guidance.unconditional_prompt");
  // Guidance with a draft tree, and a guided draft where prompt lookup drafts, are refused.
  ExpectError(Call("POST", "/v1/completions",
                   R"({"prompt": "hi", "num_speculative_tokens": 2, "guidance": {"scale": 3},
                       "speculation_tree": {"branching": 2, "depth": 1}})"),
              400, "speculation_tree");
  ExpectError(Call("POST", "/v1/completions",
                   R"({"prompt": "hi", "draft_method": "ngram",
                       "guidance": {"scale": 3, "draft": true}})"),
              400, "guidance.draft");
  ExpectError(
      Call("POST", "/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})"),
      400, "messages");  // this model has no chat template
  ExpectError(Call("POST", "/v1/chat/completions", R"({"messages": [{"content": "no role"}]})"),
              400, "messages");
  // 404 and 405.
  ExpectError(Call("GET", "/v2/nothing", ""), 404);
  ExpectError(Call("POST", "/v1/completions", R"({"prompt": "hi", "model": "gpt-4"})"), 404,
              "model");
  ExpectError(Call("GET", "/v1/completions", ""), 405);
  // 413: over --max-request-bytes (4 MiB by default).
  const std::string huge = absl::StrCat(R"({"prompt": ")", std::string(5 << 20, 'a'), R"("})");
  ExpectError(Call("POST", "/v1/completions", huge), 413);
  ExpectServing();

  // 429: one running, one queued, the third is refused.
  auto connect_stream = [&](int max_tokens) {
    absl::StatusOr<std::unique_ptr<HttpConnection>> c =
        HttpConnection::Connect(serve_->http_port());
    EXPECT_TRUE(c.ok());
    EXPECT_TRUE((*c)->Send("POST", "/v1/completions",
                           Json({{"prompt", "busy"},
                                 {"max_tokens", max_tokens},
                                 {"ignore_eos", true},
                                 {"num_speculative_tokens", 0},
                                 {"stream", true}})
                               .dump(),
                           {absl::StrCat("Authorization: Bearer ", kToken)})
                    .ok());
    return *std::move(c);
  };
  // The target worker is stopped while the probes run, so that the running request cannot
  // finish (and admit the queued one) however slowly this test is scheduled: it survives a
  // stopped worker for a call deadline plus --worker-unavailable-seconds, 3 s.
  const pid_t target = serve_->Pid("target-worker");
  ASSERT_GT(target, 0);
  std::unique_ptr<HttpConnection> running = connect_stream(480);
  ASSERT_EQ((*running->ReadHead()).status, 200);
  ASSERT_TRUE(running->NextEvent().ok());
  ASSERT_EQ(StopProcess(target), absl::OkStatus());
  absl::Cleanup thaw_running = [target] { kill(target, SIGCONT); };
  std::unique_ptr<HttpConnection> queued = connect_stream(4);
  // Only once the coordinator holds it in its queue is a third request sure to find the queue
  // full (before that, the probe itself would be queued, and wait out the running request).
  const int metrics = serve_->MetricsPort("coordinator");
  ASSERT_GT(metrics, 0);
  bool waiting = false;
  for (int i = 0; i < 1000 && !waiting; ++i) {
    waiting = testing::MetricValue(metrics, "specd_num_requests_waiting") >= 1;
    if (!waiting) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(waiting) << "the second stream never reached the queue";
  // The queued request is admitted once the running one goes; until then the queue is full.
  const HttpReply refused = Call("POST", "/v1/completions", ok_body);
  std::move(thaw_running).Invoke();
  ExpectError(refused, 429);
  EXPECT_THAT(refused.body, HasSubstr("queue is full"));
  running->Close();  // cancelled, which admits the queued one
  absl::StatusOr<HttpReply> queued_head = queued->ReadHead();
  ASSERT_TRUE(queued_head.ok());
  EXPECT_EQ(queued_head->status, 200);
  while (true) {
    absl::StatusOr<std::optional<std::string>> e = queued->NextEvent();
    ASSERT_TRUE(e.ok());
    if (!e->has_value()) break;
  }
  ExpectServing();

  // 503 while a worker is unavailable (stopped), for longer than --worker-unavailable-seconds.
  ASSERT_EQ(StopProcess(target), absl::OkStatus());
  const HttpReply unavailable = Call("POST", "/v1/completions", ok_body);
  ASSERT_EQ(kill(target, SIGCONT), 0);
  ExpectError(unavailable, 503);
  EXPECT_THAT(unavailable.body, HasSubstr("target worker"));
  for (int i = 0; i < 100; ++i) {
    if (Call("POST", "/v1/completions", ok_body).status == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ExpectServing();

  // 503 while the coordinator drains: an open stream still finishes, new requests are refused.
  // The drain lasts as long as the open stream, which is held as the running one above was:
  // otherwise it may end, and the coordinator with it, before the probe connects.
  std::unique_ptr<HttpConnection> draining = connect_stream(480);
  ASSERT_EQ((*draining->ReadHead()).status, 200);
  ASSERT_TRUE(draining->NextEvent().ok());
  ASSERT_EQ(StopProcess(target), absl::OkStatus());
  absl::Cleanup thaw_draining = [target] { kill(target, SIGCONT); };
  const pid_t coordinator = serve_->Pid("coordinator");
  ASSERT_EQ(kill(coordinator, SIGTERM), 0);
  // The coordinator's signal thread may lag on a loaded machine: /health says when admission
  // has stopped.
  for (int i = 0; i < 500; ++i) {
    absl::StatusOr<HttpReply> h = HttpCall(serve_->http_port(), "GET", "/health");
    if (h.ok() && absl::StrContains(h->body, "shutting down")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const HttpReply refused_drain = Call("POST", "/v1/completions", ok_body);
  std::move(thaw_draining).Invoke();
  ExpectError(refused_drain, 503);
  EXPECT_THAT(refused_drain.body, HasSubstr("shutting down"));
  int events = 0;
  bool done = false;
  while (true) {
    absl::StatusOr<std::optional<std::string>> e = draining->NextEvent();
    ASSERT_TRUE(e.ok()) << e.status();
    if (!e->has_value()) break;
    if (**e == "[DONE]") done = true;
    ++events;
  }
  EXPECT_TRUE(done) << "the stream open when the drain began did not finish";
  EXPECT_GT(events, 2);
  // serve restarts the coordinator on the same address.
  for (int i = 0; i < 200; ++i) {
    absl::StatusOr<HttpReply> h = HttpCall(serve_->http_port(), "GET", "/health");
    if (h.ok() && h->status == 200 && serve_->Pid("coordinator") != coordinator) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ExpectServing();
  serve_->ExpectNoBlocksUsed();
}

}  // namespace
}  // namespace specd
