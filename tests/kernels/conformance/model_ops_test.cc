// Conformance of the model ops (Matmul, MatmulGroup with and without swiglu or a folded norm,
// RmsNorm, Rope, SwiGlu, Embedding, GatherRows) on every available back end: against
// double-precision references written independently of kernels/, with finite outputs, intact
// guard zones, and batch invariance (a row alone and among 1..63 others, at any position, gives
// the same bits).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/kernels/conformance/backend_under_test.h"
#include "tests/kernels/cpu/reference.h"

namespace specd::kernels::conformance {
namespace {

using cpu_test::AllClose;
using cpu_test::RandomFloats;
using cpu_test::RandomWeight;
using cpu_test::SameBits;
using cpu_test::TestWeight;

// Any summation order of n fp32 terms errs by at most about n * 2^-24 * sum |term|.
std::vector<double> SumBound(const std::vector<double>& abs_sum, int64_t terms) {
  std::vector<double> atol(abs_sum.size());
  const double gamma = static_cast<double>(terms + 8) * std::ldexp(1.0, -24);
  for (size_t i = 0; i < atol.size(); ++i) atol[i] = gamma * abs_sum[i] + 1e-30;
  return atol;
}

// Rows `rows` of a [n, width] host array, in that order.
std::vector<float> PickRows(const std::vector<float>& all, int64_t width,
                            const std::vector<int>& rows) {
  std::vector<float> out;
  for (const int r : rows)
    out.insert(out.end(), all.begin() + r * width, all.begin() + (r + 1) * width);
  return out;
}

class ModelOpsTest : public BackendTest {
 protected:
  std::vector<float> Matmul(const TestWeight& w, const std::vector<float>& x, int64_t n) {
    const WeightView view{device().Put(w.bytes), w.dtype, w.rows, w.cols};
    float* y = device().Output<float>(n * w.rows);
    const absl::Status st = backend().Matmul({device().Put(x), view, y, n});
    EXPECT_TRUE(st.ok()) << st;
    return device().Get(y, n * w.rows);
  }
  std::vector<float> RmsNorm(const std::vector<float>& x, const std::vector<float>& weight,
                             int64_t n, int64_t dim) {
    float* y = device().Output<float>(n * dim);
    EXPECT_TRUE(backend().RmsNorm({device().Put(x), device().Put(weight), y, n, dim, 1e-5f}).ok());
    return device().Get(y, n * dim);
  }
  std::vector<float> Rope(const std::vector<float>& x, const std::vector<int32_t>& pos,
                          const std::vector<float>& inv_freq, int64_t heads, int64_t head_dim) {
    const int64_t n = static_cast<int64_t>(pos.size());
    float* d = device().Put(x);
    EXPECT_TRUE(
        backend().Rope({d, device().Put(pos), device().Put(inv_freq), n, heads, head_dim}).ok());
    return device().Get(d, n * heads * head_dim);
  }
  std::vector<float> SwiGlu(const std::vector<float>& gate, const std::vector<float>& up, int64_t n,
                            int64_t dim) {
    float* out = device().Output<float>(n * dim);
    EXPECT_TRUE(backend().SwiGlu({device().Put(gate), device().Put(up), out, n, dim}).ok());
    return device().Get(out, n * dim);
  }
};

TEST_P(ModelOpsTest, MatmulMatchesDoubleReferenceForEveryDtypeAndShape) {
  struct Shape {
    int64_t rows, cols, n;
  };
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const Shape s : {Shape{1, 1, 1}, Shape{3, 5, 1}, Shape{17, 33, 2}, Shape{64, 768, 1},
                          Shape{100, 768, 5}, Shape{130, 48, 49}, Shape{2049, 64, 3}}) {
      const TestWeight w = RandomWeight(dtype, s.rows, s.cols, rng_);
      const std::vector<float> x = RandomFloats(s.n * s.cols, rng_);
      const std::vector<float> y = Matmul(w, x, s.n);
      std::vector<double> want(static_cast<size_t>(s.n * s.rows)), abs_sum(want.size());
      for (int64_t t = 0; t < s.n; ++t) {
        for (int64_t o = 0; o < s.rows; ++o) {
          double acc = 0, mag = 0;
          for (int64_t i = 0; i < s.cols; ++i) {
            const double p = w.values[o * s.cols + i] * static_cast<double>(x[t * s.cols + i]);
            acc += p;
            mag += std::fabs(p);
          }
          want[t * s.rows + o] = acc;
          abs_sum[t * s.rows + o] = mag;
        }
      }
      EXPECT_TRUE(AllClose(y.data(), want, SumBound(abs_sum, s.cols), 0.0))
          << DTypeName(dtype) << " " << s.rows << "x" << s.cols << " x " << s.n;
    }
  }
}

