// The --listen flag of the services: a TCP "host:port" or a Unix socket, as gRPC names them
// ("unix:PATH", "unix-abstract:NAME"). The Prometheus endpoint always listens on IPv4 TCP, so a
// service on a Unix socket or an IPv6 address serves /metrics on an IPv4 host beside it.
#ifndef SPECD_SERVICES_COMMON_LISTEN_ADDRESS_H_
#define SPECD_SERVICES_COMMON_LISTEN_ADDRESS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace specd {

struct ListenAddress {
  std::string grpc;          // as given: what ServerBuilder::AddListeningPort takes
  bool unix_socket = false;  // "unix:" or "unix-abstract:"
  std::string host;          // the TCP host ("[::1]" in brackets); 127.0.0.1 for a Unix socket
  // Where /metrics listens. prometheus-cpp serves it with civetweb, which Debian builds without
  // IPv6: the TCP host, but 0.0.0.0 for "[::]" (every interface) and 127.0.0.1 for any other
  // IPv6 address or a Unix socket.
  std::string metrics_host;

  // What a client dials once gRPC has bound it: "host:port" with the port it picked, or the
  // Unix socket as given.
  std::string Bound(int port) const;

  // Adds this address to `builder`, for this process alone. gRPC sets SO_REUSEPORT by default, so
  // a second server on a port already taken would start without an error and take a share of
  // its connections: a second coordinator started by mistake, or a service that `specd serve`
  // restarts on an address another program took meanwhile, would answer some clients for the
  // first. Without it, BuildAndStart fails and the service says it cannot listen.
  void AddTo(grpc::ServerBuilder& builder,
             const std::shared_ptr<grpc::ServerCredentials>& credentials, int* port) const;
  // What a service says when BuildAndStart fails on this address.
  std::string CannotListen() const;
};

// INVALID_ARGUMENT, naming `flag`, for anything but host:port (port 0 to 65535) or a Unix
// socket with a non-empty path.
absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view flag, absl::string_view value);

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_LISTEN_ADDRESS_H_
