#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/inverse_cdf.h"
#include "base/philox.h"
#include "base/status_macros.h"
#include "kernels/cpu/processed.h"
#include "kernels/validate.h"

namespace specd::kernels::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

absl::Status CheckRowIndex(absl::string_view op, absl::string_view field, int64_t i, int64_t value,
                           int64_t limit) {
  if (value >= 0 && value < limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", field, "[", i, "] = ", value, " is outside [0, ", limit, ")"));
}

std::span<const float> Row(const float* base, int64_t row, int64_t vocab) {
  return {base + row * vocab, static_cast<size_t>(vocab)};
}

bool HasNan(std::span<const float> row) {
  return std::any_of(row.begin(), row.end(), [](float x) { return std::isnan(x); });
}

absl::Status CheckRowSampling(const ProcessRowsArgs& a, int64_t r) {
  constexpr absl::string_view kOp = "ProcessRows";
  const RowSampling& rs = a.rows[r];
  SPECD_RETURN_IF_ERROR(CheckRowIndex(kOp, "rows.prob_slot", r, rs.prob_slot, a.prob_capacity));
  switch (rs.mode) {
    case RowMode::kGreedy:
    case RowMode::kSample:
    case RowMode::kArgmaxOfProcessed:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(kOp, ": rows[", r, "].mode has unknown value ",
                                                     static_cast<int32_t>(rs.mode)));
  }
  for (const auto& [begin, len] :
       {std::pair{rs.prompt_begin, rs.prompt_len}, std::pair{rs.output_begin, rs.output_len}}) {
    if (begin < 0 || len < 0 || begin > a.history_len || len > a.history_len - begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          kOp, ": rows[", r, "] names history outside [0, history_len = ", a.history_len, ")"));
    }
  }
  if (a.history == nullptr && (rs.prompt_len > 0 || rs.output_len > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": history must not be null"));
  }
  if (rs.bias_begin < 0 || rs.bias_len < 0 || rs.bias_begin > a.n_biases ||
      rs.bias_len > a.n_biases - rs.bias_begin || (a.biases == nullptr && rs.bias_len > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": rows[", r, "] names logit biases outside [0, n_biases = ", a.n_biases, ")"));
  }
  if (rs.bias_len > 0) {
    const absl::Status bias =
        ValidateLogitBias({a.biases + rs.bias_begin, static_cast<size_t>(rs.bias_len)}, a.vocab);
    if (!bias.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          kOp, ": rows[", r, "] names logit biases that are not valid: ", bias.message()));
    }
  }
  absl::Status params = ValidateSamplingParams(rs.params, a.vocab);
  if (!params.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": rows[", r, "]: ", params.message()));
  }
  return absl::OkStatus();
}

// The n tokens of `w` with the largest values, by (value desc, id asc), into `out`. NaN-free.
void TopTokens(std::span<const float> w, int32_t n, int32_t* out) {
  int32_t count = 0;
  for (int32_t i = 0; i < static_cast<int32_t>(w.size()); ++i) {
    const float v = w[static_cast<size_t>(i)];
    if (count == n && !(v > w[static_cast<size_t>(out[n - 1])])) continue;
    // Ids arrive in ascending order, so an equal value goes after the ones already kept.
    int32_t at = count < n ? count++ : n - 1;
    while (at > 0 && v > w[static_cast<size_t>(out[at - 1])]) {
      out[at] = out[at - 1];
      --at;
    }
    out[at] = i;
  }
}

// −Σ s ln s / ln V for s = softmax(w), in fp64 over fp32 exponentials (processed.h, step 4).
float NormalizedEntropy(std::span<const float> w) {
  if (w.size() < 2) return 0.0f;
  float m = -kInf;
  for (const float x : w) m = std::max(m, x);
  if (m == -kInf) return 0.0f;  // no distribution: nothing to be unsure about
  double sum = 0.0;
  double weighted = 0.0;
  if (m == kInf) {
    // The limit: the mass is spread evenly over the +inf logits.
    sum = static_cast<double>(std::count(w.begin(), w.end(), kInf));
  } else {
    for (const float x : w) {
      const float d = x - m;
      const float e = ExpForSoftmax(d);
      if (e == 0.0f) continue;
      sum += static_cast<double>(e);
      weighted += static_cast<double>(e) * static_cast<double>(d);
    }
  }
  const double entropy = std::log(sum) - weighted / sum;
  return static_cast<float>(std::max(entropy, 0.0) / std::log(static_cast<double>(w.size())));
}

