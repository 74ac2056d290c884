#include "services/common/service_process.h"

#include <pthread.h>

#include "absl/synchronization/mutex.h"

namespace specd {

sigset_t StartServiceProcess() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // Debian builds Abseil without NDEBUG, which leaves absl::Mutex's debug-mode deadlock detection
  // on: every lock records an edge in one process-wide graph under a global spin lock. gRPC takes
  // such mutexes many times per call, so a service pays for it on every RPC; it is a debugging
  // aid (off in Abseil's release builds), not a guard the services rely on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return stop_signals;
}

}  // namespace specd
