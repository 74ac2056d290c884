// The whole service as users run it: a target worker, a draft worker and the coordinator as
// three processes on loopback (ephemeral ports), driven through specd.v1.Generation.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/synth/synth.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "specd/v1/generation.grpc.pb.h"
#include "specd/worker/v1/worker.grpc.pb.h"
#include "tests/services/worker_fixture.h"
#include "tests/services/worker_process.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::ChildProcess;
using ::testing::HasSubstr;
using testing::MetricValue;
using ::testing::Not;
using testing::ScopedTempDir;

struct Stream {
  grpc::Status status;
  std::vector<int32_t> tokens;
  std::string text;
  v1::GenerateResponse last;
};

// Three processes: target, draft, coordinator.
class Service {
 public:
  // An empty `draft_model` starts no draft worker. `worker_flags` go to both workers,
  // `coordinator_flags` to the coordinator and `draft_flags` to the draft worker only.
  static std::unique_ptr<Service> Start(const std::filesystem::path& target_model,
                                        const std::filesystem::path& draft_model,
                                        int64_t draft_exit_layer, int64_t kv_tokens = 16384,
                                        const std::vector<std::string>& worker_flags = {},
                                        const std::vector<std::string>& coordinator_flags = {},
                                        std::vector<std::string> draft_flags = {}) {
    auto s = std::make_unique<Service>();
    std::vector<std::string> kv = {"--kv-tokens", std::to_string(kv_tokens)};
    kv.insert(kv.end(), worker_flags.begin(), worker_flags.end());
    auto target =
        ChildProcess::Start(testing::TargetWorkerBinary(), testing::WorkerArgs(target_model, kv));
    EXPECT_TRUE(target.ok()) << target.status();
    if (!target.ok()) return nullptr;
    s->target = *std::move(target);
    std::vector<std::string> cargs = {"--listen",
                                      "127.0.0.1:0",
                                      "--target",
                                      s->target->address(),
                                      "--max-running",
                                      "16",
                                      "--worker-unavailable-seconds",
                                      "2"};
    if (!draft_model.empty()) {
      draft_flags.insert(draft_flags.end(), kv.begin(), kv.end());
      if (draft_exit_layer > 0) {
        draft_flags.insert(draft_flags.end(), {"--exit-layer", std::to_string(draft_exit_layer)});
      }
      auto draft = ChildProcess::Start(testing::DraftWorkerBinary(),
                                       testing::WorkerArgs(draft_model, draft_flags));
      EXPECT_TRUE(draft.ok()) << draft.status();
      if (!draft.ok()) return nullptr;
      s->draft = *std::move(draft);
      cargs.insert(cargs.end(), {"--draft", s->draft->address()});
    }
    cargs.insert(cargs.end(), coordinator_flags.begin(), coordinator_flags.end());
    auto coord =
        ChildProcess::Start(testing::BuiltBinary("services/coordinator/specd-coordinator"), cargs);
    EXPECT_TRUE(coord.ok()) << coord.status();
    if (!coord.ok()) return nullptr;
    s->coordinator = *std::move(coord);
    return s->WaitServing() ? std::move(s) : nullptr;
  }

  // Sets the stub on the coordinator and waits until it serves: it listens before it has
  // checked its workers, and health says when it serves.
  bool WaitServing() {
    stub = v1::Generation::NewStub(coordinator->Channel());
    auto health = grpc::health::v1::Health::NewStub(coordinator->Channel());
    for (int i = 0; i < 300; ++i) {
      grpc::ClientContext ctx;
      grpc::health::v1::HealthCheckRequest req;
      grpc::health::v1::HealthCheckResponse reply;
      if (health->Check(&ctx, req, &reply).ok() &&
          reply.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "coordinator never became SERVING: " << coordinator->StderrText();
    return false;
  }

  Stream Generate(const v1::GenerateRequest& req, int deadline_ms = 60000) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
    Stream out;
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      out.tokens.insert(out.tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
      out.text += msg.text();
      out.last = msg;
    }
    out.status = reader->Finish();
    return out;
  }

  // Used KV blocks on a worker, from its Info.
  template <typename StubT>
  static int64_t UsedBlocks(StubT& stub) {
    grpc::ClientContext ctx;
    worker::v1::InfoResponse info;
    EXPECT_TRUE(stub.Info(&ctx, worker::v1::InfoRequest(), &info).ok());
    return info.kv_total_blocks() - info.kv_free_blocks();
  }
  void ExpectNoBlocksUsed() {
    auto t = worker::v1::TargetWorker::NewStub(target->Channel());
    auto d = draft != nullptr ? worker::v1::DraftWorker::NewStub(draft->Channel()) : nullptr;
    auto draft_used = [&] { return d != nullptr ? UsedBlocks(*d) : 0; };
    // Releases are issued right after the last message; give them a moment to land.
    for (int i = 0; i < 100 && (UsedBlocks(*t) != 0 || draft_used() != 0); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(UsedBlocks(*t), 0);
    EXPECT_EQ(draft_used(), 0);
  }

  std::unique_ptr<ChildProcess> target, draft, coordinator;
  std::unique_ptr<v1::Generation::Stub> stub;
};

v1::GenerateRequest TextRequest(const std::string& text, uint32_t max_new, uint32_t k) {
  v1::GenerateRequest r;
  r.set_text(text);
  r.mutable_stopping()->set_max_new_tokens(max_new);
  r.mutable_stopping()->set_ignore_eos(true);
  r.mutable_speculation()->set_num_speculative_tokens(k);
  return r;
}

class GoldenE2eTest : public ::testing::TestWithParam<bool /*synthetic draft*/> {};

TEST_P(GoldenE2eTest, Stories260KStreamsTheGoldenTextForEveryK) {
  SPECD_REQUIRE_SHARED_DIR(shared);
  ScopedTempDir tmp;
  const std::filesystem::path model = tmp.path() / "stories260K";
  ASSERT_TRUE(testing::PrepareModel(testing::ModelKind::kStories260K, model).ok());
  std::filesystem::path draft_model = model;
  int64_t exit_layer = testing::DraftExitLayer(testing::ModelKind::kStories260K);
  if (GetParam()) {
    // A random draft over the same vocabulary and tokenizer.
    SynthSpec spec;
    absl::StatusOr<ModelConfig> c = LoadModelConfig(model);
    ASSERT_TRUE(c.ok());
    spec.config = *c;
    spec.config.num_layers = 2;
    spec.seed = 3;
    draft_model = tmp.path() / "synthetic-draft";
    ASSERT_TRUE(WriteSyntheticModel(spec, draft_model).ok());
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"}) {
      std::filesystem::copy_file(model / f, draft_model / f,
                                 std::filesystem::copy_options::overwrite_existing);
    }
    exit_layer = 0;
  }
  auto service = Service::Start(model, draft_model, exit_layer);
  ASSERT_NE(service, nullptr);

  std::ifstream f(shared / "models/stories260K/golden-greedy.json");
  const nlohmann::json golden = nlohmann::json::parse(f);
  for (const auto& c : golden["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    const std::vector<int32_t> ids = c["token_ids"].get<std::vector<int32_t>>();
    std::string text = c["text"].get<std::string>();
    text.pop_back();  // run.c prints a newline of its own at the end
    // How many of the golden ids are prompt: the coordinator's own tokenizer says.
    grpc::ClientContext tctx;
    v1::TokenizeRequest treq;
    treq.set_text(prompt);
    treq.set_add_special_tokens(true);
    v1::TokenizeResponse tresp;
    const size_t n = prompt.empty() ? 1
                                    : (service->stub->Tokenize(&tctx, treq, &tresp).ok()
                                           ? static_cast<size_t>(tresp.token_ids_size())
                                           : 0);
    ASSERT_GT(n, 0u);
    // Each K as asked, then K = 4 under the adaptive policy, which may lower it round by round:
    // greedy output must not change either way.
    for (const uint32_t k : {0u, 1u, 2u, 4u, 8u, 4u + 100u}) {
      const bool adaptive = k >= 100;
      v1::GenerateRequest r;
      if (prompt.empty()) {
        r.mutable_token_ids()->add_ids(1);
      } else {
        r.set_text(prompt);
      }
      r.mutable_stopping()->set_max_new_tokens(static_cast<uint32_t>(ids.size() - n));
      r.mutable_stopping()->set_ignore_eos(true);
      r.mutable_speculation()->set_num_speculative_tokens(adaptive ? k - 100 : k);
      r.mutable_speculation()->set_k_policy(adaptive ? v1::K_POLICY_ADAPTIVE : v1::K_POLICY_FIXED);
      const Stream s = service->Generate(r);
      ASSERT_TRUE(s.status.ok()) << s.status.error_message();
      EXPECT_EQ(s.tokens,
                std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end()))
          << "prompt '" << prompt << "', K = " << k;
      EXPECT_EQ(prompt + s.text, text) << "prompt '" << prompt << "', K = " << k;
      EXPECT_EQ(s.last.finish_reason(), v1::FINISH_REASON_LENGTH);
      if (k > 0 && !adaptive) {
        EXPECT_GT(s.last.usage().draft_tokens(), 0u);
      }
    }
  }
  service->ExpectNoBlocksUsed();
}

INSTANTIATE_TEST_SUITE_P(Drafts, GoldenE2eTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "synthetic" : "early_exit"; });

