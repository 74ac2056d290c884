// The scheduler over in-process workers: concurrent requests with mixed parameters, stop
// conditions, cancellation (also at random moments among streams of every kind), a full queue,
// and preemption when the KV pools run out.
#include "services/coordinator/scheduler.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/engine/decode_loop.h"
#include "common/synth/synth.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/local_worker.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/services/coordinator/forwarding_worker.h"
#include "tests/services/coordinator/pass_counter.h"
#include "tests/services/coordinator/pause_at.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::GatedWorker;
using ::testing::HasSubstr;
using testing::PassCounter;
using testing::PauseAt;
using testing::ScopedTempDir;

// Collects a request's events; Wait() returns once the last one arrived.
class Collector {
 public:
  Scheduler::EventSink Sink() {
    return [this](GenerationEvent e) {
      std::lock_guard<std::mutex> lock(mu_);
      tokens_.insert(tokens_.end(), e.tokens.begin(), e.tokens.end());
      text_ += e.text;
      if (e.finish != FinishReason::kNone || !e.error.ok()) {
        last_ = std::move(e);
        done_.set_value();
      }
    };
  }
  void Wait() { done_future_.wait(); }
  bool WaitFor(std::chrono::seconds s) {
    return done_future_.wait_for(s) == std::future_status::ready;
  }
  std::vector<int32_t> tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_;
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }
  GenerationEvent last() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

 private:
  std::mutex mu_;
  std::vector<int32_t> tokens_;
  std::string text_;
  GenerationEvent last_;
  std::promise<void> done_;
  std::future<void> done_future_ = done_.get_future();
};

class SchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    SynthSpec spec;
    spec.config = testing::SmallConfig();
    spec.config.vocab_size = 1000;  // a synthetic tokenizer with plenty of letter pieces
    spec.config.num_layers = 3;
    spec.config.max_position_embeddings = 256;
    spec.residual_scale = 0.2;
    spec.seed = 9;
    testing::WriteSynth(spec, dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }

  // `observers` (draft's, target's) watch the workers' runtimes when set.
  void MakeWorkers(int64_t kv_tokens, bool prefix_caching = true,
                   std::array<RuntimeObserver*, 2> observers = {}) {
    for (int role = 0; role < 2; ++role) {
      EngineOptions options;
      options.kv_capacity_tokens = kv_tokens;
      options.kv_block_size = 16;
      options.prefix_caching = prefix_caching;
      LoadOptions load;
      load.exit_layer = role == 0 ? 1 : 0;
      absl::StatusOr<std::unique_ptr<LlamaEngine>> engine =
          CreateCpuEngine(dir_->path(), 1, options, load);
      ASSERT_TRUE(engine.ok()) << engine.status();
      auto worker = std::make_unique<LocalWorker>(std::make_unique<WorkerRuntime>(
          *std::move(engine), WorkerRuntimeOptions{observers[static_cast<size_t>(role)]}));
      (role == 0 ? draft_ : target_) = std::move(worker);
    }
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::LoadFromDir(dir_->path());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
  }

  // `target` and `draft` stand in for the workers when set (e.g. recording wrappers of them).
  std::unique_ptr<Scheduler> MakeScheduler(int64_t max_running = 32, int64_t max_queued = 256,
                                           SchedulerOptions o = {}, WorkerApi* target = nullptr,
                                           WorkerApi* draft = nullptr) {
    o.max_running = max_running;
    o.max_queued = max_queued;
    o.max_seq_len = 256;
    o.eos_token_ids = {2};
    return std::make_unique<Scheduler>(draft != nullptr ? *draft : *draft_,
                                       target != nullptr ? *target : *target_, tokenizer_.get(), o);
  }

  std::vector<int32_t> Solo(const std::vector<int32_t>& prompt, int64_t n) {
    auto engine = testing::MakeEngine(dir_->path(), 1);
    DecodeRequest req;
    req.prompt = prompt;
    req.sampling.temperature = 0.0f;
    req.max_new_tokens = n;
    absl::StatusOr<DecodeResult> out = DecodePlain(*engine, 1, req);
    EXPECT_TRUE(out.ok());
    return out->tokens;
  }

  static GenerationRequest Greedy(std::vector<int32_t> prompt, int64_t n, int32_t k) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0.0f;
    r.max_new_tokens = n;
    r.ignore_eos = true;
    r.num_speculative_tokens = k;
    return r;
  }

  // Runs `reqs` on a scheduler over the workers, all admitted together in its first round (they
  // are submitted behind a GatedWorker, however late this thread runs), and appends each one's
  // tokens to `*out` once every one has finished without error. The scheduler has stopped on
  // return. Call it in ASSERT_NO_FATAL_FAILURE.
  void RunTogether(const std::vector<GenerationRequest>& reqs, int64_t max_running,
                   const SchedulerOptions& o, std::vector<std::vector<int32_t>>* out) {
    std::vector<std::unique_ptr<Collector>> cs;  // outlive the scheduler that calls them
    GatedWorker gate(*target_);
    auto scheduler = MakeScheduler(max_running, 256, o, &gate);
    absl::Cleanup open_gate = [&gate] { gate.Open(); };
    for (const GenerationRequest& r : reqs) {
      cs.push_back(std::make_unique<Collector>());
      ASSERT_TRUE(scheduler->Submit(r, cs.back()->Sink()).ok());
    }
    gate.Open();
    for (auto& c : cs) {
      ASSERT_TRUE(c->WaitFor(std::chrono::seconds(120)));
      ASSERT_TRUE(c->last().error.ok()) << c->last().error;
      out->push_back(c->tokens());
    }
  }

  void ExpectNoBlocksUsed() {
    EXPECT_EQ(target_->runtime().engine().kv().used_blocks(), 0);
    EXPECT_EQ(draft_->runtime().engine().kv().used_blocks(), 0);
  }

  static inline ScopedTempDir* dir_ = nullptr;
  std::unique_ptr<LocalWorker> draft_, target_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(SchedulerTest, ThirtyTwoMixedConcurrentRequestsFinishAndGreedyOnesMatchSolo) {
  MakeWorkers(8192);
  auto scheduler = MakeScheduler(/*max_running=*/8);  // forces queueing and continuous batching
  std::vector<std::unique_ptr<Collector>> out;
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 32; ++i) {
    std::vector<int32_t> prompt = {1};
    for (int j = 0; j < 1 + i % 9; ++j) prompt.push_back(3 + (i * 41 + j * 13) % 290);
    GenerationRequest r = Greedy(prompt, 10 + i % 13, i % 6);
    if (i % 2 == 1) {  // sampled, with assorted transforms
      r.sampling.temperature = 0.6f + 0.1f * static_cast<float>(i % 5);
      r.sampling.top_k = i % 3 == 0 ? 0 : 30;
      r.sampling.top_p = i % 4 == 1 ? 0.9f : 1.0f;
      r.sampling.repetition_penalty = i % 5 == 0 ? 1.1f : 1.0f;
      r.seed = 77 + static_cast<uint64_t>(i);
    }
    reqs.push_back(r);
    out.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(scheduler->Submit(r, out.back()->Sink()).ok());
  }
  for (int i = 0; i < 32; ++i) {
    ASSERT_TRUE(out[i]->WaitFor(std::chrono::seconds(60))) << "request " << i;
    const GenerationEvent last = out[i]->last();
    ASSERT_TRUE(last.error.ok()) << last.error;
    EXPECT_EQ(last.finish, FinishReason::kLength);
    EXPECT_EQ(static_cast<int64_t>(out[i]->tokens().size()), reqs[i].max_new_tokens);
    EXPECT_EQ(last.usage.completion_tokens, reqs[i].max_new_tokens);
    if (i % 2 == 0) {
      EXPECT_EQ(out[i]->tokens(), Solo(reqs[i].prompt, reqs[i].max_new_tokens)) << "request " << i;
    }
  }
  scheduler.reset();
  ExpectNoBlocksUsed();
}

