// A worker's same-host path (local_frame.h): a Unix socket on which the coordinator makes a
// round's calls without gRPC. One thread per connection reads a request frame, starts the call on
// WorkerRpcs (the same code gRPC serves) and writes the reply frame once the engine thread has
// run it. A malformed request gets INVALID_ARGUMENT and the connection serves on; a frame that
// breaks the framing closes that connection only. Info, health and ReleaseAll stay on gRPC.
#ifndef SPECD_SERVICES_COMMON_LOCAL_SOCKET_SERVER_H_
#define SPECD_SERVICES_COMMON_LOCAL_SOCKET_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/common/local_frame.h"
#include "services/common/worker_rpcs.h"

namespace specd {

class LocalSocketServer {
 public:
  // Connections beyond this many are closed at once (the coordinator keeps a few).
  static constexpr int kMaxConnections = 64;

  // Listens on `path`, replacing a socket a previous process left there (never another kind of
  // file), readable and writable by this user only. `rpcs` must outlive the server.
  static absl::StatusOr<std::unique_ptr<LocalSocketServer>> Start(const std::string& path,
                                                                  WorkerRpcs* rpcs,
                                                                  std::string program);
  ~LocalSocketServer();  // Stop()

  LocalSocketServer(const LocalSocketServer&) = delete;
  LocalSocketServer& operator=(const LocalSocketServer&) = delete;

  // Refuses new connections and requests, lets the calls in flight reply (their jobs must still
  // run: stop the engine thread after this), joins every thread and removes the socket file.
  // Idempotent.
  void Stop();

 private:
  struct Connection {
    int fd = -1;  // closed by Stop() or the reaper, after the thread is joined
    std::thread thread;
    std::atomic<bool> done{false};
  };
  struct Reply {
    absl::StatusCode code = absl::StatusCode::kOk;
    std::string payload;  // the response message, or the error's message
  };

  LocalSocketServer(std::string path, int listen_fd, WorkerRpcs* rpcs, std::string program)
      : path_(std::move(path)), listen_fd_(listen_fd), rpcs_(rpcs), program_(std::move(program)) {}

  void AcceptLoop();
  void Serve(Connection* connection);
  Reply Call(const local::Frame& request, int fd);
  // Joins and closes the connections whose threads have ended.
  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const int listen_fd_;
  WorkerRpcs* const rpcs_;
  const std::string program_;
  ino_t inode_ = 0;  // of the socket file bound at `path_`
  std::thread accept_thread_;
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::list<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
};

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_LOCAL_SOCKET_SERVER_H_
