// The process around a worker service, shared by specd-draft-worker and specd-target-worker:
// flags, model loading with progress, the engine thread, /metrics, a gRPC server with health
// and reflection, and a clean drain on SIGTERM.
#ifndef SPECD_SERVICES_COMMON_WORKER_MAIN_H_
#define SPECD_SERVICES_COMMON_WORKER_MAIN_H_

#include <functional>
#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/service_type.h"
#include "services/common/worker_rpcs.h"
#include "specd/worker/v1/worker.pb.h"

namespace specd {

struct WorkerMainSpec {
  std::string program;  // e.g. "specd-draft-worker"
  std::string summary;  // one line for --help
  worker::v1::WorkerRole role = worker::v1::WORKER_ROLE_UNSPECIFIED;
  std::string service_name;  // full gRPC name, for the health service
  // Builds the service; it outlives nothing it is given (the rpcs outlive the server).
  std::function<std::unique_ptr<grpc::Service>(WorkerRpcs* rpcs)> make_service;
};

// The exit status of a worker whose device became unusable while serving (a CUDA sticky error;
// see kernels::Backend::Health): it exits at once, for its supervisor to restart it.
inline constexpr int kExitDeviceLost = 3;

// Runs the worker until SIGTERM or SIGINT and returns the process exit code: 0 after a clean
// drain, 1 when start-up fails, 2 for bad flags (kExitDeviceLost ends the process from the engine
// thread).
int WorkerMain(int argc, char** argv, const WorkerMainSpec& spec);

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_WORKER_MAIN_H_
