#include "services/common/worker_codec.h"

#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace specd::codec {
namespace {

// The fields every DraftSequence and VerifySequence carries.
template <typename ProtoSequence>
void EncodeSequence(const SequenceRequest& r, ProtoSequence* out) {
  out->set_seq_id(r.seq);
  out->mutable_catch_up_tokens()->Add(r.catch_up.begin(), r.catch_up.end());
  out->set_expected_cached_len(r.expected_cached_len);
  Encode(r.sampling, out->mutable_sampling());
  for (const TokenBias& b : r.logit_bias) {
    pb::TokenBias* e = out->mutable_sampling()->add_logit_bias();
    e->set_token(b.token);
    e->set_bias(b.bias);
  }
  out->set_seed(r.seed);
  out->set_prompt_len(r.prompt_len);
  out->set_drop_tail(r.drop_tail);
  out->set_max_prefill_tokens(r.max_prefill_tokens);
  out->set_prefill_only(r.prefill_only);
  out->set_sample(r.sample);
  if (!r.compact.empty()) {
    out->mutable_compact()->set_tree_start(r.compact.tree_start);
    out->mutable_compact()->mutable_kept_nodes()->Add(r.compact.kept_nodes.begin(),
                                                      r.compact.kept_nodes.end());
  }
  if (r.companion.has_value()) {
    pb::Companion* c = out->mutable_companion();
    c->set_seq_id(r.companion->seq);
    c->set_scale(r.companion->scale);
    c->mutable_catch_up_tokens()->Add(r.companion->catch_up.begin(), r.companion->catch_up.end());
    c->set_expected_cached_len(r.companion->expected_cached_len);
  }
}

template <typename ProtoSequence>
void DecodeSequence(const ProtoSequence& proto, SequenceRequest* out) {
  out->seq = proto.seq_id();
  out->catch_up.assign(proto.catch_up_tokens().begin(), proto.catch_up_tokens().end());
  out->expected_cached_len = proto.expected_cached_len();
  out->sampling = Decode(proto.sampling());
  out->logit_bias.clear();
  for (const pb::TokenBias& b : proto.sampling().logit_bias()) {
    out->logit_bias.push_back({b.token(), b.bias()});
  }
  out->seed = proto.seed();
  out->prompt_len = proto.prompt_len();
  out->drop_tail = proto.drop_tail();
  out->max_prefill_tokens = proto.max_prefill_tokens();
  out->prefill_only = proto.prefill_only();
  out->sample = proto.sample();
  if (proto.has_compact()) {
    out->compact.tree_start = proto.compact().tree_start();
    out->compact.kept_nodes.assign(proto.compact().kept_nodes().begin(),
                                   proto.compact().kept_nodes().end());
  }
  if (proto.has_companion()) {
    const pb::Companion& c = proto.companion();
    out->companion = CompanionRequest{
        c.seq_id(), c.scale(),
        std::vector<int32_t>(c.catch_up_tokens().begin(), c.catch_up_tokens().end()),
        c.expected_cached_len()};
  }
}

// An empty batch or a repeated seq_id fails the whole call.
template <typename Items>
absl::Status CheckBatch(const Items& items, const char* rpc) {
  if (items.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(rpc, ": the request has no sequences"));
  }
  absl::flat_hash_set<uint64_t> seen;
  for (const auto& item : items) {
    if (!seen.insert(item.seq_id()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(rpc, ": seq_id ", item.seq_id(), " appears more than once in the request"));
    }
  }
  return absl::OkStatus();
}