// Every way of drafting (issue 17) through the scheduler, batched together with adaptive K on:
// prompt lookup, EGAG and trees of two shapes give the greedy tokens of plain decoding, sampled
// ones run to the end, the realized K is reported, and every block returns. Also with prompts
// fed 4 tokens per round (chunked prefill), so drafting methods meet prefilling rounds.
// With a pass budget of 24 tokens on both workers, trees, prompt lookup and EGAG chains meet cut
// chunks and deferred rounds, and no pass exceeds it.
struct ChunkAndBudget {
  int64_t prefill_chunk = 0;
  int64_t pass_tokens = 0;  // both workers' budget; 0 = none
};

class DraftingMethodsSchedulerTest : public SchedulerTest,
                                     public ::testing::WithParamInterface<ChunkAndBudget> {};

TEST_P(DraftingMethodsSchedulerTest, EveryDraftingMethodBatchedTogetherMatchesSolo) {
  PassCounter draft_pass, target_pass;
  MakeWorkers(8192, true, {&draft_pass, &target_pass});
  std::vector<std::pair<int32_t, bool>> lengths;  // (realized K, EGAG stopped) per drafting round
  SchedulerOptions o;
  o.egag = {0.5, 0.3, 1};
  o.ngram = {1, 3};
  o.on_draft_length = [&lengths](int32_t k, bool stopped) { lengths.emplace_back(k, stopped); };
  o.prefill_chunk = GetParam().prefill_chunk;
  o.draft_pass_tokens = o.target_pass_tokens = GetParam().pass_tokens;
  // The first eight are admitted together, so that the first passes hold all their prompts.
  GatedWorker gate(*target_);
  auto scheduler = MakeScheduler(/*max_running=*/8, 256, o, &gate);
  absl::Cleanup open_gate = [&gate] { gate.Open(); };
  std::vector<GenerationRequest> reqs;
  std::vector<std::unique_ptr<Collector>> out;
  for (int i = 0; i < 16; ++i) {
    std::vector<int32_t> prompt = {1};
    for (int rep = 0; rep < 3; ++rep) {
      for (int j = 0; j < 2 + i % 3; ++j) prompt.push_back(3 + (i * 41 + j * 13) % 290);
    }
    GenerationRequest r = Greedy(prompt, 20, 4);
    r.adaptive_k = true;
    switch (i % 4) {
      case 0:
        r.draft_method = DraftMethod::kNgram;
        break;
      case 1:
        r.egag = true;
        r.num_speculative_tokens = 6;
        break;
      case 2:
        r.tree = {2, 2};
        break;
      case 3:
        r.tree = {3, 1};
        r.num_speculative_tokens = 3;
        break;
    }
    if (i >= 12) {  // sampled, with a seed
      r.sampling.temperature = 0.9f;
      r.seed = 500 + static_cast<uint64_t>(i);
    }
    reqs.push_back(r);
    out.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(scheduler->Submit(r, out.back()->Sink()).ok());
  }
  gate.Open();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(out[i]->WaitFor(std::chrono::seconds(60))) << "request " << i;
    const GenerationEvent last = out[i]->last();
    ASSERT_TRUE(last.error.ok()) << last.error;
    EXPECT_EQ(static_cast<int64_t>(out[i]->tokens().size()), 20);
    EXPECT_GT(last.usage.draft_tokens, 0) << "request " << i << " never drafted";
    if (i < 12) {
      EXPECT_EQ(out[i]->tokens(), Solo(reqs[i].prompt, 20)) << "request " << i;
    }
  }
  scheduler.reset();
  EXPECT_FALSE(lengths.empty());
  EXPECT_TRUE(std::any_of(lengths.begin(), lengths.end(), [](const auto& l) { return l.second; }))
      << "EGAG never stopped a draft";
  if (GetParam().pass_tokens > 0) {
    EXPECT_LE(draft_pass.largest(), GetParam().pass_tokens);
    EXPECT_LE(target_pass.largest(), GetParam().pass_tokens);
  } else if (GetParam().prefill_chunk == 0) {
    EXPECT_GT(target_pass.largest(), 3 * 24);  // what a budget of 24 has to cut
  }
  ExpectNoBlocksUsed();
}

INSTANTIATE_TEST_SUITE_P(PrefillChunk, DraftingMethodsSchedulerTest,
                         ::testing::Values(ChunkAndBudget{0, 0}, ChunkAndBudget{4, 0},
                                           ChunkAndBudget{0, 24}),
                         [](const auto& info) {
                           return absl::StrCat("chunk", info.param.prefill_chunk, "_budget",
                                               info.param.pass_tokens);
                         });

// A prediction (OpenAI's predicted outputs) only changes what is drafted: the output is plain
// decoding's whatever it predicts, a perfect one has every draft accepted, and an edited one is
// followed again after the edit.
TEST_F(SchedulerTest, PredictionsDraftButNeverChangeTheOutput) {
  MakeWorkers(8192);
  SchedulerOptions o;
  o.ngram = {1, 3};
  auto scheduler = MakeScheduler(8, 256, o);
  const std::vector<int32_t> prompt = {1, 40, 77, 12, 200};
  constexpr int64_t kTokens = 48;
  const std::vector<int32_t> plain = Solo(prompt, kTokens);
  std::vector<int32_t> edited = plain;
  edited[10] = (edited[10] + 1) % 300;                     // a replaced token
  edited.insert(edited.begin() + 30, {250, 251});          // an insertion
  edited.erase(edited.begin() + 40, edited.begin() + 42);  // a deletion
  std::vector<int32_t> unrelated;
  for (int i = 0; i < kTokens; ++i) unrelated.push_back(3 + (i * 37) % 290);
  std::vector<int32_t> twice = plain;
  twice.insert(twice.end(), plain.begin(), plain.end());
  struct Case {
    const char* name;
    std::vector<int32_t> prediction;
  };
  for (const Case& c : {Case{"perfect", plain}, Case{"edited", edited},
                        Case{"unrelated", unrelated}, Case{"twice", twice}}) {
    SCOPED_TRACE(c.name);
    for (const int32_t k : {2, 5}) {
      GenerationRequest r = Greedy(prompt, kTokens, k);
      r.draft_method = DraftMethod::kNgram;
      r.prediction = c.prediction;
      Collector out;
      ASSERT_TRUE(scheduler->Submit(r, out.Sink()).ok());
      ASSERT_TRUE(out.WaitFor(std::chrono::seconds(60)));
      const GenerationEvent last = out.last();
      ASSERT_TRUE(last.error.ok()) << last.error;
      EXPECT_EQ(out.tokens(), plain) << "K = " << k;
      EXPECT_TRUE(last.usage.predicted);
      const std::string what = c.name;
      if (what == "perfect" || what == "twice") {
        EXPECT_EQ(last.usage.accepted_tokens, last.usage.draft_tokens) << "K = " << k;
        // Each round commits K + 1 tokens; the first one also prefills.
        EXPECT_LE(last.usage.rounds, 1 + (kTokens + k) / (k + 1)) << "K = " << k;
      } else if (what == "edited") {
        // Three edits cost a few rounds (a dozen tokens at most); after each, the lookup finds
        // its place again and the rest is accepted as from a perfect prediction.
        std::printf("edited prediction, K = %d: %lld of %lld drafts accepted\n", k,
                    static_cast<long long>(last.usage.accepted_tokens),
                    static_cast<long long>(last.usage.draft_tokens));
        EXPECT_GE(last.usage.accepted_tokens, (kTokens - 12) * k / (k + 1)) << "K = " << k;
      }
    }
  }
  ExpectNoBlocksUsed();
}

