#include "services/common/worker_rpcs.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/log_line.h"
#include "services/common/grpc_status.h"
#include "services/common/worker_codec.h"

namespace specd {

grpc::ServerUnaryReactor* WorkerRpcs::Info(grpc::CallbackServerContext* context,
                                           const worker::v1::InfoRequest* request,
                                           worker::v1::InfoResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The copy (megabytes with the tokenizer files) is made here, not on the engine thread.
  *response = request->omit_tokenizer_files() ? info_without_files_ : info_;
  engine_->Post([reactor, response](WorkerRuntime& runtime) {
    response->set_kv_free_blocks(runtime.kv_free().blocks);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

absl::Status WorkerRpcs::CheckEpoch(uint64_t expected) const {
  if (expected == 0 || expected == info_.epoch()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("this worker process (epoch ", info_.epoch(),
                   ") started after the caller last read its Info (epoch ", expected,
                   "): read Info again before sending sequences here"));
}

grpc::ServerUnaryReactor* WorkerRpcs::Truncate(grpc::CallbackServerContext* context,
                                               const worker::v1::TruncateRequest* request,
                                               worker::v1::TruncateResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (const absl::Status st = codec::Validate(*request); !st.ok()) {
    reactor->Finish(ToGrpcStatus(st));
    return reactor;
  }
  engine_->Post([reactor, request, response](WorkerRuntime& runtime) {
    for (const TruncateSequenceRequest& r : codec::Decode(*request)) {
      const SequenceAnswer<TruncateResult> answer{r.seq, runtime.Truncate(r)};
      codec::Encode(answer, runtime.kv_free(), response->add_results());
    }
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerRpcs::ReadRows(grpc::CallbackServerContext* context,
                                               const worker::v1::ReadRowsRequest* request,
                                               worker::v1::ReadRowsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (const absl::Status st = codec::Validate(*request); !st.ok()) {
    reactor->Finish(ToGrpcStatus(st));
    return reactor;
  }
  engine_->Post([reactor, request, response](WorkerRuntime& runtime) {
    for (const RowQuery& q : codec::Decode(*request)) {
      const SequenceAnswer<ProbRow> answer{q.seq, runtime.ReadRow(q.seq, q.step)};
      const absl::StatusOr<int64_t> cached = runtime.CachedLength(q.seq);
      codec::Encode(answer, cached.value_or(0), runtime.kv_free(), response->add_rows());
    }
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerRpcs::QueryLogprobs(grpc::CallbackServerContext* context,
                                                    const worker::v1::QueryLogprobsRequest* request,
                                                    worker::v1::QueryLogprobsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (const absl::Status st = codec::Validate(*request); !st.ok()) {
    reactor->Finish(ToGrpcStatus(st));
    return reactor;
  }
  engine_->Post([reactor, request, response](WorkerRuntime& runtime) {
    for (const LogprobQuery& q : codec::Decode(*request)) {
      codec::Encode({q.seq, runtime.QueryLogprobs(q.seq, q.step, q.tokens)},
                    response->add_answers());
    }
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerRpcs::Release(grpc::CallbackServerContext* context,
                                              const worker::v1::ReleaseRequest* request,
                                              worker::v1::ReleaseResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  engine_->Post([reactor, request, response](WorkerRuntime& runtime) {
    const absl::Status status = runtime.Release(request->seq_id());
    if (status.ok()) {
      response->set_free_kv_blocks(runtime.kv_free().blocks);
      codec::Encode(0, runtime.kv_free(), response->mutable_cache());
    }
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerRpcs::ReleaseAll(grpc::CallbackServerContext* context,
                                                 const worker::v1::ReleaseAllRequest* /*request*/,
                                                 worker::v1::ReleaseAllResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  engine_->Post([this, reactor, response](WorkerRuntime& runtime) {
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
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

}  // namespace specd
