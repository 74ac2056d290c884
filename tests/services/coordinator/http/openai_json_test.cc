// The OpenAI request parser and response encoders of the HTTP API, without a server: every bad
// field is refused naming that field, accepted fields land where the scheduler reads them, and
// the response shapes (logprobs of both endpoints, -inf, usage, errors, SSE) are OpenAI's.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/coordinator/http/openai_request.h"
#include "services/coordinator/http/openai_response.h"

namespace specd::http {
namespace {

using ::testing::HasSubstr;

struct BadCase {
  Endpoint endpoint;
  std::string body;
  std::string field;  // "" when the error names none (the body itself is wrong)
};

class BadRequestTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadRequestTest, IsRefusedNamingTheField) {
  const BadCase& c = GetParam();
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(c.endpoint, c.body);
  ASSERT_FALSE(r.ok()) << c.body;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(r.status()), c.field) << r.status();
  if (!c.field.empty()) {
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.field));
  }
  EXPECT_EQ(HttpStatusOf(r.status().code()), 400);
}

constexpr Endpoint kC = Endpoint::kCompletions;
constexpr Endpoint kChat = Endpoint::kChatCompletions;

INSTANTIATE_TEST_SUITE_P(
    Fields, BadRequestTest,
    ::testing::Values(
        BadCase{kC, "{not json", ""}, BadCase{kC, "[1, 2]", ""},
        BadCase{kC, R"({"model": "m"})", "prompt"}, BadCase{kC, R"({"prompt": 5})", "prompt"},
        BadCase{kC, R"({"prompt": []})", "prompt"},
        BadCase{kC, R"({"prompt": ["a", [1, 2]]})", "prompt"},
        BadCase{kC, R"({"prompt": [1, "a"]})", "prompt"},
        BadCase{kC, R"({"prompt": [1, 4294967296]})", "prompt"},
        BadCase{kC, R"({"prompt": "a", "model": 3})", "model"},
        BadCase{kC, R"({"prompt": "a", "temperature": "hot"})", "temperature"},
        BadCase{kC, R"({"prompt": "a", "temperature": 2.5})", "temperature"},
        BadCase{kC, R"({"prompt": "a", "temperature": -0.1})", "temperature"},
        BadCase{kC, R"({"prompt": "a", "top_p": 0})", "top_p"},
        BadCase{kC, R"({"prompt": "a", "top_p": 1.5})", "top_p"},
        BadCase{kC, R"({"prompt": "a", "top_k": -2})", "top_k"},
        BadCase{kC, R"({"prompt": "a", "top_k": 1.5})", "top_k"},
        BadCase{kC, R"({"prompt": "a", "min_p": 2})", "min_p"},
        BadCase{kC, R"({"prompt": "a", "repetition_penalty": 0})", "repetition_penalty"},
        BadCase{kC, R"({"prompt": "a", "presence_penalty": 2.5})", "presence_penalty"},
        BadCase{kC, R"({"prompt": "a", "frequency_penalty": -3})", "frequency_penalty"},
        BadCase{kC, R"({"prompt": "a", "n": 0})", "n"},
        BadCase{kC, R"({"prompt": "a", "n": 129})", "n"},
        BadCase{kC, R"({"prompt": ["a", "b", "c"], "n": 100})", "n"},
        BadCase{kC, R"({"prompt": "a", "best_of": 3})", "best_of"},
        BadCase{kC, R"({"prompt": "a", "max_tokens": 0})", "max_tokens"},
        BadCase{kC, R"({"prompt": "a", "max_tokens": "10"})", "max_tokens"},
        BadCase{kC, R"({"prompt": "a", "seed": 1.5})", "seed"},
        BadCase{kC, R"({"prompt": "a", "stop": 5})", "stop"},
        BadCase{kC, R"({"prompt": "a", "stop": ["x", 1]})", "stop"},
        BadCase{kC, R"({"prompt": "a", "stop_token_ids": [-1]})", "stop_token_ids"},
        BadCase{kC, R"({"prompt": "a", "stream": "yes"})", "stream"},
        BadCase{kC, R"({"prompt": "a", "stream_options": {"include_usage": true}})",
                "stream_options"},
        BadCase{kC, R"({"prompt": "a", "stream": true, "stream_options": 1})", "stream_options"},
        BadCase{kC, R"({"prompt": "a", "echo": 1})", "echo"},
        BadCase{kC, R"({"prompt": "a", "logprobs": 21})", "logprobs"},
        BadCase{kC, R"({"prompt": "a", "logprobs": true})", "logprobs"},
        BadCase{kC, R"({"prompt": "a", "logprobs": 2, "logprobs_mode": "final"})", "logprobs_mode"},
        BadCase{kC, R"({"prompt": "a", "ignore_eos": "no"})", "ignore_eos"},
        BadCase{kC, R"({"prompt": "a", "num_speculative_tokens": 65})", "num_speculative_tokens"},
        BadCase{kC, R"({"prompt": "a", "draft_method": "eagle"})", "draft_method"},
        BadCase{kC, R"({"prompt": "a", "draft_method": 2})", "draft_method"},
        BadCase{kC, R"({"prompt": "a", "speculation_tree": [2, 2]})", "speculation_tree"},
        BadCase{kC, R"({"prompt": "a", "speculation_tree": {"branching": 2}})", "speculation_tree"},
        BadCase{kC, R"({"prompt": "a", "speculation_tree": {"branching": -1, "depth": 1}})",
                "speculation_tree"},
        BadCase{kC, R"({"prompt": "a", "egag": "on"})", "egag"},
        BadCase{kC, R"({"prompt": "a", "logit_bias": [5]})", "logit_bias"},
        BadCase{kC, R"({"prompt": "a", "logit_bias": {"five": 1}})", "logit_bias"},
        BadCase{kC, R"({"prompt": "a", "logit_bias": {"05": 1}})", "logit_bias"},
        BadCase{kC, R"({"prompt": "a", "logit_bias": {"5": "1"}})", "logit_bias"},
        BadCase{kC, R"({"prompt": "a", "suffix": "z"})", "suffix"},
        BadCase{kChat, R"({"model": "m"})", "messages"},
        BadCase{kChat, R"({"messages": []})", "messages"},
        BadCase{kChat, R"({"messages": "hi"})", "messages"},
        BadCase{kChat, R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": 1})",
                "logprobs"},
        BadCase{kChat, R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})",
                "top_logprobs"},
        BadCase{kChat,
                R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true,
                    "top_logprobs": 21})",
                "top_logprobs"},
        BadCase{kChat, R"({"messages": [{"role": "user", "content": "hi"}], "echo": true})",
                "echo"},
        BadCase{kChat,
                R"({"messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function"}]})",
                "tools"},
        BadCase{kChat, R"({"messages": [{"role": "user", "content": "hi"}], "tools": {}})",
                "tools"},
        BadCase{kChat,
                R"({"messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "retrieval", "function": {"name": "f"}}]})",
                "tools"},
        BadCase{kChat,
                R"({"messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "no spaces"}}]})",
                "tools"},
        BadCase{kChat,
                R"({"messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": ""}}]})",
                "tools"},
        BadCase{kChat,
                R"({"messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "f"}},
                              {"type": "function", "function": {"name": "f"}}]})",
                "tools"},
        BadCase{kChat,
                R"({"messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]})",
                "tools"},
        BadCase{kChat,
                R"({"messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "f", "description": 1}}]})",
                "tools"},
        BadCase{kChat,
                R"({"messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "f"}}],
                    "tool_choice": "required"})",
                "tool_choice"},
        BadCase{kChat,
                R"({"messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "f"}}],
                    "tool_choice": {"type": "function", "function": {"name": "f"}}})",
                "tool_choice"},
        BadCase{kChat,
                R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"})",
                "tool_choice"},
        BadCase{kChat,
                R"({"messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "f"}}],
                    "tool_choice": "sometimes"})",
                "tool_choice"},
        BadCase{kChat,
                R"({"messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "f"}}],
                    "parallel_tool_calls": "yes"})",
                "parallel_tool_calls"},
        BadCase{kC,
                R"({"prompt": "a", "tools": [{"type": "function", "function": {"name": "f"}}]})",
                "tools"},
        BadCase{kChat, R"({"messages": [{"role": "user", "content": "hi"}], "functions": [{}]})",
                "functions"},
        BadCase{kChat,
                R"({"messages": [{"role": "user", "content": "hi"}],
                    "response_format": {"type": "json_object"}})",
                "response_format"},
        BadCase{kChat,
                R"({"messages": [{"role": "user", "content": "hi"}],
                    "max_completion_tokens": -5})",
                "max_completion_tokens"},
        BadCase{kC, R"({"prompt": "a", "guidance": 2})", "guidance"},
        BadCase{kC, R"({"prompt": "a", "guidance": {"scale": 2, "negative": "x"}})", "guidance"},
        BadCase{kC, R"({"prompt": "a", "guidance": {}})", "guidance.scale"},
        BadCase{kC, R"({"prompt": "a", "guidance": {"scale": "2"}})", "guidance.scale"},
        BadCase{kC, R"({"prompt": "a", "guidance": {"scale": 2, "unconditional_prompt": 5}})",
                "guidance.unconditional_prompt"},
        BadCase{kC,
                R"({"prompt": "a", "guidance": {"scale": 2, "unconditional_prompt": [1, "b"]}})",
                "guidance.unconditional_prompt"},
        BadCase{kChat,
                R"({"messages": [{"role": "user", "content": "hi"}],
                    "guidance": {"scale": 2, "draft": "yes"}})",
                "guidance.draft"}));

