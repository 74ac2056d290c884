// Tool calls in chat replies: the two formats' parsers, what a stream may send before a reply is
// known to be content, and the check of a request's tools. The expected calls are written from the
// formats as Meta's Llama 3.1 prompt format and Qwen2.5's (Hermes) template describe them.
#include "services/coordinator/tool_calls.h"

#include <algorithm>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/coordinator/request_validation.h"
#include "services/coordinator/tool_call_stream.h"

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
  EXPECT_EQ(ToolCallFormatOf("{{- '[AVAILABLE_TOOLS] ' }}...{{- '[TOOL_CALLS] [' }}"),
            ToolCallFormat::kMistral);
  EXPECT_EQ(ToolCallFormatOf("respond with <|tool_call|> followed by a JSON list"),
            ToolCallFormat::kGranite);
  EXPECT_STREQ(ToolCallFormatName(ToolCallFormat::kHermes), "hermes");
  EXPECT_STREQ(ToolCallFormatName(ToolCallFormat::kLlama3Json), "llama3_json");
  EXPECT_STREQ(ToolCallFormatName(ToolCallFormat::kMistral), "mistral");
  EXPECT_STREQ(ToolCallFormatName(ToolCallFormat::kGranite), "granite");
}

// Mistral's [TOOL_CALLS] and Granite's <|tool_call|> are special tokens, which the reply's text
// leaves out, so the list parses with its tag or without it.
TEST(ToolCallsTest, MistralAndGraniteCallLists) {
  for (const ToolCallFormat format : {ToolCallFormat::kMistral, ToolCallFormat::kGranite}) {
    const std::string tag = format == ToolCallFormat::kMistral ? "[TOOL_CALLS]" : "<|tool_call|>";
    SCOPED_TRACE(tag);
    const std::string list = R"([{"name": "get_weather", "arguments": {"city": "Oslo, \"NO\" ]"}},)"
                             R"( {"arguments": {}, "name": "calculate"}])";
    for (const std::string& text : {list, tag + list, " " + tag + " " + list + "\n"}) {
      std::optional<ParsedReply> r = ParseToolCalls(text, format, kTools);
      ASSERT_TRUE(r.has_value()) << text;
      EXPECT_EQ(r->content, "");
      ASSERT_EQ(r->calls.size(), 2u);
      EXPECT_EQ(r->calls[0].name, "get_weather");
      EXPECT_EQ(r->calls[0].arguments, R"({"city":"Oslo, \"NO\" ]"})");
      EXPECT_EQ(r->calls[1].name, "calculate");
      EXPECT_EQ(r->calls[1].arguments, "{}");
    }
    for (const std::string& text : std::vector<std::string>{
             "[]",
             tag,
             R"([{"name": "get_weather", "arguments": {}})",                 // unclosed list
             R"([{"name": "get_weather", "arguments": {}}] and then text)",  // more after it
             R"(Sure: [{"name": "get_weather", "arguments": {}}])",          // text before it
             R"([{"name": "send_email", "arguments": {}}])",                 // not declared
             R"([{"name": "get_weather", "arguments": [1]}])",               // not an object
             R"([{"name": "get_weather"} {"name": "calculate"}])",           // no comma
             R"({"name": "get_weather", "arguments": {}})",                  // not a list
             R"([1, 2, 3] are numbers)",
         }) {
      EXPECT_FALSE(ParseToolCalls(text, format, kTools).has_value()) << text;
    }
    // A stream holds a reply that may be a list of calls, and only that.
    EXPECT_EQ(ReleasableContent(" [", format), 0u);
    EXPECT_EQ(ReleasableContent(tag.substr(0, 4), format), 0u);
    EXPECT_EQ(ReleasableContent(tag + "[{", format), 0u);
    EXPECT_EQ(ReleasableContent("The answer", format), 10u);
    EXPECT_EQ(ReleasableContent("{\"name\"", format), 7u) << "a lone object is not this format";
  }
}

