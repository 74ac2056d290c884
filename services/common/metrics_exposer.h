// The /metrics HTTP endpoint every specd process serves with prometheus-cpp.
#ifndef SPECD_SERVICES_COMMON_METRICS_EXPOSER_H_
#define SPECD_SERVICES_COMMON_METRICS_EXPOSER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace specd {

// A prometheus-cpp Exposer that stops at once. Its civetweb listener looks at the stop flag only
// between polls of its listening socket, 2 s each, so a plain ~Exposer held every process's exit
// for up to 2 s; this one connects to its own port while it stops, which ends the poll.
class MetricsExposer {
 public:
  // Serves `collectable` on host:port (port 0 picks a free one). UNAVAILABLE naming
  // --metrics-port when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsExposer>> Serve(
      const std::string& host, int port,
      const std::shared_ptr<prometheus::Collectable>& collectable);

  // Takes over `exposer`, which listens on host:port (as Serve makes one).
  MetricsExposer(std::unique_ptr<prometheus::Exposer> exposer, const std::string& host, int port);
  MetricsExposer(const MetricsExposer&) = delete;
  MetricsExposer& operator=(const MetricsExposer&) = delete;
  ~MetricsExposer();

  int port() const { return port_; }

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
  const std::string host_;  // as bound: a wildcard address is reached on loopback
  const int port_;
};

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_METRICS_EXPOSER_H_
