// Syntax tree of a chat template, shaped like @huggingface/jinja's (ast.ts), whose evaluation
// rules specd reproduces.
#ifndef SPECD_COMMON_CHAT_AST_H_
#define SPECD_COMMON_CHAT_AST_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace specd::chat {

enum class ExprKind {
  kIdentifier,       // name
  kIntegerLiteral,   // integer
  kFloatLiteral,     // number
  kStringLiteral,    // name holds the text
  kArrayLiteral,     // children: items
  kTupleLiteral,     // children: items
  kObjectLiteral,    // children: key0, value0, key1, value1, ...
  kMember,           // children: object, property; flag: computed (obj[expr] rather than obj.name)
  kSlice,            // children: start, stop, step (null where omitted); only as a kMember property
  kCall,             // children: callee, then arguments
  kBinary,           // name: operator ("+", "and", "not in", ...); children: left, right
  kUnary,            // name: "not", "-" or "+"; children: operand
  kFilter,           // children: operand, then the filter: an kIdentifier or a kCall on one
  kTest,             // name: test; flag: negated; children: operand
  kSelect,           // `a if cond` without else; children: value, condition
  kTernary,          // children: condition, if-true, if-false
  kKeywordArgument,  // name: keyword; children: value
  kSpread,           // `*expr` in a call; children: expr
  kKeywordSpread,    // `**expr` in a call; children: expr
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  std::string name;
  int64_t integer = 0;
  double number = 0;
  bool flag = false;
  std::vector<ExprPtr> children;  // a null entry is an omitted slice bound
};

enum class StmtKind {
  kOutput,       // text or {{ expr }}; expr
  kIf,           // expr: test; body; alternate (an elif is one nested kIf)
  kFor,          // target: loop variable(s); expr: iterable; body; alternate: the else block
  kSet,          // target: assignee; expr: value, or null for a {% set x %}...{% endset %} body
  kMacro,        // target: name; params; body
  kCallBlock,    // expr: the kCall; params: the caller's parameters; body
  kFilterBlock,  // expr: the filter (kIdentifier or kCall); body
  kBreak,
  kContinue,
  kComment,
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Block = std::vector<StmtPtr>;

struct Stmt {
  StmtKind kind;
  ExprPtr expr;
  ExprPtr target;
  std::vector<ExprPtr> params;  // kIdentifier or kKeywordArgument (a default)
  Block body;
  Block alternate;
};

}  // namespace specd::chat

#endif  // SPECD_COMMON_CHAT_AST_H_