// Ids are unique per call and choice; Mistral's templates accept only nine letters and digits.
TEST(ToolCallsTest, CallIdsFitTheModelsTemplate) {
  EXPECT_EQ(ToolCallId(ToolCallFormat::kHermes, "abc", 1, 2), "call_abc_1_2");
  EXPECT_EQ(ToolCallId(ToolCallFormat::kLlama3Json, "abc", 0, 0), "call_abc_0_0");
  absl::flat_hash_set<std::string> ids;
  for (const std::string stem : {"00000000000000000000000f", "00000000000000000000001f"}) {
    for (size_t choice = 0; choice < 4; ++choice) {
      for (size_t k = 0; k < 16; ++k) {
        const std::string id = ToolCallId(ToolCallFormat::kMistral, stem, choice, k);
        EXPECT_EQ(id.size(), 9u) << id;
        EXPECT_TRUE(absl::c_all_of(id, [](char c) { return absl::ascii_isalnum(c); })) << id;
        EXPECT_EQ(id, ToolCallId(ToolCallFormat::kMistral, stem, choice, k));
        ids.insert(id);
      }
    }
  }
  EXPECT_EQ(ids.size(), 2u * 4u * 16u);
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

// A stream (ToolCallStream) over every split of real replies into events: chunks are whole
// events, in order, up to where ReleasableContent allows, then at the end the calls or the rest.
// The content a client assembles must be what a whole response holds, no byte of a call may go
// out as content, and each chunk's tokens must be those of the events whose text it carries.
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
      {ToolCallFormat::kMistral,
       "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"c\": \"]\"}}]"},
      {ToolCallFormat::kMistral, "[1, 2] and text"},
      {ToolCallFormat::kGranite, "[{\"name\": \"calculate\", \"arguments\": {}}]"},
      {ToolCallFormat::kGranite, "Plain [text] <|tool_ later."},
  };
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    ToolCallPolicy policy;
    policy.format = c.format;
    policy.tools = kTools;
    const std::optional<ParsedReply> whole = ParseToolCalls(c.text, c.format, kTools);
    const std::string expected_content = whole.has_value() ? whole->content : c.text;
    for (int trial = 0; trial < 200; ++trial) {
      ToolCallStream stream(policy);
      std::string text;
      std::vector<std::string> events;  // one token per event
      std::string sent;
      size_t sent_tokens = 0;
      std::optional<std::vector<ToolCall>> calls;
      for (size_t pos = 0; pos < c.text.size();) {
        const size_t n = std::min<size_t>(c.text.size() - pos, 1 + rng() % 5);
        events.push_back(c.text.substr(pos, n));
        text += events.back();
        pos += n;
        const bool last = pos == c.text.size();
        std::optional<ToolCallStream::Chunk> chunk = stream.Next(text, events.size(), last);
        ASSERT_TRUE(chunk.has_value() || !last);
        if (!chunk.has_value()) continue;
        ASSERT_EQ(chunk->begin_token, sent_tokens);
        ASSERT_GT(chunk->end_token, chunk->begin_token);
        if (!last) {
          std::string of_events;
          for (size_t e = chunk->begin_token; e < chunk->end_token; ++e) of_events += events[e];
          ASSERT_EQ(chunk->content, of_events) << c.text;
          ASSERT_FALSE(chunk->calls.has_value());
        } else {
          ASSERT_EQ(chunk->end_token, events.size());
          calls = chunk->calls;
        }
        sent += chunk->content;
        sent_tokens = chunk->end_token;
      }
      ASSERT_EQ(sent, expected_content) << c.text;
      ASSERT_EQ(calls.has_value(), whole.has_value()) << c.text;
      if (calls.has_value()) {
        EXPECT_EQ(calls->size(), whole->calls.size());
      }
    }
  }
}

TEST(ToolCallsTest, WithoutParallelCallsOnlyTheFirstIsKept) {
  ToolCallPolicy policy;
  policy.format = ToolCallFormat::kLlama3Json;
  policy.tools = kTools;
  const std::string two =
      R"({"name": "get_weather", "parameters": {}}; {"name": "calculate", "parameters": {}})";
  ASSERT_EQ(policy.Parse(two)->calls.size(), 2u);
  policy.parallel_tool_calls = false;
  const std::optional<ParsedReply> one = policy.Parse(two);
  ASSERT_EQ(one->calls.size(), 1u);
  EXPECT_EQ(one->calls[0].name, "get_weather");
  policy.tools.clear();  // tool_choice "none": never parsed
  EXPECT_FALSE(policy.Parse(two).has_value());
}

TEST(ToolCallsTest, CheckToolsNamesTheToolAtFault) {
  using Json = nlohmann::ordered_json;
  const auto tool = [](Json name) {
    return Json{{"type", "function"}, {"function", {{"name", std::move(name)}}}};
  };
  absl::StatusOr<absl::flat_hash_set<std::string>> ok =
      CheckTools(Json::array({tool("a-b_9"), tool("get_weather")}));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, (absl::flat_hash_set<std::string>{"a-b_9", "get_weather"}));
  const std::vector<std::pair<Json, std::string>> bad = {
      {Json::object(), "tools must be a list"},
      {Json::array({tool("x"), tool("x")}), "tools[1].function.name \"x\" is already"},
      {Json::array({tool("has space")}), "tools[0].function.name must be 1 to 64"},
      {Json::array({tool(std::string(65, 'a'))}), "tools[0].function.name must be 1 to 64"},
      {Json::array({tool("")}), "tools[0].function.name must be 1 to 64"},
      {Json::array({tool(3)}), "tools[0].function.name must be 1 to 64"},
      {Json::array({Json{{"type", "retrieval"}}}), "tools[0] must be {\"type\": \"function\""},
      {Json::array(
           {Json{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", "{}"}}}}}),
       "tools[0].function.parameters must be a JSON Schema object"},
  };
  for (const auto& [tools, message] : bad) {
    const absl::Status st = CheckTools(tools).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << tools.dump();
    EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr(message)) << tools.dump();
    EXPECT_EQ(FieldOf(st), "tools");
  }
  Json many = Json::array();
  for (size_t i = 0; i <= kMaxTools; ++i) many.push_back(tool("t" + std::to_string(i)));
  EXPECT_THAT(std::string(CheckTools(many).status().message()),
              ::testing::HasSubstr("at most 128"));
}

}  // namespace
}  // namespace specd
