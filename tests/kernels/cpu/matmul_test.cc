// Matmul of the CPU back end against a double-precision reference, and its batch invariance.
#include <cmath>
#include <cstdint>
#include <memory>
#include <ostream>
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

struct Shape {
  int64_t rows;
  int64_t cols;
  int64_t n_tokens;
};

struct MatmulCase {
  Shape shape;
  DType dtype;
  int threads;
  CpuIsa isa;

  std::string ToString() const {
    return absl::StrCat(shape.rows, "x", shape.cols, "_t", shape.n_tokens, "_",
                        std::string(DTypeName(dtype)), "_th", threads, "_", cpu::CpuIsaName(isa));
  }
};

std::unique_ptr<Backend> MakeBackend(int threads, CpuIsa isa) {
  auto backend = CreateCpuBackendWithIsa(threads, isa);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(*backend) : nullptr;
}

// y_ref[t, o] = Σ_i w[o, i] x[t, i] in double, and Σ |w x| for the error bound.
void ReferenceMatmul(const TestWeight& w, const std::vector<float>& x, int64_t n_tokens,
                     std::vector<double>* y, std::vector<double>* abs_sum) {
  y->assign(static_cast<size_t>(n_tokens * w.rows), 0.0);
  abs_sum->assign(y->size(), 0.0);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t o = 0; o < w.rows; ++o) {
      double s = 0.0, a = 0.0;
      for (int64_t i = 0; i < w.cols; ++i) {
        const double p = w.values[o * w.cols + i] * static_cast<double>(x[t * w.cols + i]);
        s += p;
        a += std::fabs(p);
      }
      (*y)[t * w.rows + o] = s;
      (*abs_sum)[t * w.rows + o] = a;
    }
  }
}

std::vector<float> RunMatmul(Backend& backend, const TestWeight& w, const float* x,
                             int64_t n_tokens) {
  GuardedBuffer y(n_tokens * w.rows);
  const absl::Status s = backend.Matmul(
      {.x = x, .w = {w.data(), w.dtype, w.rows, w.cols}, .y = y.data(), .n_tokens = n_tokens});
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(y.GuardsIntact());
  return y.payload();
}

void PrintTo(const Shape& s, std::ostream* os) {
  *os << s.rows << "x" << s.cols << " x " << s.n_tokens << " tokens";
}
void PrintTo(const MatmulCase& c, std::ostream* os) { *os << c.ToString(); }

class MatmulTest : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulTest, MatchesDoubleReference) {
  const MatmulCase& c = GetParam();
  if (!cpu::CpuIsaSupported(c.isa)) GTEST_SKIP() << "this CPU cannot run " << c.ToString();
  std::mt19937 rng(static_cast<uint32_t>(c.shape.rows * 131 + c.shape.cols * 7 + c.shape.n_tokens));
  const TestWeight w = RandomWeight(c.dtype, c.shape.rows, c.shape.cols, rng);
  const std::vector<float> x = RandomFloats(c.shape.n_tokens * c.shape.cols, rng);
  auto backend = MakeBackend(c.threads, c.isa);
  ASSERT_NE(backend, nullptr);

  const std::vector<float> y = RunMatmul(*backend, w, x.data(), c.shape.n_tokens);
  std::vector<double> want, abs_sum;
  ReferenceMatmul(w, x, c.shape.n_tokens, &want, &abs_sum);
  // Error bound of an fp32 sum of cols/16 fused terms per lane and a 4-level tree:
  // (cols/16 + 5) * 2^-24 * Σ|w x|.
  const double gamma = (static_cast<double>(c.shape.cols) / 16 + 5) * std::ldexp(1.0, -24);
  std::vector<double> atol(abs_sum.size());
  for (size_t i = 0; i < atol.size(); ++i) atol[i] = gamma * abs_sum[i] + 1e-30;
  EXPECT_TRUE(AllClose(y.data(), want, atol, /*rtol=*/0.0));
}

