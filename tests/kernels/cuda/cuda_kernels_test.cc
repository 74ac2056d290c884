// CUDA back end checks beyond the conformance suite (which runs every op on this back end too):
//  * the matmul's tile shapes (tokens per warp 1, 2, 4, 8) give the same bits for every row, in
//    a group and in the gate/up product with swiglu;
//  * ProcessRows matches the CPU reference: argmax and one-hot rows bit for bit, sampled rows to
//    one unit in the last place with the same kept tokens;
//  * an id out of range in device memory fails the next Synchronize, naming the op, and nothing
//    after it;
//  * recorded work (a CUDA graph) replays with new inputs exactly as eager execution.
// Attention and the KV-cache ops have their own file, attention_test.cc. Every test skips, saying
// why, where no CUDA device is present.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/processed.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/kernels/conformance/backend_under_test.h"
#include "tests/kernels/cpu/reference.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace specd::kernels {
namespace {

using conformance::Device;
using cpu_test::RandomFloats;
using cpu_test::RandomWeight;
using cpu_test::SameBits;
using cpu_test::TestWeight;
using cuda_test::CudaTest;
using cuda_test::MakeCuda;

// 67 rows take one row per warp at one token per warp (too few blocks for the SMs otherwise),
// 2100 rows two (on any GPU of up to 262 SMs).
TEST_F(CudaTest, MatmulTileShapesGiveTheSameBits) {
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{67, 5},
                                     {67, 64},
                                     {67, 700},
                                     {67, 3072},
                                     {2100, 64},
                                     {2100, 768}}) {
      const int64_t n = 19;
      const TestWeight w = RandomWeight(dtype, rows, cols, rng_);
      const TestWeight lead = RandomWeight(dtype, 33, cols, rng_);
      const TestWeight w2 = RandomWeight(dtype, rows, cols, rng_);
      const std::vector<float> x = RandomFloats(n * cols, rng_);
      std::vector<float> first;
      for (const int tw : {1, 2, 4, 8}) {
        CudaBackendOptions options;
        options.matmul_tokens_per_warp = tw;
        std::unique_ptr<Backend> backend = MakeCuda(options);
        ASSERT_NE(backend, nullptr);
        Device device(*backend);
        float* y = device.Output<float>(n * rows);
        ASSERT_TRUE(
            backend->Matmul({device.Put(x), {device.Put(w.bytes), dtype, rows, cols}, y, n}).ok());
        const std::vector<float> got = device.Get(y, n * rows);
        if (first.empty()) first = got;
        EXPECT_TRUE(SameBits(got, first))
            << DTypeName(dtype) << " " << rows << " x " << cols << ", tokens per warp " << tw;
        // And a row fed alone gives that row's bits.
        const std::vector<float> one(x.begin() + 11 * cols, x.begin() + 12 * cols);
        float* y1 = device.Output<float>(rows);
        ASSERT_TRUE(
            backend->Matmul({device.Put(one), {device.Put(w.bytes), dtype, rows, cols}, y1, 1})
                .ok());
        EXPECT_TRUE(SameBits(device.Get(y1, rows), std::vector<float>(first.begin() + 11 * rows,
                                                                      first.begin() + 12 * rows)));
        // And as the second part of a group, behind another part's blocks.
        MatmulGroupArgs g;
        g.n_parts = 2;
        const float* dx = device.Put(x);
        g.parts[0] = {dx, {device.Put(lead.bytes), dtype, lead.rows, cols}, nullptr, n};
        g.parts[0].y = device.Output<float>(n * lead.rows);
        g.parts[1] = {
            dx, {device.Put(w.bytes), dtype, rows, cols}, device.Output<float>(n * rows), n};
        ASSERT_TRUE(backend->MatmulGroup(g).ok());
        EXPECT_TRUE(SameBits(device.Get(g.parts[1].y, n * rows), first))
            << DTypeName(dtype) << " " << rows << " x " << cols << ", tokens per warp " << tw
            << ", grouped";
        // And as the gate of a gate/up product with swiglu, whose warps reduce both (halving
        // the rows per warp): the bits of SwiGlu on the separate products.
        MatmulGroupArgs gated = g;
        gated.swiglu = true;
        gated.parts[0] = g.parts[1];
        gated.parts[0].y = device.Output<float>(n * rows);
        gated.parts[1] = {
            dx, {device.Put(w2.bytes), dtype, rows, cols}, device.Output<float>(n * rows), n};
        ASSERT_TRUE(backend->MatmulGroup(gated).ok());
        float* up = device.Output<float>(n * rows);
        ASSERT_TRUE(backend->Matmul({dx, gated.parts[1].w, up, n}).ok());
        float* want = device.Output<float>(n * rows);
        ASSERT_TRUE(backend->SwiGlu({g.parts[1].y, up, want, n, rows}).ok());
        EXPECT_TRUE(SameBits(device.Get(gated.parts[0].y, n * rows), device.Get(want, n * rows)))
            << DTypeName(dtype) << " " << rows << " x " << cols << ", tokens per warp " << tw
            << ", swiglu";
        EXPECT_TRUE(device.GuardsIntact());
      }
    }
  }
}

