// One grpc.health.v1.Health/Check call, shared by `specd health` and `specd serve`.
#ifndef SPECD_TOOLS_SPECD_HEALTH_CHECK_H_
#define SPECD_TOOLS_SPECD_HEALTH_CHECK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace specd::cli {

// True when the server behind `channel` (named `server` in errors) answers SERVING for `service`
// ("" = the whole server) within `timeout_seconds`; an error when it cannot be reached.
absl::StatusOr<bool> IsServing(const std::shared_ptr<grpc::Channel>& channel,
                               const std::string& server, const std::string& service,
                               double timeout_seconds);

}  // namespace specd::cli

#endif  // SPECD_TOOLS_SPECD_HEALTH_CHECK_H_