std::vector<MatmulCase> MatmulCases() {
  const std::vector<Shape> shapes = {
      {1, 1, 1},     {3, 5, 1},     {17, 33, 2},   {5, 16, 7},    {64, 768, 1},
      {100, 768, 5}, {37, 100, 13}, {130, 48, 49}, {2049, 64, 3}, {768, 768, 5},
  };
  std::vector<MatmulCase> cases;
  for (const CpuIsa isa : cpu_test::AllIsas()) {
    for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (const Shape& shape : shapes) {
        for (const int threads : {1, 3}) cases.push_back({shape, dtype, threads, isa});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulTest, ::testing::ValuesIn(MatmulCases()),
                         [](const auto& info) { return info.param.ToString(); });

// Batch invariance: row t of the output is bit-identical however the tokens are grouped, however
// many threads run, and whichever kernel table runs.
class MatmulInvarianceTest : public ::testing::TestWithParam<std::tuple<DType, Shape>> {};

TEST_P(MatmulInvarianceTest, BitIdenticalAcrossBatchingThreadsAndIsas) {
  const auto [dtype, shape] = GetParam();
  std::mt19937 rng(1234);
  const TestWeight w = RandomWeight(dtype, shape.rows, shape.cols, rng);
  const int64_t n = shape.n_tokens;
  const std::vector<float> x = RandomFloats(n * shape.cols, rng);

  auto one_thread = MakeBackend(1, cpu::BestCpuIsa());
  ASSERT_NE(one_thread, nullptr);
  const std::vector<float> all_at_once = RunMatmul(*one_thread, w, x.data(), n);

  // Every token alone, on two threads.
  {
    auto backend = MakeBackend(2, cpu::BestCpuIsa());
    std::vector<float> y;
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<float> row = RunMatmul(*backend, w, x.data() + t * shape.cols, 1);
      y.insert(y.end(), row.begin(), row.end());
    }
    EXPECT_TRUE(SameBits(y, all_at_once)) << "one token at a time on 2 threads differs";
  }
  // Uneven groups (a K+1 = 5 verify block among others), on three threads.
  {
    auto backend = MakeBackend(3, cpu::BestCpuIsa());
    std::vector<float> y;
    const int64_t groups[] = {5, 1, 7, 2, 8};
    for (int64_t t = 0, g = 0; t < n; t += groups[g % 5], ++g) {
      const int64_t size = std::min(groups[g % 5], n - t);
      const std::vector<float> part = RunMatmul(*backend, w, x.data() + t * shape.cols, size);
      y.insert(y.end(), part.begin(), part.end());
    }
    EXPECT_TRUE(SameBits(y, all_at_once)) << "uneven groups on 3 threads differ";
  }
  // All at once on four threads, and on every other kernel table.
  {
    auto backend = MakeBackend(4, cpu::BestCpuIsa());
    EXPECT_TRUE(SameBits(RunMatmul(*backend, w, x.data(), n), all_at_once)) << "4 threads differ";
  }
  for (const CpuIsa isa : cpu_test::SupportedIsas()) {
    auto backend = MakeBackend(2, isa);
    EXPECT_TRUE(SameBits(RunMatmul(*backend, w, x.data(), n), all_at_once))
        << cpu::CpuIsaName(isa) << " differs from " << cpu::CpuIsaName(cpu::BestCpuIsa());
  }
}

INSTANTIATE_TEST_SUITE_P(
    DTypes, MatmulInvarianceTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Values(Shape{300, 200, 23}, Shape{96, 768, 13},
                                         Shape{7, 1000, 50})),
    [](const auto& info) {
      const Shape& s = std::get<1>(info.param);
      return absl::StrCat(std::string(DTypeName(std::get<0>(info.param))), "_", s.rows, "x", s.cols,
                          "_t", s.n_tokens);
    });

// A NaN in one token's input poisons that token's outputs only.
TEST(MatmulTest, NanStaysInItsRow) {
  std::mt19937 rng(7);
  const TestWeight w = RandomWeight(DType::kBF16, 40, 70, rng);
  std::vector<float> x = RandomFloats(4 * 70, rng);
  auto backend = MakeBackend(2, cpu::BestCpuIsa());
  ASSERT_NE(backend, nullptr);
  const std::vector<float> clean = RunMatmul(*backend, w, x.data(), 4);
  x[2 * 70 + 13] = NAN;
  const std::vector<float> poisoned = RunMatmul(*backend, w, x.data(), 4);
  for (int64_t t = 0; t < 4; ++t) {
    for (int64_t o = 0; o < 40; ++o) {
      const float got = poisoned[t * 40 + o];
      if (t == 2) {
        EXPECT_TRUE(std::isnan(got)) << "row " << o;
      } else {
        EXPECT_EQ(got, clean[t * 40 + o]) << "token " << t << " row " << o;
      }
    }
  }
}

TEST(MatmulTest, ZeroTokensIsANoOp) {
  auto backend = MakeBackend(1, cpu::BestCpuIsa());
  ASSERT_NE(backend, nullptr);
  const float w = 1.0f;
  EXPECT_TRUE(
      backend->Matmul({.x = nullptr, .w = {&w, DType::kF32, 1, 1}, .y = nullptr, .n_tokens = 0})
          .ok());
}

}  // namespace
}  // namespace specd::kernels
