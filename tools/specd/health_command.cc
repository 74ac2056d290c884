// `specd health --server ADDR`: one grpc.health.v1.Health/Check call, exit 0 when the server
// answers SERVING. Container health checks run it, so it stays small and prints one line. Health
// needs no bearer token (load balancers probe it without one), but a TLS server needs --tls-ca.
#include <chrono>
#include <cstdint>
#include <future>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tools/specd/command.h"
#include "tools/specd/remote_generate.h"

namespace specd::cli {
namespace {

constexpr char kSummary[] = "exit 0 when a specd process answers gRPC health SERVING";

absl::StatusOr<bool> CheckServing(const std::string& server, const ClientSecurity& security,
                                  const std::string& service, double timeout_seconds) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = OpenChannel(server, security);
  if (!channel.ok()) return channel.status();
  auto stub = grpc::health::v1::Health::NewStub(*channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status st = stub->Check(&ctx, req, &resp);
  if (!st.ok()) return absl::UnavailableError(absl::StrCat(server, ": ", st.error_message()));
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

int RunHealth(const std::vector<std::string>& argv) {
  std::vector<Args::Flag> flags = {
      {"server", "address host:port of a specd coordinator or worker", "", false, true},
      {"service", "health service name; empty = the whole server", ""},
      {"timeout", "seconds to wait for the answer", "5"},
  };
  for (Args::Flag& f : ClientSecurityFlags(/*with_token=*/false)) flags.push_back(std::move(f));
  int exit_code = 0;
  std::optional<Args> args = ParseOrExit("health", kSummary, argv, flags, &exit_code);
  if (!args) return exit_code;
  absl::StatusOr<double> timeout = args->GetDouble("timeout");
  if (!timeout.ok()) return ReportError("health", timeout.status());
  if (!(*timeout > 0 && *timeout <= 3600)) {
    return ReportError("health", absl::InvalidArgumentError(absl::StrCat(
                                     "--timeout must be in (0, 3600] seconds, got ", *timeout)));
  }
  absl::StatusOr<bool> serving = CheckServing(args->Get("server"), ClientSecurityFromArgs(*args),
                                              args->Get("service"), *timeout);
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
