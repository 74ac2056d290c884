// Helpers shared by the worker runtime's translation units (worker_runtime.cc, worker_draft.cc,
// worker_verify.cc); not part of its interface.
#ifndef SPECD_COMMON_WORKER_WORKER_RUNTIME_INTERNAL_H_
#define SPECD_COMMON_WORKER_WORKER_RUNTIME_INTERNAL_H_

#include <cstdint>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "common/protocol/worker_protocol.h"

namespace specd::worker_internal {

// INVALID_ARGUMENT naming the sequence and what went wrong in its row (kernels::RowError).
absl::Status RowError(SeqId seq, int32_t code);

// INVALID_ARGUMENT for the second and later requests naming an id already seen in the call (as
// a sequence or a companion), so one sequence is never fed twice in one forward pass.
absl::Status CheckUnique(const SequenceRequest& req, absl::flat_hash_set<SeqId>* seen);

}  // namespace specd::worker_internal

#endif  // SPECD_COMMON_WORKER_WORKER_RUNTIME_INTERNAL_H_