class SyntheticE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = tmp_.path() / "target";
    SynthSpec spec;
    absl::StatusOr<ModelConfig> c = ShapePreset("tiny");
    ASSERT_TRUE(c.ok());
    spec.config = *c;
    spec.config.vocab_size = 1000;
    spec.residual_scale = 0.1;
    ASSERT_TRUE(WriteSyntheticModel(spec, model_).ok());
    service_ = Service::Start(model_, model_, 1);
    ASSERT_NE(service_, nullptr);
  }
  ScopedTempDir tmp_;
  std::filesystem::path model_;
  std::unique_ptr<Service> service_;
};

TEST_F(SyntheticE2eTest, GreedySpeculativeEqualsPlainOverTheWire) {
  for (int p = 0; p < 30; ++p) {
    v1::GenerateRequest r;
    r.mutable_token_ids()->add_ids(1);
    for (int j = 0; j < 1 + p % 5; ++j) r.mutable_token_ids()->add_ids(300 + (p * 37 + j) % 600);
    r.mutable_stopping()->set_max_new_tokens(16);
    r.mutable_stopping()->set_ignore_eos(true);
    r.mutable_speculation()->set_num_speculative_tokens(0);
    const Stream plain = service_->Generate(r);
    ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
    ASSERT_EQ(plain.tokens.size(), 16u);
    for (const uint32_t k : {1u, 3u, 8u}) {
      r.mutable_speculation()->set_num_speculative_tokens(k);
      const Stream spec = service_->Generate(r);
      ASSERT_TRUE(spec.status.ok());
      EXPECT_EQ(spec.tokens, plain.tokens) << "prompt " << p << ", K = " << k;
    }
  }
  service_->ExpectNoBlocksUsed();
}

// logit_bias over the wire: banning the plain output's tokens and lifting others changes the
// output, and speculative decoding with the bias streams exactly plain decoding with it.
TEST_F(SyntheticE2eTest, GreedyWithALogitBiasEqualsPlainWithIt) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->add_ids(1);
  r.mutable_token_ids()->add_ids(345);
  r.mutable_stopping()->set_max_new_tokens(16);
  r.mutable_stopping()->set_ignore_eos(true);
  r.mutable_speculation()->set_num_speculative_tokens(0);
  const Stream unbiased = service_->Generate(r);
  ASSERT_TRUE(unbiased.status.ok()) << unbiased.status.error_message();
  auto& bias = *r.mutable_sampling()->mutable_logit_bias();
  for (size_t i = 0; i < 4; ++i) bias[unbiased.tokens[i]] = -100.0f;
  bias[17] = 6.0f;
  bias[600] = 5.0f;
  const Stream plain = service_->Generate(r);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  ASSERT_EQ(plain.tokens.size(), 16u);
  EXPECT_NE(plain.tokens, unbiased.tokens);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(std::count(plain.tokens.begin(), plain.tokens.end(), unbiased.tokens[i]), 0)
        << "banned token " << unbiased.tokens[i] << " was generated";
  }
  for (const uint32_t k : {1u, 4u}) {
    r.mutable_speculation()->set_num_speculative_tokens(k);
    const Stream spec = service_->Generate(r);
    ASSERT_TRUE(spec.status.ok()) << spec.status.error_message();
    EXPECT_EQ(spec.tokens, plain.tokens) << "K = " << k;
  }
  service_->ExpectNoBlocksUsed();
}

// A prompt that repeats itself, so that prompt lookup finds matches.
v1::GenerateRequest RepeatingRequest(int p, uint32_t max_new) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->add_ids(1);
  for (int rep = 0; rep < 3; ++rep) {
    for (int j = 0; j < 2 + p % 4; ++j) r.mutable_token_ids()->add_ids(300 + (p * 37 + j) % 600);
  }
  r.mutable_stopping()->set_max_new_tokens(max_new);
  r.mutable_stopping()->set_ignore_eos(true);
  return r;
}

// Every way of drafting (issue 17) over the wire: prompt lookup, EGAG and trees of several
// shapes stream exactly the tokens of plain decoding, and each really drafted.
TEST_F(SyntheticE2eTest, GreedyEveryDraftingMethodEqualsPlainOverTheWire) {
  struct Arm {
    const char* name;
    uint32_t k;
    std::function<void(v1::SpeculationParameters*)> set;
  };
  const std::vector<Arm> arms = {
      {"ngram", 4,
       [](v1::SpeculationParameters* s) { s->set_draft_method(v1::DRAFT_METHOD_NGRAM); }},
      {"egag", 6, [](v1::SpeculationParameters* s) { s->set_egag(true); }},
      {"tree 2x2", 4,
       [](v1::SpeculationParameters* s) {
         s->mutable_tree()->set_branching(2);
         s->mutable_tree()->set_depth(2);
       }},
      {"tree 3x1", 3,
       [](v1::SpeculationParameters* s) {
         s->mutable_tree()->set_branching(3);
         s->mutable_tree()->set_depth(1);
       }},
  };
  std::vector<uint32_t> drafted(arms.size(), 0);
  for (int p = 0; p < 12; ++p) {
    v1::GenerateRequest r = RepeatingRequest(p, 16);
    r.mutable_speculation()->set_num_speculative_tokens(0);
    const Stream plain = service_->Generate(r);
    ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
    ASSERT_EQ(plain.tokens.size(), 16u);
    for (size_t a = 0; a < arms.size(); ++a) {
      v1::GenerateRequest m = r;
      m.mutable_speculation()->set_num_speculative_tokens(arms[a].k);
      m.mutable_speculation()->set_k_policy(v1::K_POLICY_FIXED);
      arms[a].set(m.mutable_speculation());
      const Stream spec = service_->Generate(m);
      ASSERT_TRUE(spec.status.ok()) << arms[a].name << ": " << spec.status.error_message();
      EXPECT_EQ(spec.tokens, plain.tokens) << arms[a].name << ", prompt " << p;
      drafted[a] += spec.last.usage().draft_tokens();
    }
  }
  for (size_t a = 0; a < arms.size(); ++a) {
    EXPECT_GT(drafted[a], 0u) << arms[a].name << " never drafted";
  }
  service_->ExpectNoBlocksUsed();
}