TEST_F(SchedulerTest, StopStringEndsExactlyAtTheStringAndTrimsIt) {
  MakeWorkers(4096);
  auto scheduler = MakeScheduler();
  // A random model also emits byte tokens that decode to U+FFFD; look for a prompt whose text has
  // a run of plain letters in its second half to use as the stop string.
  for (int32_t seed_token = 40; seed_token < 80; ++seed_token) {
    const std::vector<int32_t> prompt = {1, seed_token, 50};
    Collector free_run;
    ASSERT_TRUE(scheduler->Submit(Greedy(prompt, 40, 3), free_run.Sink()).ok());
    free_run.Wait();
    const std::string full = free_run.text();
    size_t at = std::string::npos;
    for (size_t i = full.size() / 3; i + 4 <= full.size(); ++i) {
      if (std::all_of(full.begin() + i, full.begin() + i + 4,
                      [](char ch) { return ch >= 'a' && ch <= 'z'; })) {
        at = i;
        break;
      }
    }
    if (at == std::string::npos) continue;
    const std::string stop = full.substr(at, 4);
    GenerationRequest r = Greedy(prompt, 40, 3);
    r.stop_strings = {"never-occurs-here", stop};
    Collector stopped;
    ASSERT_TRUE(scheduler->Submit(r, stopped.Sink()).ok());
    stopped.Wait();
    EXPECT_EQ(stopped.last().finish, FinishReason::kStopString);
    EXPECT_EQ(stopped.text(), full.substr(0, full.find(stop)));
    EXPECT_LT(stopped.tokens().size(), free_run.tokens().size());
    scheduler.reset();
    ExpectNoBlocksUsed();
    return;
  }
  FAIL() << "no prompt produced a usable stop string";
}

TEST_F(SchedulerTest, StopTokenAndEos) {
  MakeWorkers(4096);
  auto scheduler = MakeScheduler();
  const std::vector<int32_t> prompt = {1, 60};
  const std::vector<int32_t> solo = Solo(prompt, 30);
  GenerationRequest r = Greedy(prompt, 30, 4);
  r.stop_token_ids = {solo[7]};
  const size_t first = std::find(solo.begin(), solo.end(), solo[7]) - solo.begin();
  Collector c;
  ASSERT_TRUE(scheduler->Submit(r, c.Sink()).ok());
  c.Wait();
  EXPECT_EQ(c.last().finish, FinishReason::kStopToken);
  EXPECT_EQ(c.tokens(), std::vector<int32_t>(solo.begin(), solo.begin() + first + 1));

  // Many stop ids, ascending as BuildGenerationRequest leaves them: every id the solo run never
  // produces, and solo[7] among them.
  GenerationRequest many = Greedy(prompt, 30, 4);
  for (int32_t id = 0; id < 512; ++id) {
    if (id == solo[7] || std::find(solo.begin(), solo.end(), id) == solo.end()) {
      many.stop_token_ids.push_back(id);
    }
  }
  Collector c2;
  ASSERT_TRUE(scheduler->Submit(many, c2.Sink()).ok());
  c2.Wait();
  EXPECT_EQ(c2.last().finish, FinishReason::kStopToken);
  EXPECT_EQ(c2.tokens(), std::vector<int32_t>(solo.begin(), solo.begin() + first + 1));
  scheduler.reset();
  ExpectNoBlocksUsed();
}

// Short requests draft only what they can use, and usage counts only emitted drafts: every
// round emits its accepted drafts plus one token, so accepted + rounds == completion tokens.
TEST_F(SchedulerTest, ShortRequestsDraftOnlyWhatTheyCanUseAndCountOnlyEmittedTokens) {
  MakeWorkers(8192);
  auto scheduler = MakeScheduler();
  std::vector<GenerationRequest> reqs;
  std::vector<std::unique_ptr<Collector>> out;
  for (int i = 0; i < 36; ++i) {
    GenerationRequest r = Greedy({1, static_cast<int32_t>(5 + 7 * i % 200)}, 1 + i % 6, 4);
    if (i % 2 == 1) {
      r.sampling.temperature = 0.9f;
      r.seed = 500 + static_cast<uint64_t>(i);
    }
    reqs.push_back(r);
    out.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(scheduler->Submit(r, out.back()->Sink()).ok());
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(out[i]->WaitFor(std::chrono::seconds(60)));
    const GenerationUsage u = out[i]->last().usage;
    ASSERT_EQ(u.completion_tokens, reqs[i].max_new_tokens);
    EXPECT_EQ(u.accepted_tokens + u.rounds, u.completion_tokens);
    if (reqs[i].max_new_tokens == 1) {
      EXPECT_EQ(u.draft_tokens, 0);
    }
    // A round drafts at most one fewer than the tokens still needed, and the first needs them all.
    EXPECT_LE(u.draft_tokens, u.rounds * (reqs[i].max_new_tokens - 1));
    EXPECT_LE(u.accepted_tokens, u.draft_tokens);
  }
  // A stop token inside a round drops the drafts after it from the accepted count.
  const std::vector<int32_t> prompt = {1, 60};
  const std::vector<int32_t> solo = Solo(prompt, 30);
  for (int stop_at = 0; stop_at < 12; ++stop_at) {
    GenerationRequest r = Greedy(prompt, 30, 4);
    r.stop_token_ids = {solo[static_cast<size_t>(stop_at)]};
    Collector c;
    ASSERT_TRUE(scheduler->Submit(r, c.Sink()).ok());
    c.Wait();
    const GenerationUsage u = c.last().usage;
    EXPECT_LE(u.accepted_tokens, u.completion_tokens) << stop_at;
    EXPECT_LE(u.accepted_tokens + u.rounds, u.completion_tokens + 1) << stop_at;
  }
  scheduler.reset();
  ExpectNoBlocksUsed();
}

TEST_F(SchedulerTest, CancelFreesTheSequenceWithinARound) {
  MakeWorkers(4096);
  auto scheduler = MakeScheduler();
  Collector c;
  PauseAt first_event(1);
  absl::StatusOr<Scheduler::RequestHandle> h =
      scheduler->Submit(Greedy({1, 5, 6}, 200, 2), first_event.Wrap(c.Sink()));
  ASSERT_TRUE(h.ok());
  first_event.WaitUntilReached();
  scheduler->Cancel(*h);
  first_event.Release();
  ASSERT_TRUE(c.WaitFor(std::chrono::seconds(10)));
  EXPECT_EQ(c.last().error.code(), absl::StatusCode::kCancelled);
  EXPECT_LT(c.tokens().size(), 200u);
  scheduler.reset();
  ExpectNoBlocksUsed();
}

