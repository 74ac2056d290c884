#include "services/common/metrics_exposer.h"

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"

namespace specd {

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const std::string& host, int port, const std::shared_ptr<prometheus::Collectable>& collectable,
    int* bound_port) {
  const std::string address = absl::StrCat(host, ":", port);
  std::unique_ptr<prometheus::Exposer> exposer;
  // prometheus-cpp reports a failed bind by throwing; keep that inside this module.
  try {
    exposer = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("--metrics-port: cannot serve /metrics on ", address, ": ", e.what()));
  }
  exposer->RegisterCollectable(collectable);
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("--metrics-port: nothing listens on ", address));
  }
  *bound_port = ports.front();
  return exposer;
}

}  // namespace specd
