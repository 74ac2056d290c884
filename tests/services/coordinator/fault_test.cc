// Worker faults cost no request (issue 9). In process: the scheduler over workers that crash,
// restart behind its back, lose replies or stay away, with exact expectations. Over processes:
// `specd serve` with a SIGKILLed or SIGSTOPped worker while 16 streams generate. Every surviving
// stream must equal, token for token, the same request in a run without the fault (greedy and
// seeded sampling alike), and both workers must end with every KV block free.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "common/synth/synth.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/coordinator/local_worker.h"
#include "services/coordinator/scheduler.h"
#include "specd/v1/generation.grpc.pb.h"
#include "specd/worker/v1/worker.grpc.pb.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/services/coordinator/forwarding_worker.h"
#include "tests/services/coordinator/pass_counter.h"
#include "tests/services/serve_process.h"
#include "tests/services/worker_fixture.h"
#include "tests/services/worker_process.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::ChildProcess;
using ::testing::HasSubstr;
using testing::ScopedTempDir;
using testing::StopProcess;

// ---------------------------------------------------------------------------------------------
// In process.

// A worker over a real WorkerRuntime that fails the way a remote one does. Thread-safe: the
// scheduler calls it while the test arms faults.
class FaultyWorker final : public WorkerApi {
 public:
  enum class Fault {
    kCrash,         // the process dies: the call fails, and a new one (empty) comes up later
    kQuietRestart,  // it restarted between rounds: the call reaches a new, empty process
    kLostReply,     // the call runs, but its reply is lost (a missed deadline); same process
  };
  using Factory = std::function<std::unique_ptr<WorkerRuntime>()>;

  FaultyWorker(std::string name, Factory factory)
      : name_(std::move(name)), factory_(std::move(factory)), runtime_(factory_()) {}

  // `fault` hits the `call`-th Draft or Verify from now (1 = the next); the worker then stays
  // unreachable for `down_for` (InfiniteDuration: until Recover()).
  void Arm(int call, Fault fault, absl::Duration down_for) {
    std::lock_guard<std::mutex> lock(mu_);
    fault_call_ = calls_ + call;
    fault_ = fault;
    down_for_ = down_for;
  }
  void Recover() {
    std::lock_guard<std::mutex> lock(mu_);
    down_until_ = absl::InfinitePast();
  }
  // What its probes report as InfoResponse.max_pass_tokens (nothing by default).
  void DeclarePassTokens(int64_t tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    pass_tokens_ = tokens;
  }
  bool fired() {
    std::lock_guard<std::mutex> lock(mu_);
    return fault_call_ > 0 && calls_ >= fault_call_;
  }
  int64_t UsedBlocks() {
    std::lock_guard<std::mutex> lock(mu_);
    return runtime_->engine().kv().used_blocks();
  }

  absl::StatusOr<std::vector<SequenceOutcome>> Draft(
      std::span<const DraftSequenceRequest> batch,
      const std::function<void(const DraftStep&)>& on_step) override {
    std::lock_guard<std::mutex> lock(mu_);
    SPECD_RETURN_IF_ERROR(BeforeBigCall());
    if (lose_reply_) {
      (void)runtime_->Draft(batch, {});
      return Unreachable();
    }
    return runtime_->Draft(batch, on_step);
  }
  absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest> batch) override {
    std::lock_guard<std::mutex> lock(mu_);
    SPECD_RETURN_IF_ERROR(BeforeBigCall());
    if (lose_reply_) {
      (void)runtime_->Verify(batch);
      return Unreachable();
    }
    return runtime_->Verify(batch);
  }
  absl::StatusOr<std::vector<SequenceAnswer<TruncateResult>>> Truncate(
      std::span<const TruncateSequenceRequest> batch) override {
    std::lock_guard<std::mutex> lock(mu_);
    SPECD_RETURN_IF_ERROR(CheckUp());
    std::vector<SequenceAnswer<TruncateResult>> out;
    for (const TruncateSequenceRequest& r : batch) {
      out.push_back({r.seq, runtime_->Truncate(r)});
    }
    return out;
  }
  absl::StatusOr<std::vector<SequenceAnswer<ProbRow>>> ReadRows(
      std::span<const RowQuery> batch) override {
    std::lock_guard<std::mutex> lock(mu_);
    SPECD_RETURN_IF_ERROR(CheckUp());
    std::vector<SequenceAnswer<ProbRow>> out;
    for (const RowQuery& q : batch) out.push_back({q.seq, runtime_->ReadRow(q.seq, q.step)});
    return out;
  }
  absl::StatusOr<std::vector<SequenceAnswer<std::vector<float>>>> QueryLogprobs(
      std::span<const LogprobQuery> batch) override {
    std::lock_guard<std::mutex> lock(mu_);
    SPECD_RETURN_IF_ERROR(CheckUp());
    std::vector<SequenceAnswer<std::vector<float>>> out;
    for (const LogprobQuery& q : batch) {
      out.push_back({q.seq, runtime_->QueryLogprobs(q.seq, q.step, q.tokens)});
    }
    return out;
  }
  absl::Status Release(SeqId seq) override {
    std::lock_guard<std::mutex> lock(mu_);
    SPECD_RETURN_IF_ERROR(CheckUp());
    return runtime_->Release(seq);
  }
  int64_t FreeKvTokens() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return runtime_->kv_free().tokens;
  }
  absl::StatusOr<WorkerProbe> Probe(absl::Duration /*timeout*/) override {
    std::lock_guard<std::mutex> lock(mu_);
    SPECD_RETURN_IF_ERROR(CheckUp());
    const auto& kv = runtime_->engine().kv();
    return WorkerProbe{
        epoch_, pass_tokens_,
        PrefixCacheShape{kv.prefix_caching() ? kv.block_size() : 0, kv.total_blocks()}};
  }
  std::string Name() const override { return name_; }

 private:
  absl::Status Unreachable() const {
    return absl::UnavailableError(absl::StrCat(name_, ": connection refused"));
  }
  absl::Status CheckUp() const {
    return absl::Now() < down_until_ ? Unreachable() : absl::OkStatus();
  }
  // Counts the call and applies an armed fault to it.
  absl::Status BeforeBigCall() {
    SPECD_RETURN_IF_ERROR(CheckUp());
    lose_reply_ = false;
    if (++calls_ != fault_call_) return absl::OkStatus();
    switch (fault_) {
      case Fault::kCrash:
        Restart();
        down_until_ = absl::Now() + down_for_;
        return Unreachable();
      case Fault::kQuietRestart:
        Restart();
        return absl::OkStatus();
      case Fault::kLostReply:
        lose_reply_ = true;
        down_until_ = absl::Now() + down_for_;
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }
  void Restart() {
    runtime_ = factory_();
    ++epoch_;
  }

  const std::string name_;
  const Factory factory_;
  mutable std::mutex mu_;
  std::unique_ptr<WorkerRuntime> runtime_;
  uint64_t epoch_ = 1;
  int calls_ = 0;
  int fault_call_ = 0;
  Fault fault_ = Fault::kCrash;
  absl::Duration down_for_;
  absl::Time down_until_ = absl::InfinitePast();
  bool lose_reply_ = false;
  std::optional<int64_t> pass_tokens_;
};

