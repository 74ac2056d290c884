// A server-streaming reactor fed from another thread (the engine thread): it queues the messages
// it is given and writes them in order with at most one write outstanding, then finishes once
// the producer has closed it and the queue is drained. A producer with several messages ready
// hands them over at once (SendAll): the gRPC threads then chain the writes without waking the
// producer's thread again. The producer's Close() is its last touch,
// and the reactor finishes (and may be deleted) only after that, so the producer never sees a
// dangling reactor, cancelled or not.
#ifndef SPECD_SERVICES_COMMON_STREAM_REACTOR_H_
#define SPECD_SERVICES_COMMON_STREAM_REACTOR_H_

#include <atomic>
#include <deque>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"

namespace specd {

template <typename Response>
class QueuedWriteReactor : public grpc::ServerWriteReactor<Response> {
 public:
  QueuedWriteReactor() = default;

  // True once the client cancelled or the call broke: the producer may skip its work.
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

  // Queues one message; dropped after cancellation. Thread-safe; not after Close().
  void Send(Response message) {
    std::vector<Response> one;
    one.push_back(std::move(message));
    SendAll(std::move(one));
  }

  // Queues `messages` in order; thread-safe, not after Close().
  void SendAll(std::vector<Response> messages) {
    if (messages.empty()) return;
    const Response* to_write = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (broken_ || cancelled()) return;
      for (Response& m : messages) queue_.push_back(std::move(m));
      if (writing_) return;
      writing_ = true;
      to_write = &queue_.front();  // deque::push_back keeps references to elements valid
    }
    this->StartWrite(to_write);
  }

  // The producer's last call: finishes with `status` once every queued message is written (with
  // CANCELLED if the client went away).
  void Close(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      status_ = std::move(status);
      if (writing_) return;  // OnWriteDone finishes
    }
    FinishNow();
  }

 private:
  void OnWriteDone(bool ok) override {
    const Response* to_write = nullptr;
    {
      absl::MutexLock lock(&mu_);
      queue_.pop_front();
      if (!ok) {
        broken_ = true;
        queue_.clear();
      }
      if (!queue_.empty()) {
        to_write = &queue_.front();
      } else {
        writing_ = false;
        if (!closed_) return;
      }
    }
    if (to_write != nullptr) {
      this->StartWrite(to_write);
    } else {
      FinishNow();
    }
  }

  void OnCancel() override { cancelled_.store(true, std::memory_order_relaxed); }

 protected:
  // Runs once, just before the status is sent: bookkeeping a client must find done once it has
  // the status (a slot freed for its next call on the connection) belongs here, not in the
  // destructor, which gRPC runs a moment after the client has it.
  virtual void OnFinishing() {}

 private:
  void OnDone() override { delete this; }

  // Must be the last thing a caller does with `this`: OnDone may run at once.
  void FinishNow() {
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      status = cancelled() || broken_
                   ? grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled")
                   : status_;
    }
    OnFinishing();
    this->Finish(std::move(status));
  }

  absl::Mutex mu_;
  std::deque<Response> queue_ ABSL_GUARDED_BY(mu_);  // front() is being written when writing_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> cancelled_{false};
};

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_STREAM_REACTOR_H_
