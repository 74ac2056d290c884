#include "kernels/cuda/processed.h"

#include <cstdint>

#include "base/status_macros.h"
#include "kernels/cpu/processed.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/validate.h"

namespace specd::kernels::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr float kInf = __builtin_huge_valf();
constexpr uint32_t kSeenBit = 0x80000000u;

struct Shared {
  float f[kWarp];
  int32_t i[kWarp];
  double d[kWarp];
  int64_t l[kWarp];
  int32_t bad;
  int32_t repeated;
};

// kernels/cpu/processed.cc's ExpNonPositive, one IEEE operation at a time (see processed.h).
__device__ float ExpNonPositive(float x) {
  const float xc = fmaxf(x, -87.5f);
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kRoundToInt = 12582912.0f;
  const float k = __fsub_rn(__fadd_rn(__fmul_rn(xc, kLog2e), kRoundToInt), kRoundToInt);
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  const float r = __fsub_rn(__fsub_rn(xc, __fmul_rn(k, kLn2Hi)), __fmul_rn(k, kLn2Lo));
  float p = 1.9875691500e-4f;
  p = __fadd_rn(__fmul_rn(p, r), 1.3981999507e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 8.3334519073e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 4.1665795894e-2f);
  p = __fadd_rn(__fmul_rn(p, r), 1.6666665459e-1f);
  p = __fadd_rn(__fmul_rn(p, r), 5.0000001201e-1f);
  p = __fadd_rn(__fadd_rn(__fmul_rn(p, __fmul_rn(r, r)), r), 1.0f);
  const float scale = __int_as_float((static_cast<int32_t>(k) + 127) << 23);
  return x < cpu::kExpFlushBelow ? 0.0f : __fmul_rn(p, scale);
}

// Order-preserving key of a non-NaN float, with -0 and +0 equal.
__device__ __forceinline__ uint32_t Key(float f) {
  const uint32_t u = f == 0.0f ? 0u : __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ int64_t CountIf(int64_t n, Shared& s, auto pred) {
  int64_t c = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) c += pred(i) ? 1 : 0;
  return BlockSum<int64_t>(c, s.l);
}

// The fp64 sum of value(i) over i in [0, n): each thread adds its strided ids in ascending
// order, then BlockSum's fixed tree.
__device__ double SumIf(int64_t n, Shared& s, auto value) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) acc = __dadd_rn(acc, value(i));
  return BlockSum<double>(acc, s.d);
}

// A threshold search asks about three candidate keys per pass over the row, so it takes half
// the passes of a bisection (16 instead of 32 for a 32-bit key). Each candidate's count or sum
// is formed exactly as a pass of its own would form it (CountIf's, SumIf's order), so the search
// lands on the bisection's key.
constexpr int kCandidates = 3;
using Candidates = uint32_t[kCandidates];

// For each candidate key j: how many of the row's values have Key(value) >= keys[j].
__device__ void CountKeysAtLeast(const float* row, int64_t n, Shared& s, const Candidates& keys,
                                 int64_t (&out)[kCandidates]) {
  int64_t c[kCandidates] = {};
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const uint32_t key = Key(row[i]);
#pragma unroll
    for (int j = 0; j < kCandidates; ++j) c[j] += key >= keys[j] ? 1 : 0;
  }
#pragma unroll
  for (int j = 0; j < kCandidates; ++j) out[j] = BlockSum<int64_t>(c[j], s.l);
}

// The fp64 mass of the positive probabilities whose bits are >= `key` (SumIf's order).
__device__ double MassAtLeast(const float* probs, int64_t n, Shared& s, uint32_t key) {
  return SumIf(n, s, [&](int64_t i) {
    const float p = probs[i];
    return p > 0.0f && __float_as_uint(p) >= key ? static_cast<double>(p) : 0.0;
  });
}