TEST_F(SyntheticE2eTest, ThirtyTwoConcurrentMixedStreams) {
  std::vector<v1::GenerateRequest> reqs;
  for (int i = 0; i < 32; ++i) {
    v1::GenerateRequest r = TextRequest(absl::StrCat("the story ", i), 8 + i % 17, i % 5);
    if (i % 2 == 1) {
      r.mutable_sampling()->set_temperature(0.8f);
      r.mutable_sampling()->set_top_p(0.9f);
      r.mutable_sampling()->set_seed(1000 + i);
    }
    if (i % 7 == 3) r.mutable_stopping()->add_stop("e");
    reqs.push_back(r);
  }
  std::vector<std::future<Stream>> futures;
  for (const auto& r : reqs) {
    futures.push_back(std::async(std::launch::async, [&, r] { return service_->Generate(r); }));
  }
  std::vector<Stream> results;
  for (auto& f : futures) results.push_back(f.get());
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_NE(results[i].last.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
    if (i % 2 == 0) {
      const Stream solo = service_->Generate(reqs[i]);
      EXPECT_EQ(results[i].tokens, solo.tokens) << "request " << i;
      EXPECT_EQ(results[i].text, solo.text) << "request " << i;
    }
  }
  service_->ExpectNoBlocksUsed();
}

TEST_F(SyntheticE2eTest, InvalidRequestsAreRejectedWithPreciseMessages) {
  struct Case {
    std::function<void(v1::GenerateRequest*)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](v1::GenerateRequest* r) { r->mutable_sampling()->set_temperature(-1); },
       "temperature must be >= 0"},
      {[](v1::GenerateRequest* r) { r->mutable_sampling()->set_top_p(1.5f); },
       "top_p must be in (0, 1]"},
      {[](v1::GenerateRequest* r) { r->mutable_token_ids(); }, "token_ids is empty"},
      {[](v1::GenerateRequest* r) {
         r->mutable_speculation()->set_draft_sampling(static_cast<v1::DraftSampling>(99));
       },
       "speculation.draft_sampling 99 is not a DraftSampling"},
      {[](v1::GenerateRequest* r) {
         r->mutable_speculation()->set_k_policy(static_cast<v1::KPolicy>(99));
       },
       "speculation.k_policy 99 is not a KPolicy"},
      {[](v1::GenerateRequest* r) { r->clear_prompt(); }, "has no prompt"},
      {[](v1::GenerateRequest* r) { r->mutable_token_ids()->add_ids(5000); },
       "outside the vocabulary"},
      {[](v1::GenerateRequest* r) { (*r->mutable_sampling()->mutable_logit_bias())[1000] = 1; },
       "logit_bias token 1000 is outside the vocabulary [0, 1000)"},
      {[](v1::GenerateRequest* r) { (*r->mutable_sampling()->mutable_logit_bias())[7] = 101; },
       "logit_bias of token 7 must be a number in [-100, 100], got 101"},
      {[](v1::GenerateRequest* r) { r->mutable_stopping()->set_max_new_tokens(100000); },
       "exceeds the model's limit"},
      {[](v1::GenerateRequest* r) { r->mutable_speculation()->set_num_speculative_tokens(1000); },
       "num_speculative_tokens must be in [0, 16]"},
      {[](v1::GenerateRequest* r) {
         r->mutable_speculation()->set_draft_method(static_cast<v1::DraftMethod>(7));
       },
       "speculation.draft_method 7 is not a DraftMethod"},
      {[](v1::GenerateRequest* r) { r->mutable_speculation()->mutable_tree()->set_depth(1); },
       "speculation.tree.branching must be in [2, 8], got 0"},
      {[](v1::GenerateRequest* r) {
         r->mutable_speculation()->mutable_tree()->set_branching(2);
         r->mutable_speculation()->mutable_tree()->set_depth(3);
       },
       "speculation.tree.depth must be in [1, K = 2], got 3"},
      {[](v1::GenerateRequest* r) {
         r->mutable_speculation()->set_num_speculative_tokens(8);
         r->mutable_speculation()->mutable_tree()->set_branching(4);
         r->mutable_speculation()->mutable_tree()->set_depth(3);
       },
       "speculation.tree (branching 4, depth 3, K 8) has 404 nodes, at most 64"},
      {[](v1::GenerateRequest* r) {
         r->mutable_speculation()->set_draft_method(v1::DRAFT_METHOD_NGRAM);
         r->mutable_speculation()->mutable_tree()->set_branching(2);
         r->mutable_speculation()->mutable_tree()->set_depth(1);
       },
       "speculation.tree needs model drafting"},
      {[](v1::GenerateRequest* r) {
         r->mutable_speculation()->set_egag(true);
         r->mutable_speculation()->set_draft_method(v1::DRAFT_METHOD_NGRAM);
       },
       "speculation.egag needs a chain of model drafts"},
      {[](v1::GenerateRequest* r) {
         r->mutable_logprobs()->set_prompt(true);
         r->mutable_guidance()->set_scale(2.0f);
         r->mutable_guidance()->mutable_unconditional_token_ids()->add_ids(1);
       },
       "logprobs.prompt is not supported with guidance"},
      {[](v1::GenerateRequest* r) {
         r->mutable_logprobs()->set_prompt(true);
         r->mutable_logprobs()->set_top_logprobs(21);
       },
       "logprobs.top_logprobs must be in [0, 20], got 21"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = TextRequest("hello", 4, 2);
    c.mutate(&r);
    const Stream s = service_->Generate(r);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.message;
    EXPECT_THAT(s.status.error_message(), HasSubstr(c.message));
  }
  // A bad request harms nothing: a good one still works.
  EXPECT_TRUE(service_->Generate(TextRequest("hello", 4, 2)).status.ok());
}

