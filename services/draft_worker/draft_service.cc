#include "services/draft_worker/draft_service.h"

#include <utility>

namespace specd {

namespace pb = ::specd::worker::v1;

grpc::ServerUnaryReactor* DraftWorkerService::Draft(grpc::CallbackServerContext* context,
                                                    const pb::DraftRequest* request,
                                                    pb::DraftResponse* response) {
  return ServeUnary(context, [&](WorkerRpcs::Done done) {
    rpcs().Draft(
        *request, response, [context] { return context->IsCancelled(); }, std::move(done));
  });
}

}  // namespace specd