// MassAtLeast for each candidate key, in one pass.
__device__ void MassesAtLeast(const float* probs, int64_t n, Shared& s, const Candidates& keys,
                              double (&out)[kCandidates]) {
  double acc[kCandidates] = {};
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float p = probs[i];
    const uint32_t bits = __float_as_uint(p);
#pragma unroll
    for (int j = 0; j < kCandidates; ++j) {
      acc[j] = __dadd_rn(acc[j], p > 0.0f && bits >= keys[j] ? static_cast<double>(p) : 0.0);
    }
  }
#pragma unroll
  for (int j = 0; j < kCandidates; ++j) out[j] = BlockSum<double>(acc[j], s.d);
}

// The largest key in [lo, hi] at which a monotone test holds (true up to some key, false above
// it), given that it holds at lo. `test(keys, holds)` answers for kCandidates ascending keys in
// one pass; they cut (lo, hi] into kCandidates + 1 near-equal parts.
__device__ uint32_t LargestKeyThatHolds(uint32_t lo, uint32_t hi, auto test) {
  while (lo < hi) {
    const uint64_t span = uint64_t{hi} - lo;
    Candidates keys;
#pragma unroll
    for (int j = 0; j < kCandidates; ++j) {
      keys[j] = lo + static_cast<uint32_t>((span * (j + 1) + kCandidates) / (kCandidates + 1));
    }
    bool holds[kCandidates];
    test(keys, holds);
    uint32_t next_lo = lo, next_hi = hi;
#pragma unroll
    for (int j = 0; j < kCandidates; ++j) {
      if (holds[j]) next_lo = keys[j];
    }
#pragma unroll
    for (int j = kCandidates - 1; j >= 0; --j) {
      if (!holds[j]) next_hi = keys[j] - 1;
    }
    lo = next_lo;
    hi = next_hi;
  }
  return lo;
}

// The smallest id bound B such that `pred` holds for `want` ids below B (want <= count(pred)).
__device__ int64_t NthIdBound(int64_t n, int64_t want, Shared& s, auto pred) {
  int64_t lo = 1, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (CountIf(mid, s, pred) >= want) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

__device__ bool ParamsValid(const SamplingParams& p) {
  const auto finite = [](float x) { return isfinite(x); };
  return finite(p.temperature) && p.temperature >= 0.0f && p.top_k >= 0 && finite(p.top_p) &&
         p.top_p > 0.0f && p.top_p <= 1.0f && finite(p.min_p) && p.min_p >= 0.0f &&
         p.min_p <= 1.0f && finite(p.repetition_penalty) && p.repetition_penalty > 0.0f &&
         finite(p.presence_penalty) && p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f &&
         finite(p.frequency_penalty) && p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f;
}

// The row's arguments; reports the first bad one. Thread 0 only.
__device__ bool RowValid(const ProcessRowsArgs& a, int64_t r, const RowSampling& rs,
                         DeviceError* error) {
  const auto report = [&](DeviceField f, int64_t v) {
    ReportError(error, DeviceOp::kProcessRows, f, r, v);
    return false;
  };
  if (rs.prob_slot < 0 || rs.prob_slot >= a.prob_capacity) {
    return report(DeviceField::kProbSlot, rs.prob_slot);
  }
  const int32_t mode = static_cast<int32_t>(rs.mode);
  if (mode < 0 || mode > 2) return report(DeviceField::kMode, mode);
  if (rs.prompt_begin < 0 || rs.prompt_len < 0 || rs.prompt_begin > a.history_len ||
      rs.prompt_len > a.history_len - rs.prompt_begin || rs.output_begin < 0 || rs.output_len < 0 ||
      rs.output_begin > a.history_len || rs.output_len > a.history_len - rs.output_begin ||
      (a.history == nullptr && (rs.prompt_len > 0 || rs.output_len > 0))) {
    return report(DeviceField::kHistoryRange, a.history_len);
  }
  if (!ParamsValid(rs.params)) return report(DeviceField::kParams, 0);
  if (rs.bias_begin < 0 || rs.bias_len < 0 || rs.bias_len > kMaxLogitBiasTokens ||
      rs.bias_begin > a.n_biases || rs.bias_len > a.n_biases - rs.bias_begin ||
      (a.biases == nullptr && rs.bias_len > 0)) {
    return report(DeviceField::kBias, a.n_biases);
  }
  // As ValidateLogitBias (base/sampling_params.h); AddBias's binary search needs ascending tokens.
  for (int64_t j = 0; j < rs.bias_len; ++j) {
    const TokenBias b = a.biases[rs.bias_begin + j];
    if (b.token < 0 || b.token >= a.vocab || !isfinite(b.bias) || fabsf(b.bias) > kMaxLogitBias ||
        (j > 0 && b.token <= a.biases[rs.bias_begin + j - 1].token)) {
      return report(DeviceField::kBias, a.n_biases);
    }
  }
  return true;
}

// x + the token's logit bias, when it has one (an absent token keeps its bits: x + 0 would turn
// -0 into +0). `bias` is the row's list, ascending by token.
__device__ float AddBias(float x, int32_t token, const TokenBias* bias, int64_t n) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (bias[mid].token < token) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < n && bias[lo].token == token ? __fadd_rn(x, bias[lo].bias) : x;
}

