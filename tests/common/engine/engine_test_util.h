// Shared fixtures for engine tests: synthetic checkpoints and small engines.
#ifndef SPECD_TESTS_COMMON_ENGINE_ENGINE_TEST_UTIL_H_
#define SPECD_TESTS_COMMON_ENGINE_ENGINE_TEST_UTIL_H_

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "base/status_macros.h"
#include "common/engine/llama_engine.h"
#include "common/synth/synth.h"
#include "gtest/gtest.h"
#include "tests/common/engine/recording_backend.h"
#include "tests/kernels/cuda_emulation/emulated_cuda.h"

namespace specd::testing {

// A small model with GQA (8 heads, 4 KV heads); other features are set by the caller.
inline ModelConfig SmallConfig() {
  ModelConfig c;
  c.vocab_size = 300;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 3;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 8;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.bos_token_ids = {1};
  c.eos_token_ids = {2};
  return c;
}

// The synthetic model the worker-runtime tests share: SmallConfig with 2 layers, its rows far from
// one-hot (a large residual scale), so that sampling is exercised.
inline SynthSpec WorkerTestSpec() {
  SynthSpec spec;
  spec.config = SmallConfig();
  spec.config.num_layers = 2;
  spec.residual_scale = 0.7;
  spec.embed_std = 0.5;
  return spec;
}

// The 16-token model of the chi-square tests (the joint of three tokens has 4096 cells): 3 layers,
// and a residual large enough that its 1-layer draft often disagrees, so rejections and
// residuals matter.
inline SynthSpec ChiSquareTestSpec() {
  SynthSpec spec;
  spec.config = SmallConfig();
  spec.config.vocab_size = 16;
  spec.config.num_layers = 3;
  spec.config.max_position_embeddings = 32;
  spec.residual_scale = 0.8;
  spec.embed_std = 1.0;
  spec.seed = 5;
  return spec;
}

inline void WriteSynth(const SynthSpec& spec, const std::filesystem::path& dir) {
  const absl::Status st = WriteSyntheticModel(spec, dir);
  ASSERT_TRUE(st.ok()) << st;
}

inline bool TestBackendIs(std::string_view wanted) {
  const char* name = std::getenv("SPECD_TEST_BACKEND");
  return name != nullptr && std::string_view(name) == wanted;
}

// SPECD_TEST_BACKEND=cpu-recording: the CPU inside a RecordingBackend, so that engines record
// and replay their forward passes as on a GPU (CI runs some engine tests so).
inline bool TestBackendRecords() { return TestBackendIs("cpu-recording"); }

// SPECD_TEST_BACKEND=cuda-emulated: the CUDA back end over the CUDA emulator
// (tests/kernels/cuda_emulation/), so that engine tests run the CUDA code, CUDA graphs included,
// where no GPU is (CI runs some engine tests so).
inline bool TestBackendEmulatesCuda() { return TestBackendIs("cuda-emulated"); }

// The CPU back end with `threads` threads, or the back end SPECD_TEST_BACKEND names ("cuda":
// scripts/gpu/device_check.sh runs the engine-level tests that compare an engine only with
// itself, such as invariance, greedy parity and the chi-square tests, on the GPU this way).
inline kernels::BackendOptions TestBackend(int threads) {
  kernels::BackendOptions backend;
  backend.kind = kernels::BackendKind::kCpu;
  backend.num_threads = threads;
  if (const char* name = std::getenv("SPECD_TEST_BACKEND");
      name != nullptr && *name != '\0' && !TestBackendRecords() && !TestBackendEmulatesCuda()) {
    absl::StatusOr<kernels::BackendKind> kind = kernels::ParseBackendKind(name);
    EXPECT_TRUE(kind.ok()) << kind.status();
    if (kind.ok()) backend.kind = *kind;
  }
  return backend;
}

// An engine of the model in `dir` on RecordingBackend over the CPU with `threads` threads.
inline absl::StatusOr<std::unique_ptr<LlamaEngine>> CreateRecordingEngine(
    const std::filesystem::path& dir, int threads, const EngineOptions& options,
    const LoadOptions& load = {}) {
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, LoadModelWeights(dir, load));
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> cpu, kernels::CreateCpuBackend(threads));
  return LlamaEngine::Create(std::move(weights), std::make_unique<RecordingBackend>(std::move(cpu)),
                             options);
}

// An engine of the model in `dir` on the emulated CUDA back end.
inline absl::StatusOr<std::unique_ptr<LlamaEngine>> CreateEmulatedCudaEngine(
    const std::filesystem::path& dir, const EngineOptions& options, const LoadOptions& load = {}) {
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> weights, LoadModelWeights(dir, load));
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend,
                         kernels::CreateEmulatedCudaBackend(kernels::CudaBackendOptions()));
  return LlamaEngine::Create(std::move(weights), std::move(backend), options);
}

// An engine of the model in `dir` on TestBackend(threads), on a RecordingBackend, or on the
// emulated CUDA back end.
inline std::unique_ptr<LlamaEngine> MakeTestEngine(const std::filesystem::path& dir, int threads,
                                                   const EngineOptions& options,
                                                   const LoadOptions& load = {}) {
  absl::StatusOr<std::unique_ptr<LlamaEngine>> engine =
      TestBackendRecords()        ? CreateRecordingEngine(dir, threads, options, load)
      : TestBackendEmulatesCuda() ? CreateEmulatedCudaEngine(dir, options, load)
                                  : CreateEngine(dir, TestBackend(threads), options, load);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

inline std::unique_ptr<LlamaEngine> MakeEngine(const std::filesystem::path& dir, int threads,
                                               int64_t kv_tokens = 2048, int64_t exit_layer = 0) {
  EngineOptions options;
  options.kv_capacity_tokens = kv_tokens;
  options.kv_block_size = 16;
  LoadOptions load;
  load.exit_layer = exit_layer;
  return MakeTestEngine(dir, threads, options, load);
}

// Runs `batch` and returns its logit rows on the host ([rows, vocab]); empty on failure.
inline std::vector<float> ForwardLogits(LlamaEngine& engine, std::span<const SequenceInput> batch) {
  absl::StatusOr<Logits> out = engine.Forward(batch);
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  absl::StatusOr<std::vector<float>> logits = engine.ReadLogits(*out);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *logits : std::vector<float>();
}

// Feeds `tokens` to a fresh sequence in one call and returns the logits at every position.
inline std::vector<float> PrefillAll(LlamaEngine& engine, KvPool::SeqId seq,
                                     const std::vector<int32_t>& tokens) {
  EXPECT_TRUE(engine.AddSequence(seq).ok());
  SequenceInput in;
  in.seq = seq;
  in.tokens = tokens;
  in.start_pos = 0;
  for (size_t i = 0; i < tokens.size(); ++i) in.logit_indices.push_back(static_cast<int32_t>(i));
  return ForwardLogits(engine, std::span<const SequenceInput>(&in, 1));
}

}  // namespace specd::testing

#endif  // SPECD_TESTS_COMMON_ENGINE_ENGINE_TEST_UTIL_H_
