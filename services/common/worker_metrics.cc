#include "services/common/worker_metrics.h"

#include <cmath>
#include <exception>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/common/metrics_exposer.h"

namespace specd {
namespace {

constexpr std::array<ForwardKind, 3> kKinds = {ForwardKind::kCatchUp, ForwardKind::kDraftStep,
                                               ForwardKind::kVerify};

// 100 us .. ~26 s in factors of 2: a tiny draft step to a long prefill chunk.
prometheus::Histogram::BucketBoundaries DurationBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (int i = 0; i < 19; ++i) b.push_back(std::ldexp(1e-4, i));
  return b;
}

// Sequences per forward pass: 1 .. 1024 in factors of 2.
prometheus::Histogram::BucketBoundaries BatchBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (int i = 0; i <= 10; ++i) b.push_back(std::ldexp(1.0, i));
  return b;
}

}  // namespace

WorkerMetrics::WorkerMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  kv_used_ = &prometheus::BuildGauge()
                  .Name("specd_worker_kv_blocks_used")
                  .Help("KV cache blocks held by sequences")
                  .Register(*registry_)
                  .Add({});
  kv_free_ = &prometheus::BuildGauge()
                  .Name("specd_worker_kv_blocks_free")
                  .Help("KV cache blocks free for new tokens, evictable cached blocks included")
                  .Register(*registry_)
                  .Add({});
  kv_free_bytes_ = &prometheus::BuildGauge()
                        .Name("specd_worker_kv_free_bytes")
                        .Help("Bytes of KV cache free for new tokens, in the KV dtype")
                        .Register(*registry_)
                        .Add({});
  kv_cached_ = &prometheus::BuildGauge()
                    .Name("specd_worker_kv_blocks_cached")
                    .Help("KV cache blocks in the prefix cache, held by sequences or not")
                    .Register(*registry_)
                    .Add({});
  kv_evictable_ = &prometheus::BuildGauge()
                       .Name("specd_worker_kv_blocks_evictable")
                       .Help("Prefix-cache blocks no sequence holds (evicted LRU when needed)")
                       .Register(*registry_)
                       .Add({});
  companion_kv_ = &prometheus::BuildGauge()
                       .Name("specd_worker_companion_kv_blocks")
                       .Help(
                           "KV blocks held by the companions of guided sequences (classifier-free "
                           "guidance), each counted once")
                       .Register(*registry_)
                       .Add({});
  prefix_queried_ = &prometheus::BuildCounter()
                         .Name("specd_prefix_cache_queried_tokens_total")
                         .Help(
                             "Catch-up tokens looked up in the prefix cache (all but each "
                             "catch-up's last token, which is always computed)")
                         .Register(*registry_)
                         .Add({});
  prefix_hit_ = &prometheus::BuildCounter()
                     .Name("specd_prefix_cache_hit_tokens_total")
                     .Help("Catch-up tokens whose KV came from the prefix cache")
                     .Register(*registry_)
                     .Add({});
  backend_info_ = &prometheus::BuildGauge()
                       .Name("specd_worker_backend_info")
                       .Help("Always 1; labels name the back end and the KV cache dtype")
                       .Register(*registry_);
  auto& memory = prometheus::BuildGauge()
                     .Name("specd_worker_memory_bytes")
                     .Help("Memory the back end holds, by kind (device memory on a GPU)")
                     .Register(*registry_);
  for (int k = 0; k < kernels::kNumMemoryKinds; ++k) {
    memory_bytes_[k] = &memory.Add(
        {{"kind", std::string(kernels::MemoryKindName(static_cast<kernels::MemoryKind>(k)))}});
  }
  auto& durations = prometheus::BuildHistogram()
                        .Name("specd_worker_forward_duration_seconds")
                        .Help("Duration of one batched forward pass, by kind")
                        .Register(*registry_);
  auto& batches = prometheus::BuildHistogram()
                      .Name("specd_worker_batch_size")
                      .Help("Sequences in one batched forward pass, by kind")
                      .Register(*registry_);
  auto& tokens = prometheus::BuildCounter()
                     .Name("specd_worker_tokens_processed_total")
                     .Help("Tokens fed through the model, by forward kind")
                     .Register(*registry_);
  for (const ForwardKind kind : kKinds) {
    const prometheus::Labels labels = {{"kind", std::string(ForwardKindName(kind))}};
    const size_t k = static_cast<size_t>(kind);
    forward_seconds_[k] = &durations.Add(labels, DurationBuckets());
    batch_size_[k] = &batches.Add(labels, BatchBuckets());
    tokens_[k] = &tokens.Add(labels);
  }
}

WorkerMetrics::~WorkerMetrics() = default;

absl::StatusOr<int> WorkerMetrics::Serve(const std::string& host, int port) {
  absl::StatusOr<std::unique_ptr<MetricsExposer>> exposer =
      MetricsExposer::Serve(host, port, registry_);
  if (!exposer.ok()) return exposer.status();
  exposer_ = *std::move(exposer);
  return exposer_->port();
}

void WorkerMetrics::OnLoaded(const LlamaEngine& engine) {
  backend_ = &engine.backend();
  kv_bytes_per_token_ = engine.kv_bytes_per_token();
  backend_info_
      ->Add({{"backend", std::string(engine.backend().name())},
             {"kv_dtype", std::string(kernels::KvDTypeFlagName(engine.kv_dtype()))}})
      .Set(1);
  OnKvChanged(engine.kv());
}

void WorkerMetrics::UpdateMemory() {
  if (backend_ == nullptr) return;
  for (int k = 0; k < kernels::kNumMemoryKinds; ++k) {
    memory_bytes_[k]->Set(
        static_cast<double>(backend_->allocated_bytes(static_cast<kernels::MemoryKind>(k))));
  }
}

void WorkerMetrics::OnForward(ForwardKind kind, int64_t batch_size, int64_t tokens,
                              absl::Duration elapsed) {
  const size_t k = static_cast<size_t>(kind);
  forward_seconds_[k]->Observe(absl::ToDoubleSeconds(elapsed));
  batch_size_[k]->Observe(static_cast<double>(batch_size));
  tokens_[k]->Increment(static_cast<double>(tokens));
}

void WorkerMetrics::OnKvChanged(const KvPool& kv) {
  kv_used_->Set(static_cast<double>(kv.used_blocks()));
  kv_free_->Set(static_cast<double>(kv.free_blocks()));
  kv_free_bytes_->Set(
      static_cast<double>(kv.free_blocks() * kv.block_size() * kv_bytes_per_token_));
  kv_cached_->Set(static_cast<double>(kv.cached_blocks()));
  kv_evictable_->Set(static_cast<double>(kv.evictable_blocks()));
  // Scratch grows with the largest batch seen, so the figures are refreshed with the KV ones.
  UpdateMemory();
}

void WorkerMetrics::OnCompanionKv(int64_t blocks) {
  companion_kv_->Set(static_cast<double>(blocks));
}

void WorkerMetrics::OnPrefixCache(int64_t queried, int64_t hit) {
  prefix_queried_->Increment(static_cast<double>(queried));
  prefix_hit_->Increment(static_cast<double>(hit));
}

}  // namespace specd