// Classifier-free guidance over the wire (the worker codec carries the companions): bad values
// are INVALID_ARGUMENT naming the field; greedy guided output is the same for K = 0, K = 4 and a
// guided draft; text and its token ids are the same unconditional prompt, and none is BOS;
// scale 1 is no guidance; the metrics count guided requests and their drafts.
TEST_F(SyntheticE2eTest, GuidanceOverTheWire) {
  const std::vector<std::pair<std::function<void(v1::Guidance*)>, std::string>> invalid = {
      {[](v1::Guidance* g) { g->set_scale(0.0f); }, "guidance.scale must be in (0, 10], got 0"},
      {[](v1::Guidance* g) { g->set_scale(-2.0f); }, "guidance.scale must be in (0, 10]"},
      {[](v1::Guidance* g) { g->set_scale(10.5f); }, "guidance.scale must be in (0, 10]"},
      {[](v1::Guidance* g) { g->set_scale(std::nanf("")); }, "guidance.scale must be in (0, 10]"},
      {[](v1::Guidance* g) {
         g->set_scale(2.0f);
         g->mutable_unconditional_token_ids()->add_ids(5000);
       },
       "guidance.unconditional_token_ids: token id 5000 at index 0 is outside the vocabulary"},
  };
  for (const auto& [mutate, message] : invalid) {
    v1::GenerateRequest r = TextRequest("hello", 4, 2);
    mutate(r.mutable_guidance());
    const Stream s = service_->Generate(r);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << message;
    EXPECT_THAT(s.status.error_message(), HasSubstr(message));
  }

  grpc::ClientContext context;
  v1::TokenizeRequest treq;
  treq.set_text("once upon");
  treq.set_add_special_tokens(true);
  v1::TokenizeResponse tresp;
  ASSERT_TRUE(service_->stub->Tokenize(&context, treq, &tresp).ok());
  int changed = 0;
  for (int p = 0; p < 6; ++p) {
    SCOPED_TRACE(absl::StrCat("prompt ", p));
    v1::GenerateRequest r;
    r.mutable_token_ids()->add_ids(1);
    for (int j = 0; j < 2 + p % 3; ++j) r.mutable_token_ids()->add_ids(300 + (p * 37 + j) % 600);
    r.mutable_stopping()->set_max_new_tokens(16);
    r.mutable_stopping()->set_ignore_eos(true);
    r.mutable_speculation()->set_num_speculative_tokens(0);
    // Adaptive K would lower K for greedy requests whose drafts the guided target rejects.
    r.mutable_speculation()->set_k_policy(v1::K_POLICY_FIXED);
    const Stream unguided = service_->Generate(r);
    ASSERT_TRUE(unguided.status.ok()) << unguided.status.error_message();
    r.mutable_guidance()->set_scale(1.0f);
    r.mutable_guidance()->set_unconditional_text("once upon");
    EXPECT_EQ(service_->Generate(r).tokens, unguided.tokens) << "scale 1 is no guidance";

    r.mutable_guidance()->set_scale(3.0f);
    const Stream guided = service_->Generate(r);
    ASSERT_TRUE(guided.status.ok()) << guided.status.error_message();
    ASSERT_EQ(guided.tokens.size(), 16u);
    changed += guided.tokens != unguided.tokens;
    r.mutable_speculation()->set_num_speculative_tokens(4);
    EXPECT_EQ(service_->Generate(r).tokens, guided.tokens) << "K = 4";
    r.mutable_guidance()->set_draft(true);
    const Stream guided_draft = service_->Generate(r);
    EXPECT_EQ(guided_draft.tokens, guided.tokens) << "K = 4, guided draft";
    EXPECT_GT(guided_draft.last.usage().draft_tokens(), 0u);
    r.mutable_guidance()->mutable_unconditional_token_ids()->mutable_ids()->CopyFrom(
        tresp.token_ids());
    EXPECT_EQ(service_->Generate(r).tokens, guided.tokens) << "the same prompt as token ids";

    r.mutable_guidance()->clear_unconditional_token_ids();
    const Stream from_bos = service_->Generate(r);
    r.mutable_guidance()->mutable_unconditional_token_ids()->add_ids(1);
    EXPECT_EQ(service_->Generate(r).tokens, from_bos.tokens) << "unset is BOS alone";
  }
  EXPECT_GE(changed, 3) << "guidance at scale 3 should change most outputs";

  const int port = service_->coordinator->metrics_port();
  EXPECT_EQ(MetricValue(port, "specd_guided_requests_total{guidance=\"target\"}"), 12);
  EXPECT_EQ(MetricValue(port, "specd_guided_requests_total{guidance=\"target_and_draft\"}"), 24);
  for (const char* kind : {"target", "target_and_draft"}) {
    EXPECT_GT(MetricValue(port, absl::StrCat("specd_spec_decode_num_draft_tokens_by_"
                                             "guidance_total{guidance=\"",
                                             kind, "\"}")),
              0)
        << kind;
  }
  service_->ExpectNoBlocksUsed();
  EXPECT_EQ(MetricValue(service_->target->metrics_port(), "specd_worker_companion_kv_blocks"), 0);
}

// Guidance meets issue 17's ways of drafting over the wire: with a tree it is refused naming
// speculation.tree (the companion would need the same tree), and guiding the draft where prompt
// lookup drafts is refused naming guidance.draft; a guide of scale 1 is no guidance, so its tree
// is served. Prompt lookup (its drafts reach the companion like a model's chain) and EGAG with a
// guided draft give guided plain decoding's greedy tokens, with drafts really made.
TEST_F(SyntheticE2eTest, GuidanceRefusesTreesAndIsExactWithPromptLookupAndEgag) {
  {
    v1::GenerateRequest r = TextRequest("hello", 4, 2);
    r.mutable_speculation()->mutable_tree()->set_branching(2);
    r.mutable_speculation()->mutable_tree()->set_depth(1);
    r.mutable_guidance()->set_scale(3.0f);
    const Stream s = service_->Generate(r);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.status.error_message(),
                HasSubstr("speculation.tree cannot be combined with guidance"));
    r.mutable_guidance()->set_scale(1.0f);
    EXPECT_TRUE(service_->Generate(r).status.ok()) << "scale 1 is no guidance";
  }
  {
    v1::GenerateRequest r = TextRequest("hello", 4, 2);
    r.mutable_speculation()->set_draft_method(v1::DRAFT_METHOD_NGRAM);
    r.mutable_guidance()->set_scale(3.0f);
    r.mutable_guidance()->set_draft(true);
    const Stream s = service_->Generate(r);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.status.error_message(), HasSubstr("guidance.draft guides the draft model"));
  }

  uint32_t lookup_drafted = 0;
  for (int p = 0; p < 8; ++p) {
    SCOPED_TRACE(absl::StrCat("prompt ", p));
    v1::GenerateRequest r = RepeatingRequest(p, 16);
    r.mutable_speculation()->set_num_speculative_tokens(0);
    r.mutable_speculation()->set_k_policy(v1::K_POLICY_FIXED);
    r.mutable_guidance()->set_scale(2.0f + static_cast<float>(p % 3));
    r.mutable_guidance()->mutable_unconditional_token_ids()->add_ids(1);
    r.mutable_guidance()->mutable_unconditional_token_ids()->add_ids(400 + p);
    const Stream plain = service_->Generate(r);
    ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
    ASSERT_EQ(plain.tokens.size(), 16u);
    v1::GenerateRequest ngram = r;
    ngram.mutable_speculation()->set_num_speculative_tokens(4);
    ngram.mutable_speculation()->set_draft_method(v1::DRAFT_METHOD_NGRAM);
    const Stream lookup = service_->Generate(ngram);
    ASSERT_TRUE(lookup.status.ok()) << lookup.status.error_message();
    EXPECT_EQ(lookup.tokens, plain.tokens) << "prompt lookup";
    lookup_drafted += lookup.last.usage().draft_tokens();
    v1::GenerateRequest egag = r;
    egag.mutable_speculation()->set_num_speculative_tokens(6);
    egag.mutable_speculation()->set_egag(true);
    egag.mutable_guidance()->set_draft(true);
    const Stream e = service_->Generate(egag);
    EXPECT_EQ(e.tokens, plain.tokens) << "EGAG with a guided draft";
    EXPECT_GT(e.last.usage().draft_tokens(), 0u);
  }
  EXPECT_GT(lookup_drafted, 0u) << "prompt lookup never drafted for a guided request";
  service_->ExpectNoBlocksUsed();
  EXPECT_EQ(MetricValue(service_->target->metrics_port(), "specd_worker_companion_kv_blocks"), 0);
}

