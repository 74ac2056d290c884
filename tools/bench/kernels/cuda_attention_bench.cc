// CUDA paged attention alone, at the decode (1 token) and verify (K + 1 = 5 tokens) shapes of
// Llama-3.2-1B and -3B with a bf16 KV cache of 16-token blocks, at contexts of 128 to 8192 keys,
// against the device copy bandwidth measured in the same run. For each: microseconds per call,
// the K and V bytes the call must read (the cache's rows for the context, once) per second as a
// fraction of the copy bandwidth, and the whole model's attention per token (the layers' calls)
// next to the time the same bandwidth takes to stream the model's bf16 weights once: what
// attention adds to a decode step's memory-bound floor (decode_bench measures the whole step).
//
// Calls are timed as the engine runs them: recorded, 20 to a graph, so launch overhead is not
// counted, with the block table as wide as the engine uploads it for that context (the pass's
// longest table rounded up to a power of two, at least 8 blocks), which sets the split form's
// number of chunk groups.
//
// usage: cuda_attention_bench [--reps N]
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "tools/bench/device_copy.h"
#include "tools/bench/kernels/cuda_bench_setup.h"

namespace specd {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kBlock = 16;
constexpr int kCallsPerGraph = 20;

struct ModelShape {
  const char* name;
  int64_t vocab, hidden, intermediate, layers, heads, kv_heads, head_dim;

  int64_t kv_dim() const { return kv_heads * head_dim; }
  // Bytes of bf16 weights a decode step streams: every layer's matrices and the (untied)
  // classifier.
  double WeightBytes() const {
    const int64_t q = heads * head_dim;
    const int64_t per_layer =
        hidden * q + 2 * hidden * kv_dim() + q * hidden + 3 * hidden * intermediate;
    return 2.0 * static_cast<double>(layers * per_layer + vocab * hidden);
  }
};

// A device copy of `host`, through staging memory.
template <typename T>
absl::StatusOr<kernels::Buffer> Upload(kernels::Backend& be, const std::vector<T>& host) {
  const int64_t bytes = static_cast<int64_t>(host.size() * sizeof(T));
  absl::StatusOr<kernels::Buffer> device = be.Allocate(bytes, kernels::MemoryKind::kScratch, "x");
  absl::StatusOr<kernels::Buffer> staging = be.Allocate(bytes, kernels::MemoryKind::kStaging, "x");
  if (!device.ok()) return device.status();
  if (!staging.ok()) return staging.status();
  std::memcpy(staging->data(), host.data(), static_cast<size_t>(bytes));
  if (absl::Status st = be.Upload(device->data(), staging->data(), bytes); !st.ok()) return st;
  if (absl::Status st = be.Synchronize(); !st.ok()) return st;
  return device;
}

// Microseconds per Attention call of `args`, recorded kCallsPerGraph to a graph and replayed.
absl::StatusOr<double> TimeCalls(kernels::Backend& be, const kernels::AttentionArgs& args,
                                 int reps) {
  if (absl::Status st = be.BeginRecording(); !st.ok()) return st;
  for (int i = 0; i < kCallsPerGraph; ++i) {
    if (absl::Status st = be.Attention(args); !st.ok()) {
      (void)be.EndRecording();
      return st;
    }
  }
  absl::StatusOr<std::unique_ptr<kernels::RecordedWork>> work = be.EndRecording();
  if (!work.ok()) return work.status();
  for (int i = 0; i < 3; ++i) {
    if (absl::Status st = be.Replay(**work); !st.ok()) return st;
  }
  if (absl::Status st = be.Synchronize(); !st.ok()) return st;
  const auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) {
    if (absl::Status st = be.Replay(**work); !st.ok()) return st;
  }
  if (absl::Status st = be.Synchronize(); !st.ok()) return st;
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return s / (static_cast<double>(reps) * kCallsPerGraph) * 1e6;
}

