// The engine after a back-end failure: an allocation that runs out of memory, a copy that fails,
// a device that cannot report its memory. A failure is reported with its own code and leaves the
// engine able to run every pass it could run before, with the same bits; nothing is recorded as
// done that was not done. Also: small growths of the metadata keep the recorded passes.
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/host_memory.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/common/engine/recording_backend.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using ::testing::HasSubstr;
using testing::RecordingBackend;
using testing::ScopedTempDir;

// The CPU back end with failures injected on demand (nothing fails until armed).
class FailingBackend final : public kernels::Backend {
 public:
  explicit FailingBackend(std::unique_ptr<kernels::Backend> inner) : inner_(std::move(inner)) {}

  // Scratch allocations that still succeed before one fails with RESOURCE_EXHAUSTED (as a
  // cudaMalloc out of memory); < 0: none fails. Counts down as they succeed.
  int scratch_allocations_left = -1;
  bool fail_uploads = false;                           // INTERNAL
  bool fail_kv_copies = false;                         // CopyKvRows: INTERNAL
  absl::Status memory_query;                           // QueryDeviceMemory's answer when not OK
  std::optional<kernels::DeviceMemory> device_memory;  // a device's answer, when set
  int64_t synchronizes = 0;
  int64_t kv_copies = 0;  // CopyKvRows calls that reached the CPU

  std::string_view name() const override { return "cpu-failing"; }
  int num_threads() const override { return inner_->num_threads(); }
  bool SupportsKvDtype(kernels::DType dtype) const override {
    return inner_->SupportsKvDtype(dtype);
  }
  absl::StatusOr<kernels::DeviceMemory> QueryDeviceMemory() const override {
    if (!memory_query.ok()) return memory_query;
    if (device_memory.has_value()) return *device_memory;
    return inner_->QueryDeviceMemory();
  }
  absl::Status Upload(void* device_dst, const void* host_src, int64_t bytes) override {
    if (fail_uploads) return absl::InternalError("injected upload failure");
    return inner_->Upload(device_dst, host_src, bytes);
  }
  absl::Status Download(void* host_dst, const void* device_src, int64_t bytes) override {
    return inner_->Download(host_dst, device_src, bytes);
  }
  absl::Status CopyDeviceToDevice(void* dst, const void* src, int64_t bytes) override {
    return inner_->CopyDeviceToDevice(dst, src, bytes);
  }
  absl::Status Synchronize() override {
    ++synchronizes;
    return inner_->Synchronize();
  }
  absl::Status CopyKvRows(const kernels::CopyKvRowsArgs& a) override {
    if (fail_kv_copies) return absl::InternalError("injected KV copy failure");
    ++kv_copies;
    return inner_->CopyKvRows(a);
  }

#define SPECD_FORWARDED_OP(Op) \
  absl::Status Op(const kernels::Op##Args& a) override { return inner_->Op(a); }
  SPECD_FORWARDED_OP(Matmul)
  SPECD_FORWARDED_OP(MatmulGroup)
  SPECD_FORWARDED_OP(RmsNorm)
  SPECD_FORWARDED_OP(Rope)
  SPECD_FORWARDED_OP(StoreKv)
  SPECD_FORWARDED_OP(Attention)
  SPECD_FORWARDED_OP(SwiGlu)
  SPECD_FORWARDED_OP(Embedding)
  SPECD_FORWARDED_OP(GatherRows)
  SPECD_FORWARDED_OP(CombineLogits)
  SPECD_FORWARDED_OP(ProcessRows)
  SPECD_FORWARDED_OP(SampleRows)
  SPECD_FORWARDED_OP(GatherProbs)
  SPECD_FORWARDED_OP(Logprobs)
#undef SPECD_FORWARDED_OP

 protected:
  absl::StatusOr<void*> AllocateRaw(int64_t bytes, kernels::MemoryKind kind) override {
    if (kind == kernels::MemoryKind::kScratch && scratch_allocations_left >= 0) {
      if (scratch_allocations_left == 0) {
        return absl::ResourceExhaustedError("injected out of memory");
      }
      --scratch_allocations_left;
    }
    return kernels::cpu::AllocateHostMemory(bytes);
  }
  void FreeRaw(void* data, int64_t bytes, kernels::MemoryKind kind) override {
    (void)kind;
    kernels::cpu::FreeHostMemory(data, bytes);
  }

 private:
  std::unique_ptr<kernels::Backend> inner_;
};

std::vector<int32_t> Tokens(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 131 + salt * 17 + 3) % 300);
  return t;
}

class FailureRecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SynthSpec spec;
    spec.config = testing::SmallConfig();
    spec.config.num_layers = 2;
    spec.config.max_position_embeddings = 512;
    spec.residual_scale = 0.7;
    testing::WriteSynth(spec, tmp_.path());
    options_.kv_capacity_tokens = 1024;
    options_.kv_block_size = 16;
  }

  // LlamaEngine::Create on a FailingBackend over the CPU (1 thread), which `arm` sets up first
  // when given (for failures during Create); `*backend` is set to it.
  absl::StatusOr<std::unique_ptr<LlamaEngine>> CreateOnFailingBackend(
      FailingBackend** backend, const EngineOptions& options,
      const std::function<void(FailingBackend&)>& arm = {}) {
    SPECD_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights,
                           LoadModelWeights(tmp_.path(), {}));
    SPECD_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> cpu, kernels::CreateCpuBackend(1));
    auto failing = std::make_unique<FailingBackend>(std::move(cpu));
    *backend = failing.get();
    if (arm) arm(*failing);
    return LlamaEngine::Create(std::move(weights), std::move(failing), options);
  }

  // The same, expected to succeed: null (after a failed expectation) when it does not.
  std::unique_ptr<LlamaEngine> FailingEngine(FailingBackend** backend,
                                             const EngineOptions& options) {
    absl::StatusOr<std::unique_ptr<LlamaEngine>> engine = CreateOnFailingBackend(backend, options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? *std::move(engine) : nullptr;
  }

  // An engine on a FailingBackend and one that never fails, each fed the same first pass (4
  // tokens of sequence 1: scratch for 64 tokens and 8 logit rows); `*backend` is set.
  void StartFailingAndFresh(FailingBackend** backend, std::unique_ptr<LlamaEngine>* engine,
                            std::unique_ptr<LlamaEngine>* fresh) {
    *engine = FailingEngine(backend, options_);
    *fresh = PlainEngine();
    ASSERT_NE(*engine, nullptr);
    ASSERT_NE(*fresh, nullptr);
    ASSERT_TRUE(Feed(**engine, 1, Tokens(4, 1), 1).ok());
    ASSERT_TRUE(Feed(**fresh, 1, Tokens(4, 1), 1).ok());
  }

  std::unique_ptr<LlamaEngine> PlainEngine() {
    absl::StatusOr<std::unique_ptr<LlamaEngine>> engine = CreateCpuEngine(tmp_.path(), 1, options_);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? *std::move(engine) : nullptr;
  }

  // Feeds `tokens` to `seq` after what it holds, with logits for the last `logits` of them;
  // returns the logits on the host.
  static absl::StatusOr<std::vector<float>> Feed(LlamaEngine& engine, KvPool::SeqId seq,
                                                 const std::vector<int32_t>& tokens, int logits) {
    if (!engine.kv().Has(seq)) SPECD_RETURN_IF_ERROR(engine.AddSequence(seq));
    SequenceInput in;
    in.seq = seq;
    in.tokens = tokens;
    SPECD_ASSIGN_OR_RETURN(in.start_pos, engine.kv().Length(seq));
    const int n = static_cast<int>(tokens.size());
    for (int j = n - logits; j < n; ++j) in.logit_indices.push_back(j);
    SPECD_ASSIGN_OR_RETURN(const Logits out,
                           engine.Forward(std::span<const SequenceInput>(&in, 1)));
    return engine.ReadLogits(out);
  }

  static void ExpectSameBits(const std::vector<float>& a, const std::vector<float>& b) {
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }

  // Feeds `engine` and `fresh` (one that never failed) the same pass: both run, and give the same
  // logits bit for bit.
  static void ExpectRunsAsFresh(LlamaEngine& engine, LlamaEngine& fresh, KvPool::SeqId seq,
                                const std::vector<int32_t>& tokens, int logits,
                                std::string_view what) {
    const absl::StatusOr<std::vector<float>> got = Feed(engine, seq, tokens, logits);
    ASSERT_TRUE(got.ok()) << what << ": " << got.status();
    const absl::StatusOr<std::vector<float>> want = Feed(fresh, seq, tokens, logits);
    ASSERT_TRUE(want.ok()) << want.status();
    ExpectSameBits(*got, *want);
  }

  ScopedTempDir tmp_;
  EngineOptions options_;
};