TEST(OpenAiRequestTest, CompletionFieldsLandInTheGenerateRequest) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(kC, R"({
      "model": "m", "prompt": [[1, 2], [3]], "max_tokens": 9, "temperature": 0.5,
      "top_p": 0.9, "top_k": -1, "min_p": 0.1, "repetition_penalty": 1.1,
      "presence_penalty": 0.2, "frequency_penalty": -0.3, "seed": -1, "n": 2,
      "stop": "END", "stop_token_ids": [7], "ignore_eos": true, "num_speculative_tokens": 3,
      "logprobs": 4, "logprobs_mode": "processed_logprobs", "stream": true,
      "stream_options": {"include_usage": true}, "user": "u", "return_token_ids": true})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "m");
  ASSERT_EQ(r->prompts.size(), 2u);
  EXPECT_FALSE(r->prompts[0].is_text);
  EXPECT_EQ(r->prompts[0].ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(r->prompts[1].ids, (std::vector<int32_t>{3}));
  EXPECT_EQ(r->n, 2);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_TRUE(r->return_token_ids);
  const v1::GenerateRequest& g = r->base;
  EXPECT_EQ(g.stopping().max_new_tokens(), 9u);
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.sampling().top_k(), 0);  // -1 = off
  EXPECT_FLOAT_EQ(g.sampling().min_p(), 0.1f);
  EXPECT_FLOAT_EQ(g.sampling().repetition_penalty(), 1.1f);
  EXPECT_FLOAT_EQ(g.sampling().presence_penalty(), 0.2f);
  EXPECT_FLOAT_EQ(g.sampling().frequency_penalty(), -0.3f);
  EXPECT_EQ(g.sampling().seed(), std::numeric_limits<uint64_t>::max());  // -1, two's complement
  ASSERT_EQ(g.stopping().stop_size(), 1);
  EXPECT_EQ(g.stopping().stop(0), "END");
  EXPECT_EQ(g.stopping().stop_token_ids(0), 7);
  EXPECT_TRUE(g.stopping().ignore_eos());
  EXPECT_EQ(g.speculation().num_speculative_tokens(), 3u);
  EXPECT_TRUE(g.logprobs().enabled());
  EXPECT_EQ(g.logprobs().top_logprobs(), 4u);
  EXPECT_EQ(g.logprobs().mode(), v1::LOGPROBS_MODE_PROCESSED);
  EXPECT_FALSE(g.logprobs().prompt());  // no echo
}

