#include "common/engine/decode_loop.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/inverse_cdf.h"
#include "base/philox.h"
#include "base/status_macros.h"
#include "common/sampling/processed.h"

namespace specd {
namespace {

absl::StatusOr<DecodeResult> Run(LlamaEngine& engine, KvPool::SeqId seq, const DecodeRequest& req,
                                 const std::function<void(int32_t)>& on_token) {
  const int64_t vocab = engine.config().vocab_size;
  SPECD_RETURN_IF_ERROR(ValidateSamplingParams(req.sampling, vocab));
  if (req.prompt.empty()) return absl::InvalidArgumentError("prompt must not be empty");
  if (req.max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens must be >= 0, got ", req.max_new_tokens));
  }
  const int64_t chunk = std::max<int64_t>(1, req.prefill_chunk);
  DecodeResult result;
  std::vector<float> probs(static_cast<size_t>(vocab));
  LogitsProcessor processor;
  std::vector<int32_t> fed = req.prompt;  // what the next Forward call feeds
  int64_t cached = 0;
  while (static_cast<int64_t>(result.tokens.size()) < req.max_new_tokens) {
    // Feed pending tokens in chunks; only the last chunk asks for logits.
    ForwardResult out;
    for (size_t begin = 0; begin < fed.size(); begin += static_cast<size_t>(chunk)) {
      const size_t end = std::min(fed.size(), begin + static_cast<size_t>(chunk));
      SequenceInput in;
      in.seq = seq;
      in.tokens = std::span<const int32_t>(fed).subspan(begin, end - begin);
      in.start_pos = cached;
      if (end == fed.size()) in.logit_indices = {static_cast<int32_t>(end - begin - 1)};
      SPECD_ASSIGN_OR_RETURN(out, engine.Forward(std::span<const SequenceInput>(&in, 1)));
      cached += static_cast<int64_t>(end - begin);
    }
    const std::span<const float> logits = out.row(0);
    const TokenHistory history{req.prompt, result.tokens};
    int32_t next;
    if (req.sampling.greedy()) {
      SPECD_ASSIGN_OR_RETURN(next, processor.GreedyToken(logits, req.sampling, history));
    } else {
      SPECD_RETURN_IF_ERROR(processor.ProcessedDistribution(logits, req.sampling, history, probs));
      const double u =
          StreamUniform(req.seed, static_cast<uint32_t>(cached), Purpose::kTargetSample);
      SPECD_ASSIGN_OR_RETURN(next, SampleInverseCdf(probs, u));
    }
    result.tokens.push_back(next);
    if (on_token) on_token(next);
    if (std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), next) !=
        req.stop_token_ids.end()) {
      result.stopped_by_token = true;
      break;
    }
    if (cached + 1 > engine.max_seq_len()) break;
    fed.assign(1, next);
  }
  return result;
}

}  // namespace

absl::StatusOr<DecodeResult> DecodePlain(LlamaEngine& engine, KvPool::SeqId seq,
                                         const DecodeRequest& request,
                                         const std::function<void(int32_t)>& on_token) {
  SPECD_RETURN_IF_ERROR(engine.AddSequence(seq));
  absl::StatusOr<DecodeResult> result = Run(engine, seq, request, on_token);
  // The sequence's blocks go back whatever happened.
  SPECD_RETURN_IF_ERROR(engine.Release(seq));
  return result;
}

}  // namespace specd