TEST_P(ModelOpsTest, MatmulRowsAreBatchInvariant) {
  // 700 columns take the kernels' scalar loads, 768 (a multiple of 8) their vector loads.
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const int64_t cols : {700, 768}) {
      const int64_t rows = 96, n = 64;
      const TestWeight w = RandomWeight(dtype, rows, cols, rng_);
      const std::vector<float> x = RandomFloats(n * cols, rng_);
      for (const int r : {0, 31, 63}) {
        std::vector<float> reference;
        for (const std::vector<int>& batch : InvarianceBatches(n, r, rng_)) {
          const std::vector<float> y =
              Matmul(w, PickRows(x, cols, batch), static_cast<int64_t>(batch.size()));
          const int at = static_cast<int>(std::find(batch.begin(), batch.end(), r) - batch.begin());
          const std::vector<float> row(y.begin() + at * rows, y.begin() + (at + 1) * rows);
          if (reference.empty()) reference = row;
          EXPECT_TRUE(SameBits(row, reference))
              << DTypeName(dtype) << " " << cols << " columns: row " << r << " in a batch of "
              << batch.size();
        }
      }
      // x 4 bytes past a 16-byte boundary cannot take vector loads; the bits stay the same.
      std::vector<float> shifted(1);
      shifted.insert(shifted.end(), x.begin(), x.end());
      float* y = device().Output<float>(n * rows);
      const absl::Status st = backend().Matmul(
          {device().Put(shifted) + 1, {device().Put(w.bytes), w.dtype, w.rows, w.cols}, y, n});
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_TRUE(SameBits(device().Get(y, n * rows), Matmul(w, x, n)))
          << DTypeName(dtype) << " " << cols << " columns, x misaligned";
    }
  }
}