// echo with logprobs asks the prompt's logprobs too, in the same mode and with as many
// alternatives; echo alone or logprobs alone does not.
TEST(OpenAiRequestTest, EchoWithLogprobsAsksThePromptsLogprobs) {
  for (const auto& [body, prompt] : std::vector<std::pair<const char*, bool>>{
           {R"({"prompt": "a", "echo": true, "logprobs": 3})", true},
           {R"({"prompt": "a", "echo": true, "logprobs": 0})", true},
           {R"({"prompt": "a", "echo": true})", false},
           {R"({"prompt": "a", "logprobs": 3})", false}}) {
    absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(Endpoint::kCompletions, body);
    ASSERT_TRUE(r.ok()) << body << ": " << r.status();
    EXPECT_EQ(r->base.logprobs().prompt(), prompt) << body;
  }
}

// OpenAI's logit_bias: token ids as strings, mapped onto the sampling parameters; the ids and
// ranges against the model are BuildGenerationRequest's, as on gRPC.
TEST(OpenAiRequestTest, LogitBiasLandsInTheSamplingParameters) {
  absl::StatusOr<OpenAiRequest> r =
      ParseOpenAiRequest(kC, R"({"prompt": "a", "logit_bias": {"50256": -100, "7": 2.5}})");
  ASSERT_TRUE(r.ok()) << r.status();
  const auto& bias = r->base.sampling().logit_bias();
  ASSERT_EQ(bias.size(), 2u);
  EXPECT_EQ(bias.at(50256), -100.0f);
  EXPECT_EQ(bias.at(7), 2.5f);
}