// Empty text is a prompt of BOS alone, as in vLLM and llama.cpp: the same tokens as sending the
// ids the server's tokenizer makes of "".
TEST_F(SyntheticE2eTest, EmptyTextGeneratesFromBos) {
  grpc::ClientContext context;
  v1::TokenizeRequest treq;
  treq.set_text("");
  treq.set_add_special_tokens(true);
  v1::TokenizeResponse tresp;
  ASSERT_TRUE(service_->stub->Tokenize(&context, treq, &tresp).ok());
  ASSERT_EQ(tresp.token_ids_size(), 1) << "the synthetic tokenizer adds BOS";
  const Stream from_text = service_->Generate(TextRequest("", 6, 2));
  ASSERT_TRUE(from_text.status.ok()) << from_text.status.error_message();
  EXPECT_EQ(from_text.tokens.size(), 6u);
  v1::GenerateRequest ids = TextRequest("", 6, 2);
  ids.mutable_token_ids()->mutable_ids()->CopyFrom(tresp.token_ids());
  EXPECT_EQ(service_->Generate(ids).tokens, from_text.tokens);
}

TEST_F(SyntheticE2eTest, DeadlineAndCancellationFreeTheSequence) {
  // tiny's limit is 512 tokens; a 1 ms deadline expires mid-generation.
  const Stream s = service_->Generate(TextRequest("a long one", 400, 2), /*deadline_ms=*/1);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  grpc::ClientContext ctx;
  auto reader = service_->stub->Generate(&ctx, TextRequest("another long one", 400, 2));
  v1::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  service_->ExpectNoBlocksUsed();
}

TEST_F(SyntheticE2eTest, DeadDraftWorkerIsUnavailableNamingIt) {
  service_->draft->Signal(SIGKILL);
  v1::GenerateRequest fixed = TextRequest("hello", 8, 2);
  fixed.mutable_speculation()->set_k_policy(v1::K_POLICY_FIXED);
  const Stream s = service_->Generate(fixed);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.status.error_message(), HasSubstr("draft worker at " + service_->draft->address()));
  // Plain decoding needs only the target, so it still works, and so does a request that lets
  // the server choose K: it decodes plainly while the draft worker is away.
  const Stream plain = service_->Generate(TextRequest("hello", 8, 0));
  EXPECT_TRUE(plain.status.ok()) << plain.status.error_message();
  EXPECT_EQ(plain.tokens.size(), 8u);
  const Stream adaptive = service_->Generate(TextRequest("hello", 8, 2));
  EXPECT_TRUE(adaptive.status.ok()) << adaptive.status.error_message();
  EXPECT_EQ(adaptive.tokens, plain.tokens);
  EXPECT_EQ(adaptive.last.usage().draft_tokens(), 0u);
}

TEST_F(SyntheticE2eTest, ServerInfoTokenizeDetokenize) {
  grpc::ClientContext c1;
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(service_->stub->GetServerInfo(&c1, v1::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.target().vocab_size(), 1000);
  EXPECT_EQ(info.draft().num_layers(), 1);
  EXPECT_EQ(info.default_num_speculative_tokens(), 4u);
  grpc::ClientContext c2;
  v1::TokenizeRequest treq;
  treq.set_text("hello world");
  v1::TokenizeResponse tresp;
  ASSERT_TRUE(service_->stub->Tokenize(&c2, treq, &tresp).ok());
  grpc::ClientContext c3;
  v1::DetokenizeRequest dreq;
  dreq.mutable_token_ids()->CopyFrom(tresp.token_ids());
  v1::DetokenizeResponse dresp;
  ASSERT_TRUE(service_->stub->Detokenize(&c3, dreq, &dresp).ok());
  EXPECT_EQ(dresp.text(), "hello world");
}

// Runs `command` and parses the one JSON line it prints.
nlohmann::json RunClient(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  EXPECT_EQ(WEXITSTATUS(status), 0) << command << "\n" << out;
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << out;
  return j;
}

TEST_F(SyntheticE2eTest, PythonAndNodeClientsStreamTheSameTokens) {
  const std::vector<int32_t> prompt = {1, 500, 501, 502};
  v1::GenerateRequest r;
  r.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
  r.mutable_stopping()->set_max_new_tokens(20);
  r.mutable_stopping()->set_ignore_eos(true);
  r.mutable_speculation()->set_num_speculative_tokens(3);
  const Stream expected = service_->Generate(r);
  ASSERT_TRUE(expected.status.ok());
  const std::string src = testing::SourceDir().string();
  const std::string addr = service_->coordinator->address();
  const std::string ids = "1 500 501 502";
  const nlohmann::json py =
      RunClient(absl::StrCat(testing::Python(), " ", src, "/tests/clients/python_client.py ", src,
                             " ", (tmp_.path() / "py_stubs").string(), " ", addr, " 20 ", ids));
  const nlohmann::json js = RunClient(
      absl::StrCat("node ", src, "/tests/clients/node_client.mjs ", src, " ", addr, " 20 ", ids));
  for (const nlohmann::json* j : {&py, &js}) {
    if (j->is_discarded()) continue;
    EXPECT_EQ((*j)["token_ids"].get<std::vector<int32_t>>(), expected.tokens);
    EXPECT_EQ((*j)["text"].get<std::string>(), expected.text);
    EXPECT_EQ((*j)["finish_reason"].get<std::string>(), "FINISH_REASON_LENGTH");
  }
}

TEST(SharedPrefixE2eTest, SixteenStreamsSharingASystemPromptEqualOneAtATimeCachingOnAndOff) {
  ScopedTempDir tmp;
  const std::filesystem::path model = tmp.path() / "long-context";
  // `specd synth --max-seq-len`: the tiny shape with a context longer than its preset's 512.
  std::string synth_err;
  const absl::StatusOr<int> synth =
      ChildProcess::Run(testing::BuiltBinary("tools/specd"),
                        {"synth", "--shape", "tiny", "--vocab", "1000", "--max-seq-len", "2048",
                         "--residual-scale", "0.1", "--out", model.string()},
                        &synth_err);
  ASSERT_TRUE(synth.ok() && *synth == 0) << synth_err;

  // A 1200-token system prompt (five prefill chunks of 256), then each stream's own question.
  std::vector<int32_t> system = {1};
  for (int i = 1; i < 1200; ++i) system.push_back(3 + (i * 7919) % 990);
  std::vector<v1::GenerateRequest> reqs;
  for (int i = 0; i < 16; ++i) {
    v1::GenerateRequest r;
    r.mutable_token_ids()->mutable_ids()->Add(system.begin(), system.end());
    for (int j = 0; j < 24; ++j) r.mutable_token_ids()->add_ids(3 + (i * 131 + j * 17) % 990);
    r.mutable_stopping()->set_max_new_tokens(12);
    r.mutable_stopping()->set_ignore_eos(true);
    r.mutable_speculation()->set_num_speculative_tokens(static_cast<uint32_t>(i % 4));
    if (i % 2 == 1) {
      r.mutable_sampling()->set_temperature(0.9f);
      r.mutable_sampling()->set_seed(500 + static_cast<uint64_t>(i));
    }
    reqs.push_back(r);
  }

  std::map<std::string, std::vector<std::vector<int32_t>>> outputs;
  for (const char* caching : {"on", "off"}) {
    SCOPED_TRACE(absl::StrCat("--prefix-caching ", caching));
    auto service = Service::Start(model, model, 1, 65536, {"--prefix-caching", caching},
                                  {"--prefill-chunk", "256"});
    ASSERT_NE(service, nullptr);
    std::vector<std::vector<int32_t>>& alone = outputs[absl::StrCat(caching, " alone")];
    for (const v1::GenerateRequest& r : reqs) {
      const Stream s = service->Generate(r);
      ASSERT_TRUE(s.status.ok()) << s.status.error_message();
      ASSERT_EQ(s.tokens.size(), 12u);
      alone.push_back(s.tokens);
    }
    std::vector<std::future<Stream>> futures;
    for (const v1::GenerateRequest& r : reqs) {
      futures.push_back(std::async(std::launch::async, [&, r] { return service->Generate(r); }));
    }
    std::vector<std::vector<int32_t>>& together = outputs[absl::StrCat(caching, " together")];
    for (auto& f : futures) {
      const Stream s = f.get();
      ASSERT_TRUE(s.status.ok()) << s.status.error_message();
      together.push_back(s.tokens);
    }
    const double queried =
        MetricValue(service->target->metrics_port(), "specd_prefix_cache_queried_tokens_total");
    const double hit =
        MetricValue(service->target->metrics_port(), "specd_prefix_cache_hit_tokens_total");
    if (std::string(caching) == "on") {
      // Every request after the first finds at least the system prompt's 75 whole blocks.
      EXPECT_GE(hit, 31.0 * 75 * 16) << "of " << queried << " queried";
      EXPECT_LE(hit, queried);
    } else {
      EXPECT_EQ(hit, 0) << "queried " << queried;
    }
    service->ExpectNoBlocksUsed();
  }
  const std::vector<std::vector<int32_t>>& reference = outputs["on alone"];
  for (const auto& [name, got] : outputs) {
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got[i], reference[i]) << name << ", request " << i;
    }
  }
}

