// libFuzzer target for the public request validation, BuildGenerationRequest. The first input
// byte picks the setup: bit 0 set builds the GenerateRequest field by field from the rest
// (absurd sizes, NaN/Inf, invalid UTF-8), clear parses the rest as a serialized GenerateRequest;
// bit 1 serves without a tokenizer; bit 2 serves without a draft worker; bit 3 serves a chat
// template that takes any conversation, so that the conversion of a chat (messages, tool calls,
// tools and their Structs) into the template's JSON is what is fuzzed. Validation must never
// crash, every rejection must be INVALID_ARGUMENT with a message, and an accepted request must
// satisfy every documented limit (checked here independently of the validator).
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "google/protobuf/stubs/logging.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/request_validation.h"
#include "services/coordinator/tool_calls.h"
#include "specd/v1/generation.pb.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using specd::fuzz::Check;
using specd::fuzz::MiniTokenizer;

// Small limits, so the fuzzer reaches both sides of every bound.
specd::ServerLimits Limits(bool has_draft) {
  specd::ServerLimits limits;
  limits.vocab_size = MiniTokenizer().vocab_size();
  limits.max_seq_len = 64;
  limits.default_max_new_tokens = 32;
  limits.default_num_speculative_tokens = 4;
  limits.max_num_speculative_tokens = 8;
  limits.max_prompt_bytes = 256;
  limits.max_stop_strings = 4;
  limits.max_stop_string_bytes = 16;
  limits.has_draft = has_draft;
  return limits;
}

// Floats worth trying besides arbitrary bit patterns.
float ConsumeFloat(FuzzedDataProvider& p) {
  static constexpr float kSpecial[] = {0.0f,
                                       -0.0f,
                                       1.0f,
                                       -1.0f,
                                       2.0f,
                                       -2.0f,
                                       0.5f,
                                       1e-45f,
                                       std::numeric_limits<float>::max(),
                                       std::numeric_limits<float>::infinity(),
                                       -std::numeric_limits<float>::infinity(),
                                       std::numeric_limits<float>::quiet_NaN()};
  switch (p.ConsumeIntegralInRange<int>(0, 2)) {
    case 0:
      return p.PickValueInArray(kSpecial);
    case 1:
      return p.ConsumeFloatingPointInRange<float>(-3.0f, 3.0f);
    default:
      return p.ConsumeFloatingPoint<float>();
  }
}

int32_t ConsumeId(FuzzedDataProvider& p) {
  return p.ConsumeBool() ? p.ConsumeIntegralInRange<int32_t>(-2, 300)
                         : p.ConsumeIntegral<int32_t>();
}

uint32_t ConsumeSize(FuzzedDataProvider& p) {
  return p.ConsumeBool() ? p.ConsumeIntegralInRange<uint32_t>(0, 80)
                         : p.ConsumeIntegral<uint32_t>();
}

