// specd-target-worker: serves specd.worker.v1.TargetWorker (verification and plain decoding)
// over one model.
#include <memory>

#include "services/common/worker_main.h"
#include "services/target_worker/target_service.h"

int main(int argc, char** argv) {
  specd::WorkerMainSpec spec;
  spec.program = "specd-target-worker";
  spec.summary = "Verifies draft tokens for speculative decoding (specd.worker.v1.TargetWorker).";
  spec.role = specd::worker::v1::WORKER_ROLE_TARGET;
  spec.service_name = specd::worker::v1::TargetWorker::service_full_name();
  spec.make_service = [](specd::WorkerRpcs* rpcs) -> std::unique_ptr<grpc::Service> {
    return std::make_unique<specd::TargetWorkerService>(rpcs);
  };
  return specd::WorkerMain(argc, argv, spec);
}
