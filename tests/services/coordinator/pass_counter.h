// A RuntimeObserver that counts what a worker computed: the tokens of its largest forward pass
// (the pass budget tests check it against the budget the coordinator was given or told), the
// tokens of all its passes, and the catch-up tokens it took from its prefix cache.
#ifndef SPECD_TESTS_SERVICES_COORDINATOR_PASS_COUNTER_H_
#define SPECD_TESTS_SERVICES_COORDINATOR_PASS_COUNTER_H_

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "common/worker/worker_runtime.h"

namespace specd::testing {

class PassCounter final : public RuntimeObserver {
 public:
  void OnForward(ForwardKind, int64_t, int64_t tokens, absl::Duration) override {
    std::lock_guard<std::mutex> lock(mu_);
    largest_ = std::max(largest_, tokens);
    forwarded_ += tokens;
  }
  void OnKvChanged(const KvPool&) override {}
  void OnPrefixCache(int64_t, int64_t hit) override {
    std::lock_guard<std::mutex> lock(mu_);
    hit_ += hit;
  }
  int64_t largest() {
    std::lock_guard<std::mutex> lock(mu_);
    return largest_;
  }
  int64_t forwarded() {
    std::lock_guard<std::mutex> lock(mu_);
    return forwarded_;
  }
  int64_t hit() {
    std::lock_guard<std::mutex> lock(mu_);
    return hit_;
  }
  // Starts over, e.g. after a restart.
  void Reset() {
    std::lock_guard<std::mutex> lock(mu_);
    largest_ = forwarded_ = hit_ = 0;
  }

 private:
  std::mutex mu_;
  int64_t largest_ = 0;
  int64_t forwarded_ = 0;
  int64_t hit_ = 0;
};

}  // namespace specd::testing

#endif  // SPECD_TESTS_SERVICES_COORDINATOR_PASS_COUNTER_H_
