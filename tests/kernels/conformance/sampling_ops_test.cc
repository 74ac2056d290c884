// Conformance of the per-token math (CombineLogits, ProcessRows, SampleRows, GatherProbs,
// Logprobs) on every available back end. References: the scalar processed distribution of
// kernels/cpu/processed.h (itself checked against an independent numpy reference in
// tests/kernels/cpu/processed_test.cc), base/inverse_cdf.h with base/philox.h for draws, and
// double-precision log-softmax. On the CPU every result is bit-identical to the reference; other
// back ends must match one-hot rows, argmaxes and these draws exactly and sampled rows within
// 1e-6 (their fp64 sums run in another order, so a draw could differ only when u lands within
// rounding of a prefix sum, about 1e-10 of draws: none of the fixed draws here).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/inverse_cdf.h"
#include "base/philox.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/processed.h"
#include "tests/kernels/conformance/backend_under_test.h"
#include "tests/kernels/cpu/reference.h"

namespace specd::kernels::conformance {
namespace {

using cpu_test::RandomFloats;
using cpu_test::SameBits;

constexpr float kInf = std::numeric_limits<float>::infinity();

SamplingParams Params(float temperature, int32_t top_k = 0, float top_p = 1.0f, float min_p = 0.0f,
                      float repetition = 1.0f, float presence = 0.0f, float frequency = 0.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repetition_penalty = repetition;
  p.presence_penalty = presence;
  p.frequency_penalty = frequency;
  return p;
}

struct RowCase {
  SamplingParams params;
  RowMode mode;
  std::vector<int32_t> prompt, output;
  std::vector<TokenBias> bias = {};  // ascending tokens
};

class SamplingOpsTest : public BackendTest {
 protected:
  // The vocabulary of every row; a test may change it before it makes any.
  int64_t vocab_ = 1000;

  struct Processed {
    std::vector<float> probs;  // [rows, vocab] in row order
    std::vector<int32_t> argmax, error;
    std::vector<float> penalized;
    std::vector<int32_t> top_ids;  // [rows, kTop]
    std::vector<float> entropy;
  };
  static constexpr int32_t kTop = 6;

  // ProcessRows of `logits` ([cases.size(), vocab]) for `cases`, row r into pool slot
  // capacity - 1 - r (so slots are not the row order).
  Processed Process(const std::vector<float>& logits, const std::vector<RowCase>& cases) {
    const int64_t n = static_cast<int64_t>(cases.size());
    std::vector<RowSampling> rows;
    std::vector<int32_t> history;
    std::vector<TokenBias> biases;
    const int64_t capacity = n + 3;
    for (int64_t r = 0; r < n; ++r) {
      RowSampling rs;
      rs.params = cases[r].params;
      rs.mode = cases[r].mode;
      rs.prob_slot = static_cast<int32_t>(capacity - 1 - r);
      rs.prompt_begin = static_cast<int64_t>(history.size());
      rs.prompt_len = static_cast<int64_t>(cases[r].prompt.size());
      history.insert(history.end(), cases[r].prompt.begin(), cases[r].prompt.end());
      rs.output_begin = static_cast<int64_t>(history.size());
      rs.output_len = static_cast<int64_t>(cases[r].output.size());
      history.insert(history.end(), cases[r].output.begin(), cases[r].output.end());
      rs.bias_begin = static_cast<int64_t>(biases.size());
      rs.bias_len = static_cast<int64_t>(cases[r].bias.size());
      biases.insert(biases.end(), cases[r].bias.begin(), cases[r].bias.end());
      rows.push_back(rs);
    }
    history.push_back(0);  // never empty
    biases.push_back({0, 0.0f});
    ProcessRowsArgs a;
    a.logits = device().Put(logits);
    a.n_rows = n;
    a.vocab = vocab_;
    a.rows = device().Put(rows);
    a.history = device().Put(history);
    a.history_len = static_cast<int64_t>(history.size());
    a.biases = device().Put(biases);
    a.n_biases = static_cast<int64_t>(biases.size());
    pool_ = device().Output<float>(capacity * vocab_);
    capacity_ = capacity;
    a.probs = pool_;
    a.prob_capacity = capacity;
    a.penalized = device().Output<float>(n * vocab_);
    a.argmax = device().Output<int32_t>(n);
    a.error = device().Output<int32_t>(n);
    a.top_n = kTop;
    a.top_ids = device().Output<int32_t>(n * kTop);
    a.entropy = device().Output<float>(n);
    const absl::Status st = backend().ProcessRows(a);
    EXPECT_TRUE(st.ok()) << st;
    Processed out;
    const std::vector<float> pool = device().Get(pool_, capacity * vocab_);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t slot = capacity - 1 - r;
      out.probs.insert(out.probs.end(), pool.begin() + slot * vocab_,
                       pool.begin() + (slot + 1) * vocab_);
    }
    out.argmax = device().Get(a.argmax, n);
    out.error = device().Get(a.error, n);
    out.penalized = device().Get(a.penalized, n * vocab_);
    out.top_ids = device().Get(a.top_ids, n * kTop);
    out.entropy = device().Get(a.entropy, n);
    return out;
  }

