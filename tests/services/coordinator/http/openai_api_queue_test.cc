// The HTTP API prepares requests (parses, tokenizes, validates) on its work queue, not on the
// server's I/O thread that calls Handle and carries every other stream: while the queue is busy,
// a /tokenize or generation request gets no answer yet and Handle returns at once, the cheap
// routes still answer at once, and the queued requests are answered once the queue runs them.
// A generation request still being prepared counts as open for the drain, and one that comes out
// of the queue after the drain ended the open requests gets the drain's status.
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/synth/synth.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/common/work_queue.h"
#include "services/coordinator/generation_service.h"
#include "services/coordinator/http/openai_api.h"

namespace specd::http {
namespace {

using Json = nlohmann::json;

// An exchange that records its whole response.
class RecordingExchange final : public HttpExchange {
 public:
  RecordingExchange(std::string method, std::string path, std::string body) {
    request_.method = std::move(method);
    request_.target = path;
    request_.path = std::move(path);
    request_.body = std::move(body);
  }

  const HttpRequest& request() const override { return request_; }
  void Respond(HttpResponse response) override {
    absl::MutexLock lock(&mu_);
    response_ = std::move(response);
    answered_.Notify();
  }
  void StartStream(std::string, std::vector<std::pair<std::string, std::string>>) override {
    ADD_FAILURE() << "no request in this test streams";
  }
  void Send(std::string) override {}
  void End() override {}
  void Post(std::function<void()> work) override { work(); }
  void OnClientGone(std::function<void()>) override {}

  bool answered() const { return answered_.HasBeenNotified(); }
  // Waits for the response.
  HttpResponse response() {
    EXPECT_TRUE(answered_.WaitForNotificationWithTimeout(absl::Seconds(60)));
    absl::MutexLock lock(&mu_);
    return response_.value_or(HttpResponse{});
  }

 private:
  HttpRequest request_;
  absl::Mutex mu_;
  std::optional<HttpResponse> response_ ABSL_GUARDED_BY(mu_);
  absl::Notification answered_;
};

class OpenAiApiQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<HfTokenizerFiles> files = SyntheticTokenizer(512);
    ASSERT_TRUE(files.ok()) << files.status();
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJson(
        files->tokenizer_json, files->tokenizer_config_json, files->generation_config_json);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
    state_.tokenizer = tokenizer_.get();
    state_.limits.vocab_size = 512;
    state_.limits.max_seq_len = 256;
    state_.info.set_served_model_name("m");
    api_.SetServing(&state_);
    // The queue's one thread is held until release_, as a long prompt would hold it.
    queue_.Post([this] { release_.WaitForNotificationWithTimeout(absl::Seconds(60)); });
  }

  // What the queue holds runs before the API and the state go, even after a failed assertion.
  void TearDown() override {
    if (!release_.HasBeenNotified()) release_.Notify();
    queue_.Stop();
  }

  std::shared_ptr<RecordingExchange> Call(std::string method, std::string path, Json body) {
    auto exchange = std::make_shared<RecordingExchange>(
        std::move(method), std::move(path), body.is_null() ? std::string() : body.dump());
    api_.Handle(exchange);
    return exchange;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  ServingState state_;
  WorkQueue queue_{1};
  OpenAiApi api_{OpenAiApiOptions{}, queue_};
  absl::Notification release_;
};

TEST_F(OpenAiApiQueueTest, PreparationWaitsForTheQueueAndCheapRoutesDoNot) {
  const std::string prompt = "once upon a time there was a queue";
  auto tokenize = Call("POST", "/tokenize", {{"prompt", prompt}});
  auto completion = Call("POST", "/v1/completions", {{"prompt", prompt}, {"model", "other"}});
  EXPECT_FALSE(tokenize->answered()) << "/tokenize ran on the thread that called Handle";
  EXPECT_FALSE(completion->answered()) << "a completion was prepared on the calling thread";
  EXPECT_EQ(api_.open_requests(), 1) << "a request being prepared is open for the drain";

  auto health = Call("GET", "/health", nullptr);
  auto models = Call("GET", "/v1/models", nullptr);
  ASSERT_TRUE(health->answered()) << "/health waited for the busy queue";
  ASSERT_TRUE(models->answered()) << "/v1/models waited for the busy queue";
  EXPECT_EQ(health->response().status, 200);
  EXPECT_EQ(Json::parse(models->response().body)["data"][0]["id"], "m");

  release_.Notify();
  const HttpResponse tokens = tokenize->response();
  ASSERT_EQ(tokens.status, 200) << tokens.body;
  absl::StatusOr<std::vector<int32_t>> want = tokenizer_->Encode(prompt);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(Json::parse(tokens.body)["tokens"].get<std::vector<int32_t>>(), *want);
  // Prepared on the queue, and refused there: the model is not the served one.
  const HttpResponse refused = completion->response();
  EXPECT_EQ(refused.status, 404) << refused.body;
  EXPECT_EQ(api_.open_requests(), 0);
}

TEST_F(OpenAiApiQueueTest, ARequestPreparedAfterTheDrainEndedItGetsTheDrainsStatus) {
  auto completion = Call("POST", "/v1/completions", {{"prompt", "hello"}, {"max_tokens", 4}});
  api_.StopAdmitting();
  // Admitted before the drain began: not refused for that, and counted as open.
  EXPECT_FALSE(completion->answered());
  EXPECT_EQ(api_.open_requests(), 1);
  auto late = Call("POST", "/v1/completions", {{"prompt", "hello"}, {"max_tokens", 4}});
  ASSERT_TRUE(late->answered()) << "a request after the drain began was not refused at once";
  EXPECT_EQ(late->response().status, 503);

  EXPECT_EQ(api_.EndOpenRequests(absl::UnavailableError("the drain period is over")), 0);
  release_.Notify();
  const HttpResponse ended = completion->response();
  EXPECT_EQ(ended.status, 503) << ended.body;
  EXPECT_NE(ended.body.find("the drain period is over"), std::string::npos) << ended.body;
  EXPECT_EQ(api_.open_requests(), 0);
}

}  // namespace
}  // namespace specd::http