// The coordinator's --prefix-sharing reaches its scheduler and its metric. Four requests for one
// 200-token prompt arrive together: the target is stopped while they do, so the first is admitted
// and its round waits on the target while the other three queue behind it. With sharing on,
// once the first has computed a 32-token chunk the three wait for it to compute the rest
// (specd_prefix_sharing_waits_total counts them each round); off, none waits. The outputs are
// the same either way.
TEST(PrefixSharingE2eTest, RequestsForOnePromptWaitForTheOneComputingIt) {
  ScopedTempDir tmp;
  SynthSpec spec;
  absl::StatusOr<ModelConfig> c = ShapePreset("tiny");
  ASSERT_TRUE(c.ok());
  spec.config = *c;
  spec.config.vocab_size = 1000;
  const std::filesystem::path model = tmp.path() / "m";
  ASSERT_TRUE(WriteSyntheticModel(spec, model).ok());
  v1::GenerateRequest r;
  r.mutable_token_ids()->add_ids(1);
  for (int j = 1; j < 200; ++j) r.mutable_token_ids()->add_ids(3 + (j * 37) % 900);
  r.mutable_stopping()->set_max_new_tokens(8);
  r.mutable_stopping()->set_ignore_eos(true);
  r.mutable_speculation()->set_num_speculative_tokens(2);

  std::map<bool, std::vector<std::vector<int32_t>>> outputs;
  for (const bool sharing : {true, false}) {
    SCOPED_TRACE(absl::StrCat("--prefix-sharing ", sharing ? "on" : "off"));
    auto service =
        Service::Start(model, model, 1, 16384, {},
                       {"--prefill-chunk", "32", "--prefix-sharing", sharing ? "on" : "off"});
    ASSERT_NE(service, nullptr);
    const int port = service->coordinator->metrics_port();
    ASSERT_GT(port, 0);
    const auto wait_for = [port](const std::string& gauge, double at_least) {
      for (int i = 0; i < 1000; ++i) {
        if (MetricValue(port, gauge) >= at_least) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return false;
    };
    service->target->Signal(SIGSTOP);
    std::vector<std::future<Stream>> streams;
    streams.push_back(std::async(std::launch::async, [&] { return service->Generate(r); }));
    const bool first_running = wait_for("specd_num_requests_running", 1);
    for (int i = 0; i < 3; ++i) {
      streams.push_back(std::async(std::launch::async, [&] { return service->Generate(r); }));
    }
    const bool rest_queued = wait_for("specd_num_requests_waiting", 3);
    service->target->Signal(SIGCONT);
    ASSERT_TRUE(first_running);
    ASSERT_TRUE(rest_queued);
    for (auto& f : streams) {
      const Stream s = f.get();
      ASSERT_TRUE(s.status.ok()) << s.status.error_message();
      outputs[sharing].push_back(s.tokens);
    }
    const double waits = MetricValue(port, "specd_prefix_sharing_waits_total");
    if (sharing) {
      EXPECT_GE(waits, 3);
    } else {
      EXPECT_EQ(waits, 0);
    }
    service->ExpectNoBlocksUsed();
  }
  EXPECT_EQ(outputs[true], outputs[false]);
  for (const std::vector<int32_t>& tokens : outputs[true]) EXPECT_EQ(tokens, outputs[true][0]);
}

TEST(SpecdServeTest, StartsThreeProcessesServesAndStopsOnSigint) {
  ScopedTempDir tmp;
  SynthSpec spec;
  spec.config = *ShapePreset("tiny");
  ASSERT_TRUE(WriteSyntheticModel(spec, tmp.path() / "m").ok());
  auto serve = ChildProcess::Start(
      testing::BuiltBinary("tools/specd"),
      {"serve", "--target", (tmp.path() / "m").string(), "--draft-exit-layer", "2", "--listen",
       "127.0.0.1:0", "--threads", "1", "--kv-tokens", "2048"});
  ASSERT_TRUE(serve.ok()) << serve.status();
  const std::string addr = (*serve)->address();
  const std::string out = [&] {
    FILE* pipe =
        popen(absl::StrCat(testing::BuiltBinary("tools/specd").string(), " generate --server ",
                           addr, " --prompt-ids 1,50,60 --max-tokens 12 --k 3 --ignore-eos 2>&1")
                  .c_str(),
              "r");
    std::string text;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) text.append(buf, n);
    EXPECT_EQ(pclose(pipe), 0) << text;
    return text;
  }();
  EXPECT_THAT(out, HasSubstr("12 generated, finish FINISH_REASON_LENGTH"));
  EXPECT_THAT(out, HasSubstr("acceptance rate"));
  (*serve)->Signal(SIGINT);
  EXPECT_EQ((*serve)->Terminate(), 0);
}

