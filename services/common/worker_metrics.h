// A worker's Prometheus metrics on /metrics: the back end and KV dtype, memory by kind, KV blocks
// and bytes used/free/cached/evictable, blocks held by guidance companions, prefix-cache queries
// and hits, forward durations, batch sizes and tokens processed by forward kind (catch_up,
// draft_step, verify). Labels never carry request or sequence ids.
#ifndef SPECD_SERVICES_COMMON_WORKER_METRICS_H_
#define SPECD_SERVICES_COMMON_WORKER_METRICS_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/engine/llama_engine.h"
#include "common/kv/kv_pool.h"
#include "common/worker/worker_runtime.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/common/metrics_exposer.h"

namespace specd {

class WorkerMetrics final : public RuntimeObserver {
 public:
  WorkerMetrics();
  ~WorkerMetrics() override;

  // Serves /metrics over HTTP on host:port (port 0 picks a free one) and returns the bound port.
  // UNAVAILABLE naming the address when it cannot bind.
  absl::StatusOr<int> Serve(const std::string& host, int port);

  // Names the back end and KV dtype and starts the memory figures; call once, before serving.
  // `engine` must outlive this object's use as the runtime's observer.
  void OnLoaded(const LlamaEngine& engine);

  void OnForward(ForwardKind kind, int64_t batch_size, int64_t tokens,
                 absl::Duration elapsed) override;
  void OnKvChanged(const KvPool& kv) override;
  void OnPrefixCache(int64_t queried, int64_t hit) override;
  void OnCompanionKv(int64_t blocks) override;

 private:
  static constexpr size_t kNumKinds = 3;

  void UpdateMemory();

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge* kv_used_;
  prometheus::Gauge* kv_free_;
  prometheus::Gauge* kv_free_bytes_;
  prometheus::Gauge* kv_cached_;
  prometheus::Gauge* kv_evictable_;
  prometheus::Gauge* companion_kv_;
  prometheus::Counter* prefix_queried_;
  prometheus::Counter* prefix_hit_;
  prometheus::Family<prometheus::Gauge>* backend_info_;
  std::array<prometheus::Gauge*, kernels::kNumMemoryKinds> memory_bytes_{};
  const kernels::Backend* backend_ = nullptr;
  int64_t kv_bytes_per_token_ = 0;
  std::array<prometheus::Histogram*, kNumKinds> forward_seconds_{};
  std::array<prometheus::Histogram*, kNumKinds> batch_size_{};
  std::array<prometheus::Counter*, kNumKinds> tokens_{};
  std::unique_ptr<MetricsExposer> exposer_;
};

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_WORKER_METRICS_H_
