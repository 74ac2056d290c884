// Classifier-free guidance through the scheduler and in-process workers: greedy guided output is
// the same for every K, with the draft unguided or guided, chunked or not, or with prompt lookup's
// drafts, and equals an independent numpy decoding (guided_greedy_reference.py); pairs under KV
// pressure are preempted and replayed as one (no cache mismatch ever, outputs unchanged, no block
// left), and only a request alone in the pools is failed as one that can never fit; cancelling
// frees both halves; max_seq_len bounds the longer of the two texts.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/synth/synth.h"
#include "gtest/gtest.h"
#include "services/coordinator/local_worker.h"
#include "services/coordinator/scheduler.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/services/coordinator/forwarding_worker.h"
#include "tests/services/coordinator/pause_at.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::PauseAt;
using testing::ScopedTempDir;
using Tokens = std::vector<int32_t>;

constexpr int64_t kMaxSeqLen = 256;

// One request's tokens and last event.
class Collector {
 public:
  Scheduler::EventSink Sink() {
    return [this](GenerationEvent e) {
      std::lock_guard<std::mutex> lock(mu_);
      tokens_.insert(tokens_.end(), e.tokens.begin(), e.tokens.end());
      if (e.finish != FinishReason::kNone || !e.error.ok()) {
        last_ = std::move(e);
        done_.set_value();
      }
    };
  }
  bool Wait(int seconds = 300) {
    return done_future_.wait_for(std::chrono::seconds(seconds)) == std::future_status::ready;
  }
  Tokens tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_;
  }
  GenerationEvent last() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

 private:
  std::mutex mu_;
  Tokens tokens_;
  GenerationEvent last_;
  std::promise<void> done_;
  std::future<void> done_future_ = done_.get_future();
};

// Passes every call through and counts sequence results that say the worker's copy was not
// what the coordinator believed: a pair split by preemption or replay would show here, even
// though the scheduler would recover from it.
class MismatchCounter final : public testing::ForwardingWorker {
 public:
  explicit MismatchCounter(WorkerApi& inner) : ForwardingWorker(inner) {}
  absl::StatusOr<std::vector<SequenceOutcome>> Draft(
      std::span<const DraftSequenceRequest> batch,
      const std::function<void(const DraftStep&)>& on_step) override {
    absl::StatusOr<std::vector<SequenceOutcome>> out = inner_.Draft(batch, on_step);
    if (out.ok()) {
      for (const SequenceOutcome& o : *out) Count(o.status);
    }
    return out;
  }
  absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest> batch) override {
    absl::StatusOr<std::vector<VerifySequenceResult>> out = inner_.Verify(batch);
    if (out.ok()) {
      for (const VerifySequenceResult& r : *out) Count(r.status);
    }
    return out;
  }
  absl::StatusOr<std::vector<SequenceAnswer<TruncateResult>>> Truncate(
      std::span<const TruncateSequenceRequest> batch) override {
    absl::StatusOr<std::vector<SequenceAnswer<TruncateResult>>> out = inner_.Truncate(batch);
    if (out.ok()) {
      for (const auto& a : *out) Count(a.value.status());
    }
    return out;
  }
  // A preempted request whose pair was never admitted there is NOT_FOUND: nothing to free.
  absl::Status Release(SeqId seq) override {
    absl::Status st = inner_.Release(seq);
    if (st.code() != absl::StatusCode::kNotFound) Count(st);
    return st;
  }
  int64_t mismatches() const { return mismatches_; }

 private:
  void Count(const absl::Status& st) {
    if (!st.ok() && st.code() != absl::StatusCode::kResourceExhausted) ++mismatches_;
  }
  int64_t mismatches_ = 0;  // only the scheduler thread calls
};