// Collects a request's events.
class Collector {
 public:
  Scheduler::EventSink Sink() {
    return [this](GenerationEvent e) {
      std::lock_guard<std::mutex> lock(mu_);
      tokens_.insert(tokens_.end(), e.tokens.begin(), e.tokens.end());
      if (e.finish != FinishReason::kNone || !e.error.ok()) {
        error_ = e.error;
        done_.set_value();
      }
    };
  }
  bool WaitFor(std::chrono::seconds s) { return future_.wait_for(s) == std::future_status::ready; }
  std::vector<int32_t> tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_;
  }
  absl::Status error() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  std::mutex mu_;
  std::vector<int32_t> tokens_;
  absl::Status error_;
  std::promise<void> done_;
  std::future<void> future_ = done_.get_future();
};

class InProcessFaultTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    SynthSpec spec;
    spec.config = testing::SmallConfig();
    spec.config.vocab_size = 300;
    spec.residual_scale = 0.2;
    spec.seed = 21;
    testing::WriteSynth(spec, dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::unique_ptr<FaultyWorker> MakeWorker(bool draft) {
    return std::make_unique<FaultyWorker>(
        draft ? "draft worker at fake:1" : "target worker at fake:2", [draft] {
          return std::make_unique<WorkerRuntime>(
              testing::MakeEngine(dir_->path(), 1, 4096, draft ? 1 : 0), WorkerRuntimeOptions{});
        });
  }

  static SchedulerOptions Options(absl::Duration unavailable_timeout, int64_t prefill_chunk = 512) {
    SchedulerOptions o;
    o.max_running = 16;
    o.max_seq_len = 256;
    o.eos_token_ids = {2};
    o.worker_unavailable_timeout = unavailable_timeout;
    o.prefill_chunk = prefill_chunk;
    return o;
  }
  std::unique_ptr<Scheduler> MakeScheduler(absl::Duration unavailable_timeout,
                                           int64_t prefill_chunk = 512) {
    return std::make_unique<Scheduler>(*draft_, *target_, nullptr,
                                       Options(unavailable_timeout, prefill_chunk));
  }

  // 16 requests: even ones greedy, odd ones sampled at temperature 1 with their own seed; every
  // fourth drafts a tree and two draft by prompt lookup; half with classifier-free guidance (a
  // companion on the target, and on the draft for a quarter; the prompt-lookup ones are guided
  // too), so every fault also meets guided pairs to replay and resync.
  static std::vector<GenerationRequest> Requests() {
    std::vector<GenerationRequest> out;
    for (int i = 0; i < 16; ++i) {
      GenerationRequest r;
      r.prompt = {1};
      for (int j = 0; j < 3 + i % 5; ++j) r.prompt.push_back(3 + (i * 31 + j * 17) % 290);
      r.sampling.temperature = i % 2 == 0 ? 0.0f : 1.0f;
      r.seed = 1000 + static_cast<uint64_t>(i);
      r.max_new_tokens = 24;
      r.ignore_eos = true;
      r.num_speculative_tokens = 1 + i % 4;
      if (i % 4 == 3) r.tree = {2, 2};
      if (i % 8 == 5) r.draft_method = DraftMethod::kNgram;
      if (i % 4 < 2) {
        Guidance g;
        g.scale = 1.5f + static_cast<float>(i % 3);
        g.uncond_prompt = {1, 200 + i};
        g.draft = i % 8 < 2;
        r.guidance = g;
      }
      out.push_back(r);
    }
    return out;
  }

  // Runs `reqs` concurrently and returns each one's collector once all are done.
  std::vector<std::unique_ptr<Collector>> RunAll(Scheduler& s,
                                                 const std::vector<GenerationRequest>& reqs) {
    std::vector<std::unique_ptr<Collector>> out;
    for (const GenerationRequest& r : reqs) {
      out.push_back(std::make_unique<Collector>());
      EXPECT_TRUE(s.Submit(r, out.back()->Sink()).ok());
    }
    for (auto& c : out) EXPECT_TRUE(c->WaitFor(std::chrono::seconds(60)));
    return out;
  }

  // The fault-free outputs, from fresh workers.
  std::vector<std::vector<int32_t>> Reference() {
    draft_ = MakeWorker(true);
    target_ = MakeWorker(false);
    auto s = MakeScheduler(absl::Seconds(10));
    std::vector<std::vector<int32_t>> out;
    for (auto& c : RunAll(*s, Requests())) {
      EXPECT_TRUE(c->error().ok()) << c->error();
      out.push_back(c->tokens());
    }
    return out;
  }

  void ExpectNoBlocksUsed() {
    for (int i = 0; i < 500 && (draft_->UsedBlocks() != 0 || target_->UsedBlocks() != 0); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(draft_->UsedBlocks(), 0);
    EXPECT_EQ(target_->UsedBlocks(), 0);
  }

  static inline ScopedTempDir* dir_ = nullptr;
  std::unique_ptr<FaultyWorker> draft_, target_;
};

struct FaultCase {
  bool draft;  // which worker fails
  FaultyWorker::Fault fault;
  const char* name;
  // Chunked prefill of 4 tokens a round: the first calls prefill, and the replay after the
  // fault is chunked as well (x is then 10-30 tokens long).
  int64_t prefill_chunk = 512;
  int fault_call = 3;
};
void PrintTo(const FaultCase& c, std::ostream* os) { *os << c.name; }

class SurvivedFaultTest : public InProcessFaultTest,
                          public ::testing::WithParamInterface<FaultCase> {};

TEST_P(SurvivedFaultTest, EveryRequestCompletesWithTheFaultFreeTokens) {
  const std::vector<std::vector<int32_t>> reference = Reference();
  draft_ = MakeWorker(true);
  target_ = MakeWorker(false);
  FaultyWorker& victim = GetParam().draft ? *draft_ : *target_;
  // Unchunked, the third call: every request has been prefilled and is decoding.
  victim.Arm(GetParam().fault_call, GetParam().fault, absl::Milliseconds(200));
  auto s = MakeScheduler(absl::Seconds(10), GetParam().prefill_chunk);
  const auto results = RunAll(*s, Requests());
  EXPECT_TRUE(victim.fired());
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i]->error().ok()) << "request " << i << ": " << results[i]->error();
    EXPECT_EQ(results[i]->tokens(), reference[i]) << "request " << i;
  }
  s.reset();
  ExpectNoBlocksUsed();
}