specd::v1::GenerateRequest Structured(FuzzedDataProvider& p) {
  specd::v1::GenerateRequest r;
  switch (p.ConsumeIntegralInRange<int>(0, 2)) {
    case 0:
      r.set_text(p.ConsumeRandomLengthString(400));
      break;
    case 1: {
      const size_t n = p.ConsumeIntegralInRange<size_t>(0, 80);
      for (size_t i = 0; i < n; ++i) r.mutable_token_ids()->add_ids(ConsumeId(p));
      break;
    }
    default:
      break;  // no prompt
  }
  if (p.ConsumeBool()) {
    specd::v1::SamplingParameters* s = r.mutable_sampling();
    s->set_temperature(ConsumeFloat(p));
    s->set_top_k(p.ConsumeBool() ? p.ConsumeIntegralInRange<int32_t>(-1, 300)
                                 : p.ConsumeIntegral<int32_t>());
    s->set_top_p(ConsumeFloat(p));
    s->set_min_p(ConsumeFloat(p));
    s->set_repetition_penalty(ConsumeFloat(p));
    s->set_presence_penalty(ConsumeFloat(p));
    s->set_frequency_penalty(ConsumeFloat(p));
    if (p.ConsumeBool()) s->set_seed(p.ConsumeIntegral<uint64_t>());
    const size_t biases = p.ConsumeIntegralInRange<size_t>(0, 4);
    for (size_t i = 0; i < biases; ++i) (*s->mutable_logit_bias())[ConsumeId(p)] = ConsumeFloat(p);
  }
  if (p.ConsumeBool()) {
    specd::v1::StoppingCriteria* s = r.mutable_stopping();
    s->set_max_new_tokens(ConsumeSize(p));
    const size_t stops = p.ConsumeIntegralInRange<size_t>(0, 6);
    for (size_t i = 0; i < stops; ++i) s->add_stop(p.ConsumeRandomLengthString(24));
    const size_t ids = p.ConsumeIntegralInRange<size_t>(0, 4);
    for (size_t i = 0; i < ids; ++i) s->add_stop_token_ids(ConsumeId(p));
    s->set_ignore_eos(p.ConsumeBool());
  }
  if (p.ConsumeBool()) {
    specd::v1::SpeculationParameters* s = r.mutable_speculation();
    if (p.ConsumeBool()) s->set_num_speculative_tokens(ConsumeSize(p));
    // Out-of-range enum values are what a newer client may send.
    s->set_draft_sampling(static_cast<specd::v1::DraftSampling>(p.ConsumeIntegral<int8_t>()));
  }
  if (p.ConsumeBool()) {
    r.set_request_id(p.ConsumeBool() ? std::string(p.ConsumeIntegralInRange<size_t>(250, 260), 'r')
                                     : p.ConsumeRandomLengthString(32));
  }
  return r;
}

bool Finite(float f) { return std::isfinite(f); }

// The chat "template" of bit 3: what EncodeChat hands a template must be OpenAI's form, checked.
absl::StatusOr<std::vector<int32_t>> AnyConversation(const nlohmann::ordered_json& messages,
                                                     const specd::ChatPromptOptions& options) {
  Check(messages.is_array());
  for (const nlohmann::ordered_json& m : messages) {
    Check(m.is_object() && m.contains("role") && m["role"].is_string());
    if (m.contains("tool_calls")) Check(m["tool_calls"].is_array() && !m["tool_calls"].empty());
  }
  if (!options.tools.is_null()) Check(specd::CheckTools(options.tools).ok());
  Check(options.template_kwargs.is_object());
  return std::vector<int32_t>{1};
}