// A target that holds the scheduler's first Probe (which comes before its first admission)
// until Open(), so that requests submitted before are admitted together; that holds Verify call
// number `hold_at` (1-based) until Resume(); and that reports RESOURCE_EXHAUSTED, as a full pool
// would, for `victim` in Verify call number `exhaust_at` (the scheduler then releases the
// worker's copy itself).
class TimedTarget final : public testing::ForwardingWorker {
 public:
  TimedTarget(WorkerApi& inner, int hold_at, int exhaust_at)
      : ForwardingWorker(inner), hold_at_(hold_at), exhaust_at_(exhaust_at) {}
  absl::StatusOr<WorkerProbe> Probe(absl::Duration timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return open_; });
    return inner_.Probe(timeout);
  }
  absl::StatusOr<std::vector<VerifySequenceResult>> Verify(
      std::span<const VerifySequenceRequest> batch) override {
    int call = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      call = ++calls_;
      if (call == hold_at_) {
        held_ = true;
        cv_.notify_all();
        cv_.wait(lock, [&] { return resumed_; });
      }
    }
    absl::StatusOr<std::vector<VerifySequenceResult>> out = inner_.Verify(batch);
    if (call == exhaust_at_ && out.ok()) {
      for (VerifySequenceResult& r : *out) {
        if (r.seq == victim_) r.status = absl::ResourceExhaustedError("the KV pool is full");
      }
    }
    return out;
  }
  void Open() { Set(&open_); }
  void Resume() { Set(&resumed_); }
  // Both, so that ~Scheduler does not wait for its thread forever after a failed assertion:
  // call it from an absl::Cleanup declared after the scheduler.
  void Unblock() {
    Open();
    Resume();
  }
  void WaitUntilHeld() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return held_; });
  }
  void set_victim(SeqId seq) {
    std::lock_guard<std::mutex> lock(mu_);
    victim_ = seq;
  }

 private:
  void Set(bool* flag) {
    std::lock_guard<std::mutex> lock(mu_);
    *flag = true;
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  const int hold_at_, exhaust_at_;
  int calls_ = 0;
  SeqId victim_ = 0;
  bool open_ = false, resumed_ = false, held_ = false;
};

class GuidanceSchedulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    SynthSpec spec;
    spec.config = testing::SmallConfig();
    spec.config.vocab_size = 1000;
    spec.config.num_layers = 3;
    spec.config.max_position_embeddings = kMaxSeqLen;
    spec.residual_scale = 0.2;
    spec.seed = 9;
    testing::WriteSynth(spec, dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }

  void MakeWorkers(int64_t kv_tokens) {
    for (int role = 0; role < 2; ++role) {
      auto engine = testing::MakeEngine(dir_->path(), 1, kv_tokens, /*exit_layer=*/role == 0);
      ASSERT_NE(engine, nullptr);
      auto worker = std::make_unique<LocalWorker>(
          std::make_unique<WorkerRuntime>(std::move(engine), WorkerRuntimeOptions{}));
      (role == 0 ? draft_ : target_) = std::move(worker);
    }
  }

  std::unique_ptr<Scheduler> MakeScheduler(int64_t max_running, SchedulerOptions o = {},
                                           WorkerApi* draft = nullptr,
                                           WorkerApi* target = nullptr) {
    o.max_running = max_running;
    o.max_seq_len = o.max_seq_len > 0 ? o.max_seq_len : kMaxSeqLen;
    o.eos_token_ids = {2};
    return std::make_unique<Scheduler>(draft != nullptr ? *draft : *draft_,
                                       target != nullptr ? *target : *target_, nullptr, o);
  }

  // Runs `reqs` at once and returns their tokens; every one must succeed. `drafted`, when set,
  // receives the drafts they made in all.
  static std::vector<Tokens> RunAll(Scheduler& scheduler,
                                    const std::vector<GenerationRequest>& reqs,
                                    int64_t* drafted = nullptr) {
    std::vector<std::unique_ptr<Collector>> cs;
    for (const GenerationRequest& r : reqs) {
      cs.push_back(std::make_unique<Collector>());
      EXPECT_TRUE(scheduler.Submit(r, cs.back()->Sink()).ok());
    }
    std::vector<Tokens> out;
    for (auto& c : cs) {
      EXPECT_TRUE(c->Wait());
      EXPECT_TRUE(c->last().error.ok()) << c->last().error;
      if (drafted != nullptr) *drafted += c->last().usage.draft_tokens;
      out.push_back(c->tokens());
    }
    return out;
  }

  void ExpectNoBlocksUsed() {
    EXPECT_EQ(target_->runtime().engine().kv().used_blocks(), 0);
    EXPECT_EQ(draft_->runtime().engine().kv().used_blocks(), 0);
  }

  static GenerationRequest Guided(Tokens prompt, Tokens uncond, float scale, int32_t k,
                                  bool guide_draft, int64_t n) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0.0f;
    r.max_new_tokens = n;
    r.ignore_eos = true;
    r.num_speculative_tokens = k;
    Guidance g;
    g.scale = scale;
    g.uncond_prompt = std::move(uncond);
    g.draft = guide_draft;
    r.guidance = g;
    return r;
  }

  static inline ScopedTempDir* dir_ = nullptr;
  std::unique_ptr<LocalWorker> draft_, target_;
};

