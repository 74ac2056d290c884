#include "kernels/cuda/sampling.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/validate.h"

namespace specd::kernels::cuda {
namespace {

constexpr float kInf = __builtin_huge_valf();
constexpr int kDrawThreads = 256;
constexpr int kRowThreads = 1024;

// base/philox.cc on the device: Random123's philox4x32 with 10 rounds.
__device__ uint4 Philox4x32_10(uint4 x, uint2 k) {
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k.x += 0x9E3779B9u;
      k.y += 0xBB67AE85u;
    }
    const uint32_t hi0 = __umulhi(0xD2511F53u, x.x);
    const uint32_t lo0 = 0xD2511F53u * x.x;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, x.z);
    const uint32_t lo1 = 0xCD9E8D57u * x.z;
    x = make_uint4(hi1 ^ x.y ^ k.x, lo1, hi0 ^ x.w ^ k.y, lo0);
  }
  return x;
}

__device__ double StreamUniform(const Draw& d) {
  const uint4 x = Philox4x32_10(
      make_uint4(d.position, static_cast<uint32_t>(d.purpose), d.index, d.sample),
      make_uint2(static_cast<uint32_t>(d.seed & 0xffffffffu), static_cast<uint32_t>(d.seed >> 32)));
  const uint64_t bits53 = (uint64_t{x.x} << 21) | (uint64_t{x.y} >> 11);
  return __dmul_rn(static_cast<double>(bits53), 0x1.0p-53);
}

__global__ void __launch_bounds__(kDrawThreads)
    SampleRowsKernel(SampleRowsArgs a, DeviceError* error) {
  AfterPreviousKernel();
  __shared__ double partial[kDrawThreads];
  __shared__ double offset[kDrawThreads + 1];
  __shared__ int32_t red_i[kWarp];
  __shared__ int32_t token;
  const int64_t i = blockIdx.x;
  const int tid = threadIdx.x;
  const Draw d = a.draws[i];
  if (d.prob_slot < 0 || d.prob_slot >= a.prob_capacity) {
    if (tid == 0) {
      ReportError(error, DeviceOp::kSampleRows, DeviceField::kDrawSlot, i, d.prob_slot);
      a.error[i] = kRowEmpty;
      a.tokens[i] = 0;
      a.token_probs[i] = 0.0f;
    }
    return;
  }
  const int64_t V = a.vocab;
  const float* row = a.probs + int64_t{d.prob_slot} * V;
  const int64_t seg = DivUp(V, kDrawThreads);
  const int64_t lo = min(V, tid * seg);
  const int64_t hi = min(V, lo + seg);
  double local = 0.0;
  int bad = 0;
  for (int64_t j = lo; j < hi; ++j) {
    const float p = row[j];
    bad |= !(p >= 0.0f) || isinf(p);
    local = __dadd_rn(local, static_cast<double>(p));
  }
  partial[tid] = local;
  if (__syncthreads_or(bad)) {
    if (tid == 0) {
      a.error[i] = kRowEmpty;
      a.tokens[i] = 0;
      a.token_probs[i] = 0.0f;
    }
    return;
  }
  if (tid == 0) {
    double c = 0.0;
    for (int t = 0; t < kDrawThreads; ++t) {
      offset[t] = c;
      c = __dadd_rn(c, partial[t]);
    }
    offset[kDrawThreads] = c;
    token = -1;
  }
  __syncthreads();
  const double total = offset[kDrawThreads];
  if (!(total > 0.0)) {
    if (tid == 0) {
      a.error[i] = kRowEmpty;
      a.tokens[i] = 0;
      a.token_probs[i] = 0.0f;
    }
    return;
  }
  const double target = __dmul_rn(StreamUniform(d), total);
  // C is non-decreasing, so exactly one segment has its start at or below the target and its end
  // above it (none when rounding made u * total reach total).
  if (offset[tid] <= target && target < offset[tid + 1]) {
    double c = 0.0;
    for (int64_t j = lo; j < hi; ++j) {
      c = __dadd_rn(c, static_cast<double>(row[j]));
      if (target < __dadd_rn(offset[tid], c)) {
        token = static_cast<int32_t>(j);
        break;
      }
    }
  }
  __syncthreads();
  if (token < 0) {
    // Unreachable while u < 1; as on the CPU, fall back to the last positive entry.
    int32_t last = -1;
    for (int64_t j = tid; j < V; j += kDrawThreads) {
      if (row[j] > 0.0f) last = static_cast<int32_t>(j);
    }
    last = BlockMax<int32_t>(last, red_i, -1);
    if (tid == 0) token = last;
    __syncthreads();
  }
  if (tid == 0) {
    a.error[i] = kRowOk;
    a.tokens[i] = token;
    a.token_probs[i] = row[token];
  }
}

