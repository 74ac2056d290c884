// Tool calls in chat replies: the two formats' parsers, and what a stream may send before a reply
// is known to be content. The expected calls are written from the formats as Meta's Llama 3.1
// prompt format and Qwen2.5's (Hermes) template describe them.
#include "services/coordinator/tool_calls.h"

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace specd {
namespace {

const absl::flat_hash_set<std::string> kTools = {"get_weather", "calculate"};

std::optional<ParsedReply> Llama3(const std::string& text) {
  return ParseToolCalls(text, ToolCallFormat::kLlama3Json, kTools);
}
std::optional<ParsedReply> Hermes(const std::string& text) {
  return ParseToolCalls(text, ToolCallFormat::kHermes, kTools);
}

TEST(ToolCallsTest, FormatFollowsTheTemplate) {
  EXPECT_EQ(ToolCallFormatOf("{% for tool in tools %}<tool_call>{{ tool | tojson }}"),
            ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatOf("{{- '<|python_tag|>' }}{% if tools %}"), ToolCallFormat::kLlama3Json);
  EXPECT_STREQ(ToolCallFormatName(ToolCallFormat::kHermes), "hermes");
  EXPECT_STREQ(ToolCallFormatName(ToolCallFormat::kLlama3Json), "llama3_json");
}

TEST(ToolCallsTest, Llama3JsonCalls) {
  std::optional<ParsedReply> r = Llama3(
      " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"n\": [1, 2]}}\n");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->content, "");
  ASSERT_EQ(r->calls.size(), 1u);
  EXPECT_EQ(r->calls[0].name, "get_weather");
  EXPECT_EQ(r->calls[0].arguments, R"({"city":"Paris","n":[1,2]})");

  // "arguments" as well as "parameters"; after <|python_tag|>; several joined by ";"; braces and
  // semicolons inside strings; arguments given as text; no arguments.
  r = Llama3(
      "<|python_tag|>{\"name\": \"calculate\", \"arguments\": {\"expr\": \"{1; 2}\"}}; "
      "{\"name\": \"get_weather\", \"parameters\": \"{\\\"city\\\": \\\"Oslo\\\"}\"};"
      "{\"name\": \"calculate\"}");
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->calls.size(), 3u);
  EXPECT_EQ(r->calls[0].arguments, R"({"expr":"{1; 2}"})");
  EXPECT_EQ(r->calls[1].name, "get_weather");
  EXPECT_EQ(r->calls[1].arguments, R"({"city":"Oslo"})");
  EXPECT_EQ(r->calls[2].arguments, "{}");
}

TEST(ToolCallsTest, Llama3JsonThatIsNotACallIsContent) {
  for (const char* text : {
           "",
           "The weather is fine.",
           "Sure: {\"name\": \"get_weather\", \"parameters\": {}}",  // text first
           "{\"name\": \"get_weather\", \"parameters\": {}} and more",
           "{\"name\": \"send_email\", \"parameters\": {}}",  // not a declared tool
           "{\"name\": \"get_weather\", \"parameters\": [1]}",
           "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Par",  // cut off
           "{\"tool\": \"get_weather\"}",
           "{\"name\": 7}",
           "{\"name\": \"get_weather\"};",
           "{\"name\": \"get_weather\", \"parameters\": {}} ; x",
       }) {
    EXPECT_FALSE(Llama3(text).has_value()) << text;
  }
  // Nesting a real call never needs, which would also deepen the JSON parser's recursion.
  EXPECT_FALSE(Llama3("{\"name\": \"calculate\", \"parameters\": {\"a\": " + std::string(100, '[') +
                      std::string(100, ']') + "}}")
                   .has_value());
  // The same inside arguments given as text, which the bracket count outside strings misses.
  EXPECT_FALSE(Llama3("{\"name\": \"calculate\", \"arguments\": \"{\\\"a\\\": " +
                      std::string(100, '[') + std::string(100, ']') + "}\"}")
                   .has_value());
  EXPECT_TRUE(Llama3("{\"name\": \"calculate\", \"arguments\": \"{\\\"a\\\": " +
                     std::string(10, '[') + std::string(10, ']') + "}\"}")
                  .has_value());
}

TEST(ToolCallsTest, HermesCalls) {
  std::optional<ParsedReply> r = Hermes(
      "Let me check both.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Rome\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"calculate\", \"arguments\": {\"expr\": "
      "\"</tool_call>\"}}\n</tool_call>\n");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->content, "Let me check both.");
  ASSERT_EQ(r->calls.size(), 2u);
  EXPECT_EQ(r->calls[0].name, "get_weather");
  EXPECT_EQ(r->calls[0].arguments, R"({"city":"Rome"})");
  EXPECT_EQ(r->calls[1].arguments, R"({"expr":"</tool_call>"})");

  r = Hermes("<tool_call>{\"name\": \"calculate\", \"parameters\": {}}</tool_call>");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->content, "");
  EXPECT_EQ(r->calls[0].arguments, "{}");
}