TEST_F(SchedulerTest, FullQueueIsResourceExhausted) {
  MakeWorkers(4096);
  auto scheduler = MakeScheduler(/*max_running=*/1, /*max_queued=*/2);
  std::vector<std::unique_ptr<Collector>> cs;
  int rejected = 0;
  for (int i = 0; i < 8; ++i) {
    cs.push_back(std::make_unique<Collector>());
    absl::StatusOr<Scheduler::RequestHandle> h =
        scheduler->Submit(Greedy({1, 9}, 50, 1), cs.back()->Sink());
    if (!h.ok()) {
      EXPECT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted);
      EXPECT_THAT(h.status().message(), HasSubstr("queue is full"));
      ++rejected;
      cs.pop_back();
    }
  }
  EXPECT_GT(rejected, 0);
  for (auto& c : cs) c->Wait();
  scheduler.reset();
  ExpectNoBlocksUsed();
}

TEST_F(SchedulerTest, AdmissionWaitsForKvInsteadOfThrashing) {
  // Pools of 4 blocks (64 tokens). Each request grows to 30 tokens (2 blocks), so two run at a
  // time; admitting all eight at once would run out of KV in the first round and preempt.
  MakeWorkers(64);
  auto scheduler = MakeScheduler(/*max_running=*/8);
  std::vector<std::unique_ptr<Collector>> cs;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> prompt(20, 0);
    for (int j = 0; j < 20; ++j) prompt[j] = 3 + (i * 11 + j * 7) % 290;
    cs.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(scheduler->Submit(Greedy(prompt, 10, 2), cs.back()->Sink()).ok());
  }
  for (auto& c : cs) {
    ASSERT_TRUE(c->WaitFor(std::chrono::seconds(60)));
    EXPECT_TRUE(c->last().error.ok()) << c->last().error;
    EXPECT_EQ(c->tokens().size(), 10u);
  }
  EXPECT_EQ(scheduler->preemptions(), 0);
  scheduler.reset();
  ExpectNoBlocksUsed();
}

// Adaptive K changes K from round to round (here: the controller is made to decide after one
// round and to probe K = 0 at once); greedy output must be plain decoding's all the same, and a
// FIXED request is never touched.
TEST_F(SchedulerTest, AdaptiveKChangesKButNotGreedyOutput) {
  MakeWorkers(8192);
  SchedulerOptions o;
  o.adaptive_k.min_steady_rounds = 1;
  o.adaptive_k.min_alpha_attempts = 1;
  o.adaptive_k.probe_interval = 1;
  o.adaptive_k.explore_interval = 2;
  std::mutex mu;
  std::set<int32_t> chosen;
  o.on_k_choice = [&](const KChoice& c, double) {
    std::lock_guard<std::mutex> lock(mu);
    chosen.insert(c.k);
  };
  auto scheduler = MakeScheduler(32, 256, o);
  std::vector<std::unique_ptr<Collector>> cs;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back({1, 20 + i, 40 + 3 * i});
    GenerationRequest r = Greedy(prompts.back(), 48, 4);
    r.adaptive_k = true;
    cs.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(scheduler->Submit(r, cs.back()->Sink()).ok());
  }
  GenerationRequest fixed = Greedy({1, 99, 7}, 48, 3);
  Collector fixed_c;
  ASSERT_TRUE(scheduler->Submit(fixed, fixed_c.Sink()).ok());
  for (size_t i = 0; i < cs.size(); ++i) {
    ASSERT_TRUE(cs[i]->WaitFor(std::chrono::seconds(120)));
    ASSERT_TRUE(cs[i]->last().error.ok()) << cs[i]->last().error;
    EXPECT_EQ(cs[i]->tokens(), Solo(prompts[i], 48)) << "request " << i;
  }
  ASSERT_TRUE(fixed_c.WaitFor(std::chrono::seconds(120)));
  EXPECT_EQ(fixed_c.tokens(), Solo({1, 99, 7}, 48));
  // Every round of the FIXED request drafted 3 tokens (the last may shrink near the end).
  const GenerationUsage u = fixed_c.last().usage;
  EXPECT_GE(u.draft_tokens, 3 * (u.rounds - 1));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_GE(chosen.size(), 2u) << "the controller never changed K";
  }
  scheduler.reset();
  ExpectNoBlocksUsed();
}

TEST_F(SchedulerTest, SmallKvPoolPreemptsAndOutputsAreUnchanged) {
  // Each request needs about 5 blocks of 16 tokens (prompt 10 + 60 new); the pools hold 16.
  MakeWorkers(16 * 16);
  auto scheduler = MakeScheduler(/*max_running=*/12);
  std::vector<std::unique_ptr<Collector>> cs;
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> prompt = {1};
    for (int j = 0; j < 9; ++j) prompt.push_back(3 + (i * 7 + j * 29) % 290);
    GenerationRequest r = Greedy(prompt, 60, 1 + i % 4);
    if (i % 3 == 0) {
      r.sampling.temperature = 0.9f;
      r.seed = 5 + static_cast<uint64_t>(i);
    }
    reqs.push_back(r);
    cs.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(scheduler->Submit(r, cs.back()->Sink()).ok());
  }
  std::vector<std::vector<int32_t>> small_pool;
  for (auto& c : cs) {
    ASSERT_TRUE(c->WaitFor(std::chrono::seconds(120)));
    ASSERT_TRUE(c->last().error.ok()) << c->last().error;
    small_pool.push_back(c->tokens());
  }
  EXPECT_GT(scheduler->preemptions(), 0);
  scheduler.reset();
  ExpectNoBlocksUsed();

  // The same requests with ample KV, one at a time.
  MakeWorkers(8192);
  auto ample = MakeScheduler(1);
  for (size_t i = 0; i < reqs.size(); ++i) {
    Collector c;
    ASSERT_TRUE(ample->Submit(reqs[i], c.Sink()).ok());
    c.Wait();
    EXPECT_EQ(c.tokens(), small_pool[i]) << "request " << i;
  }
}

// The target worker with a log of its Verify calls: one per round. Each call records, per
// sequence, whether it only prefilled and how many drafts it judged; a request's sink records the
// round it was called after.
class RecordingTarget final : public testing::ForwardingWorker {
 public:
  struct Entry {
    bool ok = false;
    bool prefilling = false;
    int64_t drafts = 0;
  };

  explicit RecordingTarget(WorkerApi& inner) : ForwardingWorker(inner) {}

  absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest> batch) override {
    absl::StatusOr<std::vector<VerifySequenceResult>> out = inner_.Verify(batch);
    std::lock_guard<std::mutex> lock(mu_);
    std::map<SeqId, Entry>& call = calls_.emplace_back();
    if (out.ok()) {
      for (const VerifySequenceResult& r : *out) {
        call[r.seq].ok = r.status.ok();
        call[r.seq].prefilling = r.prefilling;
      }
    }
    for (const VerifySequenceRequest& r : batch) {
      call[r.seq].drafts = static_cast<int64_t>(r.drafts.size());
    }
    return out;
  }

  // Verify calls so far, i.e. the index of the round now running or just finished.
  int64_t rounds() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(calls_.size());
  }
  std::vector<std::map<SeqId, Entry>> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  std::mutex mu_;
  std::vector<std::map<SeqId, Entry>> calls_;
};

