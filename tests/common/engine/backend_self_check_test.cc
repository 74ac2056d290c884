// The start-up self-check (common/engine/backend_self_check.h): the CUDA code over the CUDA
// emulator and the recording CPU back end pass it, and back ends with one planted fault each (a
// kernel that is not row-invariant, one that is off by 1%, replays that differ from eager runs,
// a tree mask that changes the numbers, draws that are not the inverse CDF) fail it, with the
// property named.
#include "common/engine/backend_self_check.h"

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/synth/synth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/validate.h"
#include "tests/common/engine/engine_test_util.h"
#include "tests/common/engine/recording_backend.h"
#include "tests/kernels/cuda_emulation/emulated_cuda.h"

namespace specd {
namespace {

using ::testing::HasSubstr;

// A Llama-3-like small model: GQA 8/4, llama3 RoPE scaling, tied embeddings.
ModelConfig Served() {
  ModelConfig c = testing::SmallConfig();
  c.rope_theta = 500000.0;
  c.rope_scaling = {RopeScaling::Type::kLlama3, 32.0, 1.0, 4.0, 8192};
  c.tie_word_embeddings = true;
  return c;
}

EngineOptions Options(kernels::DType kv_dtype) {
  EngineOptions o;
  o.kv_block_size = 16;
  o.kv_dtype = kv_dtype;
  return o;
}

// A recording CPU back end with hooks that run after an op (eagerly or in a replay), to plant
// faults in its outputs: the memory is host memory.
class FaultyBackend : public testing::RecordingBackend {
 public:
  struct Hooks {
    std::function<void(const kernels::MatmulArgs&, bool replaying)> matmul;
    std::function<void(const kernels::AttentionArgs&)> attention;
    std::function<void(const kernels::SampleRowsArgs&)> sample_rows;
    std::function<void(const kernels::CombineLogitsArgs&)> combine_logits;
    std::function<void(const kernels::LogprobsArgs&)> logprobs;
  };
  explicit FaultyBackend(Hooks hooks)
      : RecordingBackend(*kernels::CreateCpuBackend(2)), hooks_(std::move(hooks)) {}

  absl::Status Matmul(const kernels::MatmulArgs& a) override {
    return RunThen(kernels::ValidateMatmulArgs(a), a, &kernels::Backend::Matmul,
                   [this](const kernels::MatmulArgs& b) {
                     if (hooks_.matmul) hooks_.matmul(b, replaying_);
                   });
  }
  absl::Status Attention(const kernels::AttentionArgs& a) override {
    return RunThen(kernels::ValidateAttentionArgs(a), a, &kernels::Backend::Attention,
                   hooks_.attention);
  }
  absl::Status SampleRows(const kernels::SampleRowsArgs& a) override {
    return RunThen(kernels::ValidateSampleRowsArgs(a), a, &kernels::Backend::SampleRows,
                   hooks_.sample_rows);
  }
  absl::Status CombineLogits(const kernels::CombineLogitsArgs& a) override {
    return RunThen(kernels::ValidateCombineLogitsArgs(a), a, &kernels::Backend::CombineLogits,
                   hooks_.combine_logits);
  }
  absl::Status Logprobs(const kernels::LogprobsArgs& a) override {
    return RunThen(kernels::ValidateLogprobsArgs(a), a, &kernels::Backend::Logprobs,
                   hooks_.logprobs);
  }
  absl::Status Replay(const kernels::RecordedWork& work) override {
    replaying_ = true;  // the replay runs now: this back end computes when asked
    const absl::Status st = RecordingBackend::Replay(work);
    replaying_ = false;
    return st;
  }

 private:
  // Enqueues the inner back end's `op`, then `hook` on its outputs when it succeeded and is set.
  template <typename Args>
  absl::Status RunThen(const absl::Status& checked, const Args& a,
                       absl::Status (kernels::Backend::*op)(const Args&),
                       std::type_identity_t<std::function<void(const Args&)>> hook) {
    return Enqueue(checked, [a, op, hook = std::move(hook), this] {
      const absl::Status st = (inner().*op)(a);
      if (st.ok() && hook) hook(a);
      return st;
    });
  }