std::string ReadWholeFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// `specd chat`: each line of stdin is a turn, and every turn's prompt is the whole conversation so
// far (its transcript, replies included) as the server's template renders it: checked against
// the server's own Tokenize of each prefix of the transcript.
TEST(SpecdChatTest, EachTurnSendsTheWholeConversation) {
  ScopedTempDir tmp;
  SynthSpec spec;
  spec.config = *ShapePreset("tiny");
  spec.config.vocab_size = 1000;
  ASSERT_TRUE(WriteSyntheticModel(spec, tmp.path() / "m").ok());
  std::ofstream(tmp.path() / "chat.jinja")
      << "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:";
  auto serve =
      ChildProcess::Start(testing::BuiltBinary("tools/specd"),
                          {"serve", "--target", (tmp.path() / "m").string(), "--draft-exit-layer",
                           "2", "--listen", "127.0.0.1:0", "--threads", "1", "--kv-tokens", "4096",
                           "--chat-template", (tmp.path() / "chat.jinja").string()});
  ASSERT_TRUE(serve.ok()) << serve.status();
  const std::string addr = (*serve)->address();
  const std::filesystem::path transcript = tmp.path() / "transcript.json";
  // The prompt sizes of a session's turns, and its transcript.
  auto session = [&](const std::string& lines) {
    const std::filesystem::path err = tmp.path() / "stderr";
    FILE* pipe =
        popen(absl::StrCat("printf '", lines, "' | ", testing::BuiltBinary("tools/specd").string(),
                           " chat --server ", addr,
                           " --system 'Be brief.' --max-tokens 6 --k 3 --transcript ",
                           transcript.string(), " 2> ", err.string())
                  .c_str(),
              "r");
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
    const std::string log = ReadWholeFile(err);
    EXPECT_EQ(pclose(pipe), 0) << out << log;
    std::vector<uint32_t> prompt_tokens;
    for (size_t pos = 0; (pos = log.find("[turn ", pos)) != std::string::npos; ++pos) {
      prompt_tokens.push_back(
          static_cast<uint32_t>(std::stoul(log.substr(log.find(": ", pos) + 2))));
    }
    v1::Chat chat;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(ReadWholeFile(transcript), &chat).ok());
    for (const v1::ChatMessage& m : chat.messages()) {
      if (m.role() == "assistant") {
        EXPECT_THAT(out, HasSubstr(m.content()));
      }
    }
    return std::make_pair(prompt_tokens, chat);
  };
  auto stub =
      v1::Generation::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    v1::GetServerInfoResponse info;
    ASSERT_TRUE(stub->GetServerInfo(&ctx, {}, &info).ok());
    EXPECT_TRUE(info.has_chat_template());
    EXPECT_FALSE(info.takes_tools()) << "the template never mentions tools";
    EXPECT_EQ(info.tool_call_format(), "");
  }
  auto count = [&](const v1::Chat& chat, int messages) {
    v1::TokenizeRequest t;
    t.mutable_chat()->mutable_messages()->CopyFrom(chat.messages());
    t.mutable_chat()->mutable_messages()->DeleteSubrange(messages, chat.messages_size() - messages);
    grpc::ClientContext ctx;
    v1::TokenizeResponse r;
    EXPECT_TRUE(stub->Tokenize(&ctx, t, &r).ok());
    return static_cast<uint32_t>(r.token_ids_size());
  };

  // The empty line is no turn.
  const auto [turns, chat] = session("Hello there\\n\\nTell me more\\n");
  ASSERT_EQ(turns.size(), 2u);
  ASSERT_EQ(chat.messages_size(), 5);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(1).content(), "Hello there");
  EXPECT_EQ(chat.messages(2).role(), "assistant");
  EXPECT_EQ(chat.messages(3).content(), "Tell me more");
  EXPECT_EQ(turns[0], count(chat, 2));
  EXPECT_EQ(turns[1], count(chat, 4)) << "turn 2 holds turn 1 and its reply";

  // /reset starts over from the system message; /exit ends the session.
  const auto [reset_turns, reset_chat] = session("One\\n/reset\\nTwo\\n/exit\\nThree\\n");
  ASSERT_EQ(reset_turns.size(), 2u);
  ASSERT_EQ(reset_chat.messages_size(), 3);
  EXPECT_EQ(reset_chat.messages(1).content(), "Two");
  EXPECT_EQ(reset_turns[1], count(reset_chat, 2));
  (*serve)->Signal(SIGINT);
  EXPECT_EQ((*serve)->Terminate(), 0);
}

// A coordinator that drafts by prompt lookup needs no draft worker: it serves greedy output equal
// to plain decoding, says so in GetServerInfo, and refuses model drafting naming the field.
TEST(NgramServiceTest, PromptLookupWithoutADraftWorker) {
  ScopedTempDir tmp;
  SynthSpec spec;
  spec.config = *ShapePreset("tiny");
  spec.config.vocab_size = 1000;
  spec.residual_scale = 0.1;
  ASSERT_TRUE(WriteSyntheticModel(spec, tmp.path() / "m").ok());
  auto service =
      Service::Start(tmp.path() / "m", "", 0, 16384, {},
                     {"--draft-method", "ngram", "--ngram-min", "1", "--ngram-max", "3"});
  ASSERT_NE(service, nullptr);
  grpc::ClientContext ctx;
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(service->stub->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.default_draft_method(), v1::DRAFT_METHOD_NGRAM);
  EXPECT_EQ(info.default_num_speculative_tokens(), 4u);
  uint32_t drafted = 0;
  uint32_t accepted = 0;
  for (int p = 0; p < 8; ++p) {
    v1::GenerateRequest r = RepeatingRequest(p, 24);
    r.mutable_speculation()->set_num_speculative_tokens(0);
    const Stream plain = service->Generate(r);
    ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
    r.mutable_speculation()->clear_num_speculative_tokens();  // the server's default K, by lookup
    const Stream lookup = service->Generate(r);
    ASSERT_TRUE(lookup.status.ok()) << lookup.status.error_message();
    EXPECT_EQ(lookup.tokens, plain.tokens) << "prompt " << p;
    drafted += lookup.last.usage().draft_tokens();
    accepted += lookup.last.usage().accepted_tokens();
  }
  EXPECT_GT(drafted, 0u);
  EXPECT_GT(accepted, 0u) << "prompt lookup never had a draft accepted";
  v1::GenerateRequest model = RepeatingRequest(0, 4);
  model.mutable_speculation()->set_draft_method(v1::DRAFT_METHOD_MODEL);
  const Stream refused = service->Generate(model);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(),
              HasSubstr("speculation.draft_method: model drafting needs a draft worker"));
  service->ExpectNoBlocksUsed();
}

// A draft whose classifier keeps only its 300 most frequent tokens (FR-Spec, ranked by the
// tokenizer here) still gives exactly plain decoding's greedy output, and drafts.
TEST(ReducedDraftHeadTest, GreedyEqualsPlainOverTheWire) {
  ScopedTempDir tmp;
  SynthSpec spec;
  spec.config = *ShapePreset("tiny");
  spec.config.vocab_size = 1000;
  spec.residual_scale = 0.1;
  ASSERT_TRUE(WriteSyntheticModel(spec, tmp.path() / "m").ok());
  auto service = Service::Start(tmp.path() / "m", tmp.path() / "m", 1, 16384, {}, {},
                                {"--draft-vocab", "300"});
  ASSERT_NE(service, nullptr);
  uint32_t accepted = 0;
  for (int p = 0; p < 8; ++p) {
    v1::GenerateRequest r = RepeatingRequest(p, 16);
    r.mutable_speculation()->set_num_speculative_tokens(0);
    const Stream plain = service->Generate(r);
    ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
    r.mutable_speculation()->set_num_speculative_tokens(3);
    r.mutable_speculation()->set_k_policy(v1::K_POLICY_FIXED);
    for (const float temperature : {0.0f, 1.0f}) {
      r.mutable_sampling()->set_temperature(temperature);
      r.mutable_sampling()->set_seed(7);
      const Stream reduced = service->Generate(r);
      ASSERT_TRUE(reduced.status.ok()) << reduced.status.error_message();
      if (temperature == 0.0f) {
        EXPECT_EQ(reduced.tokens, plain.tokens) << "prompt " << p;
      }
      EXPECT_GT(reduced.last.usage().draft_tokens(), 0u);
      accepted += reduced.last.usage().accepted_tokens();
    }
  }
  EXPECT_GT(accepted, 0u);
  service->ExpectNoBlocksUsed();
}