// Chunked prefill, asserted by structure: while a long prompt is fed one chunk per round, a
// stream that is already running gets tokens in every one of those rounds. Without chunking the
// prompt takes one round. The outputs are the same either way.
TEST_F(SchedulerTest, ALongPromptIsFedOneChunkPerRoundWhileARunningStreamDecodes) {
  const std::vector<int32_t> running_prompt = {1, 77, 78, 79};
  std::vector<int32_t> long_prompt = {1};
  for (int j = 0; j < 149; ++j) long_prompt.push_back(3 + (j * 37) % 290);
  const std::vector<int32_t> running_solo = Solo(running_prompt, 120);
  const std::vector<int32_t> long_solo = Solo(long_prompt, 4);
  for (const int64_t chunk : {int64_t{16}, int64_t{0}}) {
    SCOPED_TRACE(::testing::Message() << "prefill_chunk " << chunk);
    MakeWorkers(8192);
    RecordingTarget target(*target_);
    SchedulerOptions o;
    o.prefill_chunk = chunk;
    auto scheduler = MakeScheduler(32, 256, o, &target);
    // The running stream: each of its events is stamped with the round that produced it.
    std::mutex mu;
    std::map<int64_t, int64_t> tokens_in_round;
    Collector running;
    Scheduler::EventSink inner = running.Sink();
    // The long prompt joins after the running stream's third round, while it still has most of
    // its tokens to go.
    PauseAt third_event(3);
    ASSERT_TRUE(
        scheduler
            ->Submit(Greedy(running_prompt, 120, 2), third_event.Wrap([&](GenerationEvent e) {
              {
                std::lock_guard<std::mutex> lock(mu);
                tokens_in_round[target.rounds() - 1] += static_cast<int64_t>(e.tokens.size());
              }
              inner(std::move(e));
            }))
            .ok());
    third_event.WaitUntilReached();
    Collector long_one;
    ASSERT_TRUE(scheduler->Submit(Greedy(long_prompt, 4, 2), long_one.Sink()).ok());
    third_event.Release();
    ASSERT_TRUE(long_one.WaitFor(std::chrono::seconds(60)));
    ASSERT_TRUE(running.WaitFor(std::chrono::seconds(60)));
    EXPECT_EQ(long_one.tokens(), long_solo);
    EXPECT_EQ(running.tokens(), running_solo);

    // The rounds in which the long prompt appeared: prefilling ones, then the ones that decode.
    const std::vector<std::map<SeqId, RecordingTarget::Entry>> calls = target.calls();
    const SeqId long_seq = 2;  // handles count from 1 in submission order
    std::vector<int64_t> prefill_rounds;
    int64_t first_decode = -1;
    for (size_t r = 0; r < calls.size(); ++r) {
      const auto it = calls[r].find(long_seq);
      if (it == calls[r].end()) continue;
      ASSERT_TRUE(it->second.ok) << "round " << r;
      if (it->second.prefilling) {
        EXPECT_EQ(first_decode, -1) << "prefilled again after decoding began";
        prefill_rounds.push_back(static_cast<int64_t>(r));
      } else if (first_decode < 0) {
        first_decode = static_cast<int64_t>(r);
      }
    }
    if (chunk == 0) {
      EXPECT_TRUE(prefill_rounds.empty());
      continue;
    }
    // 150 tokens in chunks of 16: nine rounds feed 144, and the tenth the last 6 and decodes.
    ASSERT_EQ(prefill_rounds.size(), 9u);
    for (size_t i = 0; i < prefill_rounds.size(); ++i) {
      const int64_t r = prefill_rounds[i];
      EXPECT_EQ(r, prefill_rounds[0] + static_cast<int64_t>(i)) << "one chunk per round";
      // The running stream was verified in that same round and streamed its tokens.
      const auto it = calls[static_cast<size_t>(r)].find(1);
      ASSERT_NE(it, calls[static_cast<size_t>(r)].end()) << "round " << r;
      EXPECT_TRUE(it->second.ok && !it->second.prefilling) << "round " << r;
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_GE(tokens_in_round[r], 1) << "the running stream got nothing in round " << r;
    }
    EXPECT_EQ(first_decode, prefill_rounds.back() + 1);
    scheduler.reset();
    ExpectNoBlocksUsed();
  }
}

// The draft worker with a log of its Draft calls. Each records, per sequence, the catch-up sent
// and whether the worker only read a chunk of it, and the round: the target's Verify calls so far.
class RecordingDraft final : public testing::ForwardingWorker {
 public:
  struct Entry {
    int64_t round = 0;
    int64_t catch_up = 0;
    bool prefilling = false;
  };

  RecordingDraft(WorkerApi& inner, RecordingTarget& target)
      : ForwardingWorker(inner), target_(target) {}

  absl::StatusOr<std::vector<SequenceOutcome>> Draft(
      std::span<const DraftSequenceRequest> batch,
      const std::function<void(const DraftStep&)>& on_step) override {
    const int64_t round = target_.rounds();
    absl::StatusOr<std::vector<SequenceOutcome>> out = inner_.Draft(batch, on_step);
    std::lock_guard<std::mutex> lock(mu_);
    std::map<SeqId, Entry>& call = calls_.emplace_back();
    for (const DraftSequenceRequest& r : batch) {
      call[r.seq] = {round, static_cast<int64_t>(r.catch_up.size()), false};
    }
    if (out.ok()) {
      for (const SequenceOutcome& o : *out) call[o.seq].prefilling = o.prefilling;
    }
    return out;
  }

  // The calls that included `seq`, in order.
  std::vector<Entry> CallsOf(SeqId seq) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Entry> out;
    for (const std::map<SeqId, Entry>& call : calls_) {
      if (const auto it = call.find(seq); it != call.end()) out.push_back(it->second);
    }
    return out;
  }

 private:
  RecordingTarget& target_;
  std::mutex mu_;
  std::vector<std::map<SeqId, Entry>> calls_;
};