  // ProcessRows of `rows` over random logits into a pool of `capacity` rows, with no history,
  // penalised rows, top ids or entropy.
  ProcessRowsArgs RowsArgs(const std::vector<RowSampling>& rows, int64_t capacity) {
    const int64_t n = static_cast<int64_t>(rows.size());
    ProcessRowsArgs a;
    a.logits = device().Put(RandomFloats(n * vocab_, rng_));
    a.n_rows = n;
    a.vocab = vocab_;
    a.rows = device().Put(rows);
    a.probs = device().Output<float>(capacity * vocab_);
    a.prob_capacity = capacity;
    a.argmax = device().Output<int32_t>(n);
    a.error = device().Output<int32_t>(n);
    return a;
  }

  // What the scalar reference makes of row `r`: the row (or one-hot), its argmax and error.
  void Reference(std::span<const float> logits, const RowCase& c, std::vector<float>* row,
                 int32_t* argmax, int32_t* error) const {
    cpu::LogitsProcessor processor;
    const cpu::TokenHistory history{c.prompt, c.output, c.bias};
    row->assign(static_cast<size_t>(vocab_), 0.0f);
    *error = kRowOk;
    if (std::any_of(logits.begin(), logits.end(), [](float x) { return std::isnan(x); })) {
      *error = kRowNanLogit;
      return;
    }
    absl::StatusOr<int32_t> greedy = processor.GreedyToken(logits, c.params, history);
    if (!greedy.ok()) {
      *error = kRowBadHistory;
      return;
    }
    *argmax = *greedy;
    if (c.mode == RowMode::kGreedy) {
      (*row)[static_cast<size_t>(*greedy)] = 1.0f;
      return;
    }
    if (!processor.ProcessedDistribution(logits, c.params, history, *row).ok()) {
      *error = kRowNoFiniteLogit;
      return;
    }
    if (c.mode == RowMode::kArgmaxOfProcessed) {
      *argmax = cpu::ArgMaxLowestId(*row);
      row->assign(static_cast<size_t>(vocab_), 0.0f);
      (*row)[static_cast<size_t>(*argmax)] = 1.0f;
    }
  }

  std::vector<RowCase> Cases() {
    std::uniform_int_distribution<int32_t> id(0, vocab_ - 1);
    std::vector<int32_t> prompt(40), output(25);
    for (int32_t& t : prompt) t = id(rng_);
    for (int32_t& t : output) t = id(rng_) % 50;  // repeats, so frequency counts matter
    // Ban this row's argmax-to-be and lift a few others, some of them in the penalty history.
    std::vector<TokenBias> bias = {{3, 2.5f},
                                   {17, -100.0f},
                                   {output[0], 4.0f},
                                   {prompt[1], -3.0f},
                                   {static_cast<int32_t>(vocab_ - 1), 100.0f}};
    std::sort(bias.begin(), bias.end(),
              [](const TokenBias& a, const TokenBias& b) { return a.token < b.token; });
    bias.erase(
        std::unique(bias.begin(), bias.end(),
                    [](const TokenBias& a, const TokenBias& b) { return a.token == b.token; }),
        bias.end());
    return {
        {Params(0.0f), RowMode::kGreedy, {}, {}},
        {Params(0.0f, 0, 1, 0, 1.3f, 0.5f, 0.7f), RowMode::kGreedy, prompt, output},
        {Params(1.0f), RowMode::kSample, {}, {}},
        {Params(0.7f, 0, 0.9f), RowMode::kSample, {}, {}},
        {Params(1.0f, 40), RowMode::kSample, {}, {}},
        {Params(1.3f, 5, 0.8f, 0.05f), RowMode::kSample, {}, {}},
        {Params(0.9f, 0, 1, 0.1f, 1.2f, -0.4f, 0.3f), RowMode::kSample, prompt, output},
        {Params(0.8f, 0, 0.95f), RowMode::kArgmaxOfProcessed, prompt, output},
        {Params(1.0f, 3), RowMode::kSample, {}, {}},  // ties at the top-k boundary (below)
        {Params(0.0f), RowMode::kGreedy, {}, {}, bias},
        {Params(0.9f, 0, 0.95f, 0, 1.25f, 0.3f, 0.2f), RowMode::kSample, prompt, output, bias},
        {Params(1.1f, 30, 1, 0.02f), RowMode::kSample, {}, {}, bias},
    };
  }

