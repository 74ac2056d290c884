// The /metrics HTTP endpoint every specd process serves with prometheus-cpp.
#ifndef SPECD_SERVICES_COMMON_METRICS_EXPOSER_H_
#define SPECD_SERVICES_COMMON_METRICS_EXPOSER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace specd {

// Serves `collectable` on host:port (port 0 picks a free one) and stores the bound port in
// `*bound_port`. UNAVAILABLE naming --metrics-port when the address cannot be bound.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const std::string& host, int port, const std::shared_ptr<prometheus::Collectable>& collectable,
    int* bound_port);

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_METRICS_EXPOSER_H_
