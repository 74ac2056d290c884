// Conversions between the worker protocol (specd.worker.v1) and WorkerRuntime's structs, and the
// whole-call checks of Draft and Verify requests. Per-sequence checks live in the runtime.
#ifndef SPECD_SERVICES_COMMON_WORKER_CONVERT_H_
#define SPECD_SERVICES_COMMON_WORKER_CONVERT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/kv/kv_pool.h"
#include "common/worker/worker_runtime.h"
#include "specd/worker/v1/worker.pb.h"

namespace specd {

namespace pb = ::specd::worker::v1;

// Proto3 zeros mean "unset": top_p 0 and repetition_penalty 0 are read as 1 (disabled).
SamplingParams SamplingFromProto(const pb::SamplingParams& proto);

DraftSequenceRequest DraftFromProto(const pb::DraftSequence& proto);
VerifySequenceRequest VerifyFromProto(const pb::VerifySequence& proto);

// INVALID_ARGUMENT for an empty request, a repeated seq_id, or K or M over the limits; these fail
// the whole RPC. Everything else is judged per sequence.
absl::Status ValidateDraftRequest(const pb::DraftRequest& request);
absl::Status ValidateVerifyRequest(const pb::VerifyRequest& request);

void StatusToProto(const absl::Status& status, pb::SequenceStatus* out);
void CacheStateToProto(int64_t cached_len, const KvPool& kv, pb::CacheState* out);
void VerifyResultToProto(const VerifySequenceResult& result, const KvPool& kv,
                         pb::VerifyResult* out);
// One stream message per draft step (see DraftResponse in worker.proto).
void DraftStepToProto(const DraftStep& step, const KvPool& kv, pb::DraftResponse* out);

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_WORKER_CONVERT_H_
