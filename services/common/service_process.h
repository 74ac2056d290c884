// What every specd service process does first, before it starts a thread.
#ifndef SPECD_SERVICES_COMMON_SERVICE_PROCESS_H_
#define SPECD_SERVICES_COMMON_SERVICE_PROCESS_H_

#include <csignal>

namespace specd {

// Blocks SIGTERM and SIGINT in the calling thread, so that every thread started afterwards
// inherits the mask and the stop signals reach only the caller's sigwait (the drain then runs on
// that thread, not in a signal handler); returns the set to wait on. Also turns off Abseil's
// mutex deadlock detection (see the definition).
sigset_t StartServiceProcess();

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_SERVICE_PROCESS_H_
