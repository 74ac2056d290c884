// libFuzzer target for chat templates, which come from a model's tokenizer_config.json (or
// --chat-template) and run on every chat request. Input: one flags byte (bit 0:
// add_generation_prompt; bit 1: the messages go through NormalizeMessages first, as a server's
// do), then the template's text, a NUL, and the messages as JSON (a fixed two-turn conversation
// where that part is absent or not JSON). Loading and rendering must never crash, hang or exhaust
// memory (libFuzzer's -timeout and -rss_limit_mb), and every failure must be INVALID_ARGUMENT
// with a message.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/civil_time.h"
#include "common/chat/chat_template.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_util.h"

using specd::fuzz::Check;
using specd::fuzz::CheckRefusal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t nul = rest.find('\0');
  const std::string_view source = rest.substr(0, nul);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array(
      {{{"role", "user"}, {"content", "Hello"}}, {{"role", "assistant"}, {"content", "Hi!"}}});
  if (nul != std::string_view::npos) {
    nlohmann::ordered_json parsed =
        nlohmann::ordered_json::parse(rest.substr(nul + 1), nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_discarded()) messages = std::move(parsed);
  }

  specd::chat::SpecialTokens tokens;
  tokens.bos_token = "<s>";
  tokens.eos_token = "</s>";
  absl::StatusOr<specd::chat::ChatTemplate> tmpl =
      specd::chat::ChatTemplate::FromSource(source, tokens);
  if (!tmpl.ok()) {
    CheckRefusal(tmpl.status());
    return 0;
  }
  if ((flags & 2) != 0) {
    absl::StatusOr<nlohmann::ordered_json> normalized = specd::chat::NormalizeMessages(messages);
    if (!normalized.ok()) {
      CheckRefusal(normalized.status());
      return 0;
    }
    messages = *std::move(normalized);
  }
  specd::chat::RenderOptions options;
  options.add_generation_prompt = (flags & 1) != 0;
  options.now = absl::CivilSecond(2026, 11, 29, 12, 0, 0);
  absl::StatusOr<specd::chat::RenderedPrompt> prompt = tmpl->Render(messages, options);
  if (!prompt.ok()) CheckRefusal(prompt.status());
  return 0;
}