// stop_token_ids reach the scheduler ascending and unique, however many and in whatever order
// the client lists them: every generated token is looked up in them.
TEST(OpenAiRequestTest, StopTokenIdsReachTheSchedulerAscendingAndUnique) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(
      kC, R"({"prompt": [1, 2], "stop_token_ids": [9, 3, 9, 5, 3, 0], "max_tokens": 4})");
  ASSERT_TRUE(r.ok()) << r.status();
  v1::GenerateRequest g = r->base;
  g.mutable_token_ids()->add_ids(1);
  ServerLimits limits;
  limits.vocab_size = 16;
  limits.max_seq_len = 32;
  absl::StatusOr<GenerationRequest> built = BuildGenerationRequest(g, {}, limits, 1);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->stop_token_ids, (std::vector<int32_t>{0, 3, 5, 9}));
}

// Issue 17's speculation fields: who drafts, a draft tree, EGAG. Their limits (a tree's shape
// against K, a method the server cannot serve) are BuildGenerationRequest's, as on gRPC.
TEST(OpenAiRequestTest, DraftingFieldsLandInTheSpeculationParameters) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(kC, R"({
      "prompt": "a", "num_speculative_tokens": 4, "draft_method": "model",
      "speculation_tree": {"branching": 3, "depth": 2}, "egag": false})");
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::SpeculationParameters& s = r->base.speculation();
  EXPECT_EQ(s.draft_method(), v1::DRAFT_METHOD_MODEL);
  ASSERT_TRUE(s.has_tree());
  EXPECT_EQ(s.tree().branching(), 3u);
  EXPECT_EQ(s.tree().depth(), 2u);
  ASSERT_TRUE(s.has_egag());
  EXPECT_FALSE(s.egag());
  r = ParseOpenAiRequest(kChat, R"({"messages": [{"role": "user", "content": "hi"}],
                                    "draft_method": "ngram", "egag": true})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->base.speculation().draft_method(), v1::DRAFT_METHOD_NGRAM);
  EXPECT_FALSE(r->base.speculation().has_tree());
  EXPECT_TRUE(r->base.speculation().egag());
  // Unset: the server's defaults.
  r = ParseOpenAiRequest(kC, R"({"prompt": "a"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->base.speculation().draft_method(), v1::DRAFT_METHOD_UNSPECIFIED);
  EXPECT_FALSE(r->base.speculation().has_tree());
  EXPECT_FALSE(r->base.speculation().has_egag());
}