// q/k/v and gate/up run as groups: each part must have the bits of its own Matmul, whatever the
// other parts, their number and order, the tile shape chosen from n, or an accumulating part.
TEST_P(ModelOpsTest, MatmulGroupPartsHaveTheBitsOfTheirOwnMatmuls) {
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const int64_t cols : {700, 768}) {
      // With all three parts, a one-token group has enough rows for CUDA's two-row warps.
      const std::vector<TestWeight> w = {RandomWeight(dtype, 96, cols, rng_),
                                         RandomWeight(dtype, 40, cols, rng_),
                                         RandomWeight(dtype, 1100, cols, rng_)};
      for (const int64_t n : {1, 2, 3, 5, 17}) {
        const std::vector<float> x = RandomFloats(n * cols, rng_);
        const std::vector<float> y0 = RandomFloats(n * w[2].rows, rng_);
        for (int n_parts = 1; n_parts <= kMaxMatmulGroup; ++n_parts) {
          MatmulGroupArgs g;
          g.n_parts = n_parts;
          const float* dx = device().Put(x);
          std::vector<float*> out;
          for (int p = 0; p < n_parts; ++p) {
            const TestWeight& wp = w[static_cast<size_t>(p)];
            // The third part accumulates onto y0, as o_proj and down_proj do onto the residual.
            const bool accumulate = p == 2;
            out.push_back(accumulate ? device().Put(y0) : device().Output<float>(n * wp.rows));
            g.parts[static_cast<size_t>(p)] = {dx,
                                               {device().Put(wp.bytes), wp.dtype, wp.rows, wp.cols},
                                               out.back(),
                                               n,
                                               accumulate};
          }
          const absl::Status st = backend().MatmulGroup(g);
          ASSERT_TRUE(st.ok()) << st;
          for (int p = 0; p < n_parts; ++p) {
            const TestWeight& wp = w[static_cast<size_t>(p)];
            std::vector<float> want = Matmul(wp, x, n);
            if (p == 2) {
              for (size_t i = 0; i < want.size(); ++i) want[i] = y0[i] + want[i];
            }
            EXPECT_TRUE(SameBits(device().Get(out[static_cast<size_t>(p)], n * wp.rows), want))
                << DTypeName(dtype) << " " << cols << " columns, " << n << " tokens: part " << p
                << " of " << n_parts;
          }
        }
      }
    }
  }
  // Parts of different dtypes (which one launch cannot take) keep their bits too.
  const int64_t cols = 256, n = 3;
  const TestWeight wf = RandomWeight(DType::kF32, 24, cols, rng_);
  const TestWeight wb = RandomWeight(DType::kBF16, 16, cols, rng_);
  const std::vector<float> x = RandomFloats(n * cols, rng_);
  const float* dx = device().Put(x);
  float* yf = device().Output<float>(n * wf.rows);
  float* yb = device().Output<float>(n * wb.rows);
  MatmulGroupArgs g;
  g.n_parts = 2;
  g.parts[0] = {dx, {device().Put(wf.bytes), wf.dtype, wf.rows, cols}, yf, n};
  g.parts[1] = {dx, {device().Put(wb.bytes), wb.dtype, wb.rows, cols}, yb, n};
  ASSERT_TRUE(backend().MatmulGroup(g).ok());
  EXPECT_TRUE(SameBits(device().Get(yf, n * wf.rows), Matmul(wf, x, n)));
  EXPECT_TRUE(SameBits(device().Get(yb, n * wb.rows), Matmul(wb, x, n)));
}

// The MLP's gate/up product with swiglu: SwiGlu's bits on the two products' bits, for every
// dtype, both load paths, the tile shapes chosen from n, and a row fed alone; and with gate and up
// of different dtypes (which one launch cannot take).
TEST_P(ModelOpsTest, SwiGluGroupHasTheBitsOfSwiGluOnItsProducts) {
  const auto gated = [&](const TestWeight& wg, const TestWeight& wu, const std::vector<float>& x,
                         int64_t n) {
    const float* dx = device().Put(x);
    MatmulGroupArgs g;
    g.n_parts = 2;
    g.swiglu = true;
    g.parts[0] = {dx,
                  {device().Put(wg.bytes), wg.dtype, wg.rows, wg.cols},
                  device().Output<float>(n * wg.rows),
                  n};
    g.parts[1] = {dx,
                  {device().Put(wu.bytes), wu.dtype, wu.rows, wu.cols},
                  device().Output<float>(n * wu.rows),
                  n};
    const absl::Status st = backend().MatmulGroup(g);
    EXPECT_TRUE(st.ok()) << st;
    return device().Get(g.parts[0].y, n * wg.rows);
  };
  const auto separate = [&](const TestWeight& wg, const TestWeight& wu, const std::vector<float>& x,
                            int64_t n) {
    return SwiGlu(Matmul(wg, x, n), Matmul(wu, x, n), n, wg.rows);
  };
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const int64_t cols : {700, 768}) {
      for (const int64_t rows : {5, 1100}) {
        const TestWeight wg = RandomWeight(dtype, rows, cols, rng_);
        const TestWeight wu = RandomWeight(dtype, rows, cols, rng_);
        const int64_t n_max = 17;
        const std::vector<float> x = RandomFloats(n_max * cols, rng_);
        for (const int64_t n : {1, 2, 3, 5, 17}) {
          const std::vector<float> xn(x.begin(), x.begin() + n * cols);
          EXPECT_TRUE(SameBits(gated(wg, wu, xn, n), separate(wg, wu, xn, n)))
              << DTypeName(dtype) << " " << rows << " x " << cols << ", " << n << " tokens";
        }
        const std::vector<float> last(x.begin() + (n_max - 1) * cols, x.end());
        const std::vector<float> all = gated(wg, wu, x, n_max);
        EXPECT_TRUE(
            SameBits(gated(wg, wu, last, 1), std::vector<float>(all.end() - rows, all.end())))
            << DTypeName(dtype) << " " << rows << " x " << cols << ": the last row alone";
      }
    }
  }
  const int64_t cols = 256, rows = 24, n = 3;
  const TestWeight wg = RandomWeight(DType::kF32, rows, cols, rng_);
  const TestWeight wu = RandomWeight(DType::kBF16, rows, cols, rng_);
  const std::vector<float> x = RandomFloats(n * cols, rng_);
  EXPECT_TRUE(SameBits(gated(wg, wu, x, n), separate(wg, wu, x, n)));
}