TEST_F(CudaTest, ProcessRowsMatchesTheCpuToTheLastBitButOne) {
  std::unique_ptr<Backend> backend = MakeCuda({});
  ASSERT_NE(backend, nullptr);
  Device device(*backend);
  const int64_t vocab = 32000;
  struct Case {
    float temperature, top_p, min_p;
    int32_t top_k;
    RowMode mode;
  };
  const std::vector<Case> cases = {{1.0f, 1.0f, 0.0f, 0, RowMode::kSample},
                                   {0.7f, 0.9f, 0.0f, 0, RowMode::kSample},
                                   {1.3f, 0.95f, 0.05f, 50, RowMode::kSample},
                                   {0.8f, 1.0f, 0.1f, 0, RowMode::kSample},
                                   {1.0f, 0.8f, 0.0f, 0, RowMode::kArgmaxOfProcessed},
                                   {0.0f, 1.0f, 0.0f, 0, RowMode::kGreedy}};
  const int64_t n = static_cast<int64_t>(cases.size());
  // Logits with an LLM-like spread, quantised so that ties occur.
  std::vector<float> logits = RandomFloats(n * vocab, rng_, -12, 12);
  for (float& x : logits) x = std::round(x * 64.0f) / 64.0f;
  std::vector<RowSampling> rows(cases.size());
  for (size_t r = 0; r < cases.size(); ++r) {
    rows[r].params.temperature = cases[r].temperature;
    rows[r].params.top_p = cases[r].top_p;
    rows[r].params.min_p = cases[r].min_p;
    rows[r].params.top_k = cases[r].top_k;
    rows[r].mode = cases[r].mode;
    rows[r].prob_slot = static_cast<int32_t>(r);
  }
  const std::vector<int32_t> history = {0};
  ProcessRowsArgs a;
  a.logits = device.Put(logits);
  a.n_rows = n;
  a.vocab = vocab;
  a.rows = device.Put(rows);
  a.history = device.Put(history);
  a.history_len = 1;
  a.probs = device.Output<float>(n * vocab);
  a.prob_capacity = n;
  a.argmax = device.Output<int32_t>(n);
  a.error = device.Output<int32_t>(n);
  ASSERT_TRUE(backend->ProcessRows(a).ok());
  const std::vector<float> probs = device.Get(a.probs, n * vocab);
  const std::vector<int32_t> argmax = device.Get(a.argmax, n);
  for (size_t r = 0; r < cases.size(); ++r) {
    const std::span<const float> row(logits.data() + r * vocab, static_cast<size_t>(vocab));
    std::vector<float> want(static_cast<size_t>(vocab));
    ASSERT_TRUE(cpu::ProcessedDistribution(row, rows[r].params, {}, want).ok());
    int32_t want_argmax = *cpu::GreedyToken(row, rows[r].params, {});
    if (cases[r].mode == RowMode::kArgmaxOfProcessed) {
      want_argmax = cpu::ArgMaxLowestId(want);
      std::fill(want.begin(), want.end(), 0.0f);
      want[static_cast<size_t>(want_argmax)] = 1.0f;
    }
    EXPECT_EQ(argmax[r], want_argmax) << "row " << r;
    const std::vector<float> got(probs.begin() + r * vocab, probs.begin() + (r + 1) * vocab);
    if (cases[r].mode != RowMode::kSample) {
      EXPECT_TRUE(SameBits(got, want)) << "row " << r;
      continue;
    }
    for (int64_t i = 0; i < vocab; ++i) {
      ASSERT_EQ(got[i] == 0.0f, want[i] == 0.0f) << "row " << r << " token " << i << " kept";
      ASSERT_LE(std::fabs(got[i] - want[i]), std::ldexp(std::fabs(want[i]), -22))
          << "row " << r << " token " << i;
    }
  }
}