// Sized by a share of device memory, the engine takes the scratch of a full pass at start: a
// device without room for it is a start-up error naming the reserve, and a pass of
// max_pass_tokens then runs without growing the scratch.
TEST_F(FailureRecoveryTest, AMemoryShareTakesItsScratchReserveAtStart) {
  EngineOptions options = options_;
  options.gpu_memory_fraction = 0.5;
  options.max_pass_tokens = 256;
  for (const bool room : {false, true}) {
    SCOPED_TRACE(room ? "room" : "no room");
    FailingBackend* backend = nullptr;
    absl::StatusOr<std::unique_ptr<LlamaEngine>> engine =
        CreateOnFailingBackend(&backend, options, [room](FailingBackend& b) {
          // A 640 MiB device: the 320 MiB share leaves the KV cache what the fixed reserve leaves.
          b.device_memory = kernels::DeviceMemory{int64_t{640} << 20, int64_t{640} << 20};
          if (!room) b.scratch_allocations_left = 0;
        });
    if (!room) {
      ASSERT_EQ(engine.status().code(), absl::StatusCode::kResourceExhausted) << engine.status();
      EXPECT_THAT(engine.status().message(),
                  HasSubstr("reserving scratch for passes of 256 tokens"));
      continue;
    }
    ASSERT_TRUE(engine.ok()) << engine.status();
    const ModelConfig& c = (*engine)->config();
    const int64_t activations =
        256 * 4 * (2 * c.hidden_size + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.intermediate_size);
    const int64_t reserved = backend->allocated_bytes(kernels::MemoryKind::kScratch);
    EXPECT_GE(reserved, activations);
    ASSERT_TRUE(Feed(**engine, 1, Tokens(256, 1), 1).ok());
    // Only the per-pass metadata may grow (kilobytes); activations of the pass were reserved.
    EXPECT_LT(backend->allocated_bytes(kernels::MemoryKind::kScratch) - reserved, activations / 4);
  }
}

// The scratch grows 8 activation buffers for a larger pass; the third allocation runs out of
// memory. The pass is RESOURCE_EXHAUSTED, and every pass as small as before still runs, with the
// bits of an engine that never failed (the failed growth used to leave the third buffer null
// while the engine believed it grown: every later pass failed "must not be null").
TEST_F(FailureRecoveryTest, FailedActivationGrowthKeepsSmallerPassesRunning) {
  FailingBackend* backend = nullptr;
  std::unique_ptr<LlamaEngine> engine, fresh;
  ASSERT_NO_FATAL_FAILURE(StartFailingAndFresh(&backend, &engine, &fresh));
  ASSERT_NE(backend, nullptr);

  backend->scratch_allocations_left = 2;
  const absl::StatusOr<std::vector<float>> grow = Feed(*engine, 2, Tokens(100, 2), 1);
  ASSERT_EQ(grow.status().code(), absl::StatusCode::kResourceExhausted) << grow.status();
  EXPECT_THAT(grow.status().message(), HasSubstr("activations"));
  EXPECT_THAT(grow.status().message(), HasSubstr("injected out of memory"));
  EXPECT_EQ(*engine->kv().Length(2), 0);

  // Memory is still short: a pass that fits the old scratch allocates nothing and runs.
  backend->scratch_allocations_left = 0;
  ExpectRunsAsFresh(*engine, *fresh, 1, Tokens(1, 3), 1, "a 1-token pass after the failed growth");

  // Memory is back: the larger pass grows the rest and runs too.
  backend->scratch_allocations_left = -1;
  ExpectRunsAsFresh(*engine, *fresh, 2, Tokens(100, 2), 3, "the larger pass, memory back");
}

// The same for the logit rows: the final hidden states grow, the logits run out of memory.
TEST_F(FailureRecoveryTest, FailedLogitGrowthKeepsFewerRowsRunning) {
  FailingBackend* backend = nullptr;
  std::unique_ptr<LlamaEngine> engine, fresh;
  ASSERT_NO_FATAL_FAILURE(StartFailingAndFresh(&backend, &engine, &fresh));
  ASSERT_NE(backend, nullptr);

  backend->scratch_allocations_left = 1;
  const absl::StatusOr<std::vector<float>> grow = Feed(*engine, 1, Tokens(20, 2), 20);
  ASSERT_EQ(grow.status().code(), absl::StatusCode::kResourceExhausted) << grow.status();
  EXPECT_THAT(grow.status().message(), HasSubstr("logits"));
  EXPECT_EQ(*engine->kv().Length(1), 4);

  backend->scratch_allocations_left = 0;
  ExpectRunsAsFresh(*engine, *fresh, 1, Tokens(3, 3), 2, "a 2-row pass after the failed growth");
}

