// RmsNorm, Rope, SwiGlu and Embedding of the CPU back end against double-precision
// references, with guard zones around every output.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/kernels/cpu/reference.h"

namespace specd::kernels {
namespace {

using cpu::CpuIsa;
using cpu_test::AllClose;
using cpu_test::GuardedBuffer;
using cpu_test::RandomFloats;
using cpu_test::RandomWeight;
using cpu_test::SameBits;
using cpu_test::TestWeight;

// (n_tokens, dim, threads, isa)
using OpCase = std::tuple<int64_t, int64_t, int, CpuIsa>;

std::string OpCaseName(const ::testing::TestParamInfo<OpCase>& info) {
  const auto [n, dim, threads, isa] = info.param;
  return absl::StrCat("t", n, "_d", dim, "_th", threads, "_", cpu::CpuIsaName(isa));
}

class OpsTest : public ::testing::TestWithParam<OpCase> {
 protected:
  void SetUp() override {
    const auto [n, dim, threads, isa] = GetParam();
    if (!cpu::CpuIsaSupported(isa)) GTEST_SKIP() << "this CPU cannot run " << cpu::CpuIsaName(isa);
    n_ = n;
    dim_ = dim;
    auto backend = CreateCpuBackendWithIsa(threads, isa);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    rng_.seed(static_cast<uint32_t>(n * 1000 + dim));
  }

  int64_t n_ = 0, dim_ = 0;
  std::unique_ptr<Backend> backend_;
  std::mt19937 rng_;
};

TEST_P(OpsTest, RmsNorm) {
  const std::vector<float> x = RandomFloats(n_ * dim_, rng_, -3.0f, 3.0f);
  const std::vector<float> weight = RandomFloats(dim_, rng_, 0.5f, 1.5f);
  const float eps = 1e-5f;
  GuardedBuffer y(n_ * dim_);
  ASSERT_TRUE(backend_->RmsNorm({x.data(), weight.data(), y.data(), n_, dim_, eps}).ok());
  EXPECT_TRUE(y.GuardsIntact());

  std::vector<double> want(x.size());
  for (int64_t t = 0; t < n_; ++t) {
    double ss = 0.0;
    for (int64_t i = 0; i < dim_; ++i) ss += static_cast<double>(x[t * dim_ + i]) * x[t * dim_ + i];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(dim_) + eps);
    for (int64_t i = 0; i < dim_; ++i) want[t * dim_ + i] = x[t * dim_ + i] * r * weight[i];
  }
  EXPECT_TRUE(AllClose(y.data(), want, {1e-6}, 1e-5));

  // In place (y == x) gives the same bits.
  GuardedBuffer in_place(n_ * dim_, x);
  ASSERT_TRUE(
      backend_->RmsNorm({in_place.data(), weight.data(), in_place.data(), n_, dim_, eps}).ok());
  EXPECT_TRUE(SameBits(in_place.payload(), y.payload()));
  EXPECT_TRUE(in_place.GuardsIntact());
}

TEST_P(OpsTest, RmsNormOfZerosIsZero) {
  const std::vector<float> x(static_cast<size_t>(n_ * dim_), 0.0f);
  const std::vector<float> weight(static_cast<size_t>(dim_), 1.0f);
  GuardedBuffer y(n_ * dim_);
  ASSERT_TRUE(backend_->RmsNorm({x.data(), weight.data(), y.data(), n_, dim_, 1e-6f}).ok());
  EXPECT_TRUE(AllClose(y.data(), std::vector<double>(x.size(), 0.0), {0.0}, 0.0));
}

TEST_P(OpsTest, Rope) {
  // dim_ is used as the head count here; head_dim covers a tail of the 16-lane width.
  const int64_t n_heads = std::max<int64_t>(1, dim_ / 64);
  const int64_t head_dim = 18;
  const int64_t width = n_heads * head_dim;
  std::vector<float> inv_freq(head_dim / 2);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    inv_freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / head_dim));
  }
  std::vector<int32_t> pos(static_cast<size_t>(n_));
  for (int64_t t = 0; t < n_; ++t) pos[t] = static_cast<int32_t>(t * 37 % 4096);
  const std::vector<float> x = RandomFloats(n_ * width, rng_);
  GuardedBuffer y(n_ * width, x);
  ASSERT_TRUE(backend_->Rope({y.data(), pos.data(), inv_freq.data(), n_, n_heads, head_dim}).ok());
  EXPECT_TRUE(y.GuardsIntact());

  // The spec fixes the angle as an f32 product; the rotation itself is done in double here.
  std::vector<double> want(x.size());
  for (int64_t t = 0; t < n_; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      for (int64_t i = 0; i < head_dim / 2; ++i) {
        const float angle = static_cast<float>(pos[t]) * inv_freq[i];
        const double c = std::cos(static_cast<double>(angle));
        const double s = std::sin(static_cast<double>(angle));
        const int64_t base = t * width + h * head_dim;
        const double x0 = x[base + i], x1 = x[base + i + head_dim / 2];
        want[base + i] = x0 * c - x1 * s;
        want[base + i + head_dim / 2] = x1 * c + x0 * s;
      }
    }
  }
  EXPECT_TRUE(AllClose(y.data(), want, {1e-6}, 1e-6));
}