struct GreedyCase {
  Tokens prompt, uncond;
  float scale;
};

std::vector<GreedyCase> TenPromptsThreeScales() {
  std::vector<GreedyCase> cases;
  for (const float scale : {0.5f, 2.0f, 6.0f}) {
    for (int i = 0; i < 10; ++i) {
      Tokens prompt = {1};
      for (int j = 0; j < 5 + i % 4; ++j) prompt.push_back(3 + (i * 53 + j * 17) % 900);
      // BOS alone (the API's default) or a short unconditional text of its own.
      Tokens uncond = {1};
      if (i % 2 == 1) uncond.insert(uncond.end(), {400 + i, 37, 500 + 3 * i});
      cases.push_back({prompt, uncond, scale});
    }
  }
  return cases;
}

// Greedy guided decoding by the numpy reference: per case, its tokens and the relative gaps
// between the best and second-best guided logit at each step.
std::vector<std::pair<Tokens, std::vector<double>>> NumpyGreedy(
    const std::filesystem::path& model, const std::vector<GreedyCase>& cases, int n) {
  const std::filesystem::path in = model / "greedy_cases.txt";
  const std::filesystem::path out = model / "greedy_ref.txt";
  {
    std::ofstream f(in);
    for (const GreedyCase& c : cases) {
      f << c.scale << " " << absl::StrJoin(c.prompt, ",") << " " << absl::StrJoin(c.uncond, ",")
        << "\n";
    }
  }
  const std::string cmd = absl::StrCat(
      testing::Python(), " ",
      (testing::SourceDir() / "tests/services/coordinator/guided_greedy_reference.py").string(),
      " ", model.string(), " ", in.string(), " ", n, " ", out.string());
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<std::pair<Tokens, std::vector<double>>> result;
  std::ifstream f(out);
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream s(line);
    auto& [tokens, gaps] = result.emplace_back();
    tokens.resize(static_cast<size_t>(n));
    gaps.resize(static_cast<size_t>(n));
    for (int32_t& t : tokens) s >> t;
    for (double& g : gaps) s >> g;
  }
  EXPECT_EQ(result.size(), cases.size());
  return result;
}

TEST_F(GuidanceSchedulerTest, GreedyGuidedOutputIsTheSameForEveryKAndEqualsNumpy) {
  constexpr int64_t kNew = 16;
  const std::vector<GreedyCase> cases = TenPromptsThreeScales();
  struct Arm {
    std::string name;
    int32_t k;
    bool guide_draft;
    int64_t prefill_chunk;
    DraftMethod method = DraftMethod::kModel;
    int64_t pass_tokens = 0;  // both workers' pass budget, counting each companion's tokens
  };
  const std::vector<Arm> arms = {
      {"K=0", 0, false, 512},
      {"K=1", 1, false, 512},
      {"K=4", 4, false, 512},
      {"K=1 guided draft", 1, true, 512},
      {"K=4 guided draft", 4, true, 512},
      {"K=4 guided draft, chunks of 4", 4, true, 4},
      {"K=4 prompt lookup", 4, false, 512, DraftMethod::kNgram},
      {"K=4 guided draft, pass budget 64", 4, true, 512, DraftMethod::kModel, 64}};
  MakeWorkers(16 * 1024);
  std::vector<std::vector<Tokens>> outputs;
  for (const Arm& arm : arms) {
    SchedulerOptions o;
    o.prefill_chunk = arm.prefill_chunk;
    o.draft_pass_tokens = o.target_pass_tokens = arm.pass_tokens;
    auto scheduler = MakeScheduler(32, o);
    std::vector<GenerationRequest> reqs;
    for (const GreedyCase& c : cases) {
      reqs.push_back(Guided(c.prompt, c.uncond, c.scale, arm.k, arm.guide_draft, kNew));
      reqs.back().draft_method = arm.method;
    }
    int64_t drafted = 0;
    outputs.push_back(RunAll(*scheduler, reqs, &drafted));
    if (arm.k > 0) {
      EXPECT_GT(drafted, 0) << arm.name << " never drafted";
    }
    scheduler.reset();
    ExpectNoBlocksUsed();
  }
  for (size_t a = 1; a < arms.size(); ++a) {
    for (size_t i = 0; i < cases.size(); ++i) {
      EXPECT_EQ(outputs[a][i], outputs[0][i]) << arms[a].name << ", case " << i;
    }
  }

  // Plain K = 0 decoding with the guidance dropped: guidance must change most outputs.
  {
    auto scheduler = MakeScheduler(32);
    std::vector<GenerationRequest> reqs;
    for (const GreedyCase& c : cases) {
      GenerationRequest r = Guided(c.prompt, c.uncond, c.scale, 0, false, kNew);
      r.guidance.reset();
      reqs.push_back(r);
    }
    const std::vector<Tokens> unguided = RunAll(*scheduler, reqs);
    int changed = 0;
    for (size_t i = 0; i < cases.size(); ++i) changed += unguided[i] != outputs[0][i];
    std::printf("guidance changed %d of %zu greedy outputs\n", changed, cases.size());
    EXPECT_GE(changed, 15);
  }

  // The guided K = 0 output against numpy, up to the first step whose best two logits are too
  // close for fp32 to be sure of (relative gap under 1e-4; rare on this model).
  constexpr int kChecked = 8;
  const auto ref = NumpyGreedy(dir_->path(), cases, kChecked);
  int compared = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    for (int j = 0; j < kChecked; ++j) {
      if (ref[i].second[static_cast<size_t>(j)] < 1e-4) break;
      ASSERT_EQ(outputs[0][i][static_cast<size_t>(j)], ref[i].first[static_cast<size_t>(j)])
          << "case " << i << " token " << j;
      ++compared;
    }
  }
  std::printf("%d guided greedy tokens equal numpy's\n", compared);
  EXPECT_GE(compared, static_cast<int>(cases.size()) * kChecked * 9 / 10);
}