// One row of ProcessRows; returns its RowError.
int32_t ProcessOneRow(const ProcessRowsArgs& a, int64_t r) {
  thread_local LogitsProcessor processor;
  thread_local std::vector<float> work;
  const RowSampling& rs = a.rows[r];
  const std::span<const float> logits = Row(a.logits, r, a.vocab);
  if (HasNan(logits)) return kRowNanLogit;
  std::span<float> penalized;
  if (a.penalized != nullptr) {
    penalized = {a.penalized + r * a.vocab, static_cast<size_t>(a.vocab)};
  } else {
    work.resize(static_cast<size_t>(a.vocab));
    penalized = work;
  }
  const TokenHistory history{
      {a.history + rs.prompt_begin, static_cast<size_t>(rs.prompt_len)},
      {a.history + rs.output_begin, static_cast<size_t>(rs.output_len)},
      {rs.bias_len > 0 ? a.biases + rs.bias_begin : nullptr, static_cast<size_t>(rs.bias_len)}};
  if (a.entropy != nullptr) a.entropy[r] = NormalizedEntropy(logits);
  if (!processor.Penalize(logits, rs.params, history, penalized).ok()) return kRowBadHistory;
  a.argmax[r] = ArgMaxLowestId(penalized);
  if (a.top_n > 0) TopTokens(penalized, a.top_n, a.top_ids + r * a.top_n);

  const std::span<float> probs(a.probs + int64_t{rs.prob_slot} * a.vocab,
                               static_cast<size_t>(a.vocab));
  int32_t one_hot = a.argmax[r];
  if (rs.mode != RowMode::kGreedy) {
    // The penalties are already in `penalized`; applying neutral ones again changes no bit.
    SamplingParams rest = rs.params;
    rest.repetition_penalty = 1.0f;
    rest.presence_penalty = 0.0f;
    rest.frequency_penalty = 0.0f;
    if (!processor.ProcessedDistribution(penalized, rest, {}, probs).ok()) {
      return kRowNoFiniteLogit;
    }
    if (rs.mode == RowMode::kSample) return kRowOk;
    one_hot = a.argmax[r] = ArgMaxLowestId(probs);
  }
  std::fill(probs.begin(), probs.end(), 0.0f);
  probs[static_cast<size_t>(one_hot)] = 1.0f;
  return kRowOk;
}

// Log-probabilities of one row into `out` (vocab entries), as LogprobsArgs defines them.
void RowLogprobs(std::span<const float> w, std::span<float> out) {
  const float m = *std::max_element(w.begin(), w.end());
  if (m == -kInf || m == kInf) {
    // No finite maximum: the mass sits on the +inf tokens (the limit), or nowhere.
    const auto at_max = static_cast<double>(std::count(w.begin(), w.end(), m));
    for (size_t i = 0; i < w.size(); ++i) {
      out[i] = (m == kInf && w[i] == kInf) ? static_cast<float>(-std::log(at_max)) : -kInf;
    }
    return;
  }
  const double md = static_cast<double>(m);
  double sum = 0.0;
  for (const float x : w) sum += std::exp(static_cast<double>(x) - md);
  const double log_sum = std::log(sum);
  for (size_t i = 0; i < w.size(); ++i) {
    out[i] = static_cast<float>((static_cast<double>(w[i]) - md) - log_sum);
  }
}

}  // namespace

absl::Status CpuCombineLogits(const CombineLogitsArgs& a, const CpuContext& ctx) {
  SPECD_RETURN_IF_ERROR(ValidateCombineLogitsArgs(a));
  if (a.n_pairs == 0) return absl::OkStatus();
  // The pairs and scales are host memory here, so they are checked before any row changes, and
  // so is disjointness, which the CUDA kernel cannot check (see kernels/cuda/sampling.h).
  constexpr absl::string_view kOp = "CombineLogits";
  std::vector<bool> used(static_cast<size_t>(a.n_rows), false);
  for (int64_t i = 0; i < a.n_pairs; ++i) {
    SPECD_RETURN_IF_ERROR(CheckRowIndex(kOp, "cond_rows", i, a.cond_rows[i], a.n_rows));
    SPECD_RETURN_IF_ERROR(CheckRowIndex(kOp, "uncond_rows", i, a.uncond_rows[i], a.n_rows));
    for (const int32_t row : {a.cond_rows[i], a.uncond_rows[i]}) {
      if (used[static_cast<size_t>(row)]) {
        return absl::InvalidArgumentError(
            absl::StrCat(kOp, ": row ", row, " appears in more than one place"));
      }
      used[static_cast<size_t>(row)] = true;
    }
    if (!std::isfinite(a.scale[i])) {
      return absl::InvalidArgumentError(absl::StrCat(kOp, ": scale[", i, "] must be finite"));
    }
  }
  ctx.pool->ParallelFor(a.n_pairs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* c = a.logits + int64_t{a.cond_rows[i]} * a.vocab;
      const float* u = a.logits + int64_t{a.uncond_rows[i]} * a.vocab;
      const float s = a.scale[i];
      for (int64_t j = 0; j < a.vocab; ++j) {
        const float diff = c[j] - u[j];
        const float scaled = s * diff;
        c[j] = u[j] + scaled;
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuProcessRows(const ProcessRowsArgs& a, const CpuContext& ctx) {
  SPECD_RETURN_IF_ERROR(ValidateProcessRowsArgs(a));
  if (a.n_rows == 0) return absl::OkStatus();
  // Each row's request is host memory here: checked before any row is processed.
  absl::flat_hash_map<int32_t, int64_t> row_of_slot;
  for (int64_t r = 0; r < a.n_rows; ++r) {
    SPECD_RETURN_IF_ERROR(CheckRowSampling(a, r));
    // Rows run in parallel, so two rows writing one pool slot would race.
    const auto [at, fresh] = row_of_slot.try_emplace(a.rows[r].prob_slot, r);
    if (!fresh) {
      return absl::InvalidArgumentError(
          absl::StrCat("ProcessRows: rows[", r, "].prob_slot = ", a.rows[r].prob_slot, " is rows[",
                       at->second, "]'s slot too; each row needs its own"));
    }
  }
  ctx.pool->ParallelFor(a.n_rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) a.error[r] = ProcessOneRow(a, r);
  });
  return absl::OkStatus();
}

absl::Status CpuSampleRows(const SampleRowsArgs& a, const CpuContext& ctx) {
  SPECD_RETURN_IF_ERROR(ValidateSampleRowsArgs(a));
  if (a.n == 0) return absl::OkStatus();
  // The draws are host memory here: their rows are checked before any is drawn.
  for (int64_t i = 0; i < a.n; ++i) {
    SPECD_RETURN_IF_ERROR(
        CheckRowIndex("SampleRows", "draws.prob_slot", i, a.draws[i].prob_slot, a.prob_capacity));
  }
  ctx.pool->ParallelFor(a.n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Draw& d = a.draws[i];
      const std::span<const float> row = Row(a.probs, d.prob_slot, a.vocab);
      const double u = StreamUniform(d.seed, d.position, d.purpose, d.index, d.sample);
      const absl::StatusOr<int32_t> token = SampleInverseCdf(row, u);
      a.error[i] = token.ok() ? kRowOk : kRowEmpty;
      a.tokens[i] = token.ok() ? *token : 0;
      a.token_probs[i] = token.ok() ? row[static_cast<size_t>(*token)] : 0.0f;
    }
  });
  return absl::OkStatus();
}