// The attention's and the MLP's norms folded into their products: RmsNorm's bits, then the
// group's, for every dtype, both load paths, one tile of tokens and several (where a GPU runs
// RmsNorm first), grouped and gated products and the classifier's normalize-in-place form; and
// the residual stream x is left as it was.
TEST_P(ModelOpsTest, MatmulGroupWithInputNormHasTheBitsOfRmsNormThenTheGroup) {
  const auto run = [&](MatmulGroupArgs g, const std::vector<float>& x, const float* gain,
                       bool in_place) {
    const int64_t n = g.parts[0].n_tokens;
    const int64_t cols = g.parts[0].w.cols;
    float* dx = device().Put(x);
    g.input_norm = {gain, 1e-5f, in_place ? dx : device().Output<float>(n * cols)};
    for (int p = 0; p < g.n_parts; ++p) g.parts[static_cast<size_t>(p)].x = dx;
    const absl::Status st = backend().MatmulGroup(g);
    EXPECT_TRUE(st.ok()) << st;
    if (!in_place) EXPECT_TRUE(SameBits(device().Get(dx, n * cols), x)) << "x was written";
    return device().Get(g.parts[0].y, n * g.parts[0].w.rows);
  };
  const auto unfused = [&](MatmulGroupArgs g, const std::vector<float>& x,
                           const std::vector<float>& gain) {
    const int64_t n = g.parts[0].n_tokens;
    const float* normed = device().Put(RmsNorm(x, gain, n, g.parts[0].w.cols));
    for (int p = 0; p < g.n_parts; ++p) g.parts[static_cast<size_t>(p)].x = normed;
    const absl::Status st = backend().MatmulGroup(g);
    EXPECT_TRUE(st.ok()) << st;
    return device().Get(g.parts[0].y, n * g.parts[0].w.rows);
  };
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const int64_t cols : {700, 768}) {
      const std::vector<TestWeight> w = {RandomWeight(dtype, 96, cols, rng_),
                                         RandomWeight(dtype, 96, cols, rng_),
                                         RandomWeight(dtype, 40, cols, rng_)};
      const std::vector<float> gain = RandomFloats(cols, rng_, 0.5f, 1.5f);
      const float* dgain = device().Put(gain);
      for (const int64_t n : {1, 2, 3, 5, 8, 9, 17}) {
        const std::vector<float> x = RandomFloats(n * cols, rng_, -3.0f, 3.0f);
        const auto part = [&](size_t i) {
          return MatmulArgs{nullptr,
                            {device().Put(w[i].bytes), w[i].dtype, w[i].rows, w[i].cols},
                            device().Output<float>(n * w[i].rows),
                            n};
        };
        const std::string what =
            absl::StrCat(std::string(DTypeName(dtype)), " ", cols, " columns, ", n, " tokens");
        MatmulGroupArgs qkv;
        qkv.n_parts = 3;
        qkv.parts = {part(0), part(1), part(2)};
        EXPECT_TRUE(SameBits(run(qkv, x, dgain, false), unfused(qkv, x, gain))) << what;
        MatmulGroupArgs gated;
        gated.n_parts = 2;
        gated.swiglu = true;
        gated.parts = {part(0), part(1)};
        EXPECT_TRUE(SameBits(run(gated, x, dgain, false), unfused(gated, x, gain)))
            << what << ", swiglu";
        MatmulGroupArgs classifier;
        classifier.n_parts = 1;
        classifier.parts = {part(2)};
        EXPECT_TRUE(SameBits(run(classifier, x, dgain, true), unfused(classifier, x, gain)))
            << what << ", normalized in place";
      }
    }
  }
}

