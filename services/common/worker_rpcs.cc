#include "services/common/worker_rpcs.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/log_line.h"
#include "services/common/worker_codec.h"

namespace specd {

namespace pb = ::specd::worker::v1;

void WorkerRpcs::Info(const pb::InfoRequest& request, pb::InfoResponse* response, Done done) {
  // The copy (megabytes with the tokenizer files) is made here, not on the engine thread.
  *response = request.omit_tokenizer_files() ? info_without_files_ : info_;
  engine_->Post([response, done = std::move(done)](WorkerRuntime& runtime) mutable {
    response->set_kv_free_blocks(runtime.kv_free().blocks);
    std::move(done)(absl::OkStatus());
  });
}

absl::Status WorkerRpcs::CheckEpoch(uint64_t expected) const {
  if (expected == 0 || expected == info_.epoch()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("this worker process (epoch ", info_.epoch(),
                   ") started after the caller last read its Info (epoch ", expected,
                   "): read Info again before sending sequences here"));
}

template <typename Request, typename Pass>
void WorkerRpcs::PostPass(const Request& request, Cancelled cancelled, Done done, Pass pass) {
  if (absl::Status st = codec::Validate(request);
      !st.ok() || !(st = CheckEpoch(request.expected_epoch())).ok()) {
    std::move(done)(st);
    return;
  }
  std::vector<decltype(codec::Decode(request.sequences(0)))> batch;
  batch.reserve(static_cast<size_t>(request.sequences_size()));
  for (const auto& s : request.sequences()) batch.push_back(codec::Decode(s));
  engine_->Post([cancelled = std::move(cancelled), done = std::move(done), pass = std::move(pass),
                 batch = std::move(batch)](WorkerRuntime& runtime) mutable {
    // A call cancelled while queued costs nothing; one cancelled mid-way runs to the end, so
    // the cache and kept rows stay consistent with what the runtime reports next time.
    if (cancelled()) {
      std::move(done)(absl::CancelledError("the call was cancelled"));
      return;
    }
    pass(runtime, batch);
    std::move(done)(absl::OkStatus());
  });
}

void WorkerRpcs::Draft(const pb::DraftRequest& request, pb::DraftResponse* response,
                       Cancelled cancelled, Done done) {
  PostPass(request, std::move(cancelled), std::move(done),
           [response](WorkerRuntime& runtime, const std::vector<DraftSequenceRequest>& batch) {
             runtime.Draft(batch, [&](const DraftStep& step) {
               codec::Encode(step, runtime.kv_free(), response);
             });
           });
}

void WorkerRpcs::Verify(const pb::VerifyRequest& request, pb::VerifyResponse* response,
                        Cancelled cancelled, Done done) {
  PostPass(request, std::move(cancelled), std::move(done),
           [response](WorkerRuntime& runtime, const std::vector<VerifySequenceRequest>& batch) {
             int64_t forward_ns = 0;
             for (const VerifySequenceResult& result : runtime.Verify(batch)) {
               forward_ns = std::max(forward_ns, result.forward_ns);
               codec::Encode(result, runtime.kv_free(), response->add_results());
             }
             response->set_forward_ns(forward_ns);
           });
}

template <typename Request, typename Answer>
void WorkerRpcs::PostQueries(const Request& request, Done done, Answer answer) {
  if (const absl::Status st = codec::Validate(request); !st.ok()) {
    std::move(done)(st);
    return;
  }
  engine_->Post([&request, done = std::move(done),
                 answer = std::move(answer)](WorkerRuntime& runtime) mutable {
    for (const auto& query : codec::Decode(request)) answer(runtime, query);
    std::move(done)(absl::OkStatus());
  });
}

void WorkerRpcs::Truncate(const pb::TruncateRequest& request, pb::TruncateResponse* response,
                          Done done) {
  PostQueries(request, std::move(done),
              [response](WorkerRuntime& runtime, const TruncateSequenceRequest& r) {
                const SequenceAnswer<TruncateResult> answer{r.seq, runtime.Truncate(r)};
                codec::Encode(answer, runtime.kv_free(), response->add_results());
              });
}

void WorkerRpcs::ReadRows(const pb::ReadRowsRequest& request, pb::ReadRowsResponse* response,
                          Done done) {
  PostQueries(request, std::move(done), [response](WorkerRuntime& runtime, const RowQuery& q) {
    const SequenceAnswer<ProbRow> answer{q.seq, runtime.ReadRow(q.seq, q.step)};
    const absl::StatusOr<int64_t> cached = runtime.CachedLength(q.seq);
    codec::Encode(answer, cached.value_or(0), runtime.kv_free(), response->add_rows());
  });
}

void WorkerRpcs::QueryLogprobs(const pb::QueryLogprobsRequest& request,
                               pb::QueryLogprobsResponse* response, Done done) {
  PostQueries(request, std::move(done), [response](WorkerRuntime& runtime, const LogprobQuery& q) {
    codec::Encode({q.seq, runtime.QueryLogprobs(q.seq, q.step, q.tokens)}, response->add_answers());
  });
}

void WorkerRpcs::Release(const pb::ReleaseRequest& request, pb::ReleaseResponse* response,
                         Done done) {
  engine_->Post(
      [seq = request.seq_id(), response, done = std::move(done)](WorkerRuntime& runtime) mutable {
        const absl::Status status = runtime.Release(seq);
        if (status.ok()) {
          response->set_free_kv_blocks(runtime.kv_free().blocks);
          codec::Encode(0, runtime.kv_free(), response->mutable_cache());
        }
        std::move(done)(status);
      });
}

void WorkerRpcs::ReleaseAll(pb::ReleaseAllResponse* response, Done done) {
  engine_->Post([this, response, done = std::move(done)](WorkerRuntime& runtime) mutable {
    const int64_t free_before = runtime.kv_free().blocks;
    const int64_t released = runtime.ReleaseAll();
    const int64_t free_blocks = runtime.kv_free().blocks;
    if (released > 0) {
      LogLine(program_) << "a coordinator claimed this worker: released " << released
                        << " sequence(s) another left, " << free_blocks - free_before
                        << " KV block(s) freed";
    }
    response->set_released_sequences(released);
    response->set_free_kv_blocks(free_blocks);
    std::move(done)(absl::OkStatus());
  });
}

}  // namespace specd