  std::vector<float> Logits(size_t rows) {
    std::vector<float> logits = RandomFloats(static_cast<int64_t>(rows) * vocab_, rng_, -6, 6);
    // Row 8: the five largest logits tie, so top-k 3 must keep the three lowest ids.
    for (int64_t i = 0; i < 5; ++i) logits[8 * vocab_ + 100 + 37 * i] = 9.0f;
    if (with_infinities_) {
      // A greedy row and a sampled one with a +inf logit, and a top-k row whose k-th value is
      // -inf (only two finite logits).
      logits[0 * vocab_ + vocab_ - 3] = kInf;
      logits[2 * vocab_ + 7] = kInf;
      std::fill(logits.begin() + 4 * vocab_, logits.begin() + 5 * vocab_, -kInf);
      logits[4 * vocab_ + 11] = 1.0f;
      logits[4 * vocab_ + vocab_ - 1] = 2.0f;
    }
    return logits;
  }

  // ProcessRows of Cases() over Logits() against the scalar reference: the same bits on the CPU
  // and for greedy rows, within 1e-6 + 1e-5 relative for sampled rows elsewhere.
  void ExpectProcessRowsMatchTheScalarReference() {
    const std::vector<RowCase> cases = Cases();
    const std::vector<float> logits = Logits(cases.size());
    const Processed got = Process(logits, cases);
    for (size_t r = 0; r < cases.size(); ++r) {
      std::vector<float> want;
      int32_t argmax = -1, error = -1;
      Reference(std::span<const float>(logits).subspan(r * vocab_, vocab_), cases[r], &want,
                &argmax, &error);
      ASSERT_EQ(got.error[r], error) << "row " << r;
      const std::vector<float> row(got.probs.begin() + r * vocab_,
                                   got.probs.begin() + (r + 1) * vocab_);
      if (!IsCpu() && cases[r].mode == RowMode::kArgmaxOfProcessed && error == kRowOk) {
        // Another back end may round two processed probabilities an ulp apart differently
        // (kernels/backend.h): its one-hot must sit at a token within that of the maximum.
        RowCase sampled = cases[r];
        sampled.mode = RowMode::kSample;
        std::vector<float> dist;
        int32_t unused_argmax = -1, unused_error = -1;
        Reference(std::span<const float>(logits).subspan(r * vocab_, vocab_), sampled, &dist,
                  &unused_argmax, &unused_error);
        const float top = *std::max_element(dist.begin(), dist.end());
        ASSERT_GE(got.argmax[r], 0) << "row " << r;
        ASSERT_LT(got.argmax[r], vocab_) << "row " << r;
        EXPECT_GE(dist[static_cast<size_t>(got.argmax[r])], top * (1.0f - 0x1p-21f)) << "row " << r;
        std::vector<float> one_hot(static_cast<size_t>(vocab_), 0.0f);
        one_hot[static_cast<size_t>(got.argmax[r])] = 1.0f;
        EXPECT_TRUE(SameBits(row, one_hot)) << "row " << r;
        continue;
      }
      EXPECT_EQ(got.argmax[r], argmax) << "row " << r;
      if (IsCpu() || cases[r].mode != RowMode::kSample) {
        EXPECT_TRUE(SameBits(row, want)) << "row " << r;
      } else {
        for (int64_t i = 0; i < vocab_; ++i) {
          ASSERT_NEAR(row[i], want[i], 1e-6 + 1e-5 * want[i]) << "row " << r << " token " << i;
        }
      }
    }
  }

