#include "services/common/worker_convert.h"

#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace specd {
namespace {

void FillSequence(uint64_t seq_id, const google::protobuf::RepeatedField<int32_t>& catch_up,
                  int64_t expected_cached_len, const pb::SamplingParams& sampling, uint64_t seed,
                  int64_t prompt_len, uint32_t sample, SequenceRequest* out) {
  out->seq = seq_id;
  out->sample = sample;
  out->catch_up.assign(catch_up.begin(), catch_up.end());
  out->expected_cached_len = expected_cached_len;
  out->sampling = SamplingFromProto(sampling);
  out->seed = seed;
  out->prompt_len = prompt_len;
}

// The whole-call checks both streaming RPCs share.
template <typename Sequences>
absl::Status CheckBatch(const Sequences& sequences, const char* rpc) {
  if (sequences.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(rpc, ": the request has no sequences"));
  }
  absl::flat_hash_set<uint64_t> seen;
  for (const auto& s : sequences) {
    if (!seen.insert(s.seq_id()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(rpc, ": seq_id ", s.seq_id(), " appears more than once in the request"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

SamplingParams SamplingFromProto(const pb::SamplingParams& proto) {
  SamplingParams p;
  p.temperature = proto.temperature();
  p.top_k = proto.top_k();
  p.top_p = proto.top_p() == 0.0f ? 1.0f : proto.top_p();
  p.min_p = proto.min_p();
  p.repetition_penalty = proto.repetition_penalty() == 0.0f ? 1.0f : proto.repetition_penalty();
  p.presence_penalty = proto.presence_penalty();
  p.frequency_penalty = proto.frequency_penalty();
  return p;
}

DraftSequenceRequest DraftFromProto(const pb::DraftSequence& proto) {
  DraftSequenceRequest r;
  FillSequence(proto.seq_id(), proto.catch_up_tokens(), proto.expected_cached_len(),
               proto.sampling(), proto.seed(), proto.prompt_len(), proto.sample(), &r);
  r.drop_tail = proto.drop_tail();
  r.num_draft_tokens = proto.num_draft_tokens();
  r.mode = proto.mode() == pb::DRAFT_MODE_GREEDY ? DraftMode::kGreedy : DraftMode::kProbabilistic;
  return r;
}

VerifySequenceRequest VerifyFromProto(const pb::VerifySequence& proto) {
  VerifySequenceRequest r;
  FillSequence(proto.seq_id(), proto.catch_up_tokens(), proto.expected_cached_len(),
               proto.sampling(), proto.seed(), proto.prompt_len(), proto.sample(), &r);
  r.drop_tail = proto.drop_tail();
  r.drafts.assign(proto.draft_tokens().begin(), proto.draft_tokens().end());
  r.num_candidates = proto.num_candidates();
  r.logprobs.mode = proto.logprobs().mode() == pb::LOGPROBS_MODE_RAW ? LogprobsMode::kRaw
                    : proto.logprobs().mode() == pb::LOGPROBS_MODE_PROCESSED
                        ? LogprobsMode::kProcessed
                        : LogprobsMode::kOff;
  r.logprobs.top_n = proto.logprobs().top_n();
  return r;
}

absl::Status ValidateDraftRequest(const pb::DraftRequest& request) {
  if (absl::Status st = CheckBatch(request.sequences(), "Draft"); !st.ok()) return st;
  for (const pb::DraftSequence& s : request.sequences()) {
    if (s.num_draft_tokens() > kMaxDraftTokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("Draft: seq_id ", s.seq_id(), " asks for num_draft_tokens ",
                       s.num_draft_tokens(), ", at most ", kMaxDraftTokens, " are allowed"));
    }
    if (!pb::DraftMode_IsValid(s.mode())) {
      return absl::InvalidArgumentError(absl::StrCat("Draft: seq_id ", s.seq_id(), " has mode ",
                                                     s.mode(), ", which is not a DraftMode"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateVerifyRequest(const pb::VerifyRequest& request) {
  if (absl::Status st = CheckBatch(request.sequences(), "Verify"); !st.ok()) return st;
  for (const pb::VerifySequence& s : request.sequences()) {
    if (s.draft_tokens_size() > kMaxDraftTokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("Verify: seq_id ", s.seq_id(), " has ", s.draft_tokens_size(),
                       " draft_tokens, at most ", kMaxDraftTokens, " are allowed"));
    }
    if (s.num_candidates() > kMaxCandidates) {
      return absl::InvalidArgumentError(
          absl::StrCat("Verify: seq_id ", s.seq_id(), " asks for num_candidates ",
                       s.num_candidates(), ", at most ", kMaxCandidates, " are allowed"));
    }
    if (!pb::LogprobsMode_IsValid(s.logprobs().mode())) {
      return absl::InvalidArgumentError(absl::StrCat("Verify: seq_id ", s.seq_id(),
                                                     " has logprobs.mode ", s.logprobs().mode(),
                                                     ", which is not a LogprobsMode"));
    }
    if (s.logprobs().top_n() < 0 || s.logprobs().top_n() > kMaxLogprobs) {
      return absl::InvalidArgumentError(
          absl::StrCat("Verify: seq_id ", s.seq_id(), " asks for logprobs.top_n ",
                       s.logprobs().top_n(), ", allowed are 0 to ", kMaxLogprobs));
    }
  }
  return absl::OkStatus();
}

void StatusToProto(const absl::Status& status, pb::SequenceStatus* out) {
  out->set_code(static_cast<int32_t>(status.code()));
  out->set_message(std::string(status.message()));
}

void CacheStateToProto(int64_t cached_len, const KvPool& kv, pb::CacheState* out) {
  out->set_cached_len(cached_len);
  out->set_free_kv_blocks(kv.free_blocks());
  out->set_free_kv_tokens(kv.free_blocks() * kv.block_size());
}

void VerifyResultToProto(const VerifySequenceResult& result, const KvPool& kv,
                         pb::VerifyResult* out) {
  out->set_seq_id(result.seq);
  StatusToProto(result.status, out->mutable_status());
  CacheStateToProto(result.cached_len, kv, out->mutable_cache());
  if (!result.status.ok()) return;
  out->mutable_p_draft()->Assign(result.p_draft.begin(), result.p_draft.end());
  out->mutable_argmax()->Assign(result.argmax.begin(), result.argmax.end());
  out->set_bonus_token(result.bonus_token);
  for (size_t i = 0; i < result.candidate_tokens.size(); ++i) {
    pb::Candidates* c = out->add_candidates();
    c->mutable_tokens()->Assign(result.candidate_tokens[i].begin(),
                                result.candidate_tokens[i].end());
    c->mutable_p_probs()->Assign(result.candidate_probs[i].begin(),
                                 result.candidate_probs[i].end());
  }
  out->set_position(result.position);
  for (const PositionLogprobs& p : result.logprobs) {
    pb::PositionLogprobs* lp = out->add_logprobs();
    lp->mutable_top_ids()->Assign(p.top_ids.begin(), p.top_ids.end());
    lp->mutable_top_logprobs()->Assign(p.top_logprobs.begin(), p.top_logprobs.end());
    lp->mutable_token_ids()->Assign(p.token_ids.begin(), p.token_ids.end());
    lp->mutable_token_logprobs()->Assign(p.token_logprobs.begin(), p.token_logprobs.end());
  }
}

void DraftStepToProto(const DraftStep& step, const KvPool& kv, pb::DraftResponse* out) {
  out->set_step(step.step);
  out->set_forward_ns(step.forward_ns);
  for (const DraftToken& t : step.tokens) {
    pb::DraftToken* token = out->add_tokens();
    token->set_seq_id(t.seq);
    token->set_token(t.token);
    token->set_q_prob(t.q_prob);
  }
  for (const SequenceOutcome& f : step.failed) {
    pb::DraftToken* token = out->add_tokens();
    token->set_seq_id(f.seq);
    StatusToProto(f.status, token->mutable_status());
  }
  for (const SequenceOutcome& o : step.outcomes) {
    pb::CacheStateEntry* entry = out->add_cache();
    entry->set_seq_id(o.seq);
    CacheStateToProto(o.cached_len, kv, entry->mutable_state());
  }
}

}  // namespace specd