// The residual add folded into a product rounds once more, exactly as a separate addition would.
TEST_P(ModelOpsTest, MatmulAccumulateAddsTheProductToY) {
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const int64_t n : {1, 4, 9, 64}) {
      const int64_t rows = 72, cols = 520;
      const TestWeight w = RandomWeight(dtype, rows, cols, rng_);
      const std::vector<float> x = RandomFloats(n * cols, rng_);
      const std::vector<float> y0 = RandomFloats(n * rows, rng_, -4.0f, 4.0f);
      float* y = device().Put(y0);
      const absl::Status st = backend().Matmul(
          {device().Put(x), {device().Put(w.bytes), dtype, rows, cols}, y, n, true});
      ASSERT_TRUE(st.ok()) << st;
      std::vector<float> want = Matmul(w, x, n);
      for (size_t i = 0; i < want.size(); ++i) want[i] = y0[i] + want[i];
      EXPECT_TRUE(SameBits(device().Get(y, n * rows), want)) << DTypeName(dtype) << " n " << n;
    }
  }
}

TEST_P(ModelOpsTest, MatmulGroupRefusesPartsThatDoNotShareTheirInput) {
  const std::vector<float> ones(64, 1.0f);
  const float* x = device().Put(ones);
  const float* other_x = device().Put(ones);
  const TestWeight w = RandomWeight(DType::kF32, 4, 8, rng_);
  const WeightView view{device().Put(w.bytes), DType::kF32, 4, 8};
  float* y0 = device().Output<float>(16);
  float* y1 = device().Output<float>(16);
  const auto message = [&](const MatmulGroupArgs& g) {
    const absl::Status st = backend().MatmulGroup(g);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    return std::string(st.message());
  };
  MatmulGroupArgs g;
  g.parts[0] = {x, view, y0, 2};
  g.parts[1] = {x, view, y1, 2};
  EXPECT_EQ(message(g), "MatmulGroup: n_parts must be in [1, 3], got 0");
  g.n_parts = 2;
  g.parts[1].x = other_x;
  EXPECT_EQ(message(g), "MatmulGroup: parts[1] must share x, n_tokens and w.cols with parts[0]");
  g.parts[1].x = x;
  g.parts[1].n_tokens = 1;
  EXPECT_EQ(message(g), "MatmulGroup: parts[1] must share x, n_tokens and w.cols with parts[0]");
  g.parts[1].n_tokens = 2;
  g.parts[1].y = y0 + 4;
  EXPECT_EQ(message(g), "MatmulGroup: parts[0].y must not overlap parts[1].y");
  g.parts[1].y = nullptr;
  EXPECT_EQ(message(g), "MatmulGroup parts[1]: Matmul: y must not be null");
  // swiglu: gate and up, of equal rows, neither accumulating.
  const TestWeight w3 = RandomWeight(DType::kF32, 3, 8, rng_);
  g.parts[1].y = y1;
  g.swiglu = true;
  g.parts[1].w = {device().Put(w3.bytes), DType::kF32, 3, 8};
  const std::string swiglu_parts =
      "MatmulGroup: swiglu needs two parts (gate, up) of equal w.rows, neither accumulating";
  EXPECT_EQ(message(g), swiglu_parts);
  g.parts[1].w = view;
  g.parts[1].accumulate = true;
  EXPECT_EQ(message(g), swiglu_parts);
  g.parts[1].accumulate = false;
  g.n_parts = 3;
  g.parts[2] = g.parts[1];
  EXPECT_EQ(message(g), swiglu_parts);
  // A folded norm needs its scratch apart from the outputs, and a usable eps.
  g.n_parts = 2;
  g.swiglu = false;
  const float* gain = device().Put(ones);
  g.input_norm = {gain, 1e-5f, nullptr};
  EXPECT_EQ(message(g), "MatmulGroup: input_norm.normed must not be null");
  g.input_norm.normed = y1;
  EXPECT_EQ(message(g), "MatmulGroup: input_norm.normed must not overlap parts[1].y");
  g.input_norm.normed = device().Output<float>(16);
  g.input_norm.eps = -1.0f;
  EXPECT_EQ(message(g), "MatmulGroup: input_norm.eps must be finite and >= 0");
}

