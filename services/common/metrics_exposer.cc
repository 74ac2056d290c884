#include "services/common/metrics_exposer.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace specd {
namespace {

// Opens and at once closes a connection to one of `addresses`, if anything listens there: the
// listener wakes, and the connection's worker reads its end at once.
void Knock(const addrinfo* addresses) {
  for (const addrinfo* a = addresses; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const bool connected = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
    if (connected) return;
  }
}

// Where a client reaches an Exposer bound to `host`: a wildcard address listens on loopback too.
std::string ReachableHost(const std::string& host) {
  return host.empty() || host == "0.0.0.0" ? "127.0.0.1" : host;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Serve(
    const std::string& host, int port,
    const std::shared_ptr<prometheus::Collectable>& collectable) {
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
  return std::make_unique<MetricsExposer>(std::move(exposer), host, ports.front());
}

MetricsExposer::MetricsExposer(std::unique_ptr<prometheus::Exposer> exposer,
                               const std::string& host, int port)
    : exposer_(std::move(exposer)), host_(ReachableHost(host)), port_(port) {}

MetricsExposer::~MetricsExposer() {
  // The stop flag is set inside ~Exposer, so knock until it returns: the first knock after the
  // flag ends the listener's poll.
  // The address is resolved once, not at every knock.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* addresses = nullptr;
  if (getaddrinfo(host_.c_str(), absl::StrCat(port_).c_str(), &hints, &addresses) != 0) {
    addresses = nullptr;  // no knocking: ~Exposer takes its time
  }
  absl::Notification stopped;
  std::thread knocker([addresses, &stopped] {
    do {
      Knock(addresses);
    } while (!stopped.WaitForNotificationWithTimeout(absl::Milliseconds(5)));
  });
  exposer_.reset();
  stopped.Notify();
  knocker.join();
  if (addresses != nullptr) freeaddrinfo(addresses);
}

}  // namespace specd
