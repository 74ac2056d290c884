// The one codec between the worker protocol's C++ types (common/protocol/worker_protocol.h) and
// its wire form (specd.worker.v1). The coordinator's client encodes requests and decodes replies
// with it, and the workers decode requests and encode replies, so every field crosses in exactly
// one function per direction; tests/services/common/worker_codec_test.cc holds each pair to a
// round trip. Values cross as they are: defaults for fields a client left unset belong to the
// public API (request_validation), never to this internal protocol.
#ifndef SPECD_SERVICES_COMMON_WORKER_CODEC_H_
#define SPECD_SERVICES_COMMON_WORKER_CODEC_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/protocol/worker_protocol.h"
#include "specd/worker/v1/worker.pb.h"

namespace specd::codec {

namespace pb = ::specd::worker::v1;

void Encode(const SamplingParams& params, pb::SamplingParams* out);
SamplingParams Decode(const pb::SamplingParams& proto);

void Encode(const absl::Status& status, pb::SequenceStatus* out);
absl::Status Decode(const pb::SequenceStatus& proto);

void Encode(int64_t cached_len, const KvFree& free, pb::CacheState* out);
KvFree DecodeKvFree(const pb::CacheState& proto);

// Requests (coordinator -> worker).
void Encode(const DraftSequenceRequest& request, pb::DraftSequence* out);
DraftSequenceRequest Decode(const pb::DraftSequence& proto);
void Encode(const VerifySequenceRequest& request, pb::VerifySequence* out);
VerifySequenceRequest Decode(const pb::VerifySequence& proto);
void Encode(std::span<const TruncateSequenceRequest> batch, pb::TruncateRequest* out);
std::vector<TruncateSequenceRequest> Decode(const pb::TruncateRequest& proto);
void Encode(std::span<const RowQuery> batch, pb::ReadRowsRequest* out);
std::vector<RowQuery> Decode(const pb::ReadRowsRequest& proto);
void Encode(std::span<const LogprobQuery> batch, pb::QueryLogprobsRequest* out);
std::vector<LogprobQuery> Decode(const pb::QueryLogprobsRequest& proto);

// INVALID_ARGUMENT for an empty request, a repeated seq_id, K, M or the top-N of logprobs over
// the limits, or an enum value the protocol does not define; these fail the whole call. Everything
// else is judged per sequence by the worker runtime.
absl::Status Validate(const pb::DraftRequest& request);
absl::Status Validate(const pb::VerifyRequest& request);
absl::Status Validate(const pb::TruncateRequest& request);
absl::Status Validate(const pb::ReadRowsRequest& request);
absl::Status Validate(const pb::QueryLogprobsRequest& request);

// Replies (worker -> coordinator). Each carries the worker's free KV as of the reply.
void Encode(const VerifySequenceResult& result, const KvFree& free, pb::VerifyResult* out);
// `forward_ns` is the VerifyResponse's.
VerifySequenceResult Decode(const pb::VerifyResult& proto, int64_t forward_ns);

// Appends one draft step to the Draft reply; the last step also adds every sequence's cache state.
void Encode(const DraftStep& step, const KvFree& free, pb::DraftResponse* out);
// A decoded step owns what a DraftStep only views. The last step's `outcomes` hold every
// sequence's cached length (status OK: failures arrive in `failed`) and `free` the worker's free
// KV.
struct DecodedDraftStep {
  int32_t step = 0;
  int64_t forward_ns = 0;
  std::vector<DraftToken> tokens;
  std::vector<SequenceOutcome> failed;
  std::vector<SequenceOutcome> outcomes;
  KvFree free;
  bool has_free = false;
  bool operator==(const DecodedDraftStep&) const = default;
};
std::vector<DecodedDraftStep> Decode(const pb::DraftResponse& proto);

void Encode(const SequenceAnswer<TruncateResult>& answer, const KvFree& free,
            pb::TruncateResult* out);
SequenceAnswer<TruncateResult> Decode(const pb::TruncateResult& proto);
void Encode(const SequenceAnswer<ProbRow>& answer, int64_t cached_len, const KvFree& free,
            pb::KeptRow* out);
SequenceAnswer<ProbRow> Decode(const pb::KeptRow& proto);
void Encode(const SequenceAnswer<std::vector<float>>& answer, pb::LogprobAnswer* out);
SequenceAnswer<std::vector<float>> Decode(const pb::LogprobAnswer& proto);

}  // namespace specd::codec

#endif  // SPECD_SERVICES_COMMON_WORKER_CODEC_H_