TEST_P(ModelOpsTest, RmsNormMatchesReferenceAndIsBatchInvariant) {
  const int64_t dim = 768, n = 64;
  const std::vector<float> x = RandomFloats(n * dim, rng_, -3.0f, 3.0f);
  const std::vector<float> weight = RandomFloats(dim, rng_, 0.5f, 1.5f);
  const std::vector<float> y = RmsNorm(x, weight, n, dim);
  std::vector<double> want(y.size());
  for (int64_t t = 0; t < n; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[t * dim + i]) * x[t * dim + i];
    const double r = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int64_t i = 0; i < dim; ++i) want[t * dim + i] = x[t * dim + i] * r * weight[i];
  }
  EXPECT_TRUE(AllClose(y.data(), want, {1e-6}, 1e-5));
  for (const int r : {0, 40}) {
    for (const std::vector<int>& batch : InvarianceBatches(static_cast<int>(n), r, rng_)) {
      const std::vector<float> got =
          RmsNorm(PickRows(x, dim, batch), weight, static_cast<int64_t>(batch.size()), dim);
      const int at = static_cast<int>(std::find(batch.begin(), batch.end(), r) - batch.begin());
      EXPECT_TRUE(SameBits(std::vector<float>(got.begin() + at * dim, got.begin() + (at + 1) * dim),
                           PickRows(y, dim, {r})))
          << "row " << r << " in a batch of " << batch.size();
    }
  }
}