TEST_F(CudaTest, AnIdOutOfRangeFailsTheNextSynchronizeOnly) {
  std::unique_ptr<Backend> backend = MakeCuda({});
  ASSERT_NE(backend, nullptr);
  Device device(*backend);
  const TestWeight table = RandomWeight(DType::kF32, 10, 8, rng_);
  const std::vector<int32_t> ids = {3, 10};
  float* out = device.Output<float>(16);
  ASSERT_TRUE(
      backend->Embedding({{device.Put(table.bytes), DType::kF32, 10, 8}, device.Put(ids), out, 2})
          .ok());
  const absl::Status st = backend->Synchronize();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("Embedding: ids at index 1"), std::string::npos) << st;
  EXPECT_TRUE(backend->Synchronize().ok());
  const std::vector<float> got = device.Get(out, 16);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(got[i], table.values[3 * 8 + i]);
  for (int i = 8; i < 16; ++i) EXPECT_EQ(got[i], 0.0f);
}

TEST_F(CudaTest, RecordedWorkReplaysWithNewInputs) {
  std::unique_ptr<Backend> backend = MakeCuda({});
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->SupportsRecording());
  Device device(*backend);
  const int64_t rows = 48, cols = 256, n = 3;
  const TestWeight w = RandomWeight(DType::kBF16, rows, cols, rng_);
  const WeightView view{device.Put(w.bytes), DType::kBF16, rows, cols};
  float* x = device.Put(RandomFloats(n * cols, rng_));
  float* y = device.Output<float>(n * rows);
  const float* norm = device.Put(RandomFloats(rows, rng_, 0.5f, 1.5f));
  ASSERT_TRUE(backend->BeginRecording().ok());
  ASSERT_TRUE(backend->Matmul({x, view, y, n}).ok());
  ASSERT_TRUE(backend->RmsNorm({y, norm, y, n, rows, 1e-5f}).ok());
  absl::StatusOr<std::unique_ptr<RecordedWork>> work = backend->EndRecording();
  ASSERT_TRUE(work.ok()) << work.status();
  for (int round = 0; round < 2; ++round) {
    const std::vector<float> input = RandomFloats(n * cols, rng_);
    Buffer staging = *backend->Allocate(n * cols * 4, MemoryKind::kStaging, "test");
    std::memcpy(staging.data(), input.data(), input.size() * 4);
    ASSERT_TRUE(backend->Upload(x, staging.data(), n * cols * 4).ok());
    ASSERT_TRUE(backend->Replay(**work).ok());
    const std::vector<float> replayed = device.Get(y, n * rows);
    ASSERT_TRUE(backend->Matmul({x, view, y, n}).ok());
    ASSERT_TRUE(backend->RmsNorm({y, norm, y, n, rows, 1e-5f}).ok());
    EXPECT_TRUE(SameBits(replayed, device.Get(y, n * rows))) << "round " << round;
  }
}

}  // namespace
}  // namespace specd::kernels
