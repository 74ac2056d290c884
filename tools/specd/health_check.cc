#include "tools/specd/health_check.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace specd::cli {

absl::StatusOr<bool> IsServing(const std::shared_ptr<grpc::Channel>& channel,
                               const std::string& server, const std::string& service,
                               double timeout_seconds) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status st = stub->Check(&ctx, req, &resp);
  if (!st.ok()) {
    return absl::UnavailableError(absl::StrCat(server, ": ", st.error_message()));
  }
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

}  // namespace specd::cli