TEST_P(ModelOpsTest, RopeMatchesReferenceAtPositionsApartFromSlots) {
  struct Shape {
    int64_t heads, head_dim;
    double base;
    double low_freq_divisor;  // llama3 scaling divides the frequencies below 1/8192 by this
    std::vector<int32_t> pos;
  };
  // Tree nodes at the same depth share a position, so positions repeat and need not ascend. The
  // second shape is Llama-3.2-3B's (more rotation pairs per token than a block has threads) at
  // positions up to its 131072-token context.
  const std::vector<Shape> shapes = {
      {4, 16, 10000.0, 1.0, {0, 1, 7, 7, 7, 300, 2, 4095}},
      {24, 128, 500000.0, 32.0, {0, 131071, 8191, 8191, 65536, 3}},
  };
  for (const Shape& s : shapes) {
    const int64_t heads = s.heads, head_dim = s.head_dim, half = head_dim / 2;
    const std::vector<int32_t>& pos = s.pos;
    const int64_t n = static_cast<int64_t>(pos.size());
    std::vector<float> inv_freq(half);
    for (int64_t i = 0; i < half; ++i) {
      const double f = std::pow(s.base, -2.0 * static_cast<double>(i) / head_dim);
      inv_freq[i] = static_cast<float>(f < 1.0 / 8192 ? f / s.low_freq_divisor : f);
    }
    const std::vector<float> x = RandomFloats(n * heads * head_dim, rng_);
    const std::vector<float> y = Rope(x, pos, inv_freq, heads, head_dim);
    std::vector<double> want(y.size());
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<float>(static_cast<float>(pos[t]) * inv_freq[i]);
          const int64_t a = (t * heads + h) * head_dim + i, b = a + half;
          want[a] = x[a] * std::cos(angle) - x[b] * std::sin(angle);
          want[b] = x[b] * std::cos(angle) + x[a] * std::sin(angle);
        }
      }
    }
    EXPECT_TRUE(AllClose(y.data(), want, {2e-6}, 1e-5)) << heads << " x " << head_dim;
    // The same (token, position) alone gives the same bits.
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<float> one = Rope(PickRows(x, heads * head_dim, {static_cast<int>(t)}),
                                          {pos[t]}, inv_freq, heads, head_dim);
      EXPECT_TRUE(SameBits(one, PickRows(y, heads * head_dim, {static_cast<int>(t)})))
          << heads << " x " << head_dim << ", token " << t;
    }
    // Queries and keys rotated in one call give the bits of a call each.
    const int64_t kv_heads = heads / 4;
    const std::vector<float> keys = RandomFloats(n * kv_heads * head_dim, rng_);
    float* dq = device().Put(x);
    float* dk = device().Put(keys);
    const absl::Status st = backend().Rope(
        {dq, device().Put(pos), device().Put(inv_freq), n, heads, head_dim, dk, kv_heads});
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_TRUE(SameBits(device().Get(dq, n * heads * head_dim), y)) << heads << " x " << head_dim;
    EXPECT_TRUE(SameBits(device().Get(dk, n * kv_heads * head_dim),
                         Rope(keys, pos, inv_freq, kv_heads, head_dim)))
        << kv_heads << " key heads x " << head_dim;
  }
}

TEST_P(ModelOpsTest, SwiGluEmbeddingAndGatherMatchReferences) {
  const int64_t n = 9, dim = 130;
  const std::vector<float> gate = RandomFloats(n * dim, rng_, -8.0f, 8.0f);
  const std::vector<float> up = RandomFloats(n * dim, rng_);
  const std::vector<float> sw = SwiGlu(gate, up, n, dim);
  std::vector<double> want(sw.size());
  for (size_t i = 0; i < want.size(); ++i)
    want[i] = gate[i] / (1.0 + std::exp(-static_cast<double>(gate[i]))) * up[i];
  EXPECT_TRUE(AllClose(sw.data(), want, {1e-6}, 1e-5));
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<float> one = SwiGlu(PickRows(gate, dim, {static_cast<int>(t)}),
                                          PickRows(up, dim, {static_cast<int>(t)}), 1, dim);
    EXPECT_TRUE(SameBits(one, PickRows(sw, dim, {static_cast<int>(t)}))) << t;
  }

  // Embedding widens exactly; GatherRows copies exactly.
  for (const DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const TestWeight table = RandomWeight(dtype, 50, dim, rng_);
    const std::vector<int32_t> ids = {49, 0, 7, 7, 23};
    float* out = device().Output<float>(5 * dim);
    ASSERT_TRUE(
        backend()
            .Embedding({{device().Put(table.bytes), dtype, 50, dim}, device().Put(ids), out, 5})
            .ok());
    const std::vector<float> got = device().Get(out, 5 * dim);
    for (int64_t t = 0; t < 5; ++t) {
      for (int64_t i = 0; i < dim; ++i) {
        ASSERT_EQ(got[t * dim + i], table.values[ids[t] * dim + i]) << DTypeName(dtype);
      }
    }
  }
  const std::vector<int32_t> rows = {8, 0, 3, 3};
  float* gathered = device().Output<float>(4 * dim);
  ASSERT_TRUE(
      backend().GatherRows({device().Put(gate), device().Put(rows), gathered, n, 4, dim}).ok());
  EXPECT_TRUE(SameBits(device().Get(gathered, 4 * dim), PickRows(gate, dim, {8, 0, 3, 3})));
}

