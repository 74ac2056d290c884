// The ChatTemplate API: loading from tokenizer_config.json, the BOS signal, error statuses and
// messages, strftime_now's injected clock, and NormalizeMessages. (Rendering parity with
// Hugging Face is chat_parity_test.)
#include "common/chat/chat_template.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/civil_time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace specd::chat {
namespace {

using Json = nlohmann::ordered_json;

// Meta's Llama 2 chat template (meta-llama/Llama-2-7b-chat-hf), which writes bos_token itself
// and rejects non-alternating conversations.
constexpr char kLlama2[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set "
    "system_message = false %}{% endif %}{% for message in loop_messages %}{% if "
    "(message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation "
    "roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 "
    "and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% "
    "endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' "
    "[/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + "
    "eos_token }}{% endif %}{% endfor %}";

constexpr char kChatMl[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";

std::string Config(const Json& chat_template) {
  Json config = {{"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                 {"eos_token", "</s>"},
                 {"pad_token", nullptr}};
  config["chat_template"] = chat_template;
  return config.dump();
}

TEST(ChatTemplate, RendersFromTokenizerConfig) {
  const auto t = ChatTemplate::FromTokenizerConfig(Config(kLlama2));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->special_tokens().bos_token, "<s>");  // from an AddedToken object
  EXPECT_EQ(t->special_tokens().eos_token, "</s>");
  const std::vector<ChatMessage> messages = {
      {"system", "Be brief."}, {"user", " Hi "}, {"assistant", "Hello."}, {"user", "Bye"}};
  const auto prompt = t->Render(messages, RenderOptions{});
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(prompt->text,
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi [/INST] Hello. </s><s>[INST] Bye "
            "[/INST]");
  EXPECT_TRUE(prompt->starts_with_bos);
}

TEST(ChatTemplate, ReportsWhetherTheTemplateWroteBos) {
  const auto chatml = ChatTemplate::FromTokenizerConfig(Config(kChatMl));
  ASSERT_TRUE(chatml.ok()) << chatml.status();
  const std::vector<ChatMessage> messages = {{"user", "Hi"}};
  RenderOptions options;
  options.add_generation_prompt = true;
  const auto prompt = chatml->Render(messages, options);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(prompt->text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_FALSE(prompt->starts_with_bos);

  // Without a BOS token there is nothing to double.
  const auto no_bos = ChatTemplate::FromSource("{{ 'x' }}", SpecialTokens{});
  ASSERT_TRUE(no_bos.ok());
  EXPECT_FALSE(no_bos->Render(messages, RenderOptions{})->starts_with_bos);
}

TEST(ChatTemplate, RaiseExceptionIsInvalidArgumentWithTheTemplatesMessage) {
  const auto t = ChatTemplate::FromTokenizerConfig(Config(kLlama2));
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<ChatMessage> messages = {{"user", "One"}, {"user", "Two"}};
  const auto prompt = t->Render(messages, RenderOptions{});
  EXPECT_EQ(prompt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(prompt.status().message(),
            "Conversation roles must alternate user/assistant/user/assistant/...");
}

TEST(ChatTemplate, RuntimeFailuresAreClearInvalidArgumentErrors) {
  const auto t = ChatTemplate::FromSource("{{ messages[0].content | trim }}", SpecialTokens{});
  ASSERT_TRUE(t.ok());
  const auto prompt =
      t->Render(Json::parse(R"([{"role": "user", "content": [1, 2]}])"), RenderOptions{});
  EXPECT_EQ(prompt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(prompt.status().message(), "chat template error: "))
      << prompt.status();
  EXPECT_TRUE(absl::StrContains(prompt.status().message(), "trim")) << prompt.status();
}

// range() at the ends of the integers, where a loop that steps past `stop` would overflow; the
// expected lists are Python's.
TEST(ChatTemplate, RangeReachesTheEndsOfTheIntegers) {
  const auto t = ChatTemplate::FromSource(
      "{% set lo = -9223372036854775807 - 1 %}{% set hi = 9223372036854775807 %}"
      "{{ range(lo, hi, 4611686018427387904) }}|{{ range(hi, lo, -4611686018427387904) }}|"
      "{{ range(lo, hi, hi) }}",
      SpecialTokens{});
  ASSERT_TRUE(t.ok()) << t.status();
  const auto out = t->Render(Json::array(), RenderOptions{});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->text,
            "[-9223372036854775808, -4611686018427387904, 0, 4611686018427387904]|"
            "[9223372036854775807, 4611686018427387903, -1, -4611686018427387905]|"
            "[-9223372036854775808, -1, 9223372036854775806]");

  const auto huge = ChatTemplate::FromSource(
      "{{ range(-9223372036854775807, 9223372036854775807) | length }}", SpecialTokens{});
  ASSERT_TRUE(huge.ok());
  const absl::Status st = huge->Render(Json::array(), RenderOptions{}).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(st.message(), "range() of 18446744073709551614 items is too long"))
      << st;
}

TEST(ChatTemplate, PicksANamedTemplateFromAList) {
  const Json list = Json::array({{{"name", "tool_use"}, {"template", "tools"}},
                                 {{"name", "default"}, {"template", "plain"}}});
  const auto by_default = ChatTemplate::FromTokenizerConfig(Config(list));
  ASSERT_TRUE(by_default.ok()) << by_default.status();
  EXPECT_EQ(by_default->source(), "plain");
  const auto tool_use = ChatTemplate::FromTokenizerConfig(Config(list), "tool_use");
  ASSERT_TRUE(tool_use.ok()) << tool_use.status();
  EXPECT_EQ(tool_use->source(), "tools");
  const auto missing = ChatTemplate::FromTokenizerConfig(Config(list), "rag");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "tool_use, default"));
}

TEST(LoadChatTemplate, AnOverrideReplacesTheConfigsTemplateButKeepsItsTokens) {
  const auto from_config = LoadChatTemplate(Config(kChatMl));
  ASSERT_TRUE(from_config.ok()) << from_config.status();
  EXPECT_EQ(from_config->source(), kChatMl);
  const auto overridden = LoadChatTemplate(Config(kChatMl), "{{ bos_token }}{{ eos_token }}");
  ASSERT_TRUE(overridden.ok()) << overridden.status();
  EXPECT_EQ(overridden->Render(Json::array(), RenderOptions{})->text, "<s></s>");
  // A model without tokenizer_config.json needs the override.
  EXPECT_EQ(LoadChatTemplate("").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(LoadChatTemplate("", "{{ 'x' }}").ok());
}

TEST(ChatTemplate, LoadErrorsSayWhatIsWrong) {
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig("{not json").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig(R"({"bos_token": "<s>"})").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig(Config(42)).status().code(),
            absl::StatusCode::kInvalidArgument);
  const auto syntax = ChatTemplate::FromSource("{% include 'x' %}", SpecialTokens{});
  EXPECT_EQ(syntax.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(syntax.status().message(), "include")) << syntax.status();
}

TEST(ChatTemplate, ExtraVariablesOverrideButCannotReplaceBuiltins) {
  SpecialTokens tokens;
  tokens.bos_token = "<s>";
  const auto t = ChatTemplate::FromSource("{{ date_string }}|{{ bos_token }}", tokens);
  ASSERT_TRUE(t.ok());
  RenderOptions options;
  options.extra_context = {{"date_string", "26 Jul 2024"}, {"bos_token", "<B>"}};
  EXPECT_EQ(t->Render(Json::array(), options)->text, "26 Jul 2024|<B>");
  for (const char* builtin : {"range", "true", "namespace", "raise_exception", "strftime_now"}) {
    options.extra_context = {{builtin, 1}};
    EXPECT_EQ(t->Render(Json::array(), options).status().code(), absl::StatusCode::kInvalidArgument)
        << builtin;
  }
  options.extra_context = Json::array();
  EXPECT_EQ(t->Render(Json::array(), options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplate, ToolsAndDocumentsAreNoneUnlessGiven) {
  const auto t = ChatTemplate::FromSource(
      "{{ tools is none }} {{ documents is none }} {{ tools | tojson }}", SpecialTokens{});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Render(Json::array(), RenderOptions{})->text, "true true null");
  RenderOptions options;
  options.tools = Json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  EXPECT_EQ(t->Render(Json::array(), options)->text,
            R"(false true [{"type": "function", "function": {"name": "f"}}])");
}

TEST(ChatTemplate, StrftimeNowUsesTheInjectedClock) {
  const auto t =
      ChatTemplate::FromSource("{{ strftime_now('%d %b %Y, %B %H:%M %% %S') }}", SpecialTokens{});
  ASSERT_TRUE(t.ok());
  RenderOptions options;
  options.now = absl::CivilSecond(2025, 3, 9, 7, 4, 59);
  EXPECT_EQ(t->Render(Json::array(), options)->text, "09 Mar 2025, March 07:04 % %S");
}

TEST(ChatTemplate, MessagesMustBeAList) {
  const auto t = ChatTemplate::FromSource("x", SpecialTokens{});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Render(Json::object(), RenderOptions{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Hostile templates and inputs get an error, never a crash from exhausting the stack.
TEST(ChatTemplate, BoundsRecursionAndNesting) {
  const std::string deep_parens = std::string(5000, '(') + "1" + std::string(5000, ')');
  EXPECT_EQ(ChatTemplate::FromSource("{{ " + deep_parens + " }}", SpecialTokens{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string deep_ifs;
  for (int i = 0; i < 5000; ++i) deep_ifs += "{% if true %}";
  EXPECT_EQ(ChatTemplate::FromSource(deep_ifs, SpecialTokens{}).status().code(),
            absl::StatusCode::kInvalidArgument);

  for (const char* hostile : {
           "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
           "{% set x = [] %}{% for i in range(100000) %}{% set x = [x] %}{% endfor %}{{ x }}",
           "{% set ns = namespace(v=1) %}{% for i in range(100000) %}{% set ns.v = {'a': ns.v} "
           "%}{% endfor %}",
           "{% set ns = namespace() %}{% set ns.self = ns %}{{ ns }}",
           "{% set ns = namespace() %}{% macro m() %}{{ caller }}{% endmacro %}"
           "{% macro keep() %}{% set ns.c = caller %}{% endmacro %}"
           "{% for i in [1] %}{% call keep() %}x{% endcall %}{% endfor %}{{ ns.c() }}",
       }) {
    const auto t = ChatTemplate::FromSource(hostile, SpecialTokens{});
    ASSERT_TRUE(t.ok()) << hostile << ": " << t.status();
    EXPECT_EQ(t->Render(Json::array(), RenderOptions{}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << hostile;
  }

  Json deep = "x";
  for (int i = 0; i < 5000; ++i) deep = Json::array({deep});
  const auto t = ChatTemplate::FromSource("{{ messages | length }}", SpecialTokens{});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Render(Json::array({{{"role", "user"}, {"content", deep}}}), RenderOptions{})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A template's work is bounded in proportion to its conversation: endless loops and values that
// double are refused, without hanging the caller or exhausting its memory, while a long
// conversation under a real template still renders.
TEST(ChatTemplate, BoundsTheWorkOfARender) {
  for (const char* hostile : {
           "{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}",
           "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}"
           "{% endfor %}",
           "{% set ns = namespace(s='x') %}{% for i in range(80) %}{% set ns.s = ns.s + ns.s %}"
           "{% endfor %}{{ ns.s | length }}",
           "{% set ns = namespace(l=[1]) %}{% for i in range(80) %}{% set ns.l = ns.l + ns.l %}"
           "{% endfor %}{{ ns.l | length }}",
           "{% macro r(n) %}{% for i in range(50) %}{{ r(n + 1) if n < 90 }}{% endfor %}"
           "{% endmacro %}{{ r(0) }}",
           // Widths that would allocate before any value could be charged.
           "{{ 'a\\nb' | indent(100000000000, true) }}",
           "{{ [[1]] | tojson(indent=100000000000) }}",
           "{{ range(1000000) | length }}{{ range(1000000) | length }}",
           // Cheap to build, enormous to write out: a list that holds itself twice per level
           // (2^40 leaves), a huge separator or replacement.
           "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}"
           "{% endfor %}{{ ns.x }}",
           "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}"
           "{% endfor %}{{ ns.x | tojson }}",
           "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}"
           "{% endfor %}{{ ns.x ~ '' }}",
           "{{ range(100000) | join(range(1000) | join('yyyyyyyyyy')) }}",
           "{{ range(100000) | join('') | replace('', range(1000) | join('zzzzzzzz')) }}",
       }) {
    const auto t = ChatTemplate::FromSource(hostile, SpecialTokens{});
    ASSERT_TRUE(t.ok()) << hostile << ": " << t.status();
    const absl::Status st = t->Render(Json::array(), RenderOptions{}).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << hostile;
    EXPECT_TRUE(absl::StrContains(st.message(), "units of work") ||
                absl::StrContains(st.message(), "MiB of text"))
        << hostile << ": " << st;
  }

  // 20000 turns (the budget grows with the conversation): Llama 2's template renders them all.
  Json conversation = Json::array();
  for (int i = 0; i < 20000; ++i) {
    conversation.push_back({{"role", i % 2 == 0 ? "user" : "assistant"},
                            {"content", "message number " + std::to_string(i)}});
  }
  SpecialTokens tokens;
  tokens.bos_token = "<s>";
  tokens.eos_token = "</s>";
  const auto llama2 = ChatTemplate::FromSource(kLlama2, tokens);
  ASSERT_TRUE(llama2.ok());
  const auto rendered = llama2->Render(conversation, RenderOptions{});
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  EXPECT_TRUE(absl::StrContains(rendered->text,
                                "[INST] message number 19998 [/INST] message "
                                "number 19999 </s>"));
}

TEST(NormalizeMessages, JoinsTextPartsAndKeepsOtherFields) {
  const auto out = NormalizeMessages(Json::parse(R"([
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]},
    {"role": "user", "content": "plain", "name": "ann"}])"));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0]["content"], "a\nb");
  EXPECT_TRUE((*out)[1]["content"].is_null());
  EXPECT_EQ((*out)[1]["tool_calls"][0]["id"], "1");
  EXPECT_EQ((*out)[2]["name"], "ann");
}

TEST(NormalizeMessages, RejectsWhatATextTemplateCannotTake) {
  for (const char* bad : {
           R"({"role": "user"})",
           R"([{"content": "no role"}])",
           R"([{"role": 1, "content": "x"}])",
           R"(["not an object"])",
           R"([{"role": "user", "content": 5}])",
           R"([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])",
           R"([{"role": "user", "content": [{"type": "text"}]}])",
       }) {
    const auto out = NormalizeMessages(Json::parse(bad));
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  const auto image = NormalizeMessages(Json::parse(
      R"([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])"));
  EXPECT_TRUE(absl::StrContains(image.status().message(), "messages[0].content[0]"))
      << image.status();
}

}  // namespace
}  // namespace specd::chat