__global__ void __launch_bounds__(kThreads)
    ProcessRowsKernel(ProcessRowsArgs a, DeviceError* error) {
  AfterPreviousKernel();
  __shared__ Shared s;
  const int64_t r = blockIdx.x;
  const int64_t V = a.vocab;
  const int tid = threadIdx.x;
  const RowSampling rs = a.rows[r];
  if (tid == 0) {
    s.bad = RowValid(a, r, rs, error) ? 0 : 1;
    s.repeated = 0;
  }
  __syncthreads();
  // Rows run in parallel, so two rows writing one pool slot would race; the later one is refused.
  for (int64_t j = tid; j < r; j += blockDim.x) {
    if (a.rows[j].prob_slot == rs.prob_slot) s.repeated = 1;
  }
  __syncthreads();
  if (tid == 0 && s.repeated && !s.bad) {
    ReportError(error, DeviceOp::kProcessRows, DeviceField::kRepeatedProbSlot, r, rs.prob_slot);
    s.bad = 1;
  }
  __syncthreads();
  if (s.bad) {
    if (tid == 0) a.error[r] = kRowBadHistory;
    return;
  }
  const SamplingParams params = rs.params;
  const RowMode mode = rs.mode;
  const float* logits = a.logits + r * V;
  float* probs = a.probs + int64_t{rs.prob_slot} * V;

  // 0. A NaN logit fails the row.
  if (CountIf(V, s, [&](int64_t i) { return isnan(logits[i]); }) > 0) {
    if (tid == 0) a.error[r] = kRowNanLogit;
    return;
  }

  // The normalized entropy of softmax(logits) at temperature 1 (EGAG), as the CPU computes it
  // up to the order of the fp64 sums.
  if (a.entropy != nullptr) {
    float lm = -kInf;
    for (int64_t i = tid; i < V; i += kThreads) lm = fmaxf(lm, logits[i]);
    lm = BlockMax(lm, s.f, -kInf);
    double sum = 0.0;
    double weighted = 0.0;
    if (lm == kInf) {
      sum = static_cast<double>(CountIf(V, s, [&](int64_t i) { return logits[i] == kInf; }));
    } else if (lm != -kInf) {
      sum = SumIf(V, s, [&](int64_t i) {
        return static_cast<double>(ExpNonPositive(__fsub_rn(logits[i], lm)));
      });
      __syncthreads();
      weighted = SumIf(V, s, [&](int64_t i) {
        const float d = __fsub_rn(logits[i], lm);
        const float e = ExpNonPositive(d);
        return e == 0.0f ? 0.0 : static_cast<double>(e) * static_cast<double>(d);
      });
    }
    if (tid == 0) {
      const double h = lm == -kInf || V < 2 ? 0.0 : fmax(log(sum) - weighted / sum, 0.0);
      a.entropy[r] = V < 2 ? 0.0f : static_cast<float>(h / log(static_cast<double>(V)));
    }
    __syncthreads();
  }

  // 1. The logit bias, then the penalties, into `work` (the penalized row when asked for, else
  // the pool slot), using it first as per-token counts: bit 31 = seen in prompt or output, low
  // bits = output count.
  const float rep = params.repetition_penalty;
  const float freq = params.frequency_penalty;
  const float pres = params.presence_penalty;
  const bool penalize = rep != 1.0f || freq != 0.0f || pres != 0.0f;
  const TokenBias* const bias = a.biases + rs.bias_begin;
  const int64_t n_bias = rs.bias_len;
  float* const penalized_out = a.penalized != nullptr ? a.penalized + r * V : nullptr;
  const float* w = logits;  // the penalised logits from here on
  if (penalize) {
    float* work = penalized_out != nullptr ? penalized_out : probs;
    uint32_t* counts = reinterpret_cast<uint32_t*>(work);
    const int32_t* prompt = a.history + rs.prompt_begin;
    const int32_t* output = a.history + rs.output_begin;
    const int64_t np = rep != 1.0f ? rs.prompt_len : 0;
    const int64_t no = rs.output_len;
    const auto bad_id = [V](int32_t id) { return id < 0 || id >= V; };
    int bad = 0;
    for (int64_t j = tid; j < np; j += kThreads) bad |= bad_id(prompt[j]);
    for (int64_t j = tid; j < no; j += kThreads) bad |= bad_id(output[j]);
    if (__syncthreads_or(bad)) {
      if (tid == 0) a.error[r] = kRowBadHistory;
      return;
    }
    for (int64_t i = tid; i < V; i += kThreads) counts[i] = 0;
    __syncthreads();
    for (int64_t j = tid; j < np; j += kThreads) atomicOr(&counts[prompt[j]], kSeenBit);
    for (int64_t j = tid; j < no; j += kThreads) {
      if (rep != 1.0f) atomicOr(&counts[output[j]], kSeenBit);
      if (freq != 0.0f || pres != 0.0f) atomicAdd(&counts[output[j]], 1u);
    }
    __syncthreads();
    for (int64_t i = tid; i < V; i += kThreads) {
      const uint32_t c = counts[i];
      float x = n_bias > 0 ? AddBias(logits[i], static_cast<int32_t>(i), bias, n_bias) : logits[i];
      if (rep != 1.0f && (c & kSeenBit) != 0) x = x > 0.0f ? __fdiv_rn(x, rep) : __fmul_rn(x, rep);
      const uint32_t n = c & ~kSeenBit;
      if (n > 0) {
        if (freq != 0.0f) x = __fsub_rn(x, __fmul_rn(freq, static_cast<float>(n)));
        if (pres != 0.0f) x = __fsub_rn(x, pres);
      }
      work[i] = x;
    }
    __syncthreads();
    w = work;
  } else if (n_bias > 0) {
    float* work = penalized_out != nullptr ? penalized_out : probs;
    for (int64_t i = tid; i < V; i += kThreads) {
      work[i] = AddBias(logits[i], static_cast<int32_t>(i), bias, n_bias);
    }
    __syncthreads();
    w = work;
  } else if (penalized_out != nullptr) {
    for (int64_t i = tid; i < V; i += kThreads) penalized_out[i] = logits[i];
  }

  // 2. The penalised argmax, lowest id on ties.
  ArgMax best{-kInf, 0x7fffffff};
  for (int64_t i = tid; i < V; i += kThreads) {
    best = Better(best, ArgMax{w[i], static_cast<int32_t>(i)});
  }
  best = BlockArgMax(best, s.f, s.i);
  if (tid == 0) a.argmax[r] = best.id;

  // 2b. The top_n tokens by penalised logit, (value desc, id asc): each round takes the best
  // entry after the previous one.
  float prev_v = kInf;
  int32_t prev_id = -1;
  for (int32_t j = 0; j < a.top_n; ++j) {
    ArgMax next{-kInf, 0x7fffffff};
    for (int64_t i = tid; i < V; i += kThreads) {
      const float v = w[i];
      if (v < prev_v || (v == prev_v && i > prev_id)) {
        next = Better(next, ArgMax{v, static_cast<int32_t>(i)});
      }
    }
    next = BlockArgMax(next, s.f, s.i);
    if (tid == 0) a.top_ids[r * a.top_n + j] = next.id;
    prev_v = next.value;
    prev_id = next.id;
  }

  const auto one_hot = [&](int32_t at) {
    __syncthreads();  // every read of the row is done
    for (int64_t i = tid; i < V; i += kThreads) probs[i] = 0.0f;
    __syncthreads();
    if (tid == 0) {
      probs[at] = 1.0f;
      a.argmax[r] = at;
      a.error[r] = kRowOk;
    }
  };
  if (mode == RowMode::kGreedy || params.temperature == 0.0f) {
    one_hot(best.id);
    return;
  }

  // 3. Temperature, into the pool slot (in place when w is the slot).
  const float temp = params.temperature;
  for (int64_t i = tid; i < V; i += kThreads) {
    probs[i] = temp != 1.0f ? __fdiv_rn(w[i], temp) : w[i];
  }
  __syncthreads();

  // 4. Top-k: the k-th largest key (the largest key at or above which k values lie; every value
  // is at or above key 0), then the ties that fit, lowest ids first.
  const int64_t k = params.top_k;
  if (k > 0 && k < V) {
    const uint32_t tau = LargestKeyThatHolds(
        0u, 0xffffffffu, [&](const Candidates& keys, bool(&holds)[kCandidates]) {
          int64_t counts[kCandidates];
          CountKeysAtLeast(probs, V, s, keys, counts);
#pragma unroll
          for (int j = 0; j < kCandidates; ++j) holds[j] = counts[j] >= k;
        });
    const int64_t above =
        tau == 0xffffffffu ? 0 : CountIf(V, s, [&](int64_t i) { return Key(probs[i]) > tau; });
    const int64_t ties = CountIf(V, s, [&](int64_t i) { return Key(probs[i]) == tau; });
    const int64_t fit = k - above;
    const int64_t bound =
        fit >= ties ? V : NthIdBound(V, fit, s, [&](int64_t i) { return Key(probs[i]) == tau; });
    __syncthreads();
    for (int64_t i = tid; i < V; i += kThreads) {
      const uint32_t key = Key(probs[i]);
      if (key < tau || (key == tau && i >= bound)) probs[i] = -kInf;
    }
    __syncthreads();
  }

  // 5. Softmax: exact max, the CPU's exponential, the fp64 total, one division each.
  float m = -kInf;
  for (int64_t i = tid; i < V; i += kThreads) m = fmaxf(m, probs[i]);
  m = BlockMax(m, s.f, -kInf);
  if (m == -kInf) {
    if (tid == 0) a.error[r] = kRowNoFiniteLogit;
    return;
  }
  for (int64_t i = tid; i < V; i += kThreads) {
    const float x = probs[i];
    probs[i] = m == kInf ? (x == kInf ? 1.0f : 0.0f) : ExpNonPositive(__fsub_rn(x, m));
  }
  __syncthreads();
  const double total = SumIf(V, s, [&](int64_t i) { return static_cast<double>(probs[i]); });
  __syncthreads();
  for (int64_t i = tid; i < V; i += kThreads) {
    probs[i] = __double2float_rn(__ddiv_rn(static_cast<double>(probs[i]), total));
  }
  __syncthreads();

  // 6. Top-p: tau = the largest value whose mass at or above it reaches top_p; ties at tau kept
  // in ascending id until the running mass reaches top_p.
  const bool top_p = params.top_p < 1.0f;
  if (top_p) {
    const double target = static_cast<double>(params.top_p);
    if (MassAtLeast(probs, V, s, 1) >= target) {
      const uint32_t tau = LargestKeyThatHolds(
          1u, 0x7f800000u, [&](const Candidates& keys, bool(&holds)[kCandidates]) {
            double masses[kCandidates];
            MassesAtLeast(probs, V, s, keys, masses);
#pragma unroll
            for (int j = 0; j < kCandidates; ++j) holds[j] = masses[j] >= target;
          });
      const float tv = __uint_as_float(tau);
      const double above = MassAtLeast(probs, V, s, tau + 1);
      const int64_t ties =
          CountIf(V, s, [&](int64_t i) { return __float_as_uint(probs[i]) == tau; });
      // The fewest ties c with above + c * tv >= target (c * tv is exact in fp64).
      int64_t c_lo = 1, c_hi = ties;
      while (c_lo < c_hi) {
        const int64_t mid = c_lo + (c_hi - c_lo) / 2;
        if (__dadd_rn(above, __dmul_rn(static_cast<double>(mid), tv)) >= target) {
          c_hi = mid;
        } else {
          c_lo = mid + 1;
        }
      }
      const int64_t bound = c_lo >= ties ? V : NthIdBound(V, c_lo, s, [&](int64_t i) {
        return __float_as_uint(probs[i]) == tau;
      });
      __syncthreads();
      for (int64_t i = tid; i < V; i += kThreads) {
        const uint32_t key = __float_as_uint(probs[i]);
        if (key < tau || (key == tau && i >= bound)) probs[i] = 0.0f;
      }
      __syncthreads();
    }
    // else: rounding keeps the whole row short of top_p: keep everything.
  }

  // 7. Min-p against the largest probability (top-p always keeps it).
  const bool min_p = params.min_p > 0.0f;
  if (min_p) {
    float p_max = 0.0f;
    for (int64_t i = tid; i < V; i += kThreads) p_max = fmaxf(p_max, probs[i]);
    p_max = BlockMax(p_max, s.f, 0.0f);
    const float threshold = __fmul_rn(params.min_p, p_max);
    for (int64_t i = tid; i < V; i += kThreads) {
      if (probs[i] < threshold) probs[i] = 0.0f;
    }
    __syncthreads();
  }

  // 8. Renormalise when a filter ran.
  if (top_p || min_p) {
    const double kept = SumIf(V, s, [&](int64_t i) { return static_cast<double>(probs[i]); });
    __syncthreads();
    for (int64_t i = tid; i < V; i += kThreads) {
      probs[i] = __double2float_rn(__ddiv_rn(static_cast<double>(probs[i]), kept));
    }
    __syncthreads();
  }

  if (mode == RowMode::kArgmaxOfProcessed) {
    ArgMax top{-kInf, 0x7fffffff};
    for (int64_t i = tid; i < V; i += kThreads) {
      top = Better(top, ArgMax{probs[i], static_cast<int32_t>(i)});
    }
    top = BlockArgMax(top, s.f, s.i);
    one_hot(top.id);
    return;
  }
  if (tid == 0) a.error[r] = kRowOk;
}

}  // namespace

absl::Status LaunchProcessRows(const ProcessRowsArgs& a, const CudaContext& ctx,
                               cudaStream_t stream) {
  SPECD_RETURN_IF_ERROR(ValidateProcessRowsArgs(a));
  if (a.n_rows == 0) return absl::OkStatus();
  // This back end's own limits: 32-bit ids in the kernel, one block per row in a grid's x
  // dimension. The rows' requests are device memory: the kernel checks them and Synchronize
  // reports them.
  if (a.vocab > 0x7fffffff) return absl::InvalidArgumentError("ProcessRows: vocab too large");
  if (a.n_rows > 0x7fffffff) return absl::InvalidArgumentError("ProcessRows: n_rows too large");
  LaunchKernel(ProcessRowsKernel, static_cast<unsigned>(a.n_rows), kThreads, 0, stream,
               ctx.programmatic_launch, a, ctx.error);
  return CudaStatus(cudaGetLastError(), "ProcessRows launch");
}

}  // namespace specd::kernels::cuda