// A draft tree of two children (nodes 0 and 1) after a 14-token prompt fills block 0; keeping
// node 1 moves its KV (and, with prefix caching, its recorded token) from slot 15 to slot 14.
class CompactionFailureTest : public FailureRecoveryTest {
 protected:
  static constexpr int32_t kPrompt = 14;

  std::vector<int32_t> Prompt() const { return Tokens(kPrompt, 7); }

  void FeedTree(LlamaEngine& engine) {
    ASSERT_TRUE(Feed(engine, 1, Prompt(), 1).ok());
    const std::vector<int32_t> children = {40, 41};
    const std::vector<int32_t> positions = {kPrompt, kPrompt};
    const std::vector<uint64_t> masks = {0b01, 0b10};
    SequenceInput in;
    in.seq = 1;
    in.start_pos = kPrompt;
    in.tokens = children;
    in.positions = positions;
    in.tree_mask = masks;
    in.logit_indices = {0, 1};
    const absl::StatusOr<Logits> out = engine.Forward(std::span<const SequenceInput>(&in, 1));
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE(engine.Synchronize().ok());
    ASSERT_EQ(*engine.kv().Length(1), kPrompt + 2);
  }

  // Whether a new sequence fed `tail` after the prompt finds block 0 in the prefix cache (the
  // pool keys it by the tokens it records for it).
  static bool BlockZeroCachedAs(LlamaEngine& engine, KvPool::SeqId seq,
                                const std::vector<int32_t>& prompt,
                                const std::vector<int32_t>& tail) {
    std::vector<int32_t> tokens = prompt;
    tokens.insert(tokens.end(), tail.begin(), tail.end());
    EXPECT_TRUE(engine.AddSequence(seq).ok());
    const absl::StatusOr<int64_t> attached = engine.AttachCached(seq, tokens, 16);
    EXPECT_TRUE(attached.ok()) << attached.status();
    return attached.ok() && *attached == 16;
  }
};

// A compaction whose upload or KV copy fails changes nothing in the pool: the sequence keeps its
// length and the tokens it records (they used to move before the copy, so the block was keyed
// by the kept node's token although its KV never moved); the failed upload is waited for.
TEST_F(CompactionFailureTest, FailedCopyLeavesTheRecordedTokens) {
  for (const bool fail_upload : {true, false}) {
    SCOPED_TRACE(fail_upload ? "upload fails" : "KV copy fails");
    FailingBackend* backend = nullptr;
    std::unique_ptr<LlamaEngine> engine = FailingEngine(&backend, options_);
    ASSERT_NE(engine, nullptr);
    ASSERT_TRUE(engine->kv().prefix_caching());
    FeedTree(*engine);
    backend->fail_uploads = fail_upload;
    backend->fail_kv_copies = !fail_upload;
    const int64_t synchronized = backend->synchronizes;
    const absl::Status st = engine->CompactKv(1, kPrompt, std::vector<int32_t>{1});
    EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
    EXPECT_GT(backend->synchronizes, synchronized);
    EXPECT_EQ(*engine->kv().Length(1), kPrompt + 2);
    backend->fail_uploads = backend->fail_kv_copies = false;

    // The pool still records node 0's token at slot 14: block 0 is cached as prompt, 40, 41.
    ASSERT_TRUE(engine->CacheCommitted(1, 16).ok());
    EXPECT_TRUE(BlockZeroCachedAs(*engine, 2, Prompt(), {40, 41, 0}));
    EXPECT_FALSE(BlockZeroCachedAs(*engine, 3, Prompt(), {41, 41, 0}));

    // Now that block 0 is cached, compacting into it is refused before any KV is written.
    const int64_t copies = backend->kv_copies;
    const absl::Status shared = engine->CompactKv(1, kPrompt, std::vector<int32_t>{1});
    EXPECT_EQ(shared.code(), absl::StatusCode::kFailedPrecondition) << shared;
    EXPECT_EQ(backend->kv_copies, copies);
    EXPECT_EQ(*engine->kv().Length(1), kPrompt + 2);
  }
}