TEST_F(GuidanceSchedulerTest, PairsUnderKvPressurePreemptAsOneAndEndWithNoBlocks) {
  // A request needs about 5 blocks of 16 tokens (prompt 10 + 60 new) and its companion 4; each
  // pool holds 16 blocks, so a guided pair takes more than half of it.
  MakeWorkers(16 * 16);
  MismatchCounter draft(*draft_), target(*target_);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    Tokens prompt = {1};
    for (int j = 0; j < 9; ++j) prompt.push_back(3 + (i * 7 + j * 29) % 290);
    GenerationRequest r = Guided(prompt, {1, 600 + i, 700}, 1.5f + 0.5f * (i % 3), 1 + i % 4,
                                 /*guide_draft=*/i % 4 == 1, 60);
    if (i % 3 == 0) {
      r.sampling.temperature = 0.9f;
      r.seed = 5 + static_cast<uint64_t>(i);
    }
    if (i % 4 == 3) r.guidance.reset();  // unguided requests compete for the same blocks
    reqs.push_back(r);
  }
  auto scheduler = MakeScheduler(12, {}, &draft, &target);
  const std::vector<Tokens> pressed = RunAll(*scheduler, reqs);
  EXPECT_GT(scheduler->preemptions(), 0);
  scheduler.reset();
  EXPECT_EQ(draft.mismatches(), 0);
  EXPECT_EQ(target.mismatches(), 0);
  ExpectNoBlocksUsed();

  MakeWorkers(8192);
  auto ample = MakeScheduler(1);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(RunAll(*ample, {reqs[i]})[0], pressed[i]) << "request " << i;
  }
}

// A request that runs out of KV in the very round in which the only other running request
// finishes was not alone in the pool: it is requeued and finishes with its solo output, instead
// of failing as one that can never fit (which timing alone used to decide).
TEST_F(GuidanceSchedulerTest, PreemptedBesideARequestThatFinishesInTheSameRoundIsRequeued) {
  MakeWorkers(4096);
  GenerationRequest a = Guided({1, 5, 6, 7}, {1}, 1.0f, 0, false, 3);  // finishes in round 3
  a.guidance.reset();
  const GenerationRequest b = Guided({1, 8, 9, 10}, {1, 11}, 2.0f, 2, true, 20);
  const Tokens solo = RunAll(*MakeScheduler(1), {b})[0];

  TimedTarget target(*target_, /*hold_at=*/0, /*exhaust_at=*/3);
  auto scheduler = MakeScheduler(4, {}, nullptr, &target);
  absl::Cleanup unblock = [&target] { target.Unblock(); };
  Collector ca, cb;
  ASSERT_TRUE(scheduler->Submit(a, ca.Sink()).ok());
  const absl::StatusOr<Scheduler::RequestHandle> hb = scheduler->Submit(b, cb.Sink());
  ASSERT_TRUE(hb.ok());
  target.set_victim(*hb);
  target.Open();  // both were queued before the first admission
  ASSERT_TRUE(ca.Wait());
  ASSERT_TRUE(cb.Wait());
  EXPECT_TRUE(ca.last().error.ok()) << ca.last().error;
  EXPECT_TRUE(cb.last().error.ok()) << cb.last().error;
  EXPECT_EQ(cb.tokens(), solo);
  EXPECT_EQ(scheduler->preemptions(), 1);
  scheduler.reset();
  ExpectNoBlocksUsed();
}

