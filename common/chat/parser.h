// Parser from tokens to the syntax tree, with @huggingface/jinja's grammar and precedence (a
// filter binds tighter than `+`, a test tighter than `*`, `not` looser than comparisons).
// Statements: if/elif/else, for (with `if` filter and else), set (incl. block set and tuple and
// namespace attribute targets), macro, call, filter, break, continue. Anything else, such as
// include, extends, block, raw or with, is a syntax error at load time.
#ifndef SPECD_COMMON_CHAT_PARSER_H_
#define SPECD_COMMON_CHAT_PARSER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/ast.h"
#include "common/chat/lexer.h"

namespace specd::chat {

// Syntax errors are INVALID_ARGUMENT naming what was expected.
absl::StatusOr<Block> Parse(const std::vector<Token>& tokens);

}  // namespace specd::chat

#endif  // SPECD_COMMON_CHAT_PARSER_H_