INSTANTIATE_TEST_SUITE_P(
    Faults, SurvivedFaultTest,
    ::testing::Values(
        FaultCase{false, FaultyWorker::Fault::kCrash, "TargetCrash"},
        FaultCase{true, FaultyWorker::Fault::kCrash, "DraftCrash"},
        FaultCase{false, FaultyWorker::Fault::kQuietRestart, "TargetQuietRestart"},
        FaultCase{true, FaultyWorker::Fault::kQuietRestart, "DraftQuietRestart"},
        FaultCase{false, FaultyWorker::Fault::kLostReply, "TargetLostReply"},
        FaultCase{true, FaultyWorker::Fault::kLostReply, "DraftLostReply"},
        FaultCase{false, FaultyWorker::Fault::kCrash, "TargetCrashChunked", 4, 9},
        FaultCase{true, FaultyWorker::Fault::kCrash, "DraftCrashChunked", 4, 9},
        FaultCase{false, FaultyWorker::Fault::kQuietRestart, "TargetQuietRestartChunked", 4, 9},
        FaultCase{true, FaultyWorker::Fault::kLostReply, "DraftLostReplyChunked", 4, 9}),
    [](const auto& info) { return std::string(info.param.name); });

TEST_F(InProcessFaultTest, RequestsGiveUpOnAWorkerThatStaysAwayAndItsBlocksAreFreedLater) {
  draft_ = MakeWorker(true);
  target_ = MakeWorker(false);
  // The target runs the call and then stops answering: it holds every sequence.
  target_->Arm(2, FaultyWorker::Fault::kLostReply, absl::InfiniteDuration());
  auto s = MakeScheduler(absl::Milliseconds(400));
  const std::vector<GenerationRequest> reqs = Requests();
  std::vector<std::unique_ptr<Collector>> running;
  for (const GenerationRequest& r : reqs) {
    running.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(s->Submit(r, running.back()->Sink()).ok());
  }
  for (size_t i = 0; i < running.size(); ++i) {
    ASSERT_TRUE(running[i]->WaitFor(std::chrono::seconds(30)));
    EXPECT_EQ(running[i]->error().code(), absl::StatusCode::kUnavailable) << "request " << i;
    EXPECT_THAT(running[i]->error().message(),
                HasSubstr("target worker at fake:2 is unavailable: connection refused"));
  }
  // A request that arrives while the worker is away waits in the queue as long, then fails.
  Collector queued;
  ASSERT_TRUE(s->Submit(reqs[0], queued.Sink()).ok());
  ASSERT_TRUE(queued.WaitFor(std::chrono::seconds(30)));
  EXPECT_EQ(queued.error().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(queued.error().message(), HasSubstr("target worker at fake:2 is unavailable"));
  EXPECT_TRUE(queued.tokens().empty());

  // Back in the same process: the sequences it kept are released without any new request.
  target_->Recover();
  ExpectNoBlocksUsed();
  Collector after;
  ASSERT_TRUE(s->Submit(reqs[1], after.Sink()).ok());
  ASSERT_TRUE(after.WaitFor(std::chrono::seconds(30)));
  EXPECT_TRUE(after.error().ok()) << after.error();
  EXPECT_EQ(after.tokens().size(), 24u);
}

// A target restarted with --prefix-caching switched gets the prefix sharing its new process
// supports, without restarting the coordinator. Four completions of one 100-token prompt start
// together, and the target crashes in their third round, so all four replay that prompt together
// on the new process: they wait for one another's blocks after the restart exactly when the new
// process caches prefixes. Outputs are unchanged either way.
TEST_F(InProcessFaultTest, PrefixSharingFollowsARestartedTargetsCache) {
  std::vector<GenerationRequest> reqs;
  for (uint32_t i = 0; i < 4; ++i) {
    GenerationRequest r;
    r.prompt = {1};
    for (int j = 1; j < 100; ++j) r.prompt.push_back(3 + (j * 37) % 290);
    r.sampling.temperature = i == 0 ? 0.0f : 0.9f;
    r.seed = 7;
    r.sample = i;
    r.max_new_tokens = 24;
    r.ignore_eos = true;
    r.num_speculative_tokens = 2;
    reqs.push_back(r);
  }
  draft_ = MakeWorker(true);
  target_ = MakeWorker(false);
  std::vector<std::vector<int32_t>> reference;
  {
    auto s = MakeScheduler(absl::Seconds(10));
    for (auto& c : RunAll(*s, reqs)) {
      EXPECT_TRUE(c->error().ok()) << c->error();
      reference.push_back(c->tokens());
    }
  }
  for (const bool caching_after : {false, true}) {
    SCOPED_TRACE(caching_after ? "restarted with prefix caching" : "restarted without it");
    int processes = 0;
    draft_ = MakeWorker(true);
    target_ = std::make_unique<FaultyWorker>("target worker at fake:2", [&] {
      EngineOptions options;
      options.kv_capacity_tokens = 4096;
      options.kv_block_size = 16;
      options.prefix_caching = (processes++ == 0) != caching_after;
      return std::make_unique<WorkerRuntime>(testing::MakeTestEngine(dir_->path(), 1, options),
                                             WorkerRuntimeOptions{});
    });
    target_->Arm(3, FaultyWorker::Fault::kCrash, absl::Milliseconds(200));
    SchedulerOptions o = Options(absl::Seconds(10));
    o.prefix_sharing = true;
    o.prefix_block_size = caching_after ? 0 : 16;  // the first process's cache
    o.prefix_pool_blocks = 4096 / 16;
    std::mutex mu;
    std::vector<std::string> timeline;  // restarts and rounds with waits, in order
    std::vector<std::string> events;
    o.on_prefix_wait = [&](int64_t sequences) {
      std::lock_guard<std::mutex> lock(mu);
      if (sequences > 0) timeline.push_back("wait");
    };
    o.on_worker_restart = [&](bool target) {
      std::lock_guard<std::mutex> lock(mu);
      if (target) timeline.push_back("restart");
    };
    o.on_worker_event = [&](const std::string& e) {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(e);
    };
    testing::GatedWorker gated(*target_);  // all four are admitted in the first round
    auto s = std::make_unique<Scheduler>(*draft_, gated, nullptr, o);
    absl::Cleanup open = [&gated] { gated.Open(); };
    std::vector<std::unique_ptr<Collector>> results;
    for (const GenerationRequest& r : reqs) {
      results.push_back(std::make_unique<Collector>());
      ASSERT_TRUE(s->Submit(r, results.back()->Sink()).ok());
    }
    gated.Open();
    for (size_t i = 0; i < results.size(); ++i) {
      ASSERT_TRUE(results[i]->WaitFor(std::chrono::seconds(60)));
      ASSERT_TRUE(results[i]->error().ok()) << "request " << i << ": " << results[i]->error();
      EXPECT_EQ(results[i]->tokens(), reference[i]) << "request " << i;
    }
    s.reset();
    ASSERT_EQ(processes, 2);
    const auto restart = std::find(timeline.begin(), timeline.end(), "restart");
    ASSERT_NE(restart, timeline.end());
    const auto waits_before = std::count(timeline.begin(), restart, "wait");
    const auto waits_after = std::count(restart, timeline.end(), "wait");
    if (caching_after) {
      EXPECT_EQ(waits_before, 0);
      EXPECT_GT(waits_after, 0);
      EXPECT_THAT(events, ::testing::Contains(
                              "target worker at fake:2 caches prefixes in blocks of 16 tokens "
                              "now: prompts that share them compute them once"));
    } else {
      EXPECT_GT(waits_before, 0);
      EXPECT_EQ(waits_after, 0);
      EXPECT_THAT(events, ::testing::Contains(::testing::StartsWith(
                              "target worker at fake:2 caches no prefixes now")));
    }
    ExpectNoBlocksUsed();
  }
}

// A target restarted with a larger --max-pass-tokens (as the deferred metric advises) gets passes
// of that size from its first round, without restarting the coordinator; outputs are unchanged.
TEST_F(InProcessFaultTest, ARestartedWorkersPassBudgetIsTheNewProcesses) {
  const std::vector<std::vector<int32_t>> reference = Reference();
  constexpr int64_t kBudget = 24;
  std::deque<testing::PassCounter> passes;  // one per target process
  draft_ = MakeWorker(true);
  target_ = std::make_unique<FaultyWorker>("target worker at fake:2", [&passes] {
    passes.emplace_back();
    return std::make_unique<WorkerRuntime>(testing::MakeEngine(dir_->path(), 1, 4096, 0),
                                           WorkerRuntimeOptions{&passes.back()});
  });
  target_->DeclarePassTokens(4096);
  target_->Arm(3, FaultyWorker::Fault::kCrash, absl::Milliseconds(200));
  SchedulerOptions o = Options(absl::Seconds(10));
  o.draft_pass_tokens = kBudget;
  o.target_pass_tokens = kBudget;
  std::mutex mu;
  std::vector<std::string> events;
  o.on_worker_event = [&](const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(e);
  };
  std::vector<std::string> transitions;  // what the metrics are told
  o.on_worker_up = [&](bool target, bool up) {
    std::lock_guard<std::mutex> lock(mu);
    transitions.push_back(absl::StrCat(target ? "target" : "draft", up ? " up" : " down"));
  };
  o.on_worker_restart = [&](bool target) {
    std::lock_guard<std::mutex> lock(mu);
    transitions.push_back(absl::StrCat(target ? "target" : "draft", " restarted"));
  };
  auto s = std::make_unique<Scheduler>(*draft_, *target_, nullptr, o);
  const auto results = RunAll(*s, Requests());
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i]->error().ok()) << "request " << i << ": " << results[i]->error();
    EXPECT_EQ(results[i]->tokens(), reference[i]) << "request " << i;
  }
  s.reset();
  ASSERT_EQ(passes.size(), 2u);
  EXPECT_LE(passes[0].largest(), kBudget) << "before the restart, the coordinator's budget";
  // Sixteen sequences replay from position 0 on the new process, in passes only its budget
  // allows (the old one cut every pass to 24: no round here drafts more alone).
  EXPECT_GT(passes[1].largest(), kBudget) << "after it, the new process's";
  EXPECT_THAT(events,
              ::testing::Contains(
                  "target worker at fake:2 takes passes of up to 4096 tokens now (was 24)"));
  EXPECT_THAT(transitions, ::testing::ElementsAre("target down", "target restarted", "target up"));
  ExpectNoBlocksUsed();
}

