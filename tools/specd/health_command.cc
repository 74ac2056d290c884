// `specd health --server ADDR`: one grpc.health.v1.Health/Check call, exit 0 when the server
// answers SERVING. Container health checks run it, so it stays small and prints one line. Health
// needs no bearer token (load balancers probe it without one), but a TLS server needs --tls-ca.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tools/specd/command.h"
#include "tools/specd/health_check.h"
#include "tools/specd/remote_generate.h"

namespace specd::cli {
namespace {

constexpr char kSummary[] = "exit 0 when a specd process answers gRPC health SERVING";

int RunHealth(const std::vector<std::string>& argv) {
  std::vector<FlagSpec> flags = {
      {"server", "address host:port of a specd coordinator or worker", "", false, true},
      {"service", "health service name; empty = the whole server", ""},
      {"timeout", "seconds to wait for the answer", "5"},
  };
  for (FlagSpec& f : ClientSecurityFlags(/*with_token=*/false)) flags.push_back(std::move(f));
  int exit_code = 0;
  std::optional<Flags> args = ParseOrExit("health", kSummary, argv, flags, &exit_code);
  if (!args) return exit_code;
  absl::StatusOr<double> timeout = args->GetDouble("timeout");
  if (!timeout.ok()) return ReportError("health", timeout.status());
  if (!(*timeout > 0 && *timeout <= 3600)) {
    return ReportError("health", absl::InvalidArgumentError(absl::StrCat(
                                     "--timeout must be in (0, 3600] seconds, got ", *timeout)));
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      OpenChannel(args->Get("server"), ClientSecurityFromArgs(*args));
  if (!channel.ok()) return ReportError("health", channel.status());
  absl::StatusOr<bool> serving =
      IsServing(*channel, args->Get("server"), args->Get("service"), *timeout);
  if (!serving.ok()) return ReportError("health", serving.status());
  if (!*serving) {
    std::cout << args->Get("server") << ": NOT_SERVING" << std::endl;
    return 1;
  }
  std::cout << args->Get("server") << ": SERVING" << std::endl;
  return 0;
}

const CommandRegistration kRegistration({"health", kSummary, RunHealth});

}  // namespace
}  // namespace specd::cli
