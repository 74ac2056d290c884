// A RuntimeObserver that keeps the tokens of the largest forward pass a worker ran: the pass
// budget tests check it against the budget the coordinator was given or told.
#ifndef SPECD_TESTS_SERVICES_COORDINATOR_LARGEST_PASS_H_
#define SPECD_TESTS_SERVICES_COORDINATOR_LARGEST_PASS_H_

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "common/worker/worker_runtime.h"

namespace specd::testing {

class LargestPass final : public RuntimeObserver {
 public:
  void OnForward(ForwardKind, int64_t, int64_t tokens, absl::Duration) override {
    std::lock_guard<std::mutex> lock(mu_);
    largest_ = std::max(largest_, tokens);
  }
  void OnKvChanged(const KvPool&) override {}
  void OnPrefixCache(int64_t, int64_t) override {}
  int64_t tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    return largest_;
  }
  // Starts over, e.g. after a restart.
  void Reset() {
    std::lock_guard<std::mutex> lock(mu_);
    largest_ = 0;
  }

 private:
  std::mutex mu_;
  int64_t largest_ = 0;
};

}  // namespace specd::testing

#endif  // SPECD_TESTS_SERVICES_COORDINATOR_LARGEST_PASS_H_