absl::Status CpuGatherProbs(const GatherProbsArgs& a, const CpuContext& ctx) {
  (void)ctx;  // a lookup per request is not worth other threads
  SPECD_RETURN_IF_ERROR(ValidateGatherProbsArgs(a));
  if (a.n == 0) return absl::OkStatus();
  // The lookups are host memory here: checked before any is made.
  constexpr absl::string_view kOp = "GatherProbs";
  for (int64_t i = 0; i < a.n; ++i) {
    SPECD_RETURN_IF_ERROR(CheckRowIndex(kOp, "slots", i, a.slots[i], a.prob_capacity));
    SPECD_RETURN_IF_ERROR(CheckRowIndex(kOp, "tokens", i, a.tokens[i], a.vocab));
  }
  for (int64_t i = 0; i < a.n; ++i) a.out[i] = a.probs[int64_t{a.slots[i]} * a.vocab + a.tokens[i]];
  return absl::OkStatus();
}

absl::Status CpuLogprobs(const LogprobsArgs& a, const CpuContext& ctx) {
  SPECD_RETURN_IF_ERROR(ValidateLogprobsArgs(a));
  if (a.n_rows == 0 && a.n_queries == 0) return absl::OkStatus();
  // The queries are host memory here: checked before any is answered.
  constexpr absl::string_view kOp = "Logprobs";
  for (int64_t i = 0; i < a.n_queries; ++i) {
    SPECD_RETURN_IF_ERROR(CheckRowIndex(kOp, "query_rows", i, a.query_rows[i], a.n_rows));
    SPECD_RETURN_IF_ERROR(CheckRowIndex(kOp, "query_tokens", i, a.query_tokens[i], a.vocab));
  }
  // Each row's logprobs are computed once, on one thread; queries then read them.
  std::vector<float> all(static_cast<size_t>(a.n_rows * a.vocab));
  ctx.pool->ParallelFor(a.n_rows, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<int32_t> order;
    for (int64_t r = begin; r < end; ++r) {
      const std::span<float> lp(all.data() + r * a.vocab, static_cast<size_t>(a.vocab));
      RowLogprobs(Row(a.logits, r, a.vocab), lp);
      if (a.top_n == 0) continue;
      order.resize(static_cast<size_t>(a.vocab));
      for (int32_t i = 0; i < a.vocab; ++i) order[static_cast<size_t>(i)] = i;
      std::partial_sort(
          order.begin(), order.begin() + a.top_n, order.end(),
          [&](int32_t x, int32_t y) { return lp[x] > lp[y] || (lp[x] == lp[y] && x < y); });
      for (int32_t j = 0; j < a.top_n; ++j) {
        a.top_ids[r * a.top_n + j] = order[static_cast<size_t>(j)];
        a.top_logprobs[r * a.top_n + j] = lp[order[static_cast<size_t>(j)]];
      }
    }
  });
  for (int64_t i = 0; i < a.n_queries; ++i) {
    a.query_logprobs[i] =
        all[static_cast<size_t>(int64_t{a.query_rows[i]} * a.vocab + a.query_tokens[i])];
  }
  return absl::OkStatus();
}

}  // namespace specd::kernels::cpu