  Hooks hooks_;
  bool replaying_ = false;
};

BackendFactory Faulty(FaultyBackend::Hooks hooks) {
  return [hooks]() -> absl::StatusOr<std::unique_ptr<kernels::Backend>> {
    return std::make_unique<FaultyBackend>(hooks);
  };
}

void Nudge(float* y, int64_t n, double relative) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(y[i] * (1.0 + relative));
}

TEST(BackendSelfCheckTest, TheCudaCodeOverTheEmulatorPasses) {
  kernels::BackendOptions cuda;
  cuda.kind = kernels::BackendKind::kCuda;
  if (kernels::CreateBackend(cuda).ok()) {
    GTEST_SKIP() << "a CUDA device is present: TheCudaBackEndPassesOnThisDevice checks the same "
                    "code on it (the emulator would take seconds of device time)";
  }
  if (absl::StatusOr<std::unique_ptr<kernels::Backend>> probe =
          kernels::CreateEmulatedCudaBackend(kernels::CudaBackendOptions());
      !probe.ok()) {
    GTEST_SKIP() << probe.status();
  }
  absl::StatusOr<ModelConfig> llama3b = ShapePreset("llama-3.2-3b");  // head size 128, group 3
  ASSERT_TRUE(llama3b.ok()) << llama3b.status();
  for (const kernels::DType dtype : {kernels::DType::kF32, kernels::DType::kBF16}) {
    for (ModelConfig served : {Served(), *llama3b}) {
      served.torch_dtype = dtype;
      const absl::Status st = SelfCheckBackend(
          [] { return kernels::CreateEmulatedCudaBackend(kernels::CudaBackendOptions()); }, served,
          Options(dtype));
      EXPECT_TRUE(st.ok()) << kernels::DTypeName(dtype) << ", head size " << served.head_dim << ": "
                           << st;
    }
  }
}

// CreateEngine checks the back ends that compute on a device, and trusts the CPU, its reference.
TEST(BackendSelfCheckTest, CreateEngineTellsTheCudaBackEndFromTheCpu) {
  absl::StatusOr<std::unique_ptr<kernels::Backend>> cuda =
      kernels::CreateEmulatedCudaBackend(kernels::CudaBackendOptions());
  if (!cuda.ok()) GTEST_SKIP() << cuda.status();
  EXPECT_TRUE(NeedsSelfCheck(**cuda));
  absl::StatusOr<std::unique_ptr<kernels::Backend>> cpu = kernels::CreateCpuBackend(1);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_FALSE(NeedsSelfCheck(**cpu));
}

// On a GPU (scripts/gpu/device_check.sh's engine_tests stage): the real CUDA back end, on the
// shapes of the benchmark pair, with every weight dtype and KV cache precision.
TEST(BackendSelfCheckTest, TheCudaBackEndPassesOnThisDevice) {
  kernels::BackendOptions cuda;
  cuda.kind = kernels::BackendKind::kCuda;
  if (absl::StatusOr<std::unique_ptr<kernels::Backend>> probe = kernels::CreateBackend(cuda);
      !probe.ok()) {
    GTEST_SKIP() << probe.status();
  }
  for (const char* shape : {"llama-3.2-1b", "llama-3.2-3b"}) {
    absl::StatusOr<ModelConfig> served = ShapePreset(shape);
    ASSERT_TRUE(served.ok()) << served.status();
    for (const kernels::DType dtype :
         {kernels::DType::kF32, kernels::DType::kBF16, kernels::DType::kF16}) {
      for (const kernels::DType kv : {kernels::DType::kF32, kernels::DType::kBF16}) {
        served->torch_dtype = dtype;
        const absl::Status st = SelfCheckBackend([&cuda] { return kernels::CreateBackend(cuda); },
                                                 *served, Options(kv));
        EXPECT_TRUE(st.ok()) << shape << ", " << kernels::DTypeName(dtype) << " weights, "
                             << kernels::DTypeName(kv) << " KV: " << st;
      }
    }
  }
}

TEST(BackendSelfCheckTest, TheRecordingCpuBackEndPassesWithEveryKvDtype) {
  ModelConfig served = Served();
  served.tie_word_embeddings = false;
  served.torch_dtype = kernels::DType::kF16;
  for (const kernels::DType kv :
       {kernels::DType::kF32, kernels::DType::kBF16, kernels::DType::kF16}) {
    const absl::Status st = SelfCheckBackend(Faulty({}), served, Options(kv));
    EXPECT_TRUE(st.ok()) << kernels::DTypeName(kv) << ": " << st;
  }
}

// The chi-square tests' model: 16 tokens, 32 positions, which the check's model must not inherit.
TEST(BackendSelfCheckTest, ATinyServedModelStillGetsAWholeCheck) {
  const ModelConfig served = testing::ChiSquareTestSpec().config;
  const ModelConfig check = SelfCheckConfig(served);
  EXPECT_EQ(check.vocab_size, 256);
  EXPECT_GE(check.max_position_embeddings, 64);
  const absl::Status st = SelfCheckBackend(Faulty({}), served, Options(kernels::DType::kF32));
  EXPECT_TRUE(st.ok()) << st;
}

TEST(BackendSelfCheckTest, AKernelThatIsNotRowInvariantFails) {
  // As a split-K chosen from the number of rows would: passes of several rows round row 0
  // differently.
  FaultyBackend::Hooks hooks;
  hooks.matmul = [](const kernels::MatmulArgs& a, bool) {
    if (a.n_tokens > 1) Nudge(a.y, a.w.rows, 1e-6);
  };
  const absl::Status st = SelfCheckBackend(Faulty(hooks), Served(), Options(kernels::DType::kF32));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("cpu-recording back end did not pass its start-up "
                        "self-check"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("in chunks of 7, 1, 12"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("must not depend on how its tokens are"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("--backend cpu"));
}

TEST(BackendSelfCheckTest, AKernelOffByOnePercentFails) {
  FaultyBackend::Hooks hooks;
  hooks.matmul = [](const kernels::MatmulArgs& a, bool) {
    Nudge(a.y, a.n_tokens * a.w.rows, 1e-2);
  };
  const absl::Status st = SelfCheckBackend(Faulty(hooks), Served(), Options(kernels::DType::kF32));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("far from the CPU's"));
}

TEST(BackendSelfCheckTest, ReplaysThatDifferFromEagerRunsFail) {
  // The prompt's chunk of one token made the one-token decode shape seen once, so the first decode
  // step alone is recorded and replayed, while the batch of two beside it runs eagerly.
  FaultyBackend::Hooks hooks;
  hooks.matmul = [](const kernels::MatmulArgs& a, bool replaying) {
    if (replaying) Nudge(a.y, a.n_tokens * a.w.rows, 1e-6);
  };
  const absl::Status st = SelfCheckBackend(Faulty(hooks), Served(), Options(kernels::DType::kF32));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("decode step 0 alone and in a batch of two"));
}

TEST(BackendSelfCheckTest, ATreeMaskThatChangesTheNumbersFails) {
  FaultyBackend::Hooks hooks;
  hooks.attention = [](const kernels::AttentionArgs& a) {
    if (a.tree_mask != nullptr) Nudge(a.out, a.n_tokens * a.n_heads * a.head_dim, 1e-6);
  };
  const absl::Status st = SelfCheckBackend(Faulty(hooks), Served(), Options(kernels::DType::kF32));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("a draft tree's nodes and their paths fed linearly"));
}

