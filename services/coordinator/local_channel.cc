#include "services/coordinator/local_channel.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/protocol/worker_protocol.h"

namespace specd {
namespace {

// Idle connections kept for later calls; a round makes one call at a time per worker, besides
// Releases from other threads.
constexpr size_t kMaxIdle = 4;

}  // namespace

absl::StatusOr<std::unique_ptr<LocalChannel>> LocalChannel::Open(const std::string& path,
                                                                 uint64_t epoch,
                                                                 absl::Duration timeout) {
  std::unique_ptr<LocalChannel> channel(new LocalChannel(path, epoch));
  absl::StatusOr<int> fd = channel->Connect(absl::Now() + timeout);
  if (!fd.ok()) return fd.status();
  channel->idle_.push_back(*fd);
  return channel;
}

LocalChannel::~LocalChannel() {
  absl::MutexLock lock(&mu_);
  for (const int fd : idle_) close(fd);
}

absl::StatusOr<int> LocalChannel::Connect(absl::Time deadline) const {
  const absl::StatusOr<sockaddr_un> addr = local::UnixAddress(path_);
  if (!addr.ok()) return absl::UnavailableError(absl::StrCat("no socket can be at ", path_));
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", strerror(errno)));
  if (connect(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    const absl::Status status =
        absl::UnavailableError(absl::StrCat("cannot connect to ", path_, ": ", strerror(errno)));
    close(fd);
    return status;
  }
  absl::StatusOr<local::Frame> frame = local::ReadFrame(fd, deadline);
  absl::StatusOr<local::Hello> hello =
      frame.ok() ? local::DecodeHello(*frame) : absl::StatusOr<local::Hello>(frame.status());
  absl::Status status;
  if (!hello.ok()) {
    status = absl::UnavailableError(
        absl::StrCat("no worker's hello on ", path_, ": ", hello.status().message()));
  } else if (hello->protocol_version != kWorkerProtocolVersion) {
    status = absl::FailedPreconditionError(
        absl::StrCat("the worker process at ", path_, " speaks worker protocol version ",
                     hello->protocol_version, ", this coordinator ", kWorkerProtocolVersion));
  } else if (hello->epoch != epoch_) {
    // As the worker itself words it when a gRPC call names another epoch.
    status = absl::FailedPreconditionError(
        absl::StrCat("the worker process at ", path_, " (epoch ", hello->epoch,
                     ") started after the caller last read its Info (epoch ", epoch_,
                     "): read Info again before sending sequences here"));
  }
  if (!status.ok()) {
    close(fd);
    return status;
  }
  return fd;
}

absl::Status LocalChannel::Call(local::Method method, const google::protobuf::Message& request,
                                google::protobuf::Message* response, absl::Time deadline) {
  int fd = -1;
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      fd = idle_.back();
      idle_.pop_back();
    }
  }
  if (fd < 0) {
    absl::StatusOr<int> connected = Connect(deadline);
    if (!connected.ok()) return absl::UnavailableError(connected.status().message());
    fd = *connected;
  }
  absl::Status status =
      local::WriteFrame(fd, static_cast<uint8_t>(method), request.SerializeAsString(), deadline);
  absl::StatusOr<local::Frame> reply =
      status.ok() ? local::ReadFrame(fd, deadline) : absl::StatusOr<local::Frame>(status);
  if (!reply.ok()) {
    close(fd);
    if (reply.status().code() == absl::StatusCode::kDeadlineExceeded) return reply.status();
    return absl::UnavailableError(reply.status().message());
  }
  {
    absl::MutexLock lock(&mu_);
    if (idle_.size() < kMaxIdle) {
      idle_.push_back(fd);
      fd = -1;
    }
  }
  if (fd >= 0) close(fd);
  if (reply->tag > static_cast<uint8_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnavailableError(absl::StrCat("a reply with status ", int{reply->tag}));
  }
  const auto code = static_cast<absl::StatusCode>(reply->tag);
  if (code != absl::StatusCode::kOk) return absl::Status(code, reply->payload);
  if (!response->ParseFromString(reply->payload)) {
    return absl::UnavailableError(
        absl::StrCat("a malformed ", local::MethodName(method), " reply"));
  }
  return absl::OkStatus();
}

}  // namespace specd
