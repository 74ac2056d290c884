// `specd serve` as a child process for the service tests (fault tests, the HTTP API's tests): it
// starts the three processes, and this knows their addresses and pids, streams Generate calls
// over gRPC, and reads the workers' KV usage.
#ifndef SPECD_TESTS_SERVICES_SERVE_PROCESS_H_
#define SPECD_TESTS_SERVICES_SERVE_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "specd/v1/generation.grpc.pb.h"
#include "tests/services/worker_process.h"

namespace specd::testing {

class ServeProcess {
 public:
  struct Stream {
    grpc::Status status;
    std::vector<int32_t> tokens;
    std::string text;
    std::vector<v1::GenerateResponse> messages;
    bool done_before_hook = false;  // finished before Generate's on_first_tokens ran
  };

  // Starts `specd serve --listen 127.0.0.1:0 ARGS` (with --pid-dir when `pid_dir` is given) and
  // waits until it prints its address. Null (with a test failure) when it does not start.
  static std::unique_ptr<ServeProcess> Start(const std::vector<std::string>& args,
                                             const std::filesystem::path& pid_dir = {});
  // SIGTERM, which stops the three children; expects a clean exit.
  ~ServeProcess();

  int port() const { return process_->port(); }
  int http_port() const { return process_->http_port(); }  // 0 without --http-listen
  std::string address() const { return process_->address(); }
  v1::Generation::Stub& stub() { return *stub_; }

  // A child's pid from --pid-dir ("target-worker", "draft-worker", "coordinator").
  pid_t Pid(const std::string& child) const;
  // Where `name` ("target worker") listens, from serve's "NAME pid N on ADDR" lines.
  std::string Address(const std::string& name) const;
  // The port of `name`'s /metrics (serve's "NAME metrics on http://ADDR/metrics" line, with
  // --metrics); 0 if none.
  int MetricsPort(const std::string& name) const;
  std::string StderrText() const { return process_->StderrText(); }
  // A new client connection, as a client that retries after the coordinator went away makes.
  void Reconnect();

  // Runs `reqs` as concurrent streams. `on_first_tokens` runs once, as soon as `after` streams
  // have received tokens; it gets how many streams had finished by then.
  std::vector<Stream> Generate(const std::vector<v1::GenerateRequest>& reqs, int after = 0,
                               const std::function<void(int finished)>& on_first_tokens = {});

  // KV blocks in use on a worker ("target worker" or "draft worker"), from its Info; -1 when it
  // cannot be asked.
  int64_t UsedKvBlocks(const std::string& worker) const;
  // Both workers report every KV block free (the last Releases may still be landing).
  void ExpectNoBlocksUsed() const;

 private:
  ServeProcess() = default;
  std::filesystem::path pid_dir_;
  std::unique_ptr<ChildProcess> process_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

}  // namespace specd::testing

#endif  // SPECD_TESTS_SERVICES_SERVE_PROCESS_H_