// The first token is the target's alone, as in plain decoding: its round judges no drafts, while
// the draft reads the prompt (a long one a chunk per round, beside the target). The next round's
// draft catch-up is two tokens (the prompt's last and the first token) and the stream speculates
// from then on without a round that only prefills. The output is plain decoding's.
TEST_F(SchedulerTest, TheFirstTokenComesFromTheTargetAloneWhileTheDraftReadsThePrompt) {
  std::vector<int32_t> long_prompt = {1};
  for (int j = 0; j < 149; ++j) long_prompt.push_back(3 + (j * 37) % 290);
  struct Case {
    std::vector<int32_t> prompt;
    int64_t chunk;
    int64_t prefill_rounds;  // rounds before the first token
  };
  // 150 tokens in chunks of 16: nine rounds feed 144, the tenth the rest and draws.
  for (const Case& c : {Case{{1, 40, 41, 42, 43, 44}, 0, 0}, Case{long_prompt, 16, 9}}) {
    SCOPED_TRACE(::testing::Message() << c.prompt.size() << "-token prompt, chunk " << c.chunk);
    MakeWorkers(8192);
    RecordingTarget target(*target_);
    RecordingDraft draft(*draft_, target);
    SchedulerOptions o;
    o.prefill_chunk = c.chunk;
    auto scheduler = MakeScheduler(32, 256, o, &target, &draft);
    std::mutex mu;
    std::vector<size_t> event_sizes;
    Collector out;
    Scheduler::EventSink inner = out.Sink();
    ASSERT_TRUE(scheduler
                    ->Submit(Greedy(c.prompt, 16, 4),
                             [&](GenerationEvent e) {
                               if (!e.tokens.empty()) {
                                 std::lock_guard<std::mutex> lock(mu);
                                 event_sizes.push_back(e.tokens.size());
                               }
                               inner(std::move(e));
                             })
                    .ok());
    ASSERT_TRUE(out.WaitFor(std::chrono::seconds(60)));
    EXPECT_EQ(out.tokens(), Solo(c.prompt, 16));
    scheduler.reset();
    ASSERT_FALSE(event_sizes.empty());
    EXPECT_EQ(event_sizes[0], 1u);

    const SeqId seq = 1;
    const std::vector<std::map<SeqId, RecordingTarget::Entry>> calls = target.calls();
    const auto first = static_cast<size_t>(c.prefill_rounds);
    ASSERT_GT(calls.size(), first + 1);
    for (size_t r = 0; r < calls.size(); ++r) {
      ASSERT_TRUE(calls[r].contains(seq)) << "round " << r;
      const RecordingTarget::Entry& e = calls[r].at(seq);
      ASSERT_TRUE(e.ok) << "round " << r;
      EXPECT_EQ(e.prefilling, r < first) << "round " << r;
      if (r == first) {
        EXPECT_EQ(e.drafts, 0) << "the first token's round judged drafts";
      }
    }
    EXPECT_EQ(calls[first + 1].at(seq).drafts, 4) << "the next round speculates";
    const std::vector<RecordingDraft::Entry> drafts = draft.CallsOf(seq);
    ASSERT_EQ(drafts.size(), calls.size() - (calls.back().at(seq).drafts == 0 ? 1 : 0))
        << "a draft call every round but a last one without drafts";
    for (size_t r = 0; r <= first; ++r) {
      EXPECT_EQ(drafts[r].round, static_cast<int64_t>(r));
      EXPECT_TRUE(drafts[r].prefilling) << "the draft drafted before the first token";
    }
    EXPECT_EQ(drafts[first + 1].catch_up, 2);
    EXPECT_FALSE(drafts[first + 1].prefilling);
    ExpectNoBlocksUsed();
  }
}

// A target whose passes run out of device memory whenever they hold more than two sequences (as
// a scratch allocation the device cannot make): the whole batch is preempted each time. The
// scheduler backs off to batches that fit instead of re-admitting the same batch into the same
// failing pass forever, and every output is still plain decoding's.
class TwoPerPassTarget final : public testing::ForwardingWorker {
 public:
  explicit TwoPerPassTarget(WorkerApi& inner) : ForwardingWorker(inner) {}
  absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest> batch) override {
    if (batch.size() > 2) {
      return absl::ResourceExhaustedError("out of device memory growing the activations");
    }
    return inner_.Verify(batch);
  }
};

// A target none of whose passes fit.
class NoPassTarget final : public testing::ForwardingWorker {
 public:
  explicit NoPassTarget(WorkerApi& inner) : ForwardingWorker(inner) {}
  absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest>) override {
    return absl::ResourceExhaustedError("out of device memory growing the logits");
  }
};

TEST_F(SchedulerTest, APassThatRunsOutOfMemoryBacksOffInsteadOfLoopingOnTheSameBatch) {
  MakeWorkers(8192);
  TwoPerPassTarget target(*target_);
  auto scheduler = MakeScheduler(8, 256, {}, &target);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::unique_ptr<Collector>> cs;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back({1, 20 + i, 40 + 2 * i, 7});
    cs.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(scheduler->Submit(Greedy(prompts.back(), 12, 2), cs.back()->Sink()).ok());
  }
  for (size_t i = 0; i < cs.size(); ++i) {
    ASSERT_TRUE(cs[i]->WaitFor(std::chrono::seconds(60))) << "request " << i;
    ASSERT_TRUE(cs[i]->last().error.ok()) << cs[i]->last().error;
    EXPECT_EQ(cs[i]->tokens(), Solo(prompts[i], 12)) << "request " << i;
  }
  EXPECT_GT(scheduler->preemptions(), 0);
  scheduler.reset();
  ExpectNoBlocksUsed();

  // Alone and still out of memory, a request fails, with the worker's reason.
  MakeWorkers(8192);
  NoPassTarget never(*target_);
  scheduler = MakeScheduler(8, 256, {}, &never);
  Collector c;
  ASSERT_TRUE(scheduler->Submit(Greedy(prompts[0], 12, 2), c.Sink()).ok());
  ASSERT_TRUE(c.WaitFor(std::chrono::seconds(60)));
  EXPECT_EQ(c.last().error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(c.last().error.message()),
              HasSubstr("does not fit in the workers' memory even alone (out of device memory "
                        "growing the logits)"));
  scheduler.reset();
  ExpectNoBlocksUsed();
}

// A full pool of cached prefixes is free room: new requests evict them and nothing is preempted.
TEST_F(SchedulerTest, KvExhaustionEvictsCachedBlocksBeforePreempting) {
  MakeWorkers(16 * 16);  // 16 blocks
  auto scheduler = MakeScheduler();
  std::vector<int32_t> first = {1};
  for (int j = 0; j < 150; ++j) first.push_back(3 + (j * 13) % 290);
  Collector c;
  ASSERT_TRUE(scheduler->Submit(Greedy(first, 40, 2), c.Sink()).ok());
  c.Wait();
  // 190 tokens: 11 full blocks stay cached after the request ends.
  for (LocalWorker* w : {target_.get(), draft_.get()}) {
    EXPECT_EQ(w->runtime().engine().kv().evictable_blocks(), 11);
    EXPECT_EQ(w->runtime().engine().kv().used_blocks(), 0);
    EXPECT_EQ(w->FreeKvTokens(), 16 * 16);  // admission counts them as free
  }
  // Two requests of 100 tokens each need 14 blocks: only 5 are on the free list.
  std::vector<std::unique_ptr<Collector>> cs;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 2; ++i) {
    std::vector<int32_t> p = {1};
    for (int j = 0; j < 79; ++j) p.push_back(3 + (i * 101 + j * 7) % 290);
    prompts.push_back(p);
    cs.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(scheduler->Submit(Greedy(p, 20, 2), cs.back()->Sink()).ok());
  }
  for (size_t i = 0; i < cs.size(); ++i) {
    ASSERT_TRUE(cs[i]->WaitFor(std::chrono::seconds(60)));
    ASSERT_TRUE(cs[i]->last().error.ok()) << cs[i]->last().error;
    EXPECT_EQ(cs[i]->tokens(), Solo(prompts[i], 20));
  }
  EXPECT_EQ(scheduler->preemptions(), 0);
  EXPECT_LT(target_->runtime().engine().kv().evictable_blocks(), 11 + 2 * 6);
  scheduler.reset();
  ExpectNoBlocksUsed();
}