// After a failed compaction, the same compaction succeeds and moves the token with the KV.
TEST_F(CompactionFailureTest, RetryAfterAFailedCopySucceeds) {
  FailingBackend* backend = nullptr;
  std::unique_ptr<LlamaEngine> engine = FailingEngine(&backend, options_);
  ASSERT_NE(engine, nullptr);
  FeedTree(*engine);
  backend->fail_kv_copies = true;
  EXPECT_FALSE(engine->CompactKv(1, kPrompt, std::vector<int32_t>{1}).ok());
  backend->fail_kv_copies = false;
  ASSERT_TRUE(engine->CompactKv(1, kPrompt, std::vector<int32_t>{1}).ok());
  EXPECT_EQ(*engine->kv().Length(1), kPrompt + 1);
  ASSERT_TRUE(Feed(*engine, 1, {77}, 1).ok());
  ASSERT_TRUE(engine->CacheCommitted(1, 16).ok());
  EXPECT_TRUE(BlockZeroCachedAs(*engine, 2, Prompt(), {41, 77, 0}));
}

// Only a back end without device memory (UNIMPLEMENTED, the CPU) sizes the KV cache by
// kv_capacity_tokens when a memory fraction is asked for; any other failure to report the
// device's memory is an error, not a silent fallback.
TEST_F(FailureRecoveryTest, MemoryQueryFailureIsAnErrorUnlessUnimplemented) {
  EngineOptions options = options_;
  options.gpu_memory_fraction = 0.5;
  {
    FailingBackend* backend = nullptr;
    std::unique_ptr<LlamaEngine> engine = FailingEngine(&backend, options);
    ASSERT_NE(engine, nullptr);  // the CPU answers UNIMPLEMENTED
    EXPECT_EQ(engine->kv().total_blocks(), 1024 / 16);
  }
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights = LoadModelWeights(tmp_.path(), {});
  ASSERT_TRUE(weights.ok()) << weights.status();
  absl::StatusOr<std::unique_ptr<kernels::Backend>> cpu = kernels::CreateCpuBackend(1);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto failing = std::make_unique<FailingBackend>(*std::move(cpu));
  failing->memory_query = absl::InternalError("injected cudaMemGetInfo failure");
  const absl::StatusOr<std::unique_ptr<LlamaEngine>> engine =
      LlamaEngine::Create(*std::move(weights), std::move(failing), options);
  ASSERT_EQ(engine.status().code(), absl::StatusCode::kInternal) << engine.status();
  EXPECT_THAT(engine.status().message(), HasSubstr("gpu_memory_fraction"));
  EXPECT_THAT(engine.status().message(), HasSubstr("injected cudaMemGetInfo failure"));
}

// The metadata buffer grows geometrically: after a large pass, a slightly larger one moves no
// buffer, so the recorded passes stay (each growth of the device metadata discards them all).
TEST_F(FailureRecoveryTest, SmallMetadataGrowthKeepsRecordings) {
  absl::StatusOr<std::unique_ptr<LlamaEngine>> created =
      testing::CreateRecordingEngine(tmp_.path(), 1, options_);
  ASSERT_TRUE(created.ok()) << created.status();
  LlamaEngine& engine = **created;
  auto* backend = dynamic_cast<RecordingBackend*>(&engine.backend());
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(Feed(engine, 1, Tokens(8, 1), 1).ok());
  int salt = 10;
  const auto decode = [&] { ASSERT_TRUE(Feed(engine, 1, Tokens(1, ++salt), 1).ok()); };
  // Passes over kMaxRecordedTokens run unpadded and are never recorded.
  ASSERT_TRUE(Feed(engine, 2, Tokens(300, 2), 1).ok());
  decode();
  decode();  // recorded
  decode();  // replayed
  const int64_t recordings = backend->recordings();
  const int64_t replays = backend->replays();
  ASSERT_GT(recordings, 0);
  ASSERT_GT(replays, 0);
  // 10 more tokens: the same activation scratch (steps of 64 tokens), 160 more metadata bytes.
  ASSERT_TRUE(Feed(engine, 3, Tokens(310, 3), 1).ok());
  decode();
  EXPECT_EQ(backend->recordings(), recordings);
  EXPECT_EQ(backend->replays(), replays + 1);
}

}  // namespace
}  // namespace specd
