#include "services/common/listen_address.h"

#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"

namespace specd {

std::string ListenAddress::Bound(int port) const {
  return unix_socket ? grpc : absl::StrCat(host, ":", port);
}

void ListenAddress::AddTo(grpc::ServerBuilder& builder,
                          const std::shared_ptr<grpc::ServerCredentials>& credentials,
                          int* port) const {
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(grpc, credentials, port);
}

std::string ListenAddress::CannotListen() const {
  return absl::StrCat("--listen: cannot listen on ", grpc,
                      " (is another program listening there?)");
}

absl::StatusOr<ListenAddress> ParseListenAddress(absl::string_view flag, absl::string_view value) {
  ListenAddress a;
  a.grpc = std::string(value);
  for (const absl::string_view scheme :
       {absl::string_view("unix:"), absl::string_view("unix-abstract:")}) {
    if (!absl::StartsWith(value, scheme)) continue;
    if (value.size() == scheme.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", value, "' names no socket path"));
    }
    a.unix_socket = true;
    a.host = "127.0.0.1";
    a.metrics_host = a.host;
    return a;
  }
  const size_t colon = value.rfind(':');
  int64_t port = -1;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(value.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " must be host:port (port 0 picks a free one) or unix:PATH, got '",
                     value, "'"));
  }
  a.host = std::string(value.substr(0, colon));
  a.metrics_host = !absl::StartsWith(a.host, "[") ? a.host
                   : a.host == "[::]"             ? "0.0.0.0"
                                                  : "127.0.0.1";
  return a;
}

}  // namespace specd
