#include "common/engine/decode_loop.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/absl_string.h"
#include "base/philox.h"
#include "base/status_macros.h"
#include "common/sampling/row_pool.h"
#include "common/sampling/row_sampler.h"

namespace specd {
namespace {

absl::StatusOr<DecodeResult> Run(LlamaEngine& engine, KvPool::SeqId seq, const DecodeRequest& req,
                                 const std::function<void(int32_t)>& on_token) {
  const int64_t vocab = engine.config().vocab_size;
  SPECD_RETURN_IF_ERROR(ValidateSamplingParams(req.sampling, vocab));
  SPECD_RETURN_IF_ERROR(ValidateLogitBias(req.logit_bias, vocab));
  if (!engine.output_vocab().empty()) {
    return absl::FailedPreconditionError(
        "plain decoding needs the whole classifier; this engine keeps a reduced one");
  }
  if (req.prompt.empty()) return absl::InvalidArgumentError("prompt must not be empty");
  if (req.max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens must be >= 0, got ", req.max_new_tokens));
  }
  const int64_t chunk = std::max<int64_t>(1, req.prefill_chunk);
  DecodeResult result;
  RowPool pool(engine.backend(), vocab);
  SPECD_ASSIGN_OR_RETURN(const std::vector<int32_t> slot, pool.Acquire(1));
  RowSampler sampler(engine.backend());
  const kernels::RowMode mode =
      req.sampling.greedy() ? kernels::RowMode::kGreedy : kernels::RowMode::kSample;
  std::vector<int32_t> fed = req.prompt;  // what the next Forward call feeds
  int64_t cached = 0;
  while (static_cast<int64_t>(result.tokens.size()) < req.max_new_tokens) {
    // Feed pending tokens in chunks; only the last chunk asks for logits.
    Logits logits;
    for (size_t begin = 0; begin < fed.size(); begin += static_cast<size_t>(chunk)) {
      const size_t end = std::min(fed.size(), begin + static_cast<size_t>(chunk));
      SequenceInput in;
      in.seq = seq;
      in.tokens = std::span<const int32_t>(fed).subspan(begin, end - begin);
      in.start_pos = cached;
      if (end == fed.size()) in.logit_indices = {static_cast<int32_t>(end - begin - 1)};
      SPECD_ASSIGN_OR_RETURN(logits, engine.Forward(std::span<const SequenceInput>(&in, 1)));
      cached += static_cast<int64_t>(end - begin);
    }
    sampler.Clear();
    const int32_t row =
        sampler.AddRow(req.sampling, mode, req.prompt, result.tokens, slot[0], req.logit_bias);
    int32_t draw = -1;
    if (!req.sampling.greedy()) {
      kernels::Draw d;
      d.prob_slot = slot[0];
      d.seed = req.seed;
      d.position = static_cast<uint32_t>(cached);
      d.purpose = Purpose::kTargetSample;
      draw = sampler.AddDraw(d);
    }
    SPECD_RETURN_IF_ERROR(sampler.Run(logits.data, logits.rows, pool));
    if (sampler.row_error(row) != kernels::kRowOk) {
      return absl::InvalidArgumentError(ToAbsl(kernels::RowErrorMessage(sampler.row_error(row))));
    }
    if (draw >= 0 && sampler.draw_error(draw) != kernels::kRowOk) {
      return absl::InvalidArgumentError(ToAbsl(kernels::RowErrorMessage(sampler.draw_error(draw))));
    }
    const int32_t next = draw >= 0 ? sampler.token(draw) : sampler.argmax(row);
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