__global__ void GatherProbsKernel(GatherProbsArgs a, DeviceError* error) {
  AfterPreviousKernel();
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= a.n) return;
  const int32_t slot = a.slots[i];
  const int32_t token = a.tokens[i];
  if (slot < 0 || slot >= a.prob_capacity) {
    ReportError(error, DeviceOp::kGatherProbs, DeviceField::kSlots, i, slot);
    a.out[i] = 0.0f;
    return;
  }
  if (token < 0 || token >= a.vocab) {
    ReportError(error, DeviceOp::kGatherProbs, DeviceField::kTokens, i, token);
    a.out[i] = 0.0f;
    return;
  }
  a.out[i] = a.probs[int64_t{slot} * a.vocab + token];
}

__global__ void CombineLogitsKernel(CombineLogitsArgs a, DeviceError* error) {
  AfterPreviousKernel();
  const int64_t pair = blockIdx.y;
  const int32_t cond = a.cond_rows[pair];
  const int32_t uncond = a.uncond_rows[pair];
  const float scale = a.scale[pair];
  if (cond < 0 || cond >= a.n_rows || uncond < 0 || uncond >= a.n_rows || !isfinite(scale)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      const bool bad_cond = cond < 0 || cond >= a.n_rows;
      const bool bad_uncond = uncond < 0 || uncond >= a.n_rows;
      ReportError(error, DeviceOp::kCombineLogits,
                  bad_cond     ? DeviceField::kCondRows
                  : bad_uncond ? DeviceField::kUncondRows
                               : DeviceField::kScale,
                  pair,
                  bad_cond     ? cond
                  : bad_uncond ? uncond
                               : 0);
    }
    return;
  }
  float* c = a.logits + int64_t{cond} * a.vocab;
  const float* u = a.logits + int64_t{uncond} * a.vocab;
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < a.vocab;
       j += int64_t{gridDim.x} * blockDim.x) {
    c[j] = __fadd_rn(u[j], __fmul_rn(scale, __fsub_rn(c[j], u[j])));
  }
}

// Per-row statistics for the logprob formula, shared by the top-N and query kernels.
struct RowStats {
  float m;        // the row's maximum
  int32_t n_max;  // entries at +inf (when m is +inf)
  double log_sum;
};

__device__ float LogprobOf(float w, const RowStats& st) {
  if (st.m == -kInf) return -kInf;
  if (st.m == kInf)
    return w == kInf ? static_cast<float>(-log(static_cast<double>(st.n_max))) : -kInf;
  return __double2float_rn(
      __dsub_rn(__dsub_rn(static_cast<double>(w), static_cast<double>(st.m)), st.log_sum));
}

__global__ void __launch_bounds__(kRowThreads) LogprobRowsKernel(LogprobsArgs a, RowStats* stats) {
  AfterPreviousKernel();
  __shared__ float red_f[kWarp];
  __shared__ int32_t red_i[kWarp];
  __shared__ double red_d[kWarp];
  __shared__ int64_t red_l[kWarp];
  const int64_t r = blockIdx.x;
  const int64_t V = a.vocab;
  const float* w = a.logits + r * V;
  float m = -kInf;
  for (int64_t i = threadIdx.x; i < V; i += kRowThreads) m = fmaxf(m, w[i]);
  m = BlockMax(m, red_f, -kInf);
  RowStats st{m, 0, 0.0};
  if (m == kInf) {
    int64_t n = 0;
    for (int64_t i = threadIdx.x; i < V; i += kRowThreads) n += w[i] == kInf ? 1 : 0;
    st.n_max = static_cast<int32_t>(BlockSum<int64_t>(n, red_l));
  } else if (m != -kInf) {
    const double md = static_cast<double>(m);
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < V; i += kRowThreads) {
      sum = __dadd_rn(sum, exp(__dsub_rn(static_cast<double>(w[i]), md)));
    }
    st.log_sum = log(BlockSum<double>(sum, red_d));
  }
  if (threadIdx.x == 0) stats[r] = st;
  // Top-N by (logprob desc, id asc): each round takes the best entry after the previous one.
  float prev_lp = kInf;
  int32_t prev_id = -1;
  for (int32_t j = 0; j < a.top_n; ++j) {
    ArgMax best{-kInf, 0x7fffffff};
    for (int64_t i = threadIdx.x; i < V; i += kRowThreads) {
      const float lp = LogprobOf(w[i], st);
      const bool after = lp < prev_lp || (lp == prev_lp && i > prev_id);
      if (after) best = Better(best, ArgMax{lp, static_cast<int32_t>(i)});
    }
    best = BlockArgMax(best, red_f, red_i);
    if (threadIdx.x == 0) {
      a.top_ids[r * a.top_n + j] = best.id;
      a.top_logprobs[r * a.top_n + j] = best.value;
    }
    prev_lp = best.value;
    prev_id = best.id;
  }
}

