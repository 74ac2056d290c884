#include "kernels/cpu/processed.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"

namespace specd::kernels::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

absl::Status CheckHistoryIds(std::span<const int32_t> ids, absl::string_view field,
                             int64_t vocab_size) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("history.", field, "[", i, "] = ", ids[i],
                                                     " is outside the vocabulary [0, ", vocab_size,
                                                     ")"));
    }
  }
  return absl::OkStatus();
}

// The maximum of a NaN-free row. Max is exact, so splitting into lanes changes no bit; the
// lanes only let the compiler vectorise.
float MaxOf(std::span<const float> w) {
  constexpr size_t kLanes = 8;
  std::array<float, kLanes> lanes;
  lanes.fill(-kInf);
  const size_t body = w.size() - w.size() % kLanes;
  for (size_t i = 0; i < body; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lanes[j] = std::max(lanes[j], w[i + j]);
  }
  float m = -kInf;
  for (const float lane : lanes) m = std::max(m, lane);
  for (size_t i = body; i < w.size(); ++i) m = std::max(m, w[i]);
  return m;
}

// exp(x) for x <= 0 in fp32, 0 below kExpFlushBelow. See processed.h, step 4: a fixed
// polynomial (Cephes' expf: Cody-Waite reduction by ln 2, degree-6 minimax polynomial) made of
// IEEE adds and multiplies only, so it vectorises and gives the same bits with any libm. Max error
// 1 ulp over [-87, 0] (checked by processed_test against fp64 exp).
inline float ExpNonPositive(float x) {
  // Clamping keeps k in int range for -inf; those lanes are flushed to 0 below.
  const float xc = std::max(x, -87.5f);
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kRoundToInt = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float k = (xc * kLog2e + kRoundToInt) - kRoundToInt;
  constexpr float kLn2Hi = 0.693359375f;  // ln 2 split so that k * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  const float r = (xc - k * kLn2Hi) - k * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // k is in [-126, 0] for x >= -87, so 2^k is a normal float built from its exponent bits.
  const float scale = std::bit_cast<float>((static_cast<int32_t>(k) + 127) << 23);
  return x < kExpFlushBelow ? 0.0f : p * scale;
}

// Divides `w` by its fp64 sum, accumulated in index order. The division is element-wise, so
// the compiler may vectorise it without changing a bit.
void NormalizeInPlace(std::span<float> w) {
  double sum = 0.0;
  for (const float x : w) sum += static_cast<double>(x);
  for (float& x : w) x = static_cast<float>(static_cast<double>(x) / sum);
}

// Step 4 in place over `w` (the kept tokens' logits in ascending id order).
absl::Status SoftmaxInPlace(std::span<float> w) {
  const float m = MaxOf(w);
  if (m == -kInf) {
    return absl::InvalidArgumentError(
        "every token's logit is -inf after penalties, temperature and top-k; there is no "
        "distribution to sample from");
  }
  if (m == kInf) {
    for (float& x : w) x = x == kInf ? 1.0f : 0.0f;
  } else {
    for (float& x : w) x = ExpNonPositive(x - m);
  }
  NormalizeInPlace(w);
  return absl::OkStatus();
}

// Probability buckets for top-p: the float's exponent and top 4 mantissa bits, so bucket order
// is probability order and each bucket spans 1/16 of an octave. (0, 1] maps into [0, 2032].
constexpr int kTopPBucketShift = 19;
constexpr size_t kTopPBuckets = (std::bit_cast<uint32_t>(1.0f) >> kTopPBucketShift) + 1;

inline size_t TopPBucket(float p) {
  return static_cast<size_t>(std::bit_cast<uint32_t>(p) >> kTopPBucketShift);
}

}  // namespace

template <typename Fn>
void LogitsProcessor::ForEachActive(std::span<float> probs, Fn&& fn) const {
  if (dense_) {
    for (size_t i = 0; i < probs.size(); ++i) fn(static_cast<int32_t>(i), probs[i]);
  } else {
    for (const int32_t id : support_) fn(id, probs[id]);
  }
}