TEST_F(InProcessFaultTest, PlainDecodingGoesOnWhileTheDraftWorkerIsAway) {
  draft_ = MakeWorker(true);
  target_ = MakeWorker(false);
  draft_->Arm(1, FaultyWorker::Fault::kCrash, absl::InfiniteDuration());
  auto s = MakeScheduler(absl::Milliseconds(500));
  GenerationRequest spec = Requests()[2];
  GenerationRequest plain = spec;
  plain.num_speculative_tokens = 0;
  Collector speculative, target_only;
  ASSERT_TRUE(s->Submit(spec, speculative.Sink()).ok());
  ASSERT_TRUE(s->Submit(plain, target_only.Sink()).ok());
  ASSERT_TRUE(target_only.WaitFor(std::chrono::seconds(30)));
  EXPECT_TRUE(target_only.error().ok()) << target_only.error();
  EXPECT_EQ(target_only.tokens().size(), 24u);
  ASSERT_TRUE(speculative.WaitFor(std::chrono::seconds(30)));
  EXPECT_EQ(speculative.error().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(speculative.error().message(), HasSubstr("draft worker at fake:1 is unavailable"));
  s.reset();
  EXPECT_EQ(target_->UsedBlocks(), 0);
}

// ---------------------------------------------------------------------------------------------
// Over processes: `specd serve` supervises the three processes and restarts a killed one.

using Stream = testing::ServeProcess::Stream;

// 16 requests of 40 tokens: even ones greedy, odd ones sampled at temperature 1 with a seed;
// every fourth drafts a 2x2 tree, so a killed worker dies mid-tree too. `guided`: every other one
// (none of the trees) with classifier-free guidance, half of those with a guided draft.
std::vector<v1::GenerateRequest> SixteenStreams(uint32_t max_new = 40, bool guided = false) {
  std::vector<v1::GenerateRequest> out;
  for (int i = 0; i < 16; ++i) {
    v1::GenerateRequest r;
    r.mutable_token_ids()->add_ids(1);
    for (int j = 0; j < 2 + i % 6; ++j) r.mutable_token_ids()->add_ids(300 + (i * 53 + j) % 600);
    r.mutable_stopping()->set_max_new_tokens(max_new);
    r.mutable_stopping()->set_ignore_eos(true);
    r.mutable_speculation()->set_num_speculative_tokens(1 + i % 4);
    if (i % 4 == 3) {
      r.mutable_speculation()->mutable_tree()->set_branching(2);
      r.mutable_speculation()->mutable_tree()->set_depth(2);
    }
    if (i % 2 == 1) {
      r.mutable_sampling()->set_temperature(1.0f);
      r.mutable_sampling()->set_seed(500 + i);
    }
    if (guided && i % 4 < 2) {
      v1::Guidance* g = r.mutable_guidance();
      g->set_scale(1.5f + static_cast<float>(i % 3));
      g->mutable_unconditional_token_ids()->add_ids(1);
      g->mutable_unconditional_token_ids()->add_ids(400 + i);
      g->set_draft(i % 8 < 2);
    }
    out.push_back(r);
  }
  return out;
}

using Health = grpc::health::v1::HealthCheckResponse;

// The coordinator's health as it settles: polled for up to 10 s until it says `want`.
Health::ServingStatus HealthBecomes(grpc::health::v1::Health::Stub& health,
                                    Health::ServingStatus want) {
  Health::ServingStatus got = Health::UNKNOWN;
  for (int i = 0; i < 100 && got != want; ++i) {
    grpc::ClientContext ctx;
    Health reply;
    if (health.Check(&ctx, {}, &reply).ok()) got = reply.status();
    if (got != want) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return got;
}

class ServeFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SynthSpec spec;
    absl::StatusOr<ModelConfig> c = ShapePreset("tiny");
    ASSERT_TRUE(c.ok());
    spec.config = *c;
    spec.config.vocab_size = 1000;
    spec.residual_scale = 0.1;
    model_ = tmp_.path() / "model";
    pids_ = tmp_.path() / "pids";
    std::filesystem::create_directories(pids_);
    ASSERT_TRUE(WriteSyntheticModel(spec, model_).ok());
  }

  // `specd serve` over the tiny synthetic pair, with short fault timeouts, the coordinator on
  // `listen`.
  std::unique_ptr<testing::ServeProcess> StartServeOn(const std::string& listen, int unavailable_s,
                                                      int64_t kv_tokens = 16384) {
    return testing::ServeProcess::Start(
        {"--listen", listen, "--target", model_.string(), "--draft-exit-layer", "1", "--threads",
         "1", "--kv-tokens", std::to_string(kv_tokens), "--max-running", "16",
         "--worker-call-timeout-seconds", "1", "--worker-unavailable-seconds",
         std::to_string(unavailable_s)},
        pids_);
  }

  // The coordinator on a Unix socket in the test's own directory: tests that kill it expect
  // nothing but it, or nothing at all, at its address until it is back, and a TCP port it left
  // free could meanwhile go to a process of a test running beside this one.
  std::unique_ptr<testing::ServeProcess> StartServe(int unavailable_s, int64_t kv_tokens = 16384) {
    return StartServeOn("unix:" + (tmp_.path() / "coordinator.sock").string(), unavailable_s,
                        kv_tokens);
  }

  ScopedTempDir tmp_;
  std::filesystem::path model_, pids_;
};