  // SampleRows of Cases()' rows against the inverse CDF of each row, and GatherProbs.
  void ExpectSampleRowsFollowTheInverseCdf() {
    const std::vector<RowCase> cases = Cases();
    const Processed rows = Process(Logits(cases.size()), cases);
    std::vector<Draw> draws;
    for (int32_t r = 0; r < static_cast<int32_t>(cases.size()); ++r) {
      for (uint32_t index = 0; index < 40; ++index) {
        Draw d;
        d.prob_slot = static_cast<int32_t>(capacity_ - 1 - r);
        d.seed = 0x9e3779b97f4a7c15ull * (r + 1);
        d.position = 17 + index;
        d.purpose = index % 2 == 0 ? Purpose::kCandidate : Purpose::kBonus;
        d.index = index;
        d.sample = index % 3;
        draws.push_back(d);
      }
    }
    const int64_t n = static_cast<int64_t>(draws.size());
    SampleRowsArgs s;
    s.probs = pool_;
    s.prob_capacity = capacity_;
    s.vocab = vocab_;
    s.draws = device().Put(draws);
    s.n = n;
    s.tokens = device().Output<int32_t>(n);
    s.token_probs = device().Output<float>(n);
    s.error = device().Output<int32_t>(n);
    ASSERT_TRUE(backend().SampleRows(s).ok());
    const std::vector<int32_t> tokens = device().Get(s.tokens, n);
    const std::vector<float> probs = device().Get(s.token_probs, n);
    const std::vector<int32_t> errors = device().Get(s.error, n);

    std::vector<int32_t> slots, lookup_tokens;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = capacity_ - 1 - draws[i].prob_slot;
      const std::span<const float> row(rows.probs.data() + r * vocab_, vocab_);
      const double u = StreamUniform(draws[i].seed, draws[i].position, draws[i].purpose,
                                     draws[i].index, draws[i].sample);
      absl::StatusOr<int32_t> want = SampleInverseCdf(row, u);
      ASSERT_TRUE(want.ok());
      ASSERT_EQ(errors[i], kRowOk);
      EXPECT_EQ(tokens[i], *want) << "draw " << i;
      EXPECT_EQ(probs[i], row[static_cast<size_t>(*want)]) << "draw " << i;
      EXPECT_GT(probs[i], 0.0f) << "a zero-probability token was drawn";
      slots.push_back(draws[i].prob_slot);
      lookup_tokens.push_back((tokens[i] * 7 + 3) % vocab_);
    }

    GatherProbsArgs g;
    g.probs = pool_;
    g.prob_capacity = capacity_;
    g.vocab = vocab_;
    g.slots = device().Put(slots);
    g.tokens = device().Put(lookup_tokens);
    g.out = device().Output<float>(n);
    g.n = n;
    ASSERT_TRUE(backend().GatherProbs(g).ok());
    const std::vector<float> looked_up = device().Get(g.out, n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = capacity_ - 1 - slots[i];
      EXPECT_EQ(looked_up[i], rows.probs[r * vocab_ + lookup_tokens[i]]) << i;
    }
  }

  bool with_infinities_ = false;  // see Logits()
  float* pool_ = nullptr;
  int64_t capacity_ = 0;
};

TEST_P(SamplingOpsTest, ProcessRowsMatchesTheScalarReference) {
  ExpectProcessRowsMatchTheScalarReference();
}