TEST(ToolCallsTest, HermesThatIsNotACallIsContent) {
  for (const char* text : {
           "No tools needed.",
           "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n",  // no closing tag
           "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call> Done.",
           "<tool_call>{\"name\": \"book_flight\", \"arguments\": {}}</tool_call>",
           "<tool_call>get_weather(city='Rome')</tool_call>",
           "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call><tool_call>",
       }) {
    EXPECT_FALSE(Hermes(text).has_value()) << text;
  }
}

TEST(ToolCallsTest, ReleasableContentHoldsWhatMayBecomeACall) {
  using F = ToolCallFormat;
  EXPECT_EQ(ReleasableContent("", F::kLlama3Json), 0u);
  EXPECT_EQ(ReleasableContent("  \n", F::kLlama3Json), 0u);
  EXPECT_EQ(ReleasableContent(" {\"na", F::kLlama3Json), 0u);
  EXPECT_EQ(ReleasableContent("<|python", F::kLlama3Json), 0u);
  EXPECT_EQ(ReleasableContent("<|python_tag|>{", F::kLlama3Json), 0u);
  EXPECT_EQ(ReleasableContent("<b>", F::kLlama3Json), 3u);
  EXPECT_EQ(ReleasableContent(" Hello {", F::kLlama3Json), 8u);

  EXPECT_EQ(ReleasableContent("Hello there", F::kHermes), 11u);
  EXPECT_EQ(ReleasableContent("Hello there \n", F::kHermes), 11u);  // a tag may follow
  EXPECT_EQ(ReleasableContent("Hello <tool", F::kHermes), 5u);
  EXPECT_EQ(ReleasableContent("Hello <tool_call>{", F::kHermes), 5u);
  EXPECT_EQ(ReleasableContent("a < b", F::kHermes), 5u);
  EXPECT_EQ(ReleasableContent("a <", F::kHermes), 1u);
}

// What a stream sends, replayed over every split of real replies into events: whole events, up
// to where ReleasableContent allows, then at the end the calls or the rest. The content a client
// assembles must be what a whole response holds, and no byte of a call may go out as content.
TEST(ToolCallsTest, StreamedContentEqualsTheWholeReplyForEverySplit) {
  struct Case {
    ToolCallFormat format;
    std::string text;
  };
  const std::vector<Case> cases = {
      {ToolCallFormat::kLlama3Json, "{\"name\": \"get_weather\", \"parameters\": {}}"},
      {ToolCallFormat::kLlama3Json, "  Plain text, with {braces} <|python later."},
      {ToolCallFormat::kLlama3Json, "<|python_tag|>{\"name\": \"calculate\"}"},
      {ToolCallFormat::kLlama3Json, "{\"name\": \"nope\"} was not a call"},
      {ToolCallFormat::kHermes,
       "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"c\": 1}}\n"
       "</tool_call>"},
      {ToolCallFormat::kHermes, "a <tool b <tool_call> c </tool_call>\n"},
      {ToolCallFormat::kHermes, "<tool_call>{\"name\": \"calculate\"}</tool_call>"},
      {ToolCallFormat::kHermes, "Text only, ending in spaces  \n"},
  };
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    const std::optional<ParsedReply> whole = ParseToolCalls(c.text, c.format, kTools);
    const std::string expected_content = whole.has_value() ? whole->content : c.text;
    for (int trial = 0; trial < 200; ++trial) {
      std::string text;
      std::string sent;
      std::vector<size_t> held;  // event ends not yet sent
      size_t known = 0;          // ReleasableContent so far, as CompletionJob keeps it
      for (size_t pos = 0; pos < c.text.size();) {
        const size_t n = std::min<size_t>(c.text.size() - pos, 1 + rng() % 5);
        text += c.text.substr(pos, n);
        pos += n;
        if (pos == c.text.size()) break;  // the last event: below
        held.push_back(text.size());
        const size_t releasable = ReleasableContent(text, c.format, known);
        ASSERT_EQ(releasable, ReleasableContent(text, c.format)) << "searching from " << known;
        known = releasable;
        size_t upto = sent.size();
        while (!held.empty() && held.front() <= releasable) {
          upto = held.front();
          held.erase(held.begin());
        }
        sent += text.substr(sent.size(), upto - sent.size());
      }
      if (whole.has_value()) {
        ASSERT_LE(sent.size(), whole->content.size()) << c.text;
        sent += whole->content.substr(sent.size());
      } else {
        sent += text.substr(sent.size());
      }
      ASSERT_EQ(sent, expected_content) << c.text;
    }
  }
}

}  // namespace
}  // namespace specd
