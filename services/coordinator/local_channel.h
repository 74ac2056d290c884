// The coordinator's end of a worker's same-host path (services/common/local_frame.h): a few
// connections to the Unix socket the worker's Info names, each opened only after the worker's
// hello there shows the process whose Info the coordinator read. GrpcWorker makes a round's calls
// here when the worker has one and is reachable, and over gRPC otherwise.
#ifndef SPECD_SERVICES_COORDINATOR_LOCAL_CHANNEL_H_
#define SPECD_SERVICES_COORDINATOR_LOCAL_CHANNEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "services/common/local_frame.h"

namespace specd {

class LocalChannel {
 public:
  // Connects once, within `timeout`, to check the worker's hello: UNAVAILABLE when nothing
  // listens at `path` (a worker on another host or in another container),
  // FAILED_PRECONDITION when another process (another epoch) or protocol version answers.
  static absl::StatusOr<std::unique_ptr<LocalChannel>> Open(const std::string& path, uint64_t epoch,
                                                            absl::Duration timeout);
  ~LocalChannel();  // closes the idle connections

  LocalChannel(const LocalChannel&) = delete;
  LocalChannel& operator=(const LocalChannel&) = delete;

  // One call on an idle connection, or a new one: the worker's own status, or UNAVAILABLE when
  // the connection fails or the reply is malformed, DEADLINE_EXCEEDED past `deadline` (the
  // connection is then closed; a reply that comes later is never mistaken for another call's).
  // Thread-safe: concurrent calls use separate connections.
  absl::Status Call(local::Method method, const google::protobuf::Message& request,
                    google::protobuf::Message* response, absl::Time deadline);

  const std::string& path() const { return path_; }
  uint64_t epoch() const { return epoch_; }

 private:
  LocalChannel(std::string path, uint64_t epoch) : path_(std::move(path)), epoch_(epoch) {}
  // A connected socket whose hello matched, or the reason none is.
  absl::StatusOr<int> Connect(absl::Time deadline) const;

  const std::string path_;
  const uint64_t epoch_;
  absl::Mutex mu_;
  std::vector<int> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_LOCAL_CHANNEL_H_