// The draft-tree children (top tokens by penalised logit, lowest id on ties) against a full sort
// of the reference's penalised row, and EGAG's entropy of the raw logits against fp64 libm.
TEST_P(SamplingOpsTest, ProcessRowsTopTokensAndEntropy) {
  std::vector<RowCase> cases = Cases();
  std::vector<float> logits = Logits(cases.size());
  // Row 0: every logit -inf but two, so the top tokens run into -inf ones (by id).
  std::fill(logits.begin(), logits.begin() + vocab_, -kInf);
  logits[500] = 1.0f;
  logits[7] = 1.0f;
  const Processed got = Process(logits, cases);
  for (size_t r = 0; r < cases.size(); ++r) {
    const std::span<const float> row = std::span<const float>(logits).subspan(r * vocab_, vocab_);
    std::vector<float> w(vocab_);
    cpu::LogitsProcessor processor;
    ASSERT_TRUE(
        processor
            .Penalize(row, cases[r].params, {cases[r].prompt, cases[r].output, cases[r].bias}, w)
            .ok());
    std::vector<int32_t> order(vocab_);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return w[a] > w[b]; });
    EXPECT_EQ(
        std::vector<int32_t>(got.top_ids.begin() + static_cast<std::ptrdiff_t>(r * kTop),
                             got.top_ids.begin() + static_cast<std::ptrdiff_t>((r + 1) * kTop)),
        std::vector<int32_t>(order.begin(), order.begin() + kTop))
        << "row " << r;
    double m = -kInf;
    for (const float x : row) m = std::max(m, static_cast<double>(x));
    double sum = 0, weighted = 0;
    for (const float x : row) {
      if (x == -kInf) continue;
      sum += std::exp(x - m);
      weighted += std::exp(x - m) * (x - m);
    }
    const double h = (std::log(sum) - weighted / sum) / std::log(static_cast<double>(vocab_));
    EXPECT_NEAR(got.entropy[r], h, 1e-5) << "row " << r;
  }
  EXPECT_NEAR(got.entropy[0], std::log(2.0) / std::log(static_cast<double>(vocab_)), 1e-6);
  EXPECT_EQ(got.top_ids[0], 7);
  EXPECT_EQ(got.top_ids[1], 500);
  EXPECT_EQ(got.top_ids[2], 0);  // then the -inf tokens, lowest ids first
}

TEST_P(SamplingOpsTest, ProcessRowsReportsBadRowsWithoutDisturbingOthers) {
  std::vector<RowCase> cases = {{Params(1.0f), RowMode::kSample, {}, {}},
                                {Params(1.0f), RowMode::kSample, {}, {}},
                                {Params(1.0f, 0, 1, 0, 1.5f), RowMode::kSample, {3, 1000}, {}},
                                {Params(0.0f), RowMode::kGreedy, {}, {}},
                                {Params(1.0f), RowMode::kSample, {}, {}}};
  std::vector<float> logits = RandomFloats(5 * vocab_, rng_, -3, 3);
  logits[0 * vocab_ + 17] = std::numeric_limits<float>::quiet_NaN();
  std::fill(logits.begin() + 1 * vocab_, logits.begin() + 2 * vocab_, -kInf);
  std::fill(logits.begin() + 3 * vocab_, logits.begin() + 4 * vocab_, -kInf);  // greedy: token 0
  const Processed got = Process(logits, cases);
  EXPECT_EQ(got.error[0], kRowNanLogit);
  EXPECT_EQ(got.error[1], kRowNoFiniteLogit);
  EXPECT_EQ(got.error[2], kRowBadHistory);  // history id 1000 is outside the vocabulary
  EXPECT_EQ(got.error[3], kRowOk);
  EXPECT_EQ(got.argmax[3], 0);
  EXPECT_EQ(got.error[4], kRowOk);
  std::vector<float> want;
  int32_t argmax = 0, error = 0;
  Reference(std::span<const float>(logits).subspan(4 * vocab_, vocab_), cases[4], &want, &argmax,
            &error);
  EXPECT_EQ(got.argmax[4], argmax);
}

TEST_P(SamplingOpsTest, ProcessRowsIsBatchInvariant) {
  const std::vector<RowCase> base = Cases();
  const int n = 64;
  std::vector<RowCase> cases;
  for (int i = 0; i < n; ++i) cases.push_back(base[static_cast<size_t>(i) % base.size()]);
  const std::vector<float> logits = Logits(n);
  const Processed all = Process(logits, cases);
  for (const int r : {2, 6, 45}) {
    for (const std::vector<int>& batch : InvarianceBatches(n, r, rng_)) {
      std::vector<float> sub;
      std::vector<RowCase> sub_cases;
      for (const int b : batch) {
        sub.insert(sub.end(), logits.begin() + b * vocab_, logits.begin() + (b + 1) * vocab_);
        sub_cases.push_back(cases[static_cast<size_t>(b)]);
      }
      const Processed got = Process(sub, sub_cases);
      const int at = static_cast<int>(std::find(batch.begin(), batch.end(), r) - batch.begin());
      EXPECT_TRUE(SameBits(
          std::vector<float>(got.probs.begin() + at * vocab_,
                             got.probs.begin() + (at + 1) * vocab_),
          std::vector<float>(all.probs.begin() + r * vocab_, all.probs.begin() + (r + 1) * vocab_)))
          << "row " << r << " in a batch of " << batch.size();
      EXPECT_EQ(got.argmax[at], all.argmax[r]);
    }
  }
}