absl::Status LogitsProcessor::LoadPenalized(std::span<const float> logits,
                                            const SamplingParams& params,
                                            const TokenHistory& history, std::span<float> work) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) {
      return absl::InvalidArgumentError(absl::StrCat("logits[", i, "] is NaN"));
    }
  }
  if (work.data() != logits.data()) std::copy(logits.begin(), logits.end(), work.begin());
  for (const TokenBias& b : history.bias) {
    if (b.token < 0 || b.token >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logit_bias token ", b.token, " is outside the vocabulary [0, ", vocab, ")"));
    }
    work[b.token] = work[b.token] + b.bias;
  }

  const float rep = params.repetition_penalty;
  if (rep != 1.0f) {
    SPECD_RETURN_IF_ERROR(CheckHistoryIds(history.prompt, "prompt", vocab));
    SPECD_RETURN_IF_ERROR(CheckHistoryIds(history.output, "output", vocab));
    if (static_cast<int64_t>(seen_stamp_.size()) < vocab) seen_stamp_.resize(vocab, 0);
    // A fresh stamp marks "not yet seen" for every id without clearing V entries per row.
    if (++stamp_ == 0) {
      std::fill(seen_stamp_.begin(), seen_stamp_.end(), 0);
      stamp_ = 1;
    }
    for (const std::span<const int32_t> ids : {history.prompt, history.output}) {
      for (const int32_t id : ids) {
        if (seen_stamp_[id] == stamp_) continue;
        seen_stamp_[id] = stamp_;
        work[id] = work[id] > 0.0f ? work[id] / rep : work[id] * rep;
      }
    }
  }

  const float frequency = params.frequency_penalty;
  const float presence = params.presence_penalty;
  if (frequency != 0.0f || presence != 0.0f) {
    SPECD_RETURN_IF_ERROR(CheckHistoryIds(history.output, "output", vocab));
    if (static_cast<int64_t>(output_counts_.size()) < vocab) output_counts_.resize(vocab, 0);
    for (const int32_t id : history.output) {
      if (output_counts_[id]++ == 0) touched_.push_back(id);
    }
    for (const int32_t id : touched_) {
      if (frequency != 0.0f) {
        const float scaled = frequency * static_cast<float>(output_counts_[id]);
        work[id] = work[id] - scaled;
      }
      if (presence != 0.0f) work[id] = work[id] - presence;
      output_counts_[id] = 0;
    }
    touched_.clear();
  }
  return absl::OkStatus();
}

void LogitsProcessor::SelectTopK(std::span<const float> work, int64_t k) {
  // The k-th largest value. For the usual small k a min-heap of the k largest seen so far
  // rejects almost every token with one predictable compare; large k uses nth_element.
  constexpr int64_t kHeapSelectMaxK = 1024;
  float threshold;
  if (k <= kHeapSelectMaxK) {
    values_.assign(work.begin(), work.begin() + k);
    std::make_heap(values_.begin(), values_.end(), std::greater<float>());
    for (size_t i = static_cast<size_t>(k); i < work.size(); ++i) {
      if (work[i] > values_.front()) {
        std::pop_heap(values_.begin(), values_.end(), std::greater<float>());
        values_.back() = work[i];
        std::push_heap(values_.begin(), values_.end(), std::greater<float>());
      }
    }
    threshold = values_.front();
  } else {
    values_.assign(work.begin(), work.end());
    std::nth_element(values_.begin(), values_.begin() + (k - 1), values_.end(),
                     std::greater<float>());
    threshold = values_[k - 1];
  }
  // Tokens above the threshold are all kept; the ties at the threshold that still fit go to
  // the lowest ids.
  int64_t above = 0;
  for (const float w : work) above += w > threshold ? 1 : 0;
  int64_t ties_left = k - above;
  support_.clear();
  values_.clear();
  for (size_t i = 0; i < work.size(); ++i) {
    const float w = work[i];
    if (w > threshold || (w == threshold && ties_left > 0)) {
      if (!(w > threshold)) --ties_left;
      support_.push_back(static_cast<int32_t>(i));
      values_.push_back(w);
    }
  }
}

void LogitsProcessor::ApplyTopP(std::span<float> probs, float top_p) {
  const double target = static_cast<double>(top_p);
  // The nucleus is usually a small head of the row. Bucket the mass by probability, find the
  // bucket where the mass from the top reaches top_p, and sort only the tokens at or above it:
  // they are exactly the head of the full (p desc, id asc) order, so the prefix found in them
  // is the prefix of the full order. The bucket sums run in another order than the prefix sum,
  // so if rounding leaves the head just short, the rest of the row is sorted and appended.
  bucket_mass_.assign(kTopPBuckets, 0.0);
  ForEachActive(probs, [&](int32_t, float p) {
    if (p > 0.0f) bucket_mass_[TopPBucket(p)] += static_cast<double>(p);
  });
  size_t cut = 0;
  double mass_from_top = 0.0;
  for (size_t b = kTopPBuckets; b-- > 0;) {
    mass_from_top += bucket_mass_[b];
    if (mass_from_top >= target) {
      cut = b;
      break;
    }
  }
  order_.clear();
  ForEachActive(probs, [&](int32_t id, float p) {
    if (p > 0.0f && TopPBucket(p) >= cut) order_.push_back(id);
  });
  const auto before = [&probs](int32_t a, int32_t b) {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
  };
  std::sort(order_.begin(), order_.end(), before);
  size_t keep = 0;
  double mass = 0.0;
  const auto scan = [&](size_t from) {
    for (size_t j = from; j < order_.size(); ++j) {
      mass += static_cast<double>(probs[order_[j]]);
      if (mass >= target) {
        keep = j + 1;
        return true;
      }
    }
    return false;
  };
  if (!scan(0)) {
    const size_t head = order_.size();
    ForEachActive(probs, [&](int32_t id, float p) {
      if (p > 0.0f && TopPBucket(p) < cut) order_.push_back(id);
    });
    std::sort(order_.begin() + head, order_.end(), before);
    // If even the whole row falls short of top_p, rounding decides: keep everything.
    if (!scan(head)) keep = order_.size();
  }
  for (size_t j = keep; j < order_.size(); ++j) probs[order_[j]] = 0.0f;
  // Tokens below the cut bucket were never candidates and are not in the prefix.
  if (cut > 0) {
    ForEachActive(probs, [&](int32_t id, float p) {
      if (p > 0.0f && TopPBucket(p) < cut) probs[id] = 0.0f;
    });
  }
}