TEST_P(ModelOpsTest, BadArgumentsAreErrorsNotCrashes) {
  const std::vector<float> x(16, 1.0f);
  const TestWeight w = RandomWeight(DType::kF32, 4, 4, rng_);
  MatmulArgs m{
      device().Put(x), {device().Put(w.bytes), DType::kF32, 4, 4}, device().Output<float>(16), 4};
  m.w.cols = 0;
  EXPECT_EQ(backend().Matmul(m).code(), absl::StatusCode::kInvalidArgument);
  m.w.cols = 4;
  m.x = nullptr;
  EXPECT_EQ(backend().Matmul(m).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      backend().RmsNorm({device().Put(x), nullptr, device().Output<float>(16), 4, 4, 1e-5f}).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend().Rope({device().Output<float>(16), nullptr, nullptr, 2, 2, 3}).code(),
            absl::StatusCode::kInvalidArgument);  // odd head_dim
}

// One message per bad call, whichever back end runs it. Each case is one where the CUDA launcher
// used to disagree with the CPU: another order of checks, another message, or no check at all.
TEST_P(ModelOpsTest, BadArgumentsGetTheSameMessageOnEveryBackEnd) {
  const std::vector<float> ones(16, 1.0f);
  float* x = device().Put(ones);
  const float* w = device().Put(ones);
  float* y = device().Output<float>(16);
  EXPECT_TRUE(IsInvalidArgument(backend().RmsNorm({x, w, y, 2, 8, INFINITY}),
                                "RmsNorm: eps must be finite and >= 0"));
  EXPECT_TRUE(IsInvalidArgument(backend().RmsNorm({nullptr, nullptr, nullptr, 0, 8, -1.0f}),
                                "RmsNorm: eps must be finite and >= 0"));
  EXPECT_TRUE(IsInvalidArgument(backend().RmsNorm({x, w, y, -1, 0, 1e-5f}),
                                "RmsNorm: dim must be > 0, got 0"));
  EXPECT_TRUE(
      IsInvalidArgument(backend().SwiGlu({x, x, y, -1, 0}), "SwiGlu: dim must be > 0, got 0"));
  const int32_t* rows = device().Put(std::vector<int32_t>{0, 1});
  EXPECT_TRUE(IsInvalidArgument(backend().GatherRows({x, rows, y, -1, 2, 0}),
                                "GatherRows: dim must be > 0, got 0"));
  EXPECT_TRUE(IsInvalidArgument(
      backend().Rope({nullptr, nullptr, nullptr, 2, int64_t{1} << 30, int64_t{1} << 20}),
      "Rope: n_heads x head_dim = 1073741824 x 1048576 elements is out of range"));
  EXPECT_TRUE(IsInvalidArgument(
      backend().Rope({nullptr, nullptr, nullptr, int64_t{1} << 44, 4, 8}),
      "Rope: n_tokens x n_heads x head_dim = 17592186044416 x 32 elements is out of range"));
  EXPECT_TRUE(IsInvalidArgument(
      backend().Embedding(
          {{w, DType::kF32, int64_t{1} << 30, int64_t{1} << 20}, nullptr, nullptr, 0}),
      "Embedding: table.rows x table.cols = 1073741824 x 1048576 elements is out of range"));
  EXPECT_TRUE(IsInvalidArgument(
      backend().Embedding({{w, DType::kF32, 4, 4}, nullptr, nullptr, int64_t{1} << 47}),
      "Embedding: n_tokens x table.cols = 140737488355328 x 4 elements is out of range"));
}

INSTANTIATE_TEST_SUITE_P(Backends, ModelOpsTest, ::testing::ValuesIn(AllBackends()), CaseName);

}  // namespace
}  // namespace specd::kernels::conformance