__global__ void LogprobQueriesKernel(LogprobsArgs a, const RowStats* stats, DeviceError* error) {
  AfterPreviousKernel();
  const int64_t q = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (q >= a.n_queries) return;
  const int32_t r = a.query_rows[q];
  const int32_t t = a.query_tokens[q];
  if (r < 0 || r >= a.n_rows) {
    ReportError(error, DeviceOp::kLogprobs, DeviceField::kQueryRows, q, r);
    a.query_logprobs[q] = -kInf;
    return;
  }
  if (t < 0 || t >= a.vocab) {
    ReportError(error, DeviceOp::kLogprobs, DeviceField::kQueryTokens, q, t);
    a.query_logprobs[q] = -kInf;
    return;
  }
  a.query_logprobs[q] = LogprobOf(a.logits[int64_t{r} * a.vocab + t], stats[r]);
}

unsigned Blocks(int64_t n, int threads) { return static_cast<unsigned>(DivUp(n, threads)); }

}  // namespace

absl::Status LaunchCombineLogits(const CombineLogitsArgs& a, const CudaContext& ctx,
                                 cudaStream_t stream) {
  SPECD_RETURN_IF_ERROR(ValidateCombineLogitsArgs(a));
  if (a.n_pairs == 0) return absl::OkStatus();
  // This back end's own limit (one grid row per pair, in a grid's y dimension). The pairs and
  // scales are device memory: the kernel checks them and Synchronize reports them.
  if (a.n_pairs > 65535) return absl::InvalidArgumentError("CombineLogits: n_pairs too large");
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(DivUp(a.vocab, 256), 1024)),
                  static_cast<unsigned>(a.n_pairs));
  LaunchKernel(CombineLogitsKernel, grid, 256, 0, stream, ctx.programmatic_launch, a, ctx.error);
  return CudaStatus(cudaGetLastError(), "CombineLogits launch");
}

absl::Status LaunchSampleRows(const SampleRowsArgs& a, const CudaContext& ctx,
                              cudaStream_t stream) {
  SPECD_RETURN_IF_ERROR(ValidateSampleRowsArgs(a));
  if (a.n == 0) return absl::OkStatus();
  // This back end's own limits: 32-bit ids in the kernel, one block per draw in a grid's x
  // dimension. The draws are device memory: the kernel checks them and Synchronize reports them.
  if (a.vocab > 0x7fffffff) return absl::InvalidArgumentError("SampleRows: vocab too large");
  if (a.n > 0x7fffffff) return absl::InvalidArgumentError("SampleRows: n too large");
  LaunchKernel(SampleRowsKernel, static_cast<unsigned>(a.n), kDrawThreads, 0, stream,
               ctx.programmatic_launch, a, ctx.error);
  return CudaStatus(cudaGetLastError(), "SampleRows launch");
}

absl::Status LaunchGatherProbs(const GatherProbsArgs& a, const CudaContext& ctx,
                               cudaStream_t stream) {
  SPECD_RETURN_IF_ERROR(ValidateGatherProbsArgs(a));
  if (a.n == 0) return absl::OkStatus();
  // The lookups are device memory: the kernel checks them and Synchronize reports them.
  LaunchKernel(GatherProbsKernel, Blocks(a.n, 256), 256, 0, stream, ctx.programmatic_launch, a,
               ctx.error);
  return CudaStatus(cudaGetLastError(), "GatherProbs launch");
}

absl::Status LaunchLogprobs(const LogprobsArgs& a, const CudaContext& ctx, cudaStream_t stream) {
  SPECD_RETURN_IF_ERROR(ValidateLogprobsArgs(a));
  if (a.n_rows == 0 && a.n_queries == 0) return absl::OkStatus();
  // This back end's own limits: the row statistics live in the op workspace, one block per row.
  // The queries are device memory: the kernel checks them and Synchronize reports them.
  if (a.n_rows * static_cast<int64_t>(sizeof(RowStats)) > ctx.workspace_bytes ||
      a.n_rows > 0x7fffffff) {
    return absl::ResourceExhaustedError(
        absl::StrCat("Logprobs: ", a.n_rows, " rows exceed the back end's workspace"));
  }
  auto* stats = static_cast<RowStats*>(ctx.workspace);
  if (a.n_rows > 0) {
    LaunchKernel(LogprobRowsKernel, static_cast<unsigned>(a.n_rows), kRowThreads, 0, stream,
                 ctx.programmatic_launch, a, stats);
    SPECD_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "Logprobs launch"));
  }
  if (a.n_queries > 0) {
    LaunchKernel(LogprobQueriesKernel, Blocks(a.n_queries, 256), 256, 0, stream,
                 ctx.programmatic_launch, a, stats, ctx.error);
    SPECD_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "Logprobs launch"));
  }
  return absl::OkStatus();
}

}  // namespace specd::kernels::cuda
