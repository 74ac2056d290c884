// The --listen flag of the services: a TCP "host:port" or a Unix socket, as gRPC names them
// ("unix:PATH", "unix-abstract:NAME"). The Prometheus endpoint always listens on TCP, so a
// service on a Unix socket serves /metrics on loopback.
#ifndef SPECD_SERVICES_COMMON_LISTEN_ADDRESS_H_
#define SPECD_SERVICES_COMMON_LISTEN_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specd {

struct ListenAddress {
  std::string grpc;          // as given: what ServerBuilder::AddListeningPort takes
  bool unix_socket = false;  // "unix:" or "unix-abstract:"
  std::string host;          // the TCP host; 127.0.0.1 for a Unix socket (where /metrics goes)

  // What a client dials once gRPC has bound it: "host:port" with the port it picked, or the
  // Unix socket as given.
  std::string Bound(int port) const;
};

// INVALID_ARGUMENT, naming `flag`, for anything but host:port (port 0 to 65535) or a Unix
// socket with a non-empty path.
absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view flag, absl::string_view value);

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_LISTEN_ADDRESS_H_
