// One grpc.health.v1.Health/Check call, shared by `specd health` and `specd serve`.
#ifndef SPECD_TOOLS_SPECD_HEALTH_CHECK_H_
#define SPECD_TOOLS_SPECD_HEALTH_CHECK_H_

#include <string>

#include "absl/status/statusor.h"

namespace specd::cli {

// True when `server` answers SERVING for `service` ("" = the whole server) within
// `timeout_seconds`; an error when it cannot be reached.
absl::StatusOr<bool> IsServing(const std::string& server, const std::string& service,
                               double timeout_seconds);

}  // namespace specd::cli

#endif  // SPECD_TOOLS_SPECD_HEALTH_CHECK_H_