// Many requests sharing a long prompt prefix, greedy and seeded-sampled, under every combination
// of prefix caching and chunked prefill: the same tokens every time (and plain decoding's, for
// the greedy ones).
TEST_F(SchedulerTest, OutputsAreTheSameWithCachingAndChunkingOnAndOff) {
  std::vector<int32_t> system = {1};
  for (int j = 0; j < 70; ++j) system.push_back(3 + (j * 53) % 290);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> p = system;
    p.resize(system.size() - static_cast<size_t>(i % 3) * 20);  // prefixes of several lengths
    for (int j = 0; j < 1 + i % 5; ++j) p.push_back(3 + (i * 31 + j * 11) % 290);
    GenerationRequest r = Greedy(p, 24, i % 4);
    if (i % 2 == 1) {
      r.sampling.temperature = 0.9f;
      r.sampling.top_k = 50;
      r.seed = 300 + static_cast<uint64_t>(i);
    }
    reqs.push_back(r);
  }
  std::map<std::string, std::vector<std::vector<int32_t>>> outputs;
  for (const bool caching : {true, false}) {
    for (const int64_t chunk : {int64_t{16}, int64_t{0}}) {
      const std::string name = absl::StrCat("caching ", caching, " chunk ", chunk);
      MakeWorkers(8192, caching);
      SchedulerOptions o;
      o.prefill_chunk = chunk;
      o.prefix_sharing = true;  // as the coordinator's flag is by default
      o.prefix_block_size = caching ? 16 : 0;
      o.prefix_pool_blocks = 8192 / 16;
      auto scheduler = MakeScheduler(8, 256, o);
      // Two waves, so the second finds the first's prefixes cached.
      for (int wave = 0; wave < 2; ++wave) {
        std::vector<std::unique_ptr<Collector>> cs;
        for (const GenerationRequest& r : reqs) {
          cs.push_back(std::make_unique<Collector>());
          ASSERT_TRUE(scheduler->Submit(r, cs.back()->Sink()).ok());
        }
        for (auto& c : cs) {
          ASSERT_TRUE(c->WaitFor(std::chrono::seconds(120))) << name;
          ASSERT_TRUE(c->last().error.ok()) << name << ": " << c->last().error;
          outputs[absl::StrCat(name, " wave ", wave)].push_back(c->tokens());
        }
      }
      if (caching) {
        EXPECT_GT(target_->runtime().engine().kv().cached_blocks(), 0) << name;
      }
      scheduler.reset();
      ExpectNoBlocksUsed();
    }
  }
  const std::vector<std::vector<int32_t>>& reference = outputs.begin()->second;
  for (size_t i = 0; i < reqs.size(); i += 2) {
    EXPECT_EQ(reference[i], Solo(reqs[i].prompt, 24)) << "request " << i;
  }
  for (const auto& [name, got] : outputs) {
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i], reference[i]) << name << " " << i;
  }
}

// n completions of one 100-token prompt and a greedy request for it arrive together, with a
// prefill chunk of 16 so that the prompt takes rounds. With in-batch prefix sharing the first
// computes the prompt and the others wait until fewer than 32 shared tokens are left to compute
// (not worth another round), then take its 80 cached tokens on both workers; without it each
// computes its own copy in the same rounds. The outputs are the same either way, the greedy one
// plain decoding's.
TEST_F(SchedulerTest, CompletionsOfOnePromptComputeItOnce) {
  std::vector<int32_t> prompt = {1};
  for (int j = 1; j < 100; ++j) prompt.push_back(3 + (j * 37) % 290);
  std::vector<GenerationRequest> reqs;
  for (uint32_t sample = 0; sample < 4; ++sample) {
    GenerationRequest r = Greedy(prompt, 16, 4);
    r.sampling.temperature = 0.9f;
    r.seed = 7;
    r.sample = sample;
    reqs.push_back(r);
  }
  reqs.push_back(Greedy(prompt, 16, 2));
  std::map<bool, std::vector<std::vector<int32_t>>> outputs;
  std::map<bool, int64_t> target_forwarded;
  for (const bool sharing : {true, false}) {
    PassCounter draft_counts;
    PassCounter target_counts;
    MakeWorkers(8192, /*prefix_caching=*/true, {&draft_counts, &target_counts});
    SchedulerOptions o;
    o.prefill_chunk = 16;
    o.prefix_sharing = sharing;
    o.prefix_block_size = 16;
    o.prefix_pool_blocks = 8192 / 16;
    int64_t waits = 0;
    o.on_prefix_wait = [&waits](int64_t sequences) { waits += sequences; };
    // All five arrive in the same round, with nothing of the prompt cached yet.
    ASSERT_NO_FATAL_FAILURE(RunTogether(reqs, 8, o, &outputs[sharing]));
    ExpectNoBlocksUsed();
    target_forwarded[sharing] = target_counts.forwarded();
    if (sharing) {
      EXPECT_GT(waits, 0);
      // Whichever came first, the other four took at least 80 cached tokens on each worker.
      EXPECT_GE(target_counts.hit(), 4 * 80);
      EXPECT_GE(draft_counts.hit(), 4 * 80);
    } else {
      EXPECT_EQ(waits, 0);
    }
  }
  EXPECT_LT(target_forwarded[true] + 3 * 80, target_forwarded[false])
      << "sharing saves at least 80 prompt tokens for each of the four that waited";
  EXPECT_EQ(outputs[true], outputs[false]);
  EXPECT_EQ(outputs[true].back(), Solo(prompt, 16));
}

// Ten prompts of 60 to 150 tokens arrive together. Without a pass budget their prefill chunks
// meet in passes of hundreds of tokens; with the workers' budget of 96, no Draft or Verify pass
// takes more, on either worker, and every output (greedy and seeded-sampled, K of 0, 2 and 4) is
// the same, the greedy ones plain decoding's.
TEST_F(SchedulerTest, EveryForwardPassStaysWithinThePassBudgetAndOutputsAreUnchanged) {
  constexpr int64_t kBudget = 96;
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> p = {1};
    for (int j = 0; j < 59 + i * 10; ++j) p.push_back(3 + (i * 41 + j * 17) % 290);
    GenerationRequest r = Greedy(p, 20, (i % 3) * 2);
    if (i % 2 == 1) {
      r.sampling.temperature = 0.8f;
      r.seed = 500 + static_cast<uint64_t>(i);
    }
    reqs.push_back(r);
  }
  std::map<int64_t, std::vector<std::vector<int32_t>>> outputs;
  for (const int64_t budget : {int64_t{0}, kBudget}) {
    SCOPED_TRACE(::testing::Message() << "budget " << budget);
    PassCounter draft_pass, target_pass;
    MakeWorkers(8192, true, {&draft_pass, &target_pass});
    SchedulerOptions o;
    o.prefill_chunk = 64;
    o.draft_pass_tokens = budget;
    o.target_pass_tokens = budget;
    int64_t deferred = 0;  // on the scheduler thread; read after it stopped
    o.on_deferred = [&deferred](int64_t sequences) { deferred += sequences; };
    ASSERT_NO_FATAL_FAILURE(RunTogether(reqs, 16, o, &outputs[budget]));  // the ten together
    if (budget == 0) {
      // The budget has work to do: the ten prompts' first chunks of 64 meet in one pass.
      EXPECT_GT(target_pass.largest(), kBudget);
      EXPECT_GT(draft_pass.largest(), kBudget);
    } else {
      EXPECT_LE(target_pass.largest(), budget);
      EXPECT_LE(draft_pass.largest(), budget);
      EXPECT_GT(target_pass.largest(), budget / 2);  // and the passes are still filled
    }
    // Ten prompts of 60 or more tokens cannot all start in passes of 96.
    EXPECT_EQ(deferred > 0, budget > 0) << deferred;
    ExpectNoBlocksUsed();
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(outputs[kBudget][i], outputs[0][i]) << "request " << i;
    if (i % 2 == 0) {
      EXPECT_EQ(outputs[kBudget][i], Solo(reqs[i].prompt, 20)) << "request " << i;
    }
  }
}

