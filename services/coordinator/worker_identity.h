// What a worker must keep across a restart for the coordinator to go on using it. Crash replay
// continues every sequence on the new process from its committed tokens, which is exact only if
// the new process computes what the old one did: a target that came back with another model,
// tokenizer, back end or KV dtype would finish a stream begun by another computation. A draft
// may change anything but its vocabulary and a shorter max_seq_len: acceptance then changes,
// never the distribution. And any worker, at start or after a restart, must speak the
// coordinator's worker protocol version.
#ifndef SPECD_SERVICES_COORDINATOR_WORKER_IDENTITY_H_
#define SPECD_SERVICES_COORDINATOR_WORKER_IDENTITY_H_

#include "absl/status/status.h"
#include "specd/worker/v1/worker.pb.h"

namespace specd {

// OK when a worker speaks this coordinator's worker protocol (kWorkerProtocolVersion);
// otherwise FAILED_PRECONDITION saying which version each side speaks and that they must come
// from one release.
absl::Status CheckProtocolVersion(const worker::v1::InfoResponse& info);

// OK when a worker that answered `before` (at the coordinator's start) may serve on as `now`;
// otherwise FAILED_PRECONDITION naming what changed, e.g. "it came back with kv_dtype bf16
// (was f32)". Capacity (KV blocks, --max-pass-tokens, threads) may change; so may a larger
// max_seq_len, as the coordinator keeps the limits it started with.
absl::Status CheckSameComputation(const worker::v1::InfoResponse& before,
                                  const worker::v1::InfoResponse& now);

}  // namespace specd

#endif  // SPECD_SERVICES_COORDINATOR_WORKER_IDENTITY_H_