int Main(int argc, char** argv) {
  const int reps = RepsFlag(argc, argv, 20);
  const std::unique_ptr<kernels::Backend> made = CudaBackendOrReport();
  if (made == nullptr) return 1;
  kernels::Backend& be = *made;
  const double copy_gbps = DeviceCopyGBps(be);
  std::printf("device copy bandwidth %.0f GB/s (read + written)\n", copy_gbps);
  if (copy_gbps <= 0) return 1;

  const ModelShape shapes[] = {{"llama-3.2-1b", 128256, 2048, 8192, 16, 32, 8, 64},
                               {"llama-3.2-3b", 128256, 3072, 8192, 28, 24, 8, 128}};
  const int64_t contexts[] = {128, 512, 2048, 8192};
  const int64_t max_context = 8192;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::printf("%-13s %6s %8s %10s %9s %8s %16s %13s\n", "shape", "tokens", "context", "us/call",
              "KV GB/s", "of copy", "attn ms/token", "weights ms");
  for (const ModelShape& m : shapes) {
    // One sequence whose table runs through the blocks in order; random bf16 keys and values.
    const int64_t num_blocks = max_context / kBlock + 1;
    std::vector<uint16_t> kv(static_cast<size_t>(num_blocks * kBlock * m.kv_dim()));
    for (uint16_t& x : kv) x = kernels::F32ToBf16(uniform(rng));
    absl::StatusOr<kernels::Buffer> k = Upload(be, kv);
    absl::StatusOr<kernels::Buffer> v = Upload(be, kv);
    if (!k.ok() || !v.ok()) {
      std::fprintf(stderr, "cache: %s\n", std::string((k.ok() ? v : k).status().message()).c_str());
      return 1;
    }
    const double weights_ms = m.WeightBytes() / (copy_gbps * 1e9) * 1e3;
    for (const int n : {1, 5}) {
      for (const int64_t context : contexts) {
        int64_t stride = 8;  // LlamaEngine::TableStride for a recorded pass
        while (stride * kBlock < context) stride *= 2;
        std::vector<int32_t> table(static_cast<size_t>(stride), -1);
        for (int64_t b = 0; b * kBlock < context; ++b) table[static_cast<size_t>(b)] = b;
        std::vector<int32_t> seq(n, 0), slot(n);
        for (int i = 0; i < n; ++i) slot[i] = static_cast<int32_t>(context - n + i);
        std::vector<float> q(static_cast<size_t>(n * m.heads * m.head_dim));
        for (float& x : q) x = uniform(rng);
        absl::StatusOr<kernels::Buffer> table_d = Upload(be, table);
        absl::StatusOr<kernels::Buffer> seq_d = Upload(be, seq);
        absl::StatusOr<kernels::Buffer> slot_d = Upload(be, slot);
        absl::StatusOr<kernels::Buffer> q_d = Upload(be, q);
        absl::StatusOr<kernels::Buffer> out = be.Allocate(
            static_cast<int64_t>(q.size() * sizeof(float)), kernels::MemoryKind::kScratch, "out");
        for (const absl::Status& st :
             {table_d.status(), seq_d.status(), slot_d.status(), q_d.status(), out.status()}) {
          if (!st.ok()) {
            std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
            return 1;
          }
        }
        kernels::AttentionArgs a;
        a.q = q_d->as<const float>();
        a.out = out->as<float>();
        a.cache = {.k = k->data(),
                   .v = v->data(),
                   .dtype = kernels::DType::kBF16,
                   .block_tables = table_d->as<const int32_t>(),
                   .max_blocks = stride,
                   .num_blocks = num_blocks,
                   .block_size = kBlock,
                   .kv_dim = m.kv_dim()};
        a.token_seq = seq_d->as<const int32_t>();
        a.slot = slot_d->as<const int32_t>();
        a.n_tokens = n;
        a.n_heads = m.heads;
        a.n_kv_heads = m.kv_heads;
        a.head_dim = m.head_dim;
        a.scale = 1.0f / std::sqrt(static_cast<float>(m.head_dim));
        absl::StatusOr<double> us = TimeCalls(be, a, reps);
        if (!us.ok()) {
          std::fprintf(stderr, "%s n=%d context %lld: %s\n", m.name, n,
                       static_cast<long long>(context), std::string(us.status().message()).c_str());
          return 1;
        }
        // The cache rows the context spans, K and V, read at least once.
        const double kv_bytes = 2.0 * 2.0 * static_cast<double>(context * m.kv_dim());
        const double gbps = kv_bytes / (*us * 1e-6) / 1e9;
        std::printf("%-13s %6d %8lld %10.1f %9.0f %8.2f %16.3f %13.3f\n", m.name, n,
                    static_cast<long long>(context), *us, gbps, gbps / copy_gbps,
                    *us * static_cast<double>(m.layers) / 1e3, weights_ms);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace specd

int main(int argc, char** argv) { return specd::Main(argc, argv); }
