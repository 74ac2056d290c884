#include "services/common/work_queue.h"

#include <algorithm>
#include <utility>

namespace specd {

WorkQueue::WorkQueue(int num_threads) {
  for (int i = 0; i < std::max(1, num_threads); ++i) threads_.emplace_back([this] { Loop(); });
}

WorkQueue::~WorkQueue() { Stop(); }

void WorkQueue::Post(Task task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_) {
      queue_.push_back(std::move(task));
      return;
    }
  }
  std::move(task)();
}

void WorkQueue::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
  // Posts that raced with the last thread's exit: nobody is left to take them.
  std::deque<Task> left;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    left.swap(queue_);
  }
  for (Task& task : left) std::move(task)();
}

bool WorkQueue::HasWorkOrStopping() const { return stopping_ || !queue_.empty(); }

void WorkQueue::Loop() {
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &WorkQueue::HasWorkOrStopping));
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(task)();
  }
}

}  // namespace specd