TEST_P(SamplingOpsTest, SampleRowsAndGatherProbsFollowTheInverseCdfOfTheRow) {
  ExpectSampleRowsFollowTheInverseCdf();
}

// Llama 3's vocabulary, so that every thread of a row's block handles many tokens (1000 gives
// each at most one), with +inf logits and a top-k boundary at -inf.
TEST_P(SamplingOpsTest, LargeVocabularyRowsAndInfinitiesMatchTheReference) {
  vocab_ = 128256;
  with_infinities_ = true;
  ExpectProcessRowsMatchTheScalarReference();
  ExpectSampleRowsFollowTheInverseCdf();
}

TEST_P(SamplingOpsTest, SampleRowsReportsAnEmptyRow) {
  std::vector<float> pool(3 * vocab_, 0.0f);
  pool[2 * vocab_ + 5] = 1.0f;
  float* d = device().Put(pool);
  std::vector<Draw> draws(2);
  draws[0].prob_slot = 1;  // all zero
  draws[1].prob_slot = 2;
  SampleRowsArgs s{d,
                   3,
                   vocab_,
                   device().Put(draws),
                   2,
                   device().Output<int32_t>(2),
                   device().Output<float>(2),
                   device().Output<int32_t>(2)};
  ASSERT_TRUE(backend().SampleRows(s).ok());
  const std::vector<int32_t> errors = device().Get(s.error, 2);
  EXPECT_EQ(errors[0], kRowEmpty);
  EXPECT_EQ(errors[1], kRowOk);
  EXPECT_EQ(device().Get(s.tokens, 2)[1], 5);
}

TEST_P(SamplingOpsTest, CombineLogitsIsOneRoundingPerOperation) {
  const int64_t rows = 6;
  const std::vector<float> logits = RandomFloats(rows * vocab_, rng_, -20, 20);
  float* d = device().Put(logits);
  const std::vector<int32_t> cond = {0, 4}, uncond = {3, 1};
  const std::vector<float> scale = {1.5f, 7.25f};
  ASSERT_TRUE(backend()
                  .CombineLogits({d, rows, vocab_, device().Put(cond), device().Put(uncond),
                                  device().Put(scale), 2})
                  .ok());
  const std::vector<float> got = device().Get(d, rows * vocab_);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < vocab_; ++i) {
      float want = logits[r * vocab_ + i];
      for (size_t p = 0; p < cond.size(); ++p) {
        if (r != cond[p]) continue;
        const float c = logits[r * vocab_ + i], u = logits[uncond[p] * vocab_ + i];
        const float diff = c - u;
        const float scaled = scale[p] * diff;
        want = u + scaled;
      }
      ASSERT_EQ(got[r * vocab_ + i], want) << "row " << r << " token " << i;
    }
  }
}

// A row whose penalty history range runs past the history is refused in the CPU's words (a GPU
// reports it at the next Synchronize), whichever of its two ranges is bad.
TEST_P(SamplingOpsTest, ProcessRowsRefusesAHistoryRangeOutsideTheHistory) {
  const int64_t n = 2;
  const std::vector<int32_t> history = {5, 6, 7, 8};
  for (const bool bad_output : {false, true}) {
    std::vector<RowSampling> rows(n);
    for (int32_t r = 0; r < n; ++r) {
      rows[r].params = Params(1.0f, 0, 1, 0, 1.2f);
      rows[r].prob_slot = r;
      rows[r].prompt_len = 2;
      rows[r].output_begin = 2;
      rows[r].output_len = 2;
    }
    (bad_output ? rows[1].output_len : rows[1].prompt_len) = 5;
    ProcessRowsArgs a = RowsArgs(rows, n);
    a.history = device().Put(history);
    a.history_len = 4;
    const absl::Status status = Checked(backend().ProcessRows(a));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(status.message().rfind(
                  "ProcessRows: rows[1] names history outside [0, history_len = 4)", 0),
              0)
        << status;
  }
}