struct Crash {
  const char* victim;  // "target" or "draft"
  bool guided;         // half the streams with classifier-free guidance (companion sequences)
};

class ServeCrashTest : public ServeFaultTest, public ::testing::WithParamInterface<Crash> {};

TEST_P(ServeCrashTest, SigkilledWorkerIsRestartedAndEveryStreamIsUnchanged) {
  const std::string victim = GetParam().victim;
  auto serve = StartServe(/*unavailable_s=*/30);
  ASSERT_NE(serve, nullptr);
  const std::vector<v1::GenerateRequest> reqs = SixteenStreams(40, GetParam().guided);
  const std::vector<Stream> reference = serve->Generate(reqs);
  for (const Stream& s : reference) ASSERT_TRUE(s.status.ok()) << s.status.error_message();

  const pid_t pid = serve->Pid(victim + "-worker");
  ASSERT_GT(pid, 0);
  int finished_at_kill = -1;
  const std::vector<Stream> faulted = serve->Generate(reqs, /*after=*/4, [&](int finished) {
    finished_at_kill = finished;
    kill(pid, SIGKILL);
  });
  EXPECT_LT(finished_at_kill, 16) << "the worker died after every stream had finished";
  int trees_in_flight = 0;  // tree streams still running when the worker was killed
  for (size_t i = 0; i < reqs.size(); ++i) {
    trees_in_flight += reqs[i].speculation().has_tree() && !faulted[i].done_before_hook;
  }
  EXPECT_GT(trees_in_flight, 0) << "no draft tree was in flight when the worker died";
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(faulted[i].status.ok())
        << "stream " << i << ": " << faulted[i].status.error_message();
    EXPECT_EQ(faulted[i].tokens, reference[i].tokens) << "stream " << i;
  }
  EXPECT_NE(serve->Pid(victim + "-worker"), pid);
  EXPECT_THAT(serve->StderrText(), HasSubstr("restarting the " + victim + " worker"));
  serve->ExpectNoBlocksUsed();
}

