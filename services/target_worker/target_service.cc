#include "services/target_worker/target_service.h"

#include <utility>

namespace specd {

namespace pb = ::specd::worker::v1;

grpc::ServerUnaryReactor* TargetWorkerService::Verify(grpc::CallbackServerContext* context,
                                                      const pb::VerifyRequest* request,
                                                      pb::VerifyResponse* response) {
  return ServeUnary(context, [&](WorkerRpcs::Done done) {
    rpcs().Verify(
        *request, response, [context] { return context->IsCancelled(); }, std::move(done));
  });
}

}  // namespace specd