// A request that cannot fit even alone fails with RESOURCE_EXHAUSTED although another waits
// behind it, which then runs; it used to go back to the head of the queue and fail again every
// round, forever. `big` is admitted alone, and `small` arrives during its first round.
TEST_F(GuidanceSchedulerTest, ARequestThatCannotFitAloneFailsWhileOthersWait) {
  MakeWorkers(2 * 16);
  TimedTarget target(*target_, /*hold_at=*/1, /*exhaust_at=*/0);
  auto scheduler = MakeScheduler(4, {}, nullptr, &target);
  absl::Cleanup unblock = [&target] { target.Unblock(); };
  const GenerationRequest big =
      Guided({1, 5, 6, 7, 8, 9, 10, 11, 12, 13}, {1, 600, 700}, 2.0f, 2, true, 60);
  GenerationRequest small = Guided({1, 8}, {1}, 1.0f, 1, false, 4);
  small.guidance.reset();
  Collector cbig, csmall;
  ASSERT_TRUE(scheduler->Submit(big, cbig.Sink()).ok());
  target.Open();
  target.WaitUntilHeld();
  ASSERT_TRUE(scheduler->Submit(small, csmall.Sink()).ok());
  target.Resume();
  ASSERT_TRUE(cbig.Wait(30)) << "preemptions so far: " << scheduler->preemptions();
  ASSERT_TRUE(csmall.Wait(60));
  EXPECT_EQ(cbig.last().error.code(), absl::StatusCode::kResourceExhausted) << cbig.last().error;
  EXPECT_TRUE(csmall.last().error.ok()) << csmall.last().error;
  EXPECT_EQ(csmall.tokens().size(), 4u);
  scheduler.reset();
  ExpectNoBlocksUsed();
}

TEST_F(GuidanceSchedulerTest, CancellingAGuidedRequestFreesBothHalvesOnBothWorkers) {
  MakeWorkers(4096);
  auto scheduler = MakeScheduler(4);
  Collector c;
  // The workers are read while the scheduler waits in the sink, with most of the request to go.
  PauseAt first_tokens(1);
  absl::StatusOr<Scheduler::RequestHandle> h = scheduler->Submit(
      Guided({1, 5, 6, 7}, {1, 9}, 3.0f, 3, true, 200), first_tokens.Wrap(c.Sink()));
  ASSERT_TRUE(h.ok());
  first_tokens.WaitUntilReached();
  EXPECT_TRUE(target_->runtime().CachedLength(*h | kCompanionIdBit).ok());
  EXPECT_TRUE(draft_->runtime().CachedLength(*h | kCompanionIdBit).ok());
  scheduler->Cancel(*h);
  first_tokens.Release();
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(c.last().error.code(), absl::StatusCode::kCancelled);
  ExpectNoBlocksUsed();
  EXPECT_FALSE(target_->runtime().CachedLength(*h | kCompanionIdBit).ok());
}

TEST_F(GuidanceSchedulerTest, MaxSeqLenBoundsTheLongerUnconditionalText) {
  MakeWorkers(4096);
  SchedulerOptions o;
  o.max_seq_len = 64;
  auto scheduler = MakeScheduler(4, o);
  Tokens uncond(40, 7);
  uncond[0] = 1;
  Collector c;
  ASSERT_TRUE(
      scheduler->Submit(Guided({1, 5, 6, 7, 8}, uncond, 2.0f, 4, true, 100), c.Sink()).ok());
  ASSERT_TRUE(c.Wait());
  ASSERT_TRUE(c.last().error.ok()) << c.last().error;
  EXPECT_EQ(c.last().finish, FinishReason::kLength);
  EXPECT_EQ(c.tokens().size(), 64u - 40u);
  scheduler.reset();
  ExpectNoBlocksUsed();
}

}  // namespace
}  // namespace specd