// A row whose logit biases run past the list, or name a token outside the vocabulary, out of
// order or with a bias that is not finite or beyond ±kMaxLogitBias, or more than
// kMaxLogitBiasTokens of them, is refused (a GPU at the next Synchronize), as ValidateLogitBias
// refuses a request's.
TEST_P(SamplingOpsTest, ProcessRowsRefusesBadLogitBiases) {
  vocab_ = 2048;  // room for one more distinct token than a row may bias
  const std::vector<TokenBias> good = {{2, 1.0f}, {9, -3.0f}};
  std::vector<TokenBias> too_many;
  for (int32_t t = 0; t <= kMaxLogitBiasTokens; ++t) too_many.push_back({t, 0.5f});
  const std::vector<std::vector<TokenBias>> bad = {
      {{2, 1.0f}, {static_cast<int32_t>(vocab_), 1.0f}},
      {{9, 1.0f}, {2, 1.0f}},
      {{2, 1.0f}, {2, 2.0f}},
      {{2, std::numeric_limits<float>::quiet_NaN()}},
      {{-1, 1.0f}},
      {{2, std::nextafter(kMaxLogitBias, 1000.0f)}},
      {{3, -std::nextafter(kMaxLogitBias, 1000.0f)}},
      too_many};
  for (size_t b = 0; b <= bad.size(); ++b) {
    std::vector<RowSampling> rows(2);
    std::vector<TokenBias> biases = good;
    for (int32_t r = 0; r < 2; ++r) {
      rows[r].params = Params(1.0f);
      rows[r].prob_slot = r;
      rows[r].bias_len = 2;
    }
    if (b < bad.size()) {
      rows[1].bias_begin = 2;
      rows[1].bias_len = static_cast<int64_t>(bad[b].size());
      biases.insert(biases.end(), bad[b].begin(), bad[b].end());
    } else {
      rows[1].bias_len = 3;  // past the list
    }
    ProcessRowsArgs a = RowsArgs(rows, 2);
    a.biases = device().Put(biases);
    a.n_biases = static_cast<int64_t>(biases.size());
    const absl::Status status = Checked(backend().ProcessRows(a));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << "case " << b << ": " << status;
    EXPECT_EQ(status.message().rfind("ProcessRows: rows[1] names logit biases", 0), 0)
        << "case " << b << ": " << status;
  }
}

// A guidance scale that is not finite is refused in the CPU's words (a GPU reports it at the next
// Synchronize, adding that the kernel skipped the pair), and the back end runs on.
TEST_P(SamplingOpsTest, CombineLogitsRefusesANonFiniteScale) {
  const int64_t rows = 4;
  float* d = device().Put(RandomFloats(rows * vocab_, rng_, -20, 20));
  const std::vector<int32_t> cond = {0, 2}, uncond = {1, 3};
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), kInf}) {
    const std::vector<float> scale = {1.5f, bad};
    const CombineLogitsArgs a{
        d, rows, vocab_, device().Put(cond), device().Put(uncond), device().Put(scale), 2};
    const absl::Status status = Checked(backend().CombineLogits(a));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(status.message().rfind("CombineLogits: scale[1] must be finite", 0), 0) << status;
  }
  const std::vector<float> fine = {1.5f, 2.0f};
  EXPECT_TRUE(backend()
                  .CombineLogits({d, rows, vocab_, device().Put(cond), device().Put(uncond),
                                  device().Put(fine), 2})
                  .ok());
  EXPECT_TRUE(backend().Synchronize().ok());
}

