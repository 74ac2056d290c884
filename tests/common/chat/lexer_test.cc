// The lexer's preprocessing (trim_blocks, lstrip_blocks, generation tags) and tokens, and the
// load-time errors of the lexer and parser.
#include "common/chat/lexer.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "common/chat/parser.h"
#include "gtest/gtest.h"

namespace specd::chat {
namespace {

std::vector<std::string> Values(const std::vector<Token>& tokens) {
  std::vector<std::string> out;
  for (const Token& t : tokens) out.push_back(t.value);
  return out;
}

TEST(Preprocess, TrimsBlocksAndStripsTheirIndentation) {
  EXPECT_EQ(PreprocessTemplate("{% if x %}\n  a\n  {% endif %}\nb\n"),
            "{% if x %}  a\n{% endif %}b");
  // Only one trailing newline goes; expressions keep their indentation and newline.
  EXPECT_EQ(PreprocessTemplate("  {{ x }}\n\n"), "  {{ x }}\n");
  EXPECT_EQ(PreprocessTemplate("{# c #}\nx"), "{# c #}x");
}

TEST(Preprocess, DropsGenerationTags) {
  EXPECT_EQ(PreprocessTemplate("a {% generation %} b {% endgeneration %} c"), "a  b  c");
  EXPECT_EQ(PreprocessTemplate("a {%- generation -%} b"), "ab");
}

TEST(Tokenize, SplitsTagsTextAndOperators) {
  const auto tokens = Tokenize("Hi {{ name | trim }}{% if a != -1 %}!{% endif %}");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(Values(*tokens),
            (std::vector<std::string>{"Hi ", "{{", "name", "|", "trim", "}}", "{%", "if", "a",
                                      "!=", "-1", "%}", "!", "{%", "endif", "%}"}));
  EXPECT_EQ((*tokens)[10].type, TokenType::kNumericLiteral);
}

TEST(Tokenize, DashStripsNeighbouringWhitespace) {
  const auto tokens = Tokenize("a \n {{- x -}} \n b");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(Values(*tokens), (std::vector<std::string>{"a", "{{", "x", "}}", "b"}));
}

TEST(Tokenize, ResolvesStringEscapes) {
  const auto tokens = Tokenize(R"({{ 'a\n\'b\u00e9\ud83d\ude00' }})");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ((*tokens)[1].value, "a\n'b\u00e9\U0001F600");
}

TEST(Tokenize, RejectsBadInput) {
  for (const char* bad :
       {"{{ 'unterminated }}", "{{ '\\q' }}", "{{ x @ y }}", "{# open", "{{ '\\ud83d' }}"}) {
    const auto tokens = Tokenize(bad);
    EXPECT_EQ(tokens.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

absl::Status ParseStatus(const char* source) {
  const auto tokens = Tokenize(source);
  if (!tokens.ok()) return tokens.status();
  return Parse(*tokens).status();
}

TEST(Parse, AcceptsTheChatTemplateSubset) {
  for (const char* ok : {
           "{% for m in messages if m.role != 'system' %}{{ loop.index }}{% else %}-{% endfor %}",
           "{% set ns = namespace(a=1) %}{% set ns.a = ns.a + 1 %}{% set x, y = 1, 2 %}",
           "{% macro f(a, b=2) %}{{ a }}{% endmacro %}{% call f(1) %}x{% endcall %}",
           "{% filter upper %}x{% endfilter %}{% set b %}y{% endset %}",
           "{{ a if b else c }}{{ x[1:-1:2] }}{{ f(*args, k=1, **kw) }}{{ {'k': [1, 2]} }}",
           "{% if a %}{% elif b %}{% else %}{% endif %}{{ x is not none and y is defined }}",
       }) {
    EXPECT_TRUE(ParseStatus(ok).ok()) << ok << ": " << ParseStatus(ok);
  }
}

TEST(Parse, RejectsUnsupportedStatementsAtLoadTime) {
  for (const char* bad : {"{% include 'a' %}", "{% extends 'a' %}", "{% raw %}x{% endraw %}",
                          "{% block b %}{% endblock %}", "{% with a = 1 %}{% endwith %}"}) {
    const absl::Status status = ParseStatus(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(status.message(), "unsupported statement")) << status;
  }
}

TEST(Parse, RejectsMalformedTemplates) {
  for (const char* bad :
       {"{% if x %}never closed", "{% for x %}{% endfor %}", "{{ }}", "{{ f(a=1, 2) }}",
        "{% macro m(a=1, b) %}{% endmacro %}", "{% endif %}", "{{ x[] }}", "{{ (1, }}"}) {
    EXPECT_EQ(ParseStatus(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace specd::chat