TEST_P(OpsTest, SwiGlu) {
  std::vector<float> gate = RandomFloats(n_ * dim_, rng_, -8.0f, 8.0f);
  gate[0] = -100.0f;  // exp(100) overflows to inf: silu must still be -0, not NaN
  if (gate.size() > 1) gate[1] = 100.0f;
  const std::vector<float> up = RandomFloats(n_ * dim_, rng_, -2.0f, 2.0f);
  GuardedBuffer out(n_ * dim_);
  ASSERT_TRUE(backend_->SwiGlu({gate.data(), up.data(), out.data(), n_, dim_}).ok());
  EXPECT_TRUE(out.GuardsIntact());
  std::vector<double> want(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    want[i] = g / (1.0 + std::exp(-g)) * up[i];
  }
  EXPECT_TRUE(AllClose(out.data(), want, {1e-6}, 1e-5));

  GuardedBuffer in_place(n_ * dim_, gate);
  ASSERT_TRUE(backend_->SwiGlu({in_place.data(), up.data(), in_place.data(), n_, dim_}).ok());
  EXPECT_TRUE(SameBits(in_place.payload(), out.payload()));
}

TEST_P(OpsTest, Embedding) {
  const int64_t vocab = 50;
  std::vector<int32_t> ids(static_cast<size_t>(n_));
  for (int64_t t = 0; t < n_; ++t) ids[t] = static_cast<int32_t>((t * 17 + 3) % vocab);
  ids[0] = vocab - 1;
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const TestWeight table = RandomWeight(dtype, vocab, dim_, rng_);
    GuardedBuffer out(n_ * dim_);
    ASSERT_TRUE(backend_
                    ->Embedding({.table = {table.data(), dtype, vocab, dim_},
                                 .ids = ids.data(),
                                 .out = out.data(),
                                 .n_tokens = n_})
                    .ok());
    EXPECT_TRUE(out.GuardsIntact());
    std::vector<double> want(static_cast<size_t>(n_ * dim_));
    for (int64_t t = 0; t < n_; ++t) {
      for (int64_t i = 0; i < dim_; ++i) want[t * dim_ + i] = table.values[ids[t] * dim_ + i];
    }
    EXPECT_TRUE(AllClose(out.data(), want, {0.0}, 0.0)) << DTypeName(dtype);  // exact
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, OpsTest,
                         ::testing::Combine(::testing::Values(1, 5, 70),
                                            ::testing::Values(1, 7, 16, 768, 4099),
                                            ::testing::Values(1, 3),
                                            ::testing::ValuesIn(cpu_test::AllIsas())),
                         OpCaseName);

// Row t of every row-wise op is the same however the rows are batched.
TEST(OpsInvarianceTest, RmsNormRowsIndependentOfBatch) {
  std::mt19937 rng(3);
  const int64_t n = 9, dim = 1000;
  const std::vector<float> x = RandomFloats(n * dim, rng);
  const std::vector<float> weight = RandomFloats(dim, rng);
  auto one = CreateCpuBackendWithIsa(1, cpu::BestCpuIsa());
  auto two = CreateCpuBackendWithIsa(2, cpu::BestCpuIsa());
  ASSERT_TRUE(one.ok() && two.ok());
  std::vector<float> all(x.size()), rows(x.size());
  ASSERT_TRUE((*one)->RmsNorm({x.data(), weight.data(), all.data(), n, dim, 1e-5f}).ok());
  for (int64_t t = 0; t < n; ++t) {
    ASSERT_TRUE(
        (*two)
            ->RmsNorm({x.data() + t * dim, weight.data(), rows.data() + t * dim, 1, dim, 1e-5f})
            .ok());
  }
  EXPECT_TRUE(SameBits(all, rows));
  for (const CpuIsa isa : cpu_test::SupportedIsas()) {
    auto backend = CreateCpuBackendWithIsa(3, isa);
    ASSERT_TRUE(backend.ok());
    std::vector<float> y(x.size());
    ASSERT_TRUE((*backend)->RmsNorm({x.data(), weight.data(), y.data(), n, dim, 1e-5f}).ok());
    EXPECT_TRUE(SameBits(all, y)) << cpu::CpuIsaName(isa);
  }
}

}  // namespace
}  // namespace specd::kernels