absl::Status LogitsProcessor::ProcessedDistribution(std::span<const float> logits,
                                                    const SamplingParams& params,
                                                    const TokenHistory& history,
                                                    std::span<float> probs_out) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  SPECD_RETURN_IF_ERROR(ValidateSamplingParams(params, vocab));
  if (probs_out.size() != logits.size()) {
    return absl::InvalidArgumentError(absl::StrCat("probs_out has ", probs_out.size(),
                                                   " entries but logits has ", logits.size()));
  }
  SPECD_RETURN_IF_ERROR(LoadPenalized(logits, params, history, probs_out));
  if (params.greedy()) {
    const int32_t token = ArgMaxLowestId(probs_out);
    std::fill(probs_out.begin(), probs_out.end(), 0.0f);
    probs_out[token] = 1.0f;
    return absl::OkStatus();
  }

  if (params.temperature != 1.0f) {
    const float t = params.temperature;
    for (float& w : probs_out) w = w / t;
  }

  dense_ = !(params.top_k > 0 && params.top_k < vocab);
  if (dense_) {
    SPECD_RETURN_IF_ERROR(SoftmaxInPlace(probs_out));
  } else {
    SelectTopK(probs_out, params.top_k);
    SPECD_RETURN_IF_ERROR(SoftmaxInPlace(values_));
    std::fill(probs_out.begin(), probs_out.end(), 0.0f);
    for (size_t j = 0; j < support_.size(); ++j) probs_out[support_[j]] = values_[j];
  }

  if (params.top_p >= 1.0f && params.min_p <= 0.0f) return absl::OkStatus();

  if (params.top_p < 1.0f) ApplyTopP(probs_out, params.top_p);

  if (params.min_p > 0.0f) {
    const float p_max = dense_ ? MaxOf(probs_out) : MaxOf(values_);
    const float threshold = params.min_p * p_max;
    ForEachActive(probs_out, [&](int32_t id, float p) {
      if (p < threshold) probs_out[id] = 0.0f;
    });
  }

  // Step 7. Removed tokens are 0 here, and adding 0 leaves an fp64 sum unchanged, so in both
  // modes this divides by the sum of the kept probabilities in ascending id order.
  if (dense_) {
    NormalizeInPlace(probs_out);
  } else {
    double kept_mass = 0.0;
    for (const int32_t id : support_) kept_mass += static_cast<double>(probs_out[id]);
    for (const int32_t id : support_) {
      probs_out[id] = static_cast<float>(static_cast<double>(probs_out[id]) / kept_mass);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> LogitsProcessor::GreedyToken(std::span<const float> logits,
                                                     const SamplingParams& params,
                                                     const TokenHistory& history) {
  SPECD_RETURN_IF_ERROR(ValidateSamplingParams(params, static_cast<int64_t>(logits.size())));
  values_.resize(logits.size());
  SPECD_RETURN_IF_ERROR(LoadPenalized(logits, params, history, values_));
  return ArgMaxLowestId(values_);
}

absl::Status LogitsProcessor::Penalize(std::span<const float> logits, const SamplingParams& params,
                                       const TokenHistory& history, std::span<float> out) {
  SPECD_RETURN_IF_ERROR(ValidateSamplingParams(params, static_cast<int64_t>(logits.size())));
  if (out.size() != logits.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("out has ", out.size(), " entries but logits has ", logits.size()));
  }
  return LoadPenalized(logits, params, history, out);
}

int32_t ArgMaxLowestId(std::span<const float> row) {
  int32_t best = 0;
  for (size_t i = 1; i < row.size(); ++i) {
    if (row[i] > row[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

float ExpForSoftmax(float x) { return ExpNonPositive(x); }

absl::Status ProcessedDistribution(std::span<const float> logits, const SamplingParams& params,
                                   const TokenHistory& history, std::span<float> probs_out) {
  LogitsProcessor processor;
  return processor.ProcessedDistribution(logits, params, history, probs_out);
}

absl::StatusOr<int32_t> GreedyToken(std::span<const float> logits, const SamplingParams& params,
                                    const TokenHistory& history) {
  LogitsProcessor processor;
  return processor.GreedyToken(logits, params, history);
}

}  // namespace specd::kernels::cpu