INSTANTIATE_TEST_SUITE_P(Workers, ServeCrashTest,
                         ::testing::Values(Crash{"target", false}, Crash{"draft", false},
                                           Crash{"target", true}, Crash{"draft", true}),
                         [](const auto& info) {
                           return std::string(info.param.victim) +
                                  (info.param.guided ? "_guided" : "");
                         });

TEST_F(ServeFaultTest, HungTargetThatResumesInTimeCostsNothing) {
  auto serve = StartServe(/*unavailable_s=*/20);
  ASSERT_NE(serve, nullptr);
  const std::vector<v1::GenerateRequest> reqs = SixteenStreams();
  const std::vector<Stream> reference = serve->Generate(reqs);
  const pid_t pid = serve->Pid("target-worker");
  const std::vector<Stream> hung = serve->Generate(reqs, 4, [&](int) {
    ASSERT_EQ(StopProcess(pid), absl::OkStatus());
    // Past the 1 s call deadline, so the hang is noticed, and well within the 20 s allowed.
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    kill(pid, SIGCONT);
  });
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(hung[i].status.ok()) << "stream " << i << ": " << hung[i].status.error_message();
    EXPECT_EQ(hung[i].tokens, reference[i].tokens) << "stream " << i;
  }
  EXPECT_EQ(serve->Pid("target-worker"), pid);  // the same process throughout
  serve->ExpectNoBlocksUsed();
}

TEST_F(ServeFaultTest, HungTargetFailsItsRequestsAfterTheAllowedTime) {
  auto serve = StartServe(/*unavailable_s=*/2);
  ASSERT_NE(serve, nullptr);
  const std::string target = serve->Address("target worker");
  const pid_t pid = serve->Pid("target-worker");
  std::vector<Stream> hung;
  std::vector<Stream> late;
  hung = serve->Generate(SixteenStreams(200), 4, [&](int) {
    ASSERT_EQ(StopProcess(pid), absl::OkStatus());
    // A request that arrives while the worker hangs waits as long, then fails the same way.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    late = serve->Generate({SixteenStreams()[0]});
  });
  for (const Stream* s : {&hung[0], &hung[5], &hung[15], &late[0]}) {
    EXPECT_EQ(s->status.error_code(), grpc::StatusCode::UNAVAILABLE) << s->status.error_message();
    EXPECT_THAT(s->status.error_message(),
                HasSubstr("target worker at " + target + " is unavailable"));
  }
  EXPECT_TRUE(late[0].tokens.empty());
  kill(pid, SIGCONT);
  // What the hung worker still held is released once it answers again.
  serve->ExpectNoBlocksUsed();
  const std::vector<Stream> after = serve->Generate({SixteenStreams()[3]});
  EXPECT_TRUE(after[0].status.ok()) << after[0].status.error_message();
}

