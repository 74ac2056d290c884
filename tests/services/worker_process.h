// Runs a service binary as a child process for process-level tests: starts it, reads the port
// it prints, and always kills it when the object dies.
#ifndef SPECD_TESTS_SERVICES_WORKER_PROCESS_H_
#define SPECD_TESTS_SERVICES_WORKER_PROCESS_H_

#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace specd::testing {

// $SPECD_BUILD_DIR/<relative>, e.g. "services/draft_worker/specd-draft-worker".
std::filesystem::path BuiltBinary(const std::string& relative);

class ChildProcess {
 public:
  // Starts `binary args...` with stdout on a pipe and stderr in a temporary file, and waits until
  // it prints "listening on HOST:PORT" or "listening on unix:PATH" (after "metrics on HOST:PORT"
  // unless metrics are off, and "http on HOST:PORT" when it serves the HTTP API). An error carries
  // the child's stderr.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Start(const std::filesystem::path& binary,
                                                             const std::vector<std::string>& args);

  // Runs `binary args...` to completion and returns its exit code; `*stderr_text` gets stderr.
  static absl::StatusOr<int> Run(const std::filesystem::path& binary,
                                 const std::vector<std::string>& args, std::string* stderr_text);

  ~ChildProcess();  // SIGKILL if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  int port() const { return port_; }                  // 0 on a Unix socket
  int metrics_port() const { return metrics_port_; }  // 0 when metrics are off
  int http_port() const { return http_port_; }        // 0 without an HTTP API ("http on ...")
  // What it printed on stdout up to its "listening on" line, one entry a line.
  const std::vector<std::string>& startup_lines() const { return startup_lines_; }
  // What a client dials: 127.0.0.1:PORT, or the Unix socket it printed.
  const std::string& address() const { return address_; }
  std::shared_ptr<grpc::Channel> Channel() const;

  // Sends SIGTERM and waits: the exit code, or 128 + signal if it died of a signal. Close this
  // process's channels to it first (drop their stubs): a gRPC server's shutdown waits for its
  // connections to close, and an idle client notices the GOAWAY only at its backup poll, every
  // 5 s.
  int Terminate();
  // Sends `signal` without waiting.
  void Signal(int signal);
  std::string StderrText() const;

 private:
  ChildProcess() = default;
  int Wait();

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::filesystem::path stderr_path_;
  int port_ = 0;
  int metrics_port_ = 0;
  int http_port_ = 0;
  std::string address_;
  std::vector<std::string> startup_lines_;
};

// Sends SIGSTOP to `pid` and waits until every one of its threads has stopped. kill() returns
// once the signal is queued: until the thread chosen to take it runs, which on a loaded machine
// can take milliseconds, the other threads still answer calls.
absl::Status StopProcess(pid_t pid);

// The body of GET http://127.0.0.1:port/path (HTTP/1.0, so the server closes the connection).
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);

// A series from the /metrics of 127.0.0.1:port ("name" or "name{labels}"); -1 when it is absent.
// A failed scrape fails the test.
double MetricValue(int port, const std::string& series);

}  // namespace specd::testing

#endif  // SPECD_TESTS_SERVICES_WORKER_PROCESS_H_
