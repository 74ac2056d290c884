// The one conversion between absl::Status and grpc::Status. The two share google.rpc.Code's
// numbering, so the code carries over unchanged and the message is kept verbatim.
#ifndef SPECD_SERVICES_COMMON_GRPC_STATUS_H_
#define SPECD_SERVICES_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace specd {

grpc::Status ToGrpcStatus(const absl::Status& status);

absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_GRPC_STATUS_H_
