#include "services/common/local_socket_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/log_line.h"
#include "common/protocol/worker_protocol.h"

namespace specd {
namespace {

namespace pb = ::specd::worker::v1;

// A reply that cannot be written within this long goes to a coordinator that stopped reading.
constexpr absl::Duration kWriteTimeout = absl::Seconds(30);

absl::Status SocketError(const std::string& path, const char* what) {
  return absl::UnavailableError(
      absl::StrCat("--local-socket ", path, ": cannot ", what, ": ", strerror(errno)));
}

// The caller closed its end (it gave up on the call): a queued job is then skipped, as gRPC
// skips a cancelled one.
bool PeerGone(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalSocketServer>> LocalSocketServer::Start(const std::string& path,
                                                                            WorkerRpcs* rpcs,
                                                                            std::string program) {
  const absl::StatusOr<sockaddr_un> addr = local::UnixAddress(path);
  if (!addr.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--local-socket: ", addr.status().message()));
  }
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("--local-socket ", path, " exists and is not a socket"));
    }
    unlink(path.c_str());  // a previous worker's: its process is gone or will lose it
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return SocketError(path, "create a socket");
  // Nobody can connect before listen(), so the mode is set before anyone could use the socket.
  if (bind(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0 ||
      chmod(path.c_str(), 0600) != 0 || listen(fd, 16) != 0) {
    const absl::Status status = SocketError(path, "listen");
    close(fd);
    return status;
  }
  struct stat bound {};
  lstat(path.c_str(), &bound);
  std::unique_ptr<LocalSocketServer> server(
      new LocalSocketServer(path, fd, rpcs, std::move(program)));
  server->inode_ = bound.st_ino;
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

LocalSocketServer::~LocalSocketServer() { Stop(); }

void LocalSocketServer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    // Wakes accept() (EINVAL on Linux) and every connection's read; a reply still being made is
    // written, since only the reading side is shut.
    shutdown(listen_fd_, SHUT_RDWR);
    for (const std::unique_ptr<Connection>& c : connections_) shutdown(c->fd, SHUT_RD);
  }
  accept_thread_.join();
  absl::MutexLock lock(&mu_);
  for (const std::unique_ptr<Connection>& c : connections_) {
    c->thread.join();
    close(c->fd);
  }
  connections_.clear();
  close(listen_fd_);
  // Only our own socket: a worker started since on the same path keeps its.
  struct stat now {};
  if (lstat(path_.c_str(), &now) == 0 && now.st_ino == inode_) unlink(path_.c_str());
}

void LocalSocketServer::Reap() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if ((*it)->done.load()) {
      (*it)->thread.join();
      close((*it)->fd);
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void LocalSocketServer::AcceptLoop() {
  while (true) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    absl::MutexLock lock(&mu_);
    if (stopped_) {
      if (fd >= 0) close(fd);
      return;
    }
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors or memory: wait rather than spin; gRPC still serves meanwhile.
      LogLine(program_) << "--local-socket: accept failed: " << strerror(errno);
      mu_.AwaitWithTimeout(absl::Condition(&stopped_), absl::Milliseconds(100));
      continue;
    }
    Reap();
    if (connections_.size() >= static_cast<size_t>(kMaxConnections)) {
      close(fd);
      continue;
    }
    auto connection = std::make_unique<Connection>();
    connection->fd = fd;
    Connection* c = connection.get();
    connection->thread = std::thread([this, c] { Serve(c); });
    connections_.push_back(std::move(connection));
  }
}

void LocalSocketServer::Serve(Connection* connection) {
  const int fd = connection->fd;
  const std::string hello = local::EncodeHello({rpcs_->epoch(), kWorkerProtocolVersion});
  absl::Status status = local::WriteFrame(fd, local::kHelloTag, hello, absl::Now() + kWriteTimeout);
  while (status.ok()) {
    absl::StatusOr<local::Frame> request = local::ReadFrame(fd, absl::InfiniteFuture());
    if (!request.ok()) {
      status = request.status();
      break;
    }
    const Reply reply = Call(*request, fd);
    status = local::WriteFrame(fd, static_cast<uint8_t>(reply.code), reply.payload,
                               absl::Now() + kWriteTimeout);
  }
  // A closed connection is the normal end; one that broke the framing is worth a line.
  if (status.code() == absl::StatusCode::kInvalidArgument) {
    LogLine(program_) << "closed a --local-socket connection: " << status.message();
  }
  // The peer sees the end now; the descriptor itself is closed once the thread is joined, so
  // that Stop() never shuts a number another connection has been given since.
  shutdown(fd, SHUT_RDWR);
  connection->done.store(true);
}

LocalSocketServer::Reply LocalSocketServer::Call(const local::Frame& request, int fd) {
  const auto method = static_cast<local::Method>(request.tag);
  // Parses the request, runs `start(request, response, done)` and waits for the engine thread.
  auto run = [&](auto request_message, auto response_message, auto start) -> Reply {
    if (!request_message.ParseFromString(request.payload)) {
      return {absl::StatusCode::kInvalidArgument,
              absl::StrCat("a malformed ", local::MethodName(method), " request")};
    }
    absl::Notification finished;
    absl::Status status;
    start(request_message, &response_message, [&](absl::Status s) {
      status = std::move(s);
      finished.Notify();
    });
    finished.WaitForNotification();
    if (!status.ok()) return {status.code(), std::string(status.message())};
    return {absl::StatusCode::kOk, response_message.SerializeAsString()};
  };
  const bool draft = rpcs_->role() == pb::WORKER_ROLE_DRAFT;
  auto cancelled = [fd] { return PeerGone(fd); };
  switch (method) {
    case local::Method::kDraft:
      if (!draft) break;
      return run(pb::DraftRequest(), pb::DraftResponse(), [&](auto& req, auto* resp, auto done) {
        rpcs_->Draft(req, resp, cancelled, std::move(done));
      });
    case local::Method::kVerify:
      if (draft) break;
      return run(pb::VerifyRequest(), pb::VerifyResponse(), [&](auto& req, auto* resp, auto done) {
        rpcs_->Verify(req, resp, cancelled, std::move(done));
      });
    case local::Method::kQueryLogprobs:
      if (draft) break;
      return run(pb::QueryLogprobsRequest(), pb::QueryLogprobsResponse(),
                 [&](auto& req, auto* resp, auto done) {
                   rpcs_->QueryLogprobs(req, resp, std::move(done));
                 });
    case local::Method::kTruncate:
      return run(
          pb::TruncateRequest(), pb::TruncateResponse(),
          [&](auto& req, auto* resp, auto done) { rpcs_->Truncate(req, resp, std::move(done)); });
    case local::Method::kReadRows:
      return run(
          pb::ReadRowsRequest(), pb::ReadRowsResponse(),
          [&](auto& req, auto* resp, auto done) { rpcs_->ReadRows(req, resp, std::move(done)); });
    case local::Method::kRelease:
      return run(
          pb::ReleaseRequest(), pb::ReleaseResponse(),
          [&](auto& req, auto* resp, auto done) { rpcs_->Release(req, resp, std::move(done)); });
  }
  return {absl::StatusCode::kUnimplemented,
          absl::StrCat("the ", draft ? "draft" : "target", " worker serves no method ",
                       int{request.tag}, " (", local::MethodName(method), ")")};
}

}  // namespace specd