// Four streams whose rounds (1 + K = 5 tokens each) outgrow a pass budget of 10 take turns:
// each streams its first token before any finishes, where batch order alone would have made the
// last two wait for the first two to finish. Outputs stay plain decoding's.
TEST_F(SchedulerTest, StreamsThatOutgrowThePassBudgetTakeTurns) {
  constexpr int64_t kTokens = 24;
  MakeWorkers(8192);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    reqs.push_back(Greedy({1, 5 + i, 9 + 2 * i, 13 + 3 * i}, kTokens, 4));
    ASSERT_EQ(Solo(reqs.back().prompt, kTokens).size(), static_cast<size_t>(kTokens))
        << "request " << i << " must not stop early for the order of events to mean anything";
  }
  SchedulerOptions o;
  o.draft_pass_tokens = 10;
  o.target_pass_tokens = 10;
  GatedWorker gate(*target_);  // the four arrive together
  auto scheduler = MakeScheduler(4, 256, o, &gate);
  absl::Cleanup open_gate = [&gate] { gate.Open(); };
  std::mutex mu;
  std::vector<std::pair<size_t, bool>> log;  // (request, finished) per event with tokens
  std::vector<std::unique_ptr<Collector>> cs;
  for (size_t i = 0; i < reqs.size(); ++i) {
    cs.push_back(std::make_unique<Collector>());
    Scheduler::EventSink sink = [&mu, &log, i, inner = cs.back()->Sink()](GenerationEvent e) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!e.tokens.empty()) log.emplace_back(i, e.finish != FinishReason::kNone);
      }
      inner(std::move(e));
    };
    ASSERT_TRUE(scheduler->Submit(reqs[i], std::move(sink)).ok());
  }
  gate.Open();
  for (size_t i = 0; i < cs.size(); ++i) {
    ASSERT_TRUE(cs[i]->WaitFor(std::chrono::seconds(120)));
    ASSERT_TRUE(cs[i]->last().error.ok()) << cs[i]->last().error;
    EXPECT_EQ(cs[i]->tokens(), Solo(reqs[i].prompt, kTokens)) << "request " << i;
  }
  scheduler.reset();
  const auto first_finish =
      std::find_if(log.begin(), log.end(), [](const auto& e) { return e.second; });
  std::set<size_t> started;
  for (auto it = log.begin(); it != first_finish; ++it) started.insert(it->first);
  EXPECT_EQ(started.size(), reqs.size()) << "requests that streamed before the first finished";
  ExpectNoBlocksUsed();
}

// Clients that go away at any moment (in the queue, while their prompt is read, mid-stream,
// between rounds) must not change what the other streams get, nor leave KV blocks behind. Thirty
// greedy requests of every kind the scheduler batches together (model chains with fixed and
// adaptive K, prompt lookup, trees, guidance, prompts sharing a prefix, chunked prefill) run with
// a third of them cancelled, in the queue or at a random event of their own, on a scheduler that
// admits 6 at a time; every other one must stream exactly what it streams when run with the
// survivors alone.
TEST_F(SchedulerTest, CancellationsAtRandomMomentsChangeNoOtherStreamAndLeakNoBlock) {
  MakeWorkers(8192);
  std::mt19937 rng(21);
  auto rand = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<GenerationRequest> reqs;
  std::vector<bool> cancel;
  const std::vector<int32_t> shared = {1,  40, 41, 42, 43, 44, 45, 46, 47, 48,
                                       49, 50, 51, 52, 53, 54, 55, 56, 57, 58};
  for (int i = 0; i < 30; ++i) {
    std::vector<int32_t> prompt = i % 4 == 0 ? shared : std::vector<int32_t>{1};
    for (int j = rand(1, 30); j > 0; --j) prompt.push_back(rand(3, 999));
    GenerationRequest r = Greedy(prompt, rand(8, 40), rand(0, 5));
    switch (i % 5) {
      case 1:
        r.adaptive_k = true;
        break;
      case 2:
        r.draft_method = DraftMethod::kNgram;
        break;
      case 3:
        r.num_speculative_tokens = 3;
        r.tree = TreeShape{2, 2};
        break;
      case 4:
        r.guidance = Guidance{1.5f, {1, 7, 8}};
        break;
      default:
        break;
    }
    reqs.push_back(std::move(r));
    cancel.push_back(i % 3 == 0);
  }
  SchedulerOptions o;
  o.prefill_chunk = 8;
  // A cancelled request goes in the queue (right after Submit) or from its own sink, at its
  // n-th event: mid-prompt, mid-stream or between rounds, wherever that event falls.
  struct CancelAt {
    std::atomic<Scheduler::RequestHandle> handle{0};
    int after_events = 0;
    int seen = 0;  // the scheduler's thread only
  };
  std::vector<std::unique_ptr<CancelAt>> at;
  std::vector<std::unique_ptr<Collector>> cs;
  auto scheduler = MakeScheduler(/*max_running=*/6, 256, o);
  for (size_t i = 0; i < reqs.size(); ++i) {
    cs.push_back(std::make_unique<Collector>());
    at.push_back(std::make_unique<CancelAt>());
    CancelAt* c = at.back().get();
    c->after_events = cancel[i] ? rand(0, 4) : 0;
    Scheduler::EventSink sink = [&scheduler, c, inner = cs.back()->Sink()](GenerationEvent e) {
      inner(std::move(e));
      const Scheduler::RequestHandle h = c->handle.load();
      if (c->after_events > 0 && ++c->seen == c->after_events && h != 0) scheduler->Cancel(h);
    };
    absl::StatusOr<Scheduler::RequestHandle> h = scheduler->Submit(reqs[i], std::move(sink));
    ASSERT_TRUE(h.ok()) << h.status();
    c->handle = *h;
    if (cancel[i] && c->after_events == 0) scheduler->Cancel(*h);
  }
  int cancelled = 0;
  std::vector<GenerationRequest> survivors;
  std::vector<std::vector<int32_t>> got;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(cs[i]->WaitFor(std::chrono::seconds(120))) << "request " << i;
    const GenerationEvent last = cs[i]->last();
    if (cancel[i]) {
      // Too late to cancel is fine: a request may have finished first.
      if (!last.error.ok()) {
        EXPECT_EQ(last.error.code(), absl::StatusCode::kCancelled) << i;
        ++cancelled;
      }
      continue;
    }
    ASSERT_TRUE(last.error.ok()) << "request " << i << ": " << last.error;
    EXPECT_EQ(static_cast<int64_t>(cs[i]->tokens().size()), reqs[i].max_new_tokens) << i;
    survivors.push_back(reqs[i]);
    got.push_back(cs[i]->tokens());
  }
  EXPECT_GE(cancelled, 7) << "of the 10 cancelled requests, most must go before they finish";
  scheduler.reset();
  ExpectNoBlocksUsed();
  std::vector<std::vector<int32_t>> want;
  ASSERT_NO_FATAL_FAILURE(RunTogether(survivors, 6, o, &want));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "survivor " << i;
  ExpectNoBlocksUsed();
}

}  // namespace
}  // namespace specd