// A stopped process keeps its connection READY, so only a call finds the hang out. The idle
// coordinator probes a worker that has been quiet for two seconds: health turns NOT_SERVING
// without a request, and back once the worker resumes, with nothing lost.
TEST_F(ServeFaultTest, ATargetThatHangsWhileNothingRunsTurnsHealthNotServingUntilItResumes) {
  auto serve = StartServe(/*unavailable_s=*/20);
  ASSERT_NE(serve, nullptr);
  const v1::GenerateRequest req = SixteenStreams(8)[1];
  const std::vector<Stream> before = serve->Generate({req});
  ASSERT_TRUE(before[0].status.ok()) << before[0].status.error_message();
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(serve->address(), grpc::InsecureChannelCredentials()));
  ASSERT_EQ(HealthBecomes(*health, Health::SERVING), Health::SERVING);
  const pid_t pid = serve->Pid("target-worker");
  ASSERT_EQ(StopProcess(pid), absl::OkStatus());
  EXPECT_EQ(HealthBecomes(*health, Health::NOT_SERVING), Health::NOT_SERVING)
      << serve->StderrText();
  EXPECT_THAT(serve->StderrText(),
              HasSubstr("target worker at " + serve->Address("target worker") +
                        " is unavailable: Info got no reply within its deadline"));
  kill(pid, SIGCONT);
  EXPECT_EQ(HealthBecomes(*health, Health::SERVING), Health::SERVING) << serve->StderrText();
  const std::vector<Stream> after = serve->Generate({req});
  ASSERT_TRUE(after[0].status.ok()) << after[0].status.error_message();
  EXPECT_EQ(after[0].tokens, before[0].tokens);
  EXPECT_EQ(serve->Pid("target-worker"), pid);
  serve->ExpectNoBlocksUsed();
}

// On a Unix socket, and on `--listen 127.0.0.1:0`, where the restarted coordinator must take the
// port the first one was given, not another free one, so that clients keep their address.
class ServeCoordinatorKillTest : public ServeFaultTest, public ::testing::WithParamInterface<bool> {
 protected:
  bool tcp() const { return GetParam(); }
};