// specd's guidance extension lands in the gRPC API's Guidance, where its ranges are checked.
TEST(OpenAiRequestTest, GuidanceLandsInTheGenerateRequest) {
  absl::StatusOr<OpenAiRequest> text = ParseOpenAiRequest(
      kC, R"({"prompt": "hi", "guidance": {"scale": 1.5, "unconditional_prompt": "bye"}})");
  ASSERT_TRUE(text.ok()) << text.status();
  ASSERT_TRUE(text->base.has_guidance());
  EXPECT_FLOAT_EQ(text->base.guidance().scale(), 1.5f);
  EXPECT_EQ(text->base.guidance().unconditional_text(), "bye");
  EXPECT_FALSE(text->base.guidance().draft());
  absl::StatusOr<OpenAiRequest> ids =
      ParseOpenAiRequest(kChat, R"({"messages": [{"role": "user", "content": "hi"}],
                 "guidance": {"scale": 3, "unconditional_prompt": [1, 7], "draft": true}})");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->base.guidance().unconditional_token_ids().ids_size(), 2);
  EXPECT_TRUE(ids->base.guidance().draft());
  // No unconditional prompt: the request's validation makes it BOS; a scale out of range is
  // refused there too, naming guidance.scale (HttpErrorsTest).
  absl::StatusOr<OpenAiRequest> bos =
      ParseOpenAiRequest(kC, R"({"prompt": "hi", "guidance": {"scale": 11}})");
  ASSERT_TRUE(bos.ok()) << bos.status();
  EXPECT_EQ(bos->base.guidance().unconditional_case(), v1::Guidance::UNCONDITIONAL_NOT_SET);
  EXPECT_FALSE(ParseOpenAiRequest(kC, R"({"prompt": "hi"})")->base.has_guidance());
}

TEST(OpenAiRequestTest, DefaultsAreOpenAis) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(kC, R"({"prompt": "hi"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->prompts[0].is_text);
  EXPECT_EQ(r->prompts[0].text, "hi");
  EXPECT_FLOAT_EQ(r->base.sampling().temperature(), 1.0f);  // OpenAI samples by default
  EXPECT_FALSE(r->base.sampling().has_seed());
  EXPECT_EQ(r->base.stopping().max_new_tokens(), 0u);  // the server's default
  EXPECT_FALSE(r->base.has_speculation());             // the server's default K
  EXPECT_FALSE(r->base.logprobs().enabled());
  EXPECT_EQ(r->n, 1);
}

