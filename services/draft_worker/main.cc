// specd-draft-worker: serves specd.worker.v1.DraftWorker over one model (or the first L layers of
// a target checkpoint with --exit-layer, for self-speculation).
#include <memory>

#include "services/common/worker_main.h"
#include "services/draft_worker/draft_service.h"

int main(int argc, char** argv) {
  specd::WorkerMainSpec spec;
  spec.program = "specd-draft-worker";
  spec.summary = "Drafts tokens for speculative decoding (specd.worker.v1.DraftWorker).";
  spec.role = specd::worker::v1::WORKER_ROLE_DRAFT;
  spec.service_name = specd::worker::v1::DraftWorker::service_full_name();
  spec.make_service = [](specd::WorkerRpcs* rpcs) -> std::unique_ptr<grpc::Service> {
    return std::make_unique<specd::DraftWorkerService>(rpcs);
  };
  return specd::WorkerMain(argc, argv, spec);
}