TEST_P(ServeCoordinatorKillTest, KilledCoordinatorIsRestartedOnTheSameAddress) {
  auto serve = tcp() ? StartServeOn("127.0.0.1:0", 30) : StartServe(30);
  ASSERT_NE(serve, nullptr);
  const std::string address = serve->address();
  const v1::GenerateRequest req = SixteenStreams(8)[1];
  const std::vector<Stream> before = serve->Generate({req});
  ASSERT_TRUE(before[0].status.ok()) << before[0].status.error_message();
  const pid_t pid = serve->Pid("coordinator");
  ASSERT_GT(pid, 0);
  kill(pid, SIGKILL);
  std::vector<Stream> after;
  for (int i = 0; i < 300; ++i) {
    serve->Reconnect();
    after = serve->Generate({req});
    if (after[0].status.ok() && after[0].tokens == before[0].tokens) break;
    // Clients see UNAVAILABLE until the new coordinator serves. A freed TCP port may meanwhile be
    // given to another program (a test running beside this one), which answers what it will: the
    // restart is refused, serve retries, and only the end is checked.
    if (!tcp()) {
      EXPECT_EQ(after[0].status.error_code(), grpc::StatusCode::UNAVAILABLE);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(after[0].status.ok()) << after[0].status.error_message() << serve->StderrText();
  EXPECT_EQ(after[0].tokens, before[0].tokens);
  EXPECT_NE(serve->Pid("coordinator"), pid);
  EXPECT_EQ(serve->address(), address);
  EXPECT_EQ(serve->Address("coordinator"), address) << serve->StderrText();
  EXPECT_THAT(serve->StderrText(), HasSubstr("the coordinator (pid " + std::to_string(pid) +
                                             ") was killed by signal 9"));
}

INSTANTIATE_TEST_SUITE_P(Listen, ServeCoordinatorKillTest, ::testing::Bool(), [](const auto& info) {
  return std::string(info.param ? "PickedTcpPort" : "UnixSocket");
});

// A coordinator that dies mid-stream cannot release its sequences; the workers serve one
// coordinator, and the one that starts next claims them and frees what its predecessor left.
TEST_F(ServeFaultTest, ACoordinatorKilledMidStreamLeavesNoKvBlocksBehind) {
  auto serve = StartServe(30);
  ASSERT_NE(serve, nullptr);
  const pid_t pid = serve->Pid("coordinator");
  ASSERT_GT(pid, 0);
  const std::vector<Stream> killed =
      serve->Generate(SixteenStreams(200), 4, [&](int) { kill(pid, SIGKILL); });
  int cut = 0;
  for (const Stream& s : killed) {
    if (s.status.ok()) continue;
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::UNAVAILABLE) << s.status.error_message();
    ++cut;
  }
  ASSERT_GT(cut, 0) << "no stream was open when the coordinator died";
  const v1::GenerateRequest req = SixteenStreams(8)[1];
  std::vector<Stream> after;
  for (int i = 0; i < 100; ++i) {
    serve->Reconnect();
    after = serve->Generate({req});
    if (after[0].status.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(after[0].status.ok()) << after[0].status.error_message() << serve->StderrText();
  serve->ExpectNoBlocksUsed();
  EXPECT_THAT(serve->StderrText(), HasSubstr("a coordinator claimed this worker: released"));
}

TEST_F(ServeFaultTest, KvPoolForThreeSequencesServesTwelveStreamsUnchanged) {
  // Each stream grows to about 5 blocks of 16 tokens; 240 tokens hold 15 blocks, three streams.
  auto serve = StartServe(30, /*kv_tokens=*/240);
  ASSERT_NE(serve, nullptr);
  std::vector<v1::GenerateRequest> reqs = SixteenStreams(64);
  reqs.resize(12);
  const std::vector<Stream> together = serve->Generate(reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(together[i].status.ok())
        << "stream " << i << ": " << together[i].status.error_message();
    // Alone, a stream has the whole pool: the ample-pool reference.
    const std::vector<Stream> alone = serve->Generate({reqs[i]});
    EXPECT_EQ(together[i].tokens, alone[0].tokens) << "stream " << i;
  }
  serve->ExpectNoBlocksUsed();
}

// Over processes without `specd serve`, which restarts a worker with the flags it had: an
// operator stops the target and starts it again by hand. The idle coordinator notices the dropped
// connection and turns health (gRPC and HTTP) NOT_SERVING without a request. A target that comes
// back computing something else (another KV dtype) is not used, and requests fail naming the
// change. The original flags (and a larger --max-pass-tokens, which may change) serve again, with
// the same tokens, and health says so before any request comes.
TEST_F(ServeFaultTest, ATargetRestartedWithAnotherKvDtypeIsRefusedUntilItsOwnReturns) {
  const std::string socket = "unix:" + (tmp_.path() / "target.sock").string();
  auto start_target = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"--listen", socket, "--threads", "1", "--kv-tokens", "4096"};
    args.insert(args.end(), extra.begin(), extra.end());
    absl::StatusOr<std::unique_ptr<ChildProcess>> p =
        ChildProcess::Start(testing::TargetWorkerBinary(), testing::WorkerArgs(model_, args));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  };
  std::unique_ptr<ChildProcess> target = start_target({"--max-pass-tokens", "256"});
  ASSERT_NE(target, nullptr);
  absl::StatusOr<std::unique_ptr<ChildProcess>> coordinator = ChildProcess::Start(
      testing::BuiltBinary("services/coordinator/specd-coordinator"),
      {"--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--target", socket,
       "--worker-unavailable-seconds", "2", "--worker-call-timeout-seconds", "1"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto stub = v1::Generation::NewStub((*coordinator)->Channel());
  auto health = grpc::health::v1::Health::NewStub((*coordinator)->Channel());
  auto health_becomes = [&](Health::ServingStatus want) { return HealthBecomes(*health, want); };
  v1::GenerateRequest req = SixteenStreams(12)[1];  // sampled, with a seed
  req.mutable_speculation()->set_num_speculative_tokens(0);
  auto generate = [&] {
    Stream out;
    for (int attempt = 0; attempt < 100; ++attempt) {  // until the coordinator serves
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      auto reader = stub->Generate(&ctx, req);
      out = Stream();
      v1::GenerateResponse msg;
      while (reader->Read(&msg)) {
        out.tokens.insert(out.tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
      }
      out.status = reader->Finish();
      if (out.status.error_code() != grpc::StatusCode::UNAVAILABLE ||
          !absl::StrContains(out.status.error_message(), "not connected to its workers yet")) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return out;
  };
  const Stream reference = generate();
  ASSERT_TRUE(reference.status.ok()) << reference.status.error_message();
  ASSERT_EQ(reference.tokens.size(), 12u);

  target.reset();
  EXPECT_EQ(health_becomes(Health::NOT_SERVING), Health::NOT_SERVING);
  target = start_target({"--kv-dtype", "bf16"});
  ASSERT_NE(target, nullptr);
  const Stream refused = generate();
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.status.error_message(),
              HasSubstr("target worker at " + socket +
                        " is unavailable: it came back with kv_dtype bf16 (was f32)"));
  EXPECT_THAT(refused.status.error_message(), HasSubstr("restart the coordinator"));
  EXPECT_TRUE(refused.tokens.empty());
  EXPECT_THAT((*coordinator)->StderrText(), HasSubstr("it came back with kv_dtype bf16"));
  EXPECT_EQ(health_becomes(Health::NOT_SERVING), Health::NOT_SERVING);
  const absl::StatusOr<std::string> http_health =
      testing::HttpGet((*coordinator)->http_port(), "/health");
  EXPECT_THAT(http_health.status().message(), HasSubstr("503"));
  auto metrics = [&] {
    absl::StatusOr<std::string> text = testing::HttpGet((*coordinator)->metrics_port(), "/metrics");
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? *text : std::string();
  };
  EXPECT_THAT(metrics(), HasSubstr("specd_worker_up{worker=\"target\"} 0"));

  target.reset();
  target = start_target({"--max-pass-tokens", "512"});
  ASSERT_NE(target, nullptr);
  // No request comes while health says NOT_SERVING: the coordinator probes on its own (with a
  // backoff of up to a second).
  EXPECT_EQ(health_becomes(Health::SERVING), Health::SERVING) << (*coordinator)->StderrText();
  EXPECT_TRUE(testing::HttpGet((*coordinator)->http_port(), "/health").ok());
  EXPECT_THAT(metrics(), HasSubstr("specd_worker_up{worker=\"target\"} 1"));
  EXPECT_THAT(metrics(), HasSubstr("specd_worker_restarts_total{worker=\"target\"} 1"));
  const Stream again = generate();
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.tokens, reference.tokens);
  EXPECT_THAT(
      (*coordinator)->StderrText(),
      HasSubstr("target worker at " + socket + " takes passes of up to 512 tokens now (was 256)"));
}

}  // namespace
}  // namespace specd