// The accepted request against the documented ranges (generation.proto, sampling/params.h).
void CheckAccepted(const specd::v1::GenerateRequest& r, const specd::GenerationRequest& g,
                   const specd::ServerLimits& limits, bool has_tokenizer, bool has_chat) {
  Check(!g.prompt.empty());
  for (const int32_t id : g.prompt) Check(id >= 0 && id < limits.vocab_size);
  if (r.has_token_ids()) {
    Check(g.prompt == std::vector<int32_t>(r.token_ids().ids().begin(), r.token_ids().ids().end()));
  } else if (r.has_chat()) {
    Check(has_chat && has_tokenizer && g.prompt == std::vector<int32_t>{1});
    int64_t bytes = 0;
    for (const specd::v1::ChatMessage& m : r.chat().messages()) {
      bytes += static_cast<int64_t>(m.role().size() + m.content().size());
    }
    Check(bytes <= limits.max_prompt_bytes);
    Check(r.chat().tools_size() <= static_cast<int>(specd::kMaxTools));
    Check(specd::v1::ToolChoice_IsValid(r.chat().tool_choice()));
  } else {
    // Empty text is accepted: the tokenizer's BOS is the prompt.
    Check(has_tokenizer && r.has_text());
    Check(static_cast<int64_t>(r.text().size()) <= limits.max_prompt_bytes);
  }
  const specd::SamplingParams& s = g.sampling;
  Check(Finite(s.temperature) && s.temperature >= 0.0f);
  Check(s.top_k >= 0);
  Check(Finite(s.top_p) && s.top_p > 0.0f && s.top_p <= 1.0f);
  Check(Finite(s.min_p) && s.min_p >= 0.0f && s.min_p <= 1.0f);
  Check(Finite(s.repetition_penalty) && s.repetition_penalty > 0.0f);
  Check(Finite(s.presence_penalty) && s.presence_penalty >= -2.0f && s.presence_penalty <= 2.0f);
  Check(Finite(s.frequency_penalty) && s.frequency_penalty >= -2.0f && s.frequency_penalty <= 2.0f);
  Check(specd::v1::DraftSampling_IsValid(r.speculation().draft_sampling()));
  if (r.sampling().has_seed()) Check(g.seed == r.sampling().seed());
  Check(g.logit_bias.size() == static_cast<size_t>(r.sampling().logit_bias_size()));
  for (size_t i = 0; i < g.logit_bias.size(); ++i) {
    const specd::TokenBias& b = g.logit_bias[i];
    Check(b.token >= 0 && b.token < limits.vocab_size);
    Check(Finite(b.bias) && b.bias >= -100.0f && b.bias <= 100.0f);
    Check(i == 0 || b.token > g.logit_bias[i - 1].token);
  }

  Check(g.max_new_tokens >= 1);
  Check(static_cast<int64_t>(g.prompt.size()) + g.max_new_tokens <= limits.max_seq_len);
  if (r.stopping().max_new_tokens() != 0) {
    Check(g.max_new_tokens == static_cast<int64_t>(r.stopping().max_new_tokens()));
  }
  Check(static_cast<int64_t>(g.stop_strings.size()) <= limits.max_stop_strings);
  for (const std::string& stop : g.stop_strings) {
    Check(!stop.empty() && static_cast<int64_t>(stop.size()) <= limits.max_stop_string_bytes);
    Check(has_tokenizer);
  }
  for (size_t i = 0; i < g.stop_token_ids.size(); ++i) {
    Check(g.stop_token_ids[i] >= 0 && g.stop_token_ids[i] < limits.vocab_size);
    Check(i == 0 || g.stop_token_ids[i] > g.stop_token_ids[i - 1]);  // what the scheduler searches
  }
  Check(g.ignore_eos == r.stopping().ignore_eos());
  Check(g.num_speculative_tokens >= 0 &&
        g.num_speculative_tokens <= limits.max_num_speculative_tokens);
  // Without a draft worker only prompt lookup drafts; a request for model drafting is refused,
  // and the server's default of model drafting decodes plainly.
  if (!limits.has_draft && g.draft_method == specd::DraftMethod::kModel) {
    Check(g.num_speculative_tokens == 0);
  }
  Check(r.request_id().size() <= 256);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Protobuf logs every string field with invalid UTF-8 that fails to parse; that is expected
  // here and would drown libFuzzer's output.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t setup = data[0];
  const bool has_tokenizer = (setup & 2) == 0;
  const specd::ServerLimits limits = Limits((setup & 4) == 0);
  const bool has_chat = (setup & 8) != 0;
  specd::v1::GenerateRequest request;
  if ((setup & 1) != 0) {
    FuzzedDataProvider provider(data + 1, size - 1);
    request = Structured(provider);
  } else if (!request.ParseFromArray(data + 1, static_cast<int>(size - 1))) {
    return 0;  // the transport rejects what does not parse
  }
  specd::PromptEncoders encoders{has_tokenizer ? &MiniTokenizer() : nullptr, {}};
  if (has_chat && has_tokenizer) encoders.chat = AnyConversation;
  const absl::StatusOr<specd::GenerationRequest> built =
      specd::BuildGenerationRequest(request, encoders, limits, /*random_seed=*/12345);
  if (!built.ok()) {
    // FAILED_PRECONDITION: chat input, which a server without a chat template cannot render.
    Check(built.status().code() == absl::StatusCode::kInvalidArgument ||
          (built.status().code() == absl::StatusCode::kFailedPrecondition && request.has_chat() &&
           !encoders.chat));
    Check(!built.status().message().empty());
    return 0;
  }
  CheckAccepted(request, *built, limits, has_tokenizer, has_chat);
  return 0;
}
