// Holds the scheduler thread inside a request's sink, so that a test can act between two rounds
// however slowly its own thread is scheduled.
#ifndef SPECD_TESTS_SERVICES_COORDINATOR_PAUSE_AT_H_
#define SPECD_TESTS_SERVICES_COORDINATOR_PAUSE_AT_H_

#include <future>
#include <memory>
#include <mutex>
#include <utility>

#include "services/coordinator/scheduler.h"

namespace specd::testing {

// Holds the scheduler thread in the sink Wrap() returns, at its n-th event, until Release(). The
// scheduler calls sinks between worker calls, so the workers are idle meanwhile. Releases itself
// when destroyed, so a failed assertion does not leave the scheduler blocked.
class PauseAt {
 public:
  explicit PauseAt(int n) : state_(std::make_shared<State>()) { state_->n = n; }
  PauseAt(const PauseAt&) = delete;
  PauseAt& operator=(const PauseAt&) = delete;
  ~PauseAt() { Release(); }

  Scheduler::EventSink Wrap(Scheduler::EventSink inner) {
    return [state = state_, inner = std::move(inner)](GenerationEvent e) {
      inner(std::move(e));
      if (++state->events != state->n) return;
      state->reached.set_value();
      state->released_future.wait();
    };
  }
  void WaitUntilReached() { state_->reached_future.wait(); }
  void Release() {
    std::call_once(state_->release_once, [&] { state_->released.set_value(); });
  }

 private:
  struct State {
    int n = 0;
    int events = 0;  // touched only by the scheduler thread
    std::promise<void> reached;
    std::future<void> reached_future = reached.get_future();
    std::promise<void> released;
    std::shared_future<void> released_future = released.get_future().share();
    std::once_flag release_once;
  };
  std::shared_ptr<State> state_;
};

}  // namespace specd::testing

#endif  // SPECD_TESTS_SERVICES_COORDINATOR_PAUSE_AT_H_
