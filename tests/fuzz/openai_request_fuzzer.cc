// libFuzzer target for the HTTP API's request bodies, the largest surface any client reaches:
// ParseOpenAiRequest for both endpoints, ParseTokenizeRequest and ParseDetokenizeRequest, then,
// for a parsed generation request, what the server does next (openai_api's BuildChoices): each
// prompt (or the conversation, through a ChatML template) into BuildGenerationRequest against a
// small model's limits. The first input byte picks the body's endpoint (its low two bits:
// completions, chat, tokenize, detokenize); the rest is the body. With the byte's bit 2 set, the
// rest is instead a model's reply, parsed for tool calls (ParseReply). Nothing may crash or throw
// (nlohmann's exceptions included), and every refusal must be INVALID_ARGUMENT with a message
// (NOT_FOUND for the model name is the server's, not the parser's).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/tokenizer.h"
#include "google/protobuf/stubs/logging.h"
#include "services/coordinator/chat_prompt.h"
#include "services/coordinator/http/openai_request.h"
#include "services/coordinator/request_validation.h"
#include "services/coordinator/tool_calls.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using specd::fuzz::Check;
using specd::fuzz::CheckRefusal;
using specd::fuzz::MiniTokenizer;

const specd::ChatPrompt& ChatMl() {
  static const std::unique_ptr<specd::ChatPrompt> prompt = [] {
    absl::StatusOr<specd::ChatPrompt> p = specd::ChatPrompt::Load(
        R"({"bos_token": "<s>", "eos_token": "</s>"})",
        std::string("{% if tools %}{{ '<|im_start|>system\n' + tools | tojson + '<|im_end|>\n' }}"
                    "{% endif %}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + "
                    "m['content'] + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
                    "{{ '<|im_start|>assistant\n' }}{% endif %}"));
    Check(p.ok());
    return std::make_unique<specd::ChatPrompt>(*std::move(p));
  }();
  return *prompt;
}

specd::ServerLimits Limits() {
  specd::ServerLimits limits;
  limits.vocab_size = MiniTokenizer().vocab_size();
  limits.max_seq_len = 64;
  limits.default_max_new_tokens = 16;
  limits.max_prompt_bytes = 512;
  limits.max_stop_strings = 4;
  limits.max_stop_string_bytes = 16;
  return limits;
}

// What the server checks once a body parsed: every choice's request, as BuildChoices builds it.
void Build(const specd::http::OpenAiRequest& request) {
  const specd::ChatPrompt& chat = ChatMl();
  specd::PromptEncoders encoders;
  encoders.tokenizer = &MiniTokenizer();
  encoders.chat = [&chat](const nlohmann::ordered_json& messages,
                          const specd::ChatPromptOptions& options) {
    return chat.Encode(messages, MiniTokenizer(), options);
  };
  std::vector<specd::v1::GenerateRequest> prompts;
  if (request.endpoint == specd::http::Endpoint::kChatCompletions) {
    absl::StatusOr<std::vector<int32_t>> ids =
        encoders.chat(request.messages, request.chat_options);
    if (!ids.ok()) {
      CheckRefusal(ids.status());
      return;
    }
    specd::v1::GenerateRequest r = request.base;
    r.mutable_token_ids()->mutable_ids()->Add(ids->begin(), ids->end());
    prompts.push_back(std::move(r));
  } else {
    for (const specd::http::OpenAiRequest::Prompt& p : request.prompts) {
      specd::v1::GenerateRequest r = request.base;
      if (p.is_text) {
        r.set_text(p.text);
      } else {
        r.mutable_token_ids()->mutable_ids()->Add(p.ids.begin(), p.ids.end());
      }
      prompts.push_back(std::move(r));
    }
  }
  Check(request.n >= 1 && request.n <= specd::http::kMaxN);
  Check(static_cast<int64_t>(prompts.size()) * request.n <= specd::http::kMaxChoices);
  for (specd::v1::GenerateRequest& r : prompts) {
    r.mutable_sampling()->set_sample(static_cast<uint32_t>(request.n - 1));
    const absl::StatusOr<specd::GenerationRequest> built =
        specd::BuildGenerationRequest(r, encoders, Limits(), /*random_seed=*/7);
    if (!built.ok()) {
      CheckRefusal(built.status());
      continue;
    }
    Check(!built->prompt.empty());
  }
}

// A model's reply to a request with tools, in every format: a stream never sends
// more than the content a finished reply has, nor takes back what it sent (ReleasableContent
// only grows as the reply does, and a search from its previous answer finds the same).
void ParseReply(absl::string_view reply, const absl::flat_hash_set<std::string>& tools) {
  const std::string_view text(reply.data(), std::min<size_t>(reply.size(), 512));
  for (const specd::ToolCallFormat format :
       {specd::ToolCallFormat::kLlama3Json, specd::ToolCallFormat::kHermes,
        specd::ToolCallFormat::kMistral, specd::ToolCallFormat::kGranite}) {
    const std::optional<specd::ParsedReply> parsed = specd::ParseToolCalls(text, format, tools);
    size_t released = 0;
    for (size_t n = 0; n < text.size(); ++n) {
      const size_t r = specd::ReleasableContent(text.substr(0, n), format);
      Check(r <= n && r >= released);
      // What a stream computes, from its previous answer, is the same.
      Check(specd::ReleasableContent(text.substr(0, n), format, released) == r);
      released = r;
    }
    if (parsed.has_value()) {
      Check(!parsed->calls.empty());
      Check(released <= parsed->content.size());
      Check(text.substr(0, parsed->content.size()) == parsed->content);
      for (const specd::ToolCall& call : parsed->calls) {
        Check(tools.contains(call.name));
        Check(nlohmann::json::parse(call.arguments, nullptr, false).is_object());
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 4) {
    static const absl::flat_hash_set<std::string> kTools = {"get_weather", "calculate"};
    ParseReply(body, kTools);
    return 0;
  }
  switch (data[0] & 3) {
    case 0:
    case 1: {
      const auto endpoint = (data[0] & 3) == 0 ? specd::http::Endpoint::kCompletions
                                               : specd::http::Endpoint::kChatCompletions;
      const absl::StatusOr<specd::http::OpenAiRequest> request =
          specd::http::ParseOpenAiRequest(endpoint, body);
      if (!request.ok()) {
        CheckRefusal(request.status());
        return 0;
      }
      Build(*request);
      return 0;
    }
    case 2: {
      const absl::StatusOr<specd::http::TokenizeRequest> request =
          specd::http::ParseTokenizeRequest(body);
      if (!request.ok()) {
        CheckRefusal(request.status());
      } else if (request->chat) {
        const absl::StatusOr<std::vector<int32_t>> ids =
            ChatMl().Encode(request->messages, MiniTokenizer(), request->chat_options);
        if (!ids.ok()) CheckRefusal(ids.status());
      }
      return 0;
    }
    default: {
      const absl::StatusOr<specd::http::DetokenizeRequest> request =
          specd::http::ParseDetokenizeRequest(body);
      if (!request.ok()) {
        CheckRefusal(request.status());
      } else {
        const absl::StatusOr<std::string> text = MiniTokenizer().Decode(request->tokens);
        if (!text.ok()) CheckRefusal(text.status());
      }
      return 0;
    }
  }
}