TEST(OpenAiRequestTest, ToolsReachTheTemplateAndToolChoiceSaysWhetherRepliesAreParsed) {
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
                    "parameters": {"type": "object"}, "strict": true}},
                   {"type": "function", "function": {"name": "calc-2"}}])";
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(
      kChat, R"({"messages": [{"role": "user", "content": "hi"}], )" + tools + "}");
  ASSERT_TRUE(r.ok()) << r.status();
  // "auto" by default: replies are parsed for calls to the tools.
  EXPECT_TRUE(r->parallel_tool_calls);
  EXPECT_EQ(r->tool_names, (absl::flat_hash_set<std::string>{"get_weather", "calc-2"}));
  ASSERT_TRUE(r->chat_options.tools.is_array());
  EXPECT_EQ(r->chat_options.tools.size(), 2u);
  EXPECT_EQ(r->chat_options.tools[0]["function"]["description"], "d");

  // "none": the model still sees the tools, but its reply is content.
  r = ParseOpenAiRequest(kChat, R"({"messages": [{"role": "user", "content": "hi"}], )" + tools +
                                    R"(, "tool_choice": "none", "parallel_tool_calls": false})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->tool_names.empty());
  EXPECT_FALSE(r->parallel_tool_calls);
  EXPECT_EQ(r->chat_options.tools.size(), 2u);

  // No tools, or an empty list: nothing to parse, and "none" is harmless.
  for (const char* body : {R"({"messages": [{"role": "user", "content": "hi"}], "tools": []})",
                           R"({"messages": [{"role": "user", "content": "hi"}],
                               "tool_choice": "none"})"}) {
    r = ParseOpenAiRequest(kChat, body);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->tool_names.empty());
    EXPECT_TRUE(r->chat_options.tools.is_null());
  }

  // /tokenize counts a conversation with its tools, as chat renders it.
  absl::StatusOr<TokenizeRequest> t =
      ParseTokenizeRequest(R"({"messages": [{"role": "user", "content": "hi"}], )" + tools + "}");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->chat_options.tools.size(), 2u);

  std::string many = R"({"messages": [{"role": "user", "content": "hi"}], "tools": [)";
  for (int i = 0; i < 129; ++i) {
    many += absl::StrCat(i == 0 ? "" : ",", R"({"type": "function", "function": {"name": "f)", i,
                         R"("}})");
  }
  r = ParseOpenAiRequest(kChat, many + "]}");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("at most 128"));
}

TEST(OpenAiRequestTest, ChatTakesMaxCompletionTokensAndBooleanLogprobs) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(kChat, R"({
      "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
      "max_completion_tokens": 7, "logprobs": true, "top_logprobs": 3, "temperature": null})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->messages.size(), 1u);
  EXPECT_EQ(r->base.stopping().max_new_tokens(), 7u);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->top_logprobs, 3);
  EXPECT_EQ(r->base.logprobs().mode(), v1::LOGPROBS_MODE_RAW);
  EXPECT_FLOAT_EQ(r->base.sampling().temperature(), 1.0f);  // null = not given
}

TEST(OpenAiResponseTest, MinusInfinityIsWrittenAsMinus9999) {
  EXPECT_EQ(LogprobValue(-std::numeric_limits<float>::infinity()), -9999.0);
  EXPECT_EQ(LogprobValue(-12345.0f), -9999.0);
  EXPECT_EQ(LogprobValue(std::nanf("")), -9999.0);
  EXPECT_EQ(LogprobValue(-0.5f), -0.5);
  // It stays a JSON number (JSON has no infinity).
  const Json j = {{"logprob", LogprobValue(-std::numeric_limits<float>::infinity())}};
  EXPECT_EQ(j.dump(), R"({"logprob":-9999.0})");
}

TokenText Names() {
  return
      [](int32_t /*previous*/, int32_t id) { return std::string(1, static_cast<char>('a' + id)); };
}

TEST(OpenAiResponseTest, CompletionLogprobsAddTheEmittedTokenWhenNotInTheTop) {
  TokenLogprobs in_top{-0.1f, {0, 1}, {-0.1f, -2.5f}};
  TokenLogprobs below{-7.0f, {0, 1}, {-0.2f, -3.0f}};
  const std::vector<int32_t> tokens = {0, 3};
  const std::vector<TokenLogprobs> lps = {in_top, below};
  const Json j = CompletionLogprobs(tokens, lps, Names(), -1, 10, 2);
  EXPECT_EQ(j["tokens"], Json::array({"a", "d"}));
  EXPECT_EQ(j["token_logprobs"][0], static_cast<double>(-0.1f));
  EXPECT_EQ(j["text_offset"], Json::array({10, 11}));
  EXPECT_EQ(j["top_logprobs"][0].size(), 2u);
  ASSERT_EQ(j["top_logprobs"][1].size(), 3u);  // N + the emitted token, last: it is lowest
  EXPECT_EQ(j["top_logprobs"][1].items().begin().key(), "a");
  EXPECT_EQ(j["top_logprobs"][1]["d"], -7.0);
  // logprobs 0: the emitted token alone, as OpenAI's legacy API and vLLM answer.
  const Json zero = CompletionLogprobs(tokens, lps, Names(), -1, 0, 0);
  EXPECT_EQ(zero["top_logprobs"][0], Json({{"a", static_cast<double>(-0.1f)}}));
  EXPECT_EQ(zero["top_logprobs"][1], Json({{"d", -7.0}}));
}

