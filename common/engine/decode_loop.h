// Plain (non-speculative, K = 0) autoregressive decoding on one engine: the baseline every
// speculative result is compared against.
#ifndef SPECD_COMMON_ENGINE_DECODE_LOOP_H_
#define SPECD_COMMON_ENGINE_DECODE_LOOP_H_

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "base/sampling_params.h"
#include "common/engine/llama_engine.h"

namespace specd {

struct DecodeRequest {
  std::vector<int32_t> prompt;  // including BOS when wanted
  SamplingParams sampling;
  std::vector<TokenBias> logit_bias;  // ascending tokens
  uint64_t seed = 0;
  int64_t max_new_tokens = 128;
  std::vector<int32_t> stop_token_ids;  // e.g. the model's EOS ids; the stop token is kept
  // Tokens fed per forward call while prefilling, so a long prompt never needs one huge batch.
  int64_t prefill_chunk = 512;
};

struct DecodeResult {
  std::vector<int32_t> tokens;  // generated tokens only
  bool stopped_by_token = false;
};

// Decodes on sequence `seq` (added and released here). `on_token` sees each token as it is
// produced. Sampling follows DESIGN.md: token at absolute position j is drawn from the processed
// distribution with uniform (seed, j, TARGET_SAMPLE); temperature 0 takes the argmax.
absl::StatusOr<DecodeResult> DecodePlain(LlamaEngine& engine, KvPool::SeqId seq,
                                         const DecodeRequest& request,
                                         const std::function<void(int32_t)>& on_token = {});

}  // namespace specd

#endif  // SPECD_COMMON_ENGINE_DECODE_LOOP_H_
