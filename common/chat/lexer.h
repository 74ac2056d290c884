// Tokenizer for the Jinja subset of chat templates, with the whitespace handling of
// @huggingface/jinja's Template (trim_blocks and lstrip_blocks on, one trailing newline dropped,
// transformers' {% generation %} tags removed) and its `-` whitespace control.
#ifndef SPECD_COMMON_CHAT_LEXER_H_
#define SPECD_COMMON_CHAT_LEXER_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specd::chat {

enum class TokenType {
  kText,                    // text outside tags
  kNumericLiteral,          // 123, 1.5, -1 (a sign is part of the literal where unary)
  kStringLiteral,           // value without quotes, escapes resolved
  kIdentifier,              // names and keywords
  kEquals,                  // =
  kOpenParen,               // (
  kCloseParen,              // )
  kOpenStatement,           // {%
  kCloseStatement,          // %}
  kOpenExpression,          // {{
  kCloseExpression,         // }}
  kOpenSquareBracket,       // [
  kCloseSquareBracket,      // ]
  kOpenCurlyBracket,        // {
  kCloseCurlyBracket,       // }
  kComma,                   // ,
  kDot,                     // .
  kColon,                   // :
  kPipe,                    // |
  kAdditiveOperator,        // + - ~
  kMultiplicativeOperator,  // * / // %
  kExponentiationOperator,  // **
  kComparisonOperator,      // < > <= >= == !=
  kUnaryOperator,           // a lone unary + or -
  kComment,                 // {# ... #}
};

struct Token {
  TokenType type;
  std::string value;
};

// The template text after the Template constructor's preprocessing (exposed for tests).
std::string PreprocessTemplate(std::string_view source);

// Syntax errors are INVALID_ARGUMENT with the byte offset into the preprocessed text.
absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source);

}  // namespace specd::chat

#endif  // SPECD_COMMON_CHAT_LEXER_H_