TEST(BackendSelfCheckTest, DrawsThatAreNotTheInverseCdfFail) {
  FaultyBackend::Hooks hooks;
  hooks.sample_rows = [](const kernels::SampleRowsArgs& a) {
    a.tokens[a.n - 1] = static_cast<int32_t>((a.tokens[a.n - 1] + 1) % a.vocab);
  };
  const absl::Status st = SelfCheckBackend(Faulty(hooks), Served(), Options(kernels::DType::kF32));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("the inverse CDF of the same row"));
}

TEST(BackendSelfCheckTest, GuidanceThatIsOffFails) {
  FaultyBackend::Hooks hooks;
  hooks.combine_logits = [](const kernels::CombineLogitsArgs& a) {
    for (int64_t i = 0; i < a.n_pairs; ++i) {
      Nudge(a.logits + static_cast<int64_t>(a.cond_rows[i]) * a.vocab, a.vocab, 1e-2);
    }
  };
  const absl::Status st = SelfCheckBackend(Faulty(hooks), Served(), Options(kernels::DType::kF32));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("processed row 0 gives token"));
}

TEST(BackendSelfCheckTest, LogprobsThatAreOffFail) {
  FaultyBackend::Hooks hooks;
  hooks.logprobs = [](const kernels::LogprobsArgs& a) {
    for (int64_t i = 0; i < a.n_queries; ++i) a.query_logprobs[i] -= 1e-3f;
  };
  const absl::Status st = SelfCheckBackend(Faulty(hooks), Served(), Options(kernels::DType::kF32));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("row 0 gives token 3 logprob"));
}

TEST(BackendSelfCheckTest, ABackEndThatCannotBeMadeKeepsItsError) {
  const absl::Status st = SelfCheckBackend(
      []() -> absl::StatusOr<std::unique_ptr<kernels::Backend>> {
        return absl::FailedPreconditionError("no CUDA device");
      },
      Served(), Options(kernels::DType::kF32));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(st.message()), HasSubstr("no CUDA device"));
}

}  // namespace
}  // namespace specd
