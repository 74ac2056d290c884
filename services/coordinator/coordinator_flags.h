// The coordinator's flags other than its addresses: how it drafts, schedules, bounds and secures
// requests. `specd serve` takes the same flags and passes them on, so the two never differ.
#ifndef SPECD_SERVICES_COORDINATOR_COORDINATOR_FLAGS_H_
#define SPECD_SERVICES_COORDINATOR_COORDINATOR_FLAGS_H_

#include <vector>

#include "base/flags.h"

namespace specd {

std::vector<FlagSpec> CoordinatorServingFlags();

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_COORDINATOR_FLAGS_H_
