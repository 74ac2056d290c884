// Shared pieces of the worker process tests: the two test models, worker command lines, and
// small clients that collect a whole Draft or Verify stream.
#ifndef SPECD_TESTS_SERVICES_WORKER_FIXTURE_H_
#define SPECD_TESTS_SERVICES_WORKER_FIXTURE_H_

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/sampling_params.h"
#include "grpcpp/grpcpp.h"
#include "specd/worker/v1/worker.grpc.pb.h"

namespace specd::testing {

namespace pb = ::specd::worker::v1;

enum class ModelKind { kSynthetic, kStories260K };

std::string ModelKindName(ModelKind kind);
inline void PrintTo(ModelKind kind, std::ostream* os) { *os << ModelKindName(kind); }

// Writes the model for `kind` under `out_dir`: a `tiny` synthetic checkpoint, or stories260K
// converted from $SPECD_SHARED_DIR (FAILED_PRECONDITION when that is not set).
absl::Status PrepareModel(ModelKind kind, const std::filesystem::path& out_dir);

// The layers an early-exit draft of `kind` keeps.
int64_t DraftExitLayer(ModelKind kind);

// Command-line arguments for a worker over `model` on an ephemeral loopback port with one
// thread; `extra` flags come last and win.
std::vector<std::string> WorkerArgs(const std::filesystem::path& model,
                                    const std::vector<std::string>& extra = {});

std::filesystem::path DraftWorkerBinary();
std::filesystem::path TargetWorkerBinary();

pb::SamplingParams ToProto(const SamplingParams& p);

pb::DraftSequence DraftSeq(uint64_t seq, const std::vector<int32_t>& catch_up, int64_t cached,
                           int32_t K, const SamplingParams& p, uint64_t seed, int64_t prompt_len);
pb::VerifySequence VerifySeq(uint64_t seq, const std::vector<int32_t>& catch_up, int64_t cached,
                             const std::vector<int32_t>& drafts, const SamplingParams& p,
                             uint64_t seed, int64_t prompt_len, int32_t M);

// A whole Draft call, regrouped per sequence.
struct DraftCall {
  grpc::Status status;
  pb::DraftResponse response;
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, std::vector<float>> q;
  std::map<uint64_t, pb::SequenceStatus> failed;  // each failed sequence, reported once
  std::map<uint64_t, pb::CacheState> cache;
};
// `while_in_flight` (optional) runs on another thread `delay` after the call is sent, e.g. to
// cancel it or to signal the worker while it drafts.
DraftCall CallDraft(pb::DraftWorker::Stub& stub, const pb::DraftRequest& request,
                    const std::function<void(grpc::ClientContext&)>& while_in_flight = {},
                    std::chrono::milliseconds delay = std::chrono::milliseconds(20));

struct VerifyCall {
  grpc::Status status;
  pb::VerifyResponse response;
  std::map<uint64_t, pb::VerifyResult> results;
  std::vector<uint64_t> order;  // seq ids in reply order
};
VerifyCall CallVerify(pb::TargetWorker::Stub& stub, const pb::VerifyRequest& request);

// A dense row from a ReadRows reply (sparse or dense).
std::vector<float> RowFromReply(const pb::KeptRow& reply, int64_t vocab);

}  // namespace specd::testing

#endif  // SPECD_TESTS_SERVICES_WORKER_FIXTURE_H_
