#include "tests/services/worker_fixture.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "common/convert/llama2c.h"
#include "common/synth/synth.h"
#include "tests/services/worker_process.h"
#include "tests/test_util.h"

namespace specd::testing {

std::string ModelKindName(ModelKind kind) {
  return kind == ModelKind::kSynthetic ? "Synthetic" : "Stories260K";
}

absl::Status PrepareModel(ModelKind kind, const std::filesystem::path& out_dir) {
  if (kind == ModelKind::kSynthetic) {
    SynthSpec spec;
    absl::StatusOr<ModelConfig> config = ShapePreset("tiny");
    if (!config.ok()) return config.status();
    spec.config = *config;
    spec.seed = 20240611;
    // Layers matter enough that rows are spread out and a 2-layer draft differs from the target.
    spec.residual_scale = 0.6;
    return WriteSyntheticModel(spec, out_dir);
  }
  const std::optional<std::filesystem::path> shared = SharedDir();
  if (!shared) return absl::FailedPreconditionError("SPECD_SHARED_DIR is not set");
  Llama2cConvertOptions options;
  options.checkpoint = *shared / "models/stories260K/stories260K.bin";
  options.tokenizer = *shared / "models/stories260K/tok512.bin";
  options.out_dir = out_dir;
  return ConvertLlama2c(options);
}

int64_t DraftExitLayer(ModelKind kind) { return kind == ModelKind::kSynthetic ? 2 : 3; }

std::vector<std::string> WorkerArgs(const std::filesystem::path& model,
                                    const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--model",     model.string(), "--listen",       "127.0.0.1:0",
                                   "--backend",   "cpu",          "--threads",      "1",
                                   "--kv-tokens", "4096",         "--metrics-port", "0"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::filesystem::path DraftWorkerBinary() {
  return BuiltBinary("services/draft_worker/specd-draft-worker");
}
std::filesystem::path TargetWorkerBinary() {
  return BuiltBinary("services/target_worker/specd-target-worker");
}

pb::SamplingParams ToProto(const SamplingParams& p) {
  pb::SamplingParams out;
  out.set_temperature(p.temperature);
  out.set_top_k(p.top_k);
  out.set_top_p(p.top_p);
  out.set_min_p(p.min_p);
  out.set_repetition_penalty(p.repetition_penalty);
  out.set_presence_penalty(p.presence_penalty);
  out.set_frequency_penalty(p.frequency_penalty);
  return out;
}

pb::DraftSequence DraftSeq(uint64_t seq, const std::vector<int32_t>& catch_up, int64_t cached,
                           int32_t K, const SamplingParams& p, uint64_t seed, int64_t prompt_len) {
  pb::DraftSequence s;
  s.set_seq_id(seq);
  s.mutable_catch_up_tokens()->Assign(catch_up.begin(), catch_up.end());
  s.set_expected_cached_len(cached);
  s.set_num_speculative_tokens(K);
  *s.mutable_sampling() = ToProto(p);
  s.set_seed(seed);
  s.set_prompt_len(prompt_len);
  return s;
}

pb::VerifySequence VerifySeq(uint64_t seq, const std::vector<int32_t>& catch_up, int64_t cached,
                             const std::vector<int32_t>& drafts, const SamplingParams& p,
                             uint64_t seed, int64_t prompt_len, int32_t M) {
  pb::VerifySequence s;
  s.set_seq_id(seq);
  s.mutable_catch_up_tokens()->Assign(catch_up.begin(), catch_up.end());
  s.set_expected_cached_len(cached);
  s.mutable_draft_tokens()->Assign(drafts.begin(), drafts.end());
  *s.mutable_sampling() = ToProto(p);
  s.set_seed(seed);
  s.set_prompt_len(prompt_len);
  s.set_num_candidates(M);
  return s;
}

DraftCall CallDraft(pb::DraftWorker::Stub& stub, const pb::DraftRequest& request,
                    const std::function<void(grpc::ClientContext&)>& while_in_flight,
                    std::chrono::milliseconds delay) {
  DraftCall call;
  grpc::ClientContext context;
  std::thread side;
  if (while_in_flight) {
    side = std::thread([&context, &while_in_flight, delay] {
      std::this_thread::sleep_for(delay);
      while_in_flight(context);
    });
  }
  call.status = stub.Draft(&context, request, &call.response);
  if (side.joinable()) side.join();
  for (const pb::DraftStepResult& step : call.response.steps()) {
    for (const pb::DraftToken& t : step.tokens()) {
      if (t.has_status()) {
        call.failed[t.seq_id()] = t.status();
      } else {
        call.tokens[t.seq_id()].push_back(t.token());
        call.q[t.seq_id()].push_back(t.q_prob());
      }
    }
  }
  for (const pb::CacheStateEntry& e : call.response.cache()) call.cache[e.seq_id()] = e.state();
  return call;
}

VerifyCall CallVerify(pb::TargetWorker::Stub& stub, const pb::VerifyRequest& request) {
  VerifyCall call;
  grpc::ClientContext context;
  call.status = stub.Verify(&context, request, &call.response);
  for (const pb::VerifyResult& r : call.response.results()) {
    call.results[r.seq_id()] = r;
    call.order.push_back(r.seq_id());
  }
  return call;
}

std::vector<float> RowFromReply(const pb::KeptRow& reply, int64_t vocab) {
  if (reply.dense()) return {reply.probs().begin(), reply.probs().end()};
  std::vector<float> row(static_cast<size_t>(vocab), 0.0f);
  for (int i = 0; i < reply.ids_size(); ++i) {
    row[static_cast<size_t>(reply.ids(i))] = reply.probs(i);
  }
  return row;
}

}  // namespace specd::testing