// The same for the sequences and companions of a Draft or Verify together: one id is fed once
// per pass, whatever it names.
template <typename Items>
absl::Status CheckBatchWithCompanions(const Items& items, const char* rpc) {
  if (absl::Status st = CheckBatch(items, rpc); !st.ok()) return st;
  absl::flat_hash_set<uint64_t> seen;
  for (const auto& item : items) seen.insert(item.seq_id());
  for (const auto& item : items) {
    if (!item.has_companion()) continue;
    if (!seen.insert(item.companion().seq_id()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(rpc, ": seq_id ", item.seq_id(), " names companion.seq_id ",
                       item.companion().seq_id(), ", which another sequence of the request uses"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

void Encode(const SamplingParams& params, pb::SamplingParams* out) {
  out->set_temperature(params.temperature);
  out->set_top_k(params.top_k);
  out->set_top_p(params.top_p);
  out->set_min_p(params.min_p);
  out->set_repetition_penalty(params.repetition_penalty);
  out->set_presence_penalty(params.presence_penalty);
  out->set_frequency_penalty(params.frequency_penalty);
}

SamplingParams Decode(const pb::SamplingParams& proto) {
  SamplingParams p;
  p.temperature = proto.temperature();
  p.top_k = proto.top_k();
  p.top_p = proto.top_p();
  p.min_p = proto.min_p();
  p.repetition_penalty = proto.repetition_penalty();
  p.presence_penalty = proto.presence_penalty();
  p.frequency_penalty = proto.frequency_penalty();
  return p;
}

void Encode(const absl::Status& status, pb::SequenceStatus* out) {
  out->set_code(static_cast<int32_t>(status.code()));
  out->set_message(std::string(status.message()));
}

absl::Status Decode(const pb::SequenceStatus& proto) {
  return absl::Status(static_cast<absl::StatusCode>(proto.code()), proto.message());
}

void Encode(int64_t cached_len, const KvFree& free, pb::CacheState* out) {
  out->set_cached_len(cached_len);
  out->set_free_kv_blocks(free.blocks);
  out->set_free_kv_tokens(free.tokens);
}

KvFree DecodeKvFree(const pb::CacheState& proto) {
  return KvFree{proto.free_kv_blocks(), proto.free_kv_tokens()};
}

void Encode(const DraftSequenceRequest& request, pb::DraftSequence* out) {
  EncodeSequence(request, out);
  out->set_num_speculative_tokens(request.num_speculative_tokens);
  out->set_draft_sampling(request.draft_sampling == DraftSampling::kGreedy
                              ? pb::DRAFT_SAMPLING_GREEDY
                              : pb::DRAFT_SAMPLING_PROBABILISTIC);
  if (request.tree.is_tree()) {
    out->mutable_tree()->set_branching(request.tree.branching);
    out->mutable_tree()->set_depth(request.tree.depth);
  }
  if (request.entropy_stop.enabled) {
    out->set_egag(true);
    out->set_egag_min_tokens(request.entropy_stop.min_tokens);
    out->set_egag_threshold(request.entropy_stop.threshold);
  }
}

DraftSequenceRequest Decode(const pb::DraftSequence& proto) {
  DraftSequenceRequest r;
  DecodeSequence(proto, &r);
  r.num_speculative_tokens = proto.num_speculative_tokens();
  r.draft_sampling = proto.draft_sampling() == pb::DRAFT_SAMPLING_GREEDY
                         ? DraftSampling::kGreedy
                         : DraftSampling::kProbabilistic;
  r.tree = {proto.tree().branching(), proto.tree().depth()};
  r.entropy_stop = {proto.egag(), proto.egag_min_tokens(), proto.egag_threshold()};
  if (!r.entropy_stop.enabled) r.entropy_stop = EntropyStop();
  return r;
}

void Encode(const VerifySequenceRequest& request, pb::VerifySequence* out) {
  EncodeSequence(request, out);
  out->mutable_draft_tokens()->Add(request.drafts.begin(), request.drafts.end());
  out->mutable_tree_parents()->Add(request.tree_parents.begin(), request.tree_parents.end());
  out->set_num_candidates(request.num_candidates);
  if (request.logprobs.mode != LogprobsMode::kOff) {
    out->mutable_logprobs()->set_mode(request.logprobs.mode == LogprobsMode::kRaw
                                          ? pb::LOGPROBS_MODE_RAW
                                          : pb::LOGPROBS_MODE_PROCESSED);
    out->mutable_logprobs()->set_top_n(request.logprobs.top_n);
  }
}

VerifySequenceRequest Decode(const pb::VerifySequence& proto) {
  VerifySequenceRequest r;
  DecodeSequence(proto, &r);
  r.drafts.assign(proto.draft_tokens().begin(), proto.draft_tokens().end());
  r.tree_parents.assign(proto.tree_parents().begin(), proto.tree_parents().end());
  r.num_candidates = proto.num_candidates();
  r.logprobs.mode = proto.logprobs().mode() == pb::LOGPROBS_MODE_RAW ? LogprobsMode::kRaw
                    : proto.logprobs().mode() == pb::LOGPROBS_MODE_PROCESSED
                        ? LogprobsMode::kProcessed
                        : LogprobsMode::kOff;
  r.logprobs.top_n = proto.logprobs().top_n();
  return r;
}

void Encode(std::span<const TruncateSequenceRequest> batch, pb::TruncateRequest* out) {
  for (const TruncateSequenceRequest& r : batch) {
    pb::TruncateSequence* s = out->add_sequences();
    s->set_seq_id(r.seq);
    s->set_new_len(r.new_len);
    s->set_query_step(r.query_step);
    s->mutable_query_tokens()->Add(r.query_tokens.begin(), r.query_tokens.end());
    if (r.companion_new_len.has_value()) s->set_companion_new_len(*r.companion_new_len);
  }
}

std::vector<TruncateSequenceRequest> Decode(const pb::TruncateRequest& proto) {
  std::vector<TruncateSequenceRequest> out;
  out.reserve(static_cast<size_t>(proto.sequences_size()));
  for (const pb::TruncateSequence& s : proto.sequences()) {
    out.push_back(
        {s.seq_id(), s.new_len(), s.query_step(),
         std::vector<int32_t>(s.query_tokens().begin(), s.query_tokens().end()),
         s.has_companion_new_len() ? std::optional<int64_t>(s.companion_new_len()) : std::nullopt});
  }
  return out;
}

void Encode(std::span<const RowQuery> batch, pb::ReadRowsRequest* out) {
  for (const RowQuery& q : batch) {
    pb::RowQuery* row = out->add_rows();
    row->set_seq_id(q.seq);
    row->set_step(q.step);
  }
}

std::vector<RowQuery> Decode(const pb::ReadRowsRequest& proto) {
  std::vector<RowQuery> out;
  out.reserve(static_cast<size_t>(proto.rows_size()));
  for (const pb::RowQuery& q : proto.rows()) out.push_back({q.seq_id(), q.step()});
  return out;
}

void Encode(std::span<const LogprobQuery> batch, pb::QueryLogprobsRequest* out) {
  for (const LogprobQuery& q : batch) {
    pb::LogprobQuery* query = out->add_queries();
    query->set_seq_id(q.seq);
    query->set_step(q.step);
    query->mutable_tokens()->Add(q.tokens.begin(), q.tokens.end());
  }
}

std::vector<LogprobQuery> Decode(const pb::QueryLogprobsRequest& proto) {
  std::vector<LogprobQuery> out;
  out.reserve(static_cast<size_t>(proto.queries_size()));
  for (const pb::LogprobQuery& q : proto.queries()) {
    out.push_back(
        {q.seq_id(), q.step(), std::vector<int32_t>(q.tokens().begin(), q.tokens().end())});
  }
  return out;
}

absl::Status Validate(const pb::DraftRequest& request) {
  if (absl::Status st = CheckBatchWithCompanions(request.sequences(), "Draft"); !st.ok()) {
    return st;
  }
  for (const pb::DraftSequence& s : request.sequences()) {
    if (s.num_speculative_tokens() > kMaxSpeculativeTokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Draft: seq_id ", s.seq_id(), " asks for num_speculative_tokens ",
          s.num_speculative_tokens(), ", at most ", kMaxSpeculativeTokens, " are allowed"));
    }
    if (!pb::DraftSampling_IsValid(s.draft_sampling())) {
      return absl::InvalidArgumentError(absl::StrCat("Draft: seq_id ", s.seq_id(),
                                                     " has draft_sampling ", s.draft_sampling(),
                                                     ", which is not a DraftSampling value"));
    }
  }
  return absl::OkStatus();
}

absl::Status Validate(const pb::VerifyRequest& request) {
  if (absl::Status st = CheckBatchWithCompanions(request.sequences(), "Verify"); !st.ok()) {
    return st;
  }
  for (const pb::VerifySequence& s : request.sequences()) {
    const int limit = s.tree_parents().empty() ? kMaxSpeculativeTokens : kMaxTreeNodes;
    if (s.draft_tokens_size() > limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("Verify: seq_id ", s.seq_id(), " has ", s.draft_tokens_size(),
                       " draft_tokens, at most ", limit, " are allowed"));
    }
    if (s.num_candidates() > kMaxCandidates) {
      return absl::InvalidArgumentError(
          absl::StrCat("Verify: seq_id ", s.seq_id(), " asks for num_candidates ",
                       s.num_candidates(), ", at most ", kMaxCandidates, " are allowed"));
    }
    if (!pb::LogprobsMode_IsValid(s.logprobs().mode())) {
      return absl::InvalidArgumentError(absl::StrCat("Verify: seq_id ", s.seq_id(),
                                                     " has logprobs.mode ", s.logprobs().mode(),
                                                     ", which is not a LogprobsMode value"));
    }
    if (s.logprobs().top_n() < 0 || s.logprobs().top_n() > kMaxLogprobs) {
      return absl::InvalidArgumentError(
          absl::StrCat("Verify: seq_id ", s.seq_id(), " asks for logprobs.top_n ",
                       s.logprobs().top_n(), ", allowed are 0 to ", kMaxLogprobs));
    }
  }
  return absl::OkStatus();
}

absl::Status Validate(const pb::TruncateRequest& request) {
  return CheckBatch(request.sequences(), "Truncate");
}

absl::Status Validate(const pb::ReadRowsRequest& request) {
  if (request.rows().empty()) {
    return absl::InvalidArgumentError("ReadRows: the request has no rows");
  }
  return absl::OkStatus();
}

absl::Status Validate(const pb::QueryLogprobsRequest& request) {
  if (request.queries().empty()) {
    return absl::InvalidArgumentError("QueryLogprobs: the request has no queries");
  }
  return absl::OkStatus();
}

void Encode(const VerifySequenceResult& result, const KvFree& free, pb::VerifyResult* out) {
  out->set_seq_id(result.seq);
  Encode(result.status, out->mutable_status());
  Encode(result.cached_len, free, out->mutable_cache());
  out->mutable_cache()->set_prefilling(result.prefilling);
  out->mutable_cache()->set_companion_cached_len(result.companion_cached_len);
  if (!result.status.ok() || result.prefilling) return;
  out->mutable_p_draft()->Assign(result.p_draft.begin(), result.p_draft.end());
  out->mutable_argmax()->Assign(result.argmax.begin(), result.argmax.end());
  out->set_bonus_token(result.bonus_token);
  out->mutable_leaf_bonus_tokens()->Assign(result.leaf_bonus.begin(), result.leaf_bonus.end());
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

VerifySequenceResult Decode(const pb::VerifyResult& proto, int64_t forward_ns) {
  VerifySequenceResult r;
  r.seq = proto.seq_id();
  r.status = Decode(proto.status());
  r.cached_len = proto.cache().cached_len();
  r.prefilling = proto.cache().prefilling();
  r.companion_cached_len = proto.cache().companion_cached_len();
  if (!r.status.ok()) return r;
  r.forward_ns = forward_ns;
  if (r.prefilling) return r;
  r.position = proto.position();
  r.p_draft.assign(proto.p_draft().begin(), proto.p_draft().end());
  r.argmax.assign(proto.argmax().begin(), proto.argmax().end());
  r.bonus_token = proto.bonus_token();
  r.leaf_bonus.assign(proto.leaf_bonus_tokens().begin(), proto.leaf_bonus_tokens().end());
  for (const pb::Candidates& c : proto.candidates()) {
    r.candidate_tokens.emplace_back(c.tokens().begin(), c.tokens().end());
    r.candidate_probs.emplace_back(c.p_probs().begin(), c.p_probs().end());
  }
  for (const pb::PositionLogprobs& p : proto.logprobs()) {
    PositionLogprobs& lp = r.logprobs.emplace_back();
    lp.top_ids.assign(p.top_ids().begin(), p.top_ids().end());
    lp.top_logprobs.assign(p.top_logprobs().begin(), p.top_logprobs().end());
    lp.token_ids.assign(p.token_ids().begin(), p.token_ids().end());
    lp.token_logprobs.assign(p.token_logprobs().begin(), p.token_logprobs().end());
  }
  return r;
}

void Encode(const DraftStep& step, const KvFree& free, pb::DraftResponse* out) {
  pb::DraftStepResult* encoded = out->add_steps();
  encoded->set_step(step.step);
  encoded->set_forward_ns(step.forward_ns);
  for (const DraftToken& t : step.tokens) {
    pb::DraftToken* token = encoded->add_tokens();
    token->set_seq_id(t.seq);
    token->set_token(t.token);
    token->set_q_prob(t.q_prob);
    token->set_entropy(t.entropy);
  }
  for (const SequenceOutcome& f : step.failed) {
    pb::DraftToken* token = encoded->add_tokens();
    token->set_seq_id(f.seq);
    Encode(f.status, token->mutable_status());
  }
  for (const SequenceOutcome& o : step.outcomes) {
    pb::CacheStateEntry* entry = out->add_cache();
    entry->set_seq_id(o.seq);
    Encode(o.cached_len, free, entry->mutable_state());
    entry->mutable_state()->set_prefilling(o.prefilling);
    entry->mutable_state()->set_companion_cached_len(o.companion_cached_len);
  }
}

std::vector<DecodedDraftStep> Decode(const pb::DraftResponse& proto) {
  std::vector<DecodedDraftStep> out;
  out.reserve(static_cast<size_t>(proto.steps_size()));
  for (const pb::DraftStepResult& s : proto.steps()) {
    DecodedDraftStep& step = out.emplace_back();
    step.step = s.step();
    step.forward_ns = s.forward_ns();
    for (const pb::DraftToken& t : s.tokens()) {
      if (t.has_status() && t.status().code() != 0) {
        step.failed.push_back({t.seq_id(), Decode(t.status()), 0});
      } else {
        step.tokens.push_back({t.seq_id(), t.token(), t.q_prob(), t.entropy()});
      }
    }
  }
  if (!out.empty()) {
    DecodedDraftStep& last = out.back();
    for (const pb::CacheStateEntry& c : proto.cache()) {
      last.outcomes.push_back({c.seq_id(), absl::OkStatus(), c.state().cached_len(),
                               c.state().prefilling(), c.state().companion_cached_len()});
      last.free = DecodeKvFree(c.state());
      last.has_free = true;
    }
  }
  return out;
}

void Encode(const SequenceAnswer<TruncateResult>& answer, const KvFree& free,
            pb::TruncateResult* out) {
  out->set_seq_id(answer.seq);
  Encode(answer.value.status(), out->mutable_status());
  if (!answer.value.ok()) return;
  Encode(answer.value->cached_len, free, out->mutable_cache());
  out->mutable_cache()->set_companion_cached_len(answer.value->companion_cached_len);
  out->mutable_q_probs()->Assign(answer.value->q_probs.begin(), answer.value->q_probs.end());
}

SequenceAnswer<TruncateResult> Decode(const pb::TruncateResult& proto) {
  absl::Status status = Decode(proto.status());
  if (!status.ok()) return {proto.seq_id(), std::move(status)};
  return {proto.seq_id(),
          TruncateResult{proto.cache().cached_len(),
                         std::vector<float>(proto.q_probs().begin(), proto.q_probs().end()),
                         proto.cache().companion_cached_len()}};
}

void Encode(const SequenceAnswer<ProbRow>& answer, int64_t cached_len, const KvFree& free,
            pb::KeptRow* out) {
  out->set_seq_id(answer.seq);
  Encode(answer.value.status(), out->mutable_status());
  if (!answer.value.ok()) return;
  out->set_dense(answer.value->dense());
  out->mutable_ids()->Assign(answer.value->ids.begin(), answer.value->ids.end());
  out->mutable_probs()->Assign(answer.value->probs.begin(), answer.value->probs.end());
  Encode(cached_len, free, out->mutable_cache());
}

SequenceAnswer<ProbRow> Decode(const pb::KeptRow& proto) {
  absl::Status status = Decode(proto.status());
  if (!status.ok()) return {proto.seq_id(), std::move(status)};
  ProbRow row;
  if (!proto.dense()) row.ids.assign(proto.ids().begin(), proto.ids().end());
  row.probs.assign(proto.probs().begin(), proto.probs().end());
  return {proto.seq_id(), std::move(row)};
}

void Encode(const SequenceAnswer<std::vector<float>>& answer, pb::LogprobAnswer* out) {
  out->set_seq_id(answer.seq);
  Encode(answer.value.status(), out->mutable_status());
  if (!answer.value.ok()) return;
  out->mutable_logprobs()->Assign(answer.value->begin(), answer.value->end());
}

SequenceAnswer<std::vector<float>> Decode(const pb::LogprobAnswer& proto) {
  absl::Status status = Decode(proto.status());
  if (!status.ok()) return {proto.seq_id(), std::move(status)};
  return {proto.seq_id(), std::vector<float>(proto.logprobs().begin(), proto.logprobs().end())};
}

}  // namespace specd::codec