TEST(SpecdServeTest, DraftMethodNgramStartsNoDraftWorker) {
  ScopedTempDir tmp;
  SynthSpec spec;
  spec.config = *ShapePreset("tiny");
  ASSERT_TRUE(WriteSyntheticModel(spec, tmp.path() / "m").ok());
  auto serve = ChildProcess::Start(
      testing::BuiltBinary("tools/specd"),
      {"serve", "--target", (tmp.path() / "m").string(), "--draft-method", "ngram", "--listen",
       "127.0.0.1:0", "--threads", "1", "--kv-tokens", "2048"});
  ASSERT_TRUE(serve.ok()) << serve.status();
  // The coordinator reports how it drafts as it starts serving, about when serve does.
  std::string err = (*serve)->StderrText();
  for (int i = 0; i < 100 && err.find("drafting by") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    err = (*serve)->StderrText();
  }
  EXPECT_THAT(err, HasSubstr("target worker pid"));
  EXPECT_THAT(err, Not(HasSubstr("draft worker pid")));
  EXPECT_THAT(err, HasSubstr("drafting by ngram"));
  (*serve)->Signal(SIGINT);
  EXPECT_EQ((*serve)->Terminate(), 0);
}

// All three services on Unix sockets (--listen unix:PATH): each prints the socket it listens on,
// serves /metrics on loopback TCP, and the coordinator reaches its workers there.
TEST(UnixSocketE2eTest, ThreeProcessesOnUnixSocketsGenerateExactlyAndServeMetrics) {
  ScopedTempDir tmp;
  SynthSpec spec;
  spec.config = *ShapePreset("tiny");
  spec.residual_scale = 0.1;
  ASSERT_TRUE(WriteSyntheticModel(spec, tmp.path() / "m").ok());
  const std::string target_socket = "unix:" + (tmp.path() / "target.sock").string();
  const std::string draft_socket = "unix:" + (tmp.path() / "draft.sock").string();
  const std::string coordinator_socket = "unix:" + (tmp.path() / "coordinator.sock").string();
  Service s;
  auto target =
      ChildProcess::Start(testing::TargetWorkerBinary(),
                          testing::WorkerArgs(tmp.path() / "m", {"--listen", target_socket}));
  ASSERT_TRUE(target.ok()) << target.status();
  s.target = *std::move(target);
  auto draft = ChildProcess::Start(
      testing::DraftWorkerBinary(),
      testing::WorkerArgs(tmp.path() / "m", {"--listen", draft_socket, "--exit-layer", "1"}));
  ASSERT_TRUE(draft.ok()) << draft.status();
  s.draft = *std::move(draft);
  auto coordinator =
      ChildProcess::Start(testing::BuiltBinary("services/coordinator/specd-coordinator"),
                          {"--listen", coordinator_socket, "--target", target_socket, "--draft",
                           draft_socket, "--metrics-port", "0"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  s.coordinator = *std::move(coordinator);
  for (const ChildProcess* p : {s.target.get(), s.draft.get(), s.coordinator.get()}) {
    EXPECT_THAT(p->startup_lines(),
                ::testing::Contains(absl::StrCat("metrics on 127.0.0.1:", p->metrics_port())));
    EXPECT_GT(p->metrics_port(), 0);
    EXPECT_THAT(testing::HttpGet(p->metrics_port(), "/metrics").value_or(""), HasSubstr("# TYPE"));
  }
  EXPECT_EQ(s.target->address(), target_socket);
  EXPECT_EQ(s.draft->address(), draft_socket);
  EXPECT_EQ(s.coordinator->address(), coordinator_socket);
  EXPECT_EQ(s.coordinator->startup_lines().back(), "listening on " + coordinator_socket);
  ASSERT_TRUE(s.WaitServing());

  v1::GenerateRequest r = RepeatingRequest(1, 24);
  r.mutable_speculation()->set_num_speculative_tokens(0);
  const Stream plain = s.Generate(r);
  ASSERT_TRUE(plain.status.ok()) << plain.status.error_message();
  r.mutable_speculation()->set_num_speculative_tokens(4);
  r.mutable_speculation()->set_k_policy(v1::K_POLICY_FIXED);
  const Stream speculative = s.Generate(r);
  ASSERT_TRUE(speculative.status.ok()) << speculative.status.error_message();
  EXPECT_EQ(speculative.tokens, plain.tokens);
  EXPECT_EQ(plain.tokens.size(), 24u);
  EXPECT_GT(speculative.last.usage().draft_tokens(), 0u);
  s.ExpectNoBlocksUsed();
}

// A --listen that is neither host:port nor a Unix socket stops each service at start, naming
// the flag.
TEST(ListenFlagTest, EveryServiceRefusesAnAddressWithoutAPort) {
  ScopedTempDir tmp;
  SynthSpec spec;
  spec.config = *ShapePreset("tiny");
  ASSERT_TRUE(WriteSyntheticModel(spec, tmp.path() / "m").ok());
  const std::vector<std::pair<std::filesystem::path, std::vector<std::string>>> runs = {
      {testing::TargetWorkerBinary(),
       testing::WorkerArgs(tmp.path() / "m", {"--listen", "localhost"})},
      {testing::DraftWorkerBinary(),
       testing::WorkerArgs(tmp.path() / "m", {"--listen", "localhost"})},
      {testing::BuiltBinary("services/coordinator/specd-coordinator"),
       {"--listen", "localhost", "--target", "127.0.0.1:1"}}};
  for (const auto& [binary, args] : runs) {
    std::string err;
    const absl::StatusOr<int> rc = ChildProcess::Run(binary, args, &err);
    ASSERT_TRUE(rc.ok()) << rc.status();
    EXPECT_EQ(*rc, 2) << binary;
    EXPECT_THAT(err, HasSubstr("--listen must be host:port (port 0 picks a free one) or "
                               "unix:PATH, got 'localhost'"))
        << binary;
  }
}

TEST(CoordinatorStartupTest, RefusesADraftWithAnotherVocabulary) {
  ScopedTempDir tmp;
  SynthSpec spec;
  spec.config = *ShapePreset("tiny");
  ASSERT_TRUE(WriteSyntheticModel(spec, tmp.path() / "a").ok());
  spec.config.vocab_size = 600;
  ASSERT_TRUE(WriteSyntheticModel(spec, tmp.path() / "b").ok());
  auto target =
      ChildProcess::Start(testing::TargetWorkerBinary(), testing::WorkerArgs(tmp.path() / "a"));
  auto draft =
      ChildProcess::Start(testing::DraftWorkerBinary(), testing::WorkerArgs(tmp.path() / "b"));
  ASSERT_TRUE(target.ok() && draft.ok());
  std::string err;
  absl::StatusOr<int> rc = ChildProcess::Run(
      testing::BuiltBinary("services/coordinator/specd-coordinator"),
      {"--listen", "127.0.0.1:0", "--target", (*target)->address(), "--draft", (*draft)->address()},
      &err);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 1);
  EXPECT_THAT(err, HasSubstr("vocabulary differs"));
}

}  // namespace
}  // namespace specd