TEST_P(SamplingOpsTest, LogprobsMatchDoubleLogSoftmax) {
  const int64_t rows = 5;
  std::vector<float> logits = RandomFloats(rows * vocab_, rng_, -10, 10);
  logits[1 * vocab_ + 3] = -kInf;
  const int32_t top_n = 7;
  const std::vector<int32_t> query_rows = {0, 1, 4, 1};
  const std::vector<int32_t> query_tokens = {5, 3, 999, 0};
  LogprobsArgs a;
  a.logits = device().Put(logits);
  a.n_rows = rows;
  a.vocab = vocab_;
  a.top_n = top_n;
  a.top_ids = device().Output<int32_t>(rows * top_n);
  a.top_logprobs = device().Output<float>(rows * top_n);
  a.query_rows = device().Put(query_rows);
  a.query_tokens = device().Put(query_tokens);
  a.query_logprobs = device().Output<float>(4);
  a.n_queries = 4;
  ASSERT_TRUE(backend().Logprobs(a).ok());
  const std::vector<int32_t> ids = device().Get(a.top_ids, rows * top_n);
  const std::vector<float> top = device().Get(a.top_logprobs, rows * top_n);
  const std::vector<float> queried = device().Get(a.query_logprobs, 4);
  auto reference = [&](int64_t r, int32_t t) {
    double m = -INFINITY, sum = 0;
    for (int64_t i = 0; i < vocab_; ++i)
      m = std::max(m, static_cast<double>(logits[r * vocab_ + i]));
    for (int64_t i = 0; i < vocab_; ++i) sum += std::exp(logits[r * vocab_ + i] - m);
    return (logits[r * vocab_ + t] - m) - std::log(sum);
  };
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int32_t> order(vocab_);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) {
      return logits[r * vocab_ + x] > logits[r * vocab_ + y];
    });
    for (int32_t j = 0; j < top_n; ++j) {
      EXPECT_EQ(ids[r * top_n + j], order[j]) << "row " << r << " rank " << j;
      EXPECT_NEAR(top[r * top_n + j], reference(r, order[j]), 1e-5);
      if (j > 0) {
        EXPECT_GE(top[r * top_n + j - 1], top[r * top_n + j]);
      }
    }
  }
  for (size_t q = 0; q < query_rows.size(); ++q) {
    const double want = reference(query_rows[q], query_tokens[q]);
    if (std::isinf(want)) {
      EXPECT_EQ(queried[q], -kInf) << q;
    } else {
      EXPECT_NEAR(queried[q], want, 1e-5) << q;
    }
  }
}

// A probability pool that overlaps the logits is refused by every back end (the CPU used to
// accept it, though a row's slot would be written while other rows' logits are still read).
TEST_P(SamplingOpsTest, ProcessRowsRefusesAPoolOverlappingTheLogits) {
  const int64_t n = 2, capacity = 4;
  float* memory = device().Put(RandomFloats((n + capacity) * vocab_, rng_));
  std::vector<RowSampling> rows(2);
  for (int32_t r = 0; r < 2; ++r) {
    rows[r].params = Params(1.0f);
    rows[r].prob_slot = r;
  }
  ProcessRowsArgs a;
  a.logits = memory;
  a.n_rows = n;
  a.vocab = vocab_;
  a.rows = device().Put(rows);
  a.probs = memory + vocab_;  // slot 0 is row 1's logits
  a.prob_capacity = capacity;
  a.argmax = device().Output<int32_t>(n);
  a.error = device().Output<int32_t>(n);
  EXPECT_TRUE(
      IsInvalidArgument(backend().ProcessRows(a), "ProcessRows: probs must not overlap logits"));
  a.probs = memory + n * vocab_;
  EXPECT_TRUE(backend().ProcessRows(a).ok());
  EXPECT_EQ(device().Get(a.error, n), std::vector<int32_t>(2, kRowOk));
}

// Rows run in parallel, so two rows of one call writing one pool slot would race: every back end
// refuses the later row (the CPU before it runs, a GPU at the next Synchronize).
TEST_P(SamplingOpsTest, ProcessRowsRefusesTwoRowsSharingASlot) {
  const int64_t n = 3, capacity = 4;
  std::vector<RowSampling> rows(n);
  for (int32_t r = 0; r < n; ++r) rows[r].params = Params(1.0f);
  rows[0].prob_slot = 2;
  rows[1].prob_slot = 0;
  rows[2].prob_slot = 2;
  ProcessRowsArgs a = RowsArgs(rows, capacity);
  const absl::Status status = Checked(backend().ProcessRows(a));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("ProcessRows: rows[2].prob_slot = 2 is"), std::string::npos)
      << status;
  EXPECT_NE(status.message().find("each row needs its own"), std::string::npos) << status;
  // The same rows with their own slots run, and the back end is fine afterwards.
  rows[2].prob_slot = 3;
  a.rows = device().Put(rows);
  EXPECT_TRUE(backend().ProcessRows(a).ok());
  EXPECT_EQ(device().Get(a.error, n), std::vector<int32_t>(n, kRowOk));
}

INSTANTIATE_TEST_SUITE_P(Backends, SamplingOpsTest, ::testing::ValuesIn(AllBackends()), CaseName);

}  // namespace
}  // namespace specd::kernels::conformance