TEST(OpenAiResponseTest, ChatLogprobsCarryBytesAndSortedAlternatives) {
  TokenLogprobs lp{-1.0f, {2, 0, 1}, {-0.5f, -1.0f, -2.0f}};
  const std::vector<int32_t> tokens = {0};
  const std::vector<TokenLogprobs> lps = {lp};
  const Json j = ChatLogprobs(tokens, lps, Names(), -1, 3);
  const Json& c = j["content"][0];
  EXPECT_EQ(c["token"], "a");
  EXPECT_EQ(c["bytes"], Json::array({97}));
  ASSERT_EQ(c["top_logprobs"].size(), 3u);
  EXPECT_EQ(c["top_logprobs"][0]["token"], "c");
  EXPECT_EQ(c["top_logprobs"][1]["logprob"], -1.0);
  // top_logprobs 0: no alternatives, as OpenAI answers.
  EXPECT_TRUE(ChatLogprobs(tokens, lps, Names(), -1, 0)["content"][0]["top_logprobs"].empty());
}

TEST(OpenAiResponseTest, UsageCountsEachPromptOnceAndReportsSpeculation) {
  GenerationUsage a;
  a.prompt_tokens = 5;
  a.completion_tokens = 10;
  a.rounds = 4;
  a.draft_tokens = 12;
  a.accepted_tokens = 6;
  a.accepted_per_position = {3, 2, 1};
  GenerationUsage b = a;
  b.completion_tokens = 8;
  b.accepted_per_position = {4};
  const std::vector<GenerationUsage> both = {a, b};
  const Json total = TotalUsage(both, /*n=*/2);
  EXPECT_EQ(total["prompt_tokens"], 5);
  EXPECT_EQ(total["completion_tokens"], 18);
  EXPECT_EQ(total["total_tokens"], 23);
  EXPECT_EQ(total["speculative"]["drafted_tokens"], 24);
  EXPECT_EQ(total["speculative"]["accepted_tokens"], 12);
  EXPECT_DOUBLE_EQ(total["speculative"]["acceptance_rate"].get<double>(), 0.5);
  EXPECT_EQ(total["speculative"]["accepted_per_position"], Json::array({7, 2, 1}));
  EXPECT_EQ(TotalUsage(both, 1)["prompt_tokens"], 10);  // two prompts
}

TEST(OpenAiResponseTest, ErrorsHaveOpenAisShapeAndStatus) {
  const Json e = ErrorJson(FieldError("temperature", "temperature must be in [0, 2]"));
  EXPECT_EQ(e["error"]["message"], "temperature must be in [0, 2]");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "temperature");
  EXPECT_EQ(e["error"]["code"], 400);
  EXPECT_TRUE(ErrorJson(absl::UnavailableError("x"))["error"]["param"].is_null());
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kInternal), 500);
}

TEST(OpenAiResponseTest, ServerSentEventsAreOneDataLineEach) {
  EXPECT_EQ(SseEvent({{"a", "x\ny"}}), "data: {\"a\":\"x\\ny\"}\n\n");
  EXPECT_EQ(std::string(kSseDone), "data: [DONE]\n\n");
  EXPECT_STREQ(FinishReasonJson(FinishReason::kLength), "length");
  EXPECT_STREQ(FinishReasonJson(FinishReason::kEosToken), "stop");
  EXPECT_STREQ(FinishReasonJson(FinishReason::kStopString), "stop");
}

}  // namespace
}  // namespace specd::http
