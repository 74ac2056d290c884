#include "common/chat/parser.h"

#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/absl_string.h"
#include "base/status_macros.h"

namespace specd::chat {
namespace {

ExprPtr MakeExpr(ExprKind kind, std::string name = {}) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->name = std::move(name);
  return e;
}

ExprPtr MakeExpr(ExprKind kind, std::string name, ExprPtr a, ExprPtr b = nullptr) {
  ExprPtr e = MakeExpr(kind, std::move(name));
  e->children.push_back(std::move(a));
  if (b != nullptr) e->children.push_back(std::move(b));
  return e;
}

StmtPtr MakeStmt(StmtKind kind) {
  auto s = std::make_unique<Stmt>();
  s->kind = kind;
  return s;
}

std::string_view TypeName(TokenType type) {
  switch (type) {
    case TokenType::kText:
      return "text";
    case TokenType::kNumericLiteral:
      return "number";
    case TokenType::kStringLiteral:
      return "string";
    case TokenType::kIdentifier:
      return "identifier";
    case TokenType::kEquals:
      return "'='";
    case TokenType::kOpenParen:
      return "'('";
    case TokenType::kCloseParen:
      return "')'";
    case TokenType::kOpenStatement:
      return "'{%'";
    case TokenType::kCloseStatement:
      return "'%}'";
    case TokenType::kOpenExpression:
      return "'{{'";
    case TokenType::kCloseExpression:
      return "'}}'";
    case TokenType::kOpenSquareBracket:
      return "'['";
    case TokenType::kCloseSquareBracket:
      return "']'";
    case TokenType::kOpenCurlyBracket:
      return "'{'";
    case TokenType::kCloseCurlyBracket:
      return "'}'";
    case TokenType::kComma:
      return "','";
    case TokenType::kDot:
      return "'.'";
    case TokenType::kColon:
      return "':'";
    case TokenType::kPipe:
      return "'|'";
    case TokenType::kAdditiveOperator:
    case TokenType::kMultiplicativeOperator:
    case TokenType::kExponentiationOperator:
    case TokenType::kComparisonOperator:
    case TokenType::kUnaryOperator:
      return "operator";
    case TokenType::kComment:
      return "comment";
  }
  return "token";
}

enum class ArgsMode { kCall, kParameters };

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  absl::StatusOr<Block> Run() {
    Block program;
    while (current_ < tokens_.size()) {
      SPECD_ASSIGN_OR_RETURN(StmtPtr s, ParseAny());
      program.push_back(std::move(s));
    }
    return program;
  }

 private:
  const Token* Peek(size_t offset = 0) const {
    return current_ + offset < tokens_.size() ? &tokens_[current_ + offset] : nullptr;
  }
  bool Is(TokenType type) const { return Peek() != nullptr && Peek()->type == type; }
  bool IsIdentifier(std::initializer_list<std::string_view> names) const {
    size_t i = 0;
    for (const std::string_view name : names) {
      const Token* t = Peek(i++);
      if (t == nullptr || t->type != TokenType::kIdentifier || t->value != name) return false;
    }
    return true;
  }
  bool IsStatement(std::initializer_list<std::string_view> names) const {
    const Token* open = Peek();
    const Token* name = Peek(1);
    if (open == nullptr || open->type != TokenType::kOpenStatement || name == nullptr ||
        name->type != TokenType::kIdentifier) {
      return false;
    }
    for (const std::string_view n : names) {
      if (name->value == n) return true;
    }
    return false;
  }

  // Every level of nesting passes here; deep nesting would exhaust the stack.
  class DepthGuard {
   public:
    explicit DepthGuard(int& depth) : depth_(depth) { ++depth_; }
    ~DepthGuard() { --depth_; }
    bool exceeded() const { return depth_ > kMaxDepth; }

   private:
    int& depth_;
  };
  static constexpr int kMaxDepth = 100;

  absl::Status Error(std::string_view what) const {
    std::string where =
        current_ < tokens_.size()
            ? absl::StrCat(" (at token ", current_, ", ", ToAbsl(TypeName(tokens_[current_].type)),
                           " '", tokens_[current_].value.substr(0, 40), "')")
            : " (at the end of the template)";
    return absl::InvalidArgumentError(
        absl::StrCat("chat template syntax error: ", ToAbsl(what), where));
  }

  absl::Status Expect(TokenType type, std::string_view what) {
    const Token* t = Peek();
    if (t == nullptr || t->type != type) {
      return Error(absl::StrCat("expected ", ToAbsl(what)));
    }
    ++current_;
    return absl::OkStatus();
  }
  absl::Status ExpectIdentifier(std::string_view name) {
    if (!IsIdentifier({name})) return Error(absl::StrCat("expected '", ToAbsl(name), "'"));
    ++current_;
    return absl::OkStatus();
  }
  // `{% name %}` closing a block.
  absl::Status ExpectEndTag(std::string_view name) {
    SPECD_RETURN_IF_ERROR(
        Expect(TokenType::kOpenStatement, absl::StrCat("{% ", ToAbsl(name), " %}")));
    SPECD_RETURN_IF_ERROR(ExpectIdentifier(name));
    return Expect(TokenType::kCloseStatement, "'%}'");
  }

  // Statements up to (not including) a {% name %} among `ends`.
  absl::StatusOr<Block> ParseBlockUntil(std::initializer_list<std::string_view> ends) {
    Block block;
    while (!IsStatement(ends)) {
      SPECD_ASSIGN_OR_RETURN(StmtPtr s, ParseAny());
      block.push_back(std::move(s));
    }
    return block;
  }

  absl::StatusOr<StmtPtr> ParseAny() {
    const DepthGuard guard(depth_);
    if (guard.exceeded()) return Error("blocks nested too deeply");
    const Token* t = Peek();
    if (t == nullptr) return Error("unexpected end of template (a block is not closed)");
    switch (t->type) {
      case TokenType::kComment: {
        ++current_;
        return MakeStmt(StmtKind::kComment);
      }
      case TokenType::kText: {
        StmtPtr s = MakeStmt(StmtKind::kOutput);
        s->expr = MakeExpr(ExprKind::kStringLiteral, t->value);
        ++current_;
        return s;
      }
      case TokenType::kOpenStatement:
        return ParseStatement();
      case TokenType::kOpenExpression: {
        ++current_;
        StmtPtr s = MakeStmt(StmtKind::kOutput);
        SPECD_ASSIGN_OR_RETURN(s->expr, ParseExpression());
        SPECD_RETURN_IF_ERROR(Expect(TokenType::kCloseExpression, "'}}'"));
        return s;
      }
      default:
        return Error("unexpected token");
    }
  }

  absl::StatusOr<StmtPtr> ParseStatement() {
    ++current_;  // {%
    const Token* t = Peek();
    if (t == nullptr || t->type != TokenType::kIdentifier) return Error("expected a statement");
    const std::string name = t->value;
    ++current_;
    StmtPtr result;
    if (name == "set") {
      SPECD_ASSIGN_OR_RETURN(result, ParseSet());
    } else if (name == "if") {
      SPECD_ASSIGN_OR_RETURN(result, ParseIf());
      SPECD_RETURN_IF_ERROR(ExpectEndTag("endif"));
    } else if (name == "macro") {
      SPECD_ASSIGN_OR_RETURN(result, ParseMacro());
      SPECD_RETURN_IF_ERROR(ExpectEndTag("endmacro"));
    } else if (name == "for") {
      SPECD_ASSIGN_OR_RETURN(result, ParseFor());
      SPECD_RETURN_IF_ERROR(ExpectEndTag("endfor"));
    } else if (name == "call") {
      SPECD_ASSIGN_OR_RETURN(result, ParseCallBlock());
    } else if (name == "break" || name == "continue") {
      SPECD_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
      result = MakeStmt(name == "break" ? StmtKind::kBreak : StmtKind::kContinue);
    } else if (name == "filter") {
      result = MakeStmt(StmtKind::kFilterBlock);
      SPECD_ASSIGN_OR_RETURN(result->expr, ParsePrimary());
      if (result->expr->kind == ExprKind::kIdentifier && Is(TokenType::kOpenParen)) {
        SPECD_ASSIGN_OR_RETURN(result->expr, ParseCall(std::move(result->expr)));
      }
      SPECD_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
      SPECD_ASSIGN_OR_RETURN(result->body, ParseBlockUntil({"endfilter"}));
      SPECD_RETURN_IF_ERROR(ExpectEndTag("endfilter"));
    } else {
      --current_;
      return Error(absl::StrCat("unknown or unsupported statement '", name, "'"));
    }
    return result;
  }

  absl::StatusOr<StmtPtr> ParseSet() {
    StmtPtr s = MakeStmt(StmtKind::kSet);
    SPECD_ASSIGN_OR_RETURN(s->target, ParseExpressionSequence(/*primary=*/false));
    if (Is(TokenType::kEquals)) {
      ++current_;
      SPECD_ASSIGN_OR_RETURN(s->expr, ParseExpressionSequence(/*primary=*/false));
    } else {
      SPECD_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
      SPECD_ASSIGN_OR_RETURN(s->body, ParseBlockUntil({"endset"}));
      SPECD_RETURN_IF_ERROR(Expect(TokenType::kOpenStatement, "{% endset %}"));
      SPECD_RETURN_IF_ERROR(ExpectIdentifier("endset"));
    }
    SPECD_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
    return s;
  }

  absl::StatusOr<StmtPtr> ParseIf() {
    StmtPtr s = MakeStmt(StmtKind::kIf);
    SPECD_ASSIGN_OR_RETURN(s->expr, ParseExpression());
    SPECD_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
    SPECD_ASSIGN_OR_RETURN(s->body, ParseBlockUntil({"elif", "else", "endif"}));
    if (IsStatement({"elif"})) {
      current_ += 2;
      SPECD_ASSIGN_OR_RETURN(StmtPtr nested, ParseIf());
      s->alternate.push_back(std::move(nested));
    } else if (IsStatement({"else"})) {
      current_ += 2;
      SPECD_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
      SPECD_ASSIGN_OR_RETURN(s->alternate, ParseBlockUntil({"endif"}));
    }
    return s;
  }

  absl::StatusOr<StmtPtr> ParseMacro() {
    StmtPtr s = MakeStmt(StmtKind::kMacro);
    SPECD_ASSIGN_OR_RETURN(s->target, ParsePrimary());
    if (s->target->kind != ExprKind::kIdentifier) return Error("expected a macro name");
    SPECD_ASSIGN_OR_RETURN(s->params, ParseArgs(ArgsMode::kParameters));
    SPECD_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
    SPECD_ASSIGN_OR_RETURN(s->body, ParseBlockUntil({"endmacro"}));
    return s;
  }

  absl::StatusOr<StmtPtr> ParseFor() {
    StmtPtr s = MakeStmt(StmtKind::kFor);
    SPECD_ASSIGN_OR_RETURN(s->target, ParseExpressionSequence(/*primary=*/true));
    if (s->target->kind != ExprKind::kIdentifier && s->target->kind != ExprKind::kTupleLiteral) {
      return Error("expected a loop variable or a tuple of them");
    }
    if (!IsIdentifier({"in"})) return Error("expected 'in' after the loop variable");
    ++current_;
    SPECD_ASSIGN_OR_RETURN(s->expr, ParseExpression());
    SPECD_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
    SPECD_ASSIGN_OR_RETURN(s->body, ParseBlockUntil({"endfor", "else"}));
    if (IsStatement({"else"})) {
      current_ += 2;
      SPECD_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
      SPECD_ASSIGN_OR_RETURN(s->alternate, ParseBlockUntil({"endfor"}));
    }
    return s;
  }

  absl::StatusOr<StmtPtr> ParseCallBlock() {
    StmtPtr s = MakeStmt(StmtKind::kCallBlock);
    if (Is(TokenType::kOpenParen)) {
      SPECD_ASSIGN_OR_RETURN(s->params, ParseArgs(ArgsMode::kParameters));
    }
    SPECD_ASSIGN_OR_RETURN(ExprPtr callee, ParsePrimary());
    if (callee->kind != ExprKind::kIdentifier) return Error("expected a macro name after 'call'");
    ExprPtr call = MakeExpr(ExprKind::kCall);
    call->children.push_back(std::move(callee));
    SPECD_ASSIGN_OR_RETURN(std::vector<ExprPtr> args, ParseArgs(ArgsMode::kCall));
    for (ExprPtr& a : args) call->children.push_back(std::move(a));
    s->expr = std::move(call);
    SPECD_RETURN_IF_ERROR(Expect(TokenType::kCloseStatement, "'%}'"));
    SPECD_ASSIGN_OR_RETURN(s->body, ParseBlockUntil({"endcall"}));
    SPECD_RETURN_IF_ERROR(ExpectEndTag("endcall"));
    return s;
  }

  absl::StatusOr<ExprPtr> ParseExpressionSequence(bool primary) {
    auto parse_one = [&]() { return primary ? ParsePrimary() : ParseExpression(); };
    SPECD_ASSIGN_OR_RETURN(ExprPtr first, parse_one());
    if (!Is(TokenType::kComma)) return first;
    ExprPtr tuple = MakeExpr(ExprKind::kTupleLiteral);
    tuple->children.push_back(std::move(first));
    while (true) {
      ++current_;  // ,
      SPECD_ASSIGN_OR_RETURN(ExprPtr next, parse_one());
      tuple->children.push_back(std::move(next));
      if (!Is(TokenType::kComma)) break;
    }
    return tuple;
  }

  absl::StatusOr<ExprPtr> ParseExpression() {
    const DepthGuard guard(depth_);
    if (guard.exceeded()) return Error("expression nested too deeply");
    SPECD_ASSIGN_OR_RETURN(ExprPtr a, ParseLogicalOr());
    if (!IsIdentifier({"if"})) return a;
    ++current_;
    SPECD_ASSIGN_OR_RETURN(ExprPtr test, ParseLogicalOr());
    if (IsIdentifier({"else"})) {
      ++current_;
      SPECD_ASSIGN_OR_RETURN(ExprPtr otherwise, ParseExpression());
      ExprPtr e = MakeExpr(ExprKind::kTernary);
      e->children.push_back(std::move(test));
      e->children.push_back(std::move(a));
      e->children.push_back(std::move(otherwise));
      return e;
    }
    return MakeExpr(ExprKind::kSelect, "", std::move(a), std::move(test));
  }

  absl::StatusOr<ExprPtr> ParseLogicalOr() {
    SPECD_ASSIGN_OR_RETURN(ExprPtr left, ParseLogicalAnd());
    while (IsIdentifier({"or"})) {
      ++current_;
      SPECD_ASSIGN_OR_RETURN(ExprPtr right, ParseLogicalAnd());
      left = MakeExpr(ExprKind::kBinary, "or", std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseLogicalAnd() {
    SPECD_ASSIGN_OR_RETURN(ExprPtr left, ParseLogicalNot());
    while (IsIdentifier({"and"})) {
      ++current_;
      SPECD_ASSIGN_OR_RETURN(ExprPtr right, ParseLogicalNot());
      left = MakeExpr(ExprKind::kBinary, "and", std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseLogicalNot() {
    const DepthGuard guard(depth_);
    if (guard.exceeded()) return Error("expression nested too deeply");
    ExprPtr result;
    while (IsIdentifier({"not"})) {
      ++current_;
      SPECD_ASSIGN_OR_RETURN(ExprPtr arg, ParseLogicalNot());
      result = MakeExpr(ExprKind::kUnary, "not", std::move(arg));
    }
    if (result != nullptr) return result;
    return ParseComparison();
  }

  absl::StatusOr<ExprPtr> ParseComparison() {
    SPECD_ASSIGN_OR_RETURN(ExprPtr left, ParseAdditive());
    while (true) {
      std::string op;
      if (IsIdentifier({"not", "in"})) {
        op = "not in";
        current_ += 2;
      } else if (IsIdentifier({"in"})) {
        op = "in";
        ++current_;
      } else if (Is(TokenType::kComparisonOperator)) {
        op = tokens_[current_++].value;
      } else {
        break;
      }
      SPECD_ASSIGN_OR_RETURN(ExprPtr right, ParseAdditive());
      left = MakeExpr(ExprKind::kBinary, op, std::move(left), std::move(right));
    }
    return left;
  }

  // One left-associative binary level: operands from `next`, operators of `type`.
  template <typename Next>
  absl::StatusOr<ExprPtr> ParseBinaryLevel(TokenType type, Next next) {
    SPECD_ASSIGN_OR_RETURN(ExprPtr left, (this->*next)());
    while (Is(type)) {
      std::string op = tokens_[current_++].value;
      SPECD_ASSIGN_OR_RETURN(ExprPtr right, (this->*next)());
      left = MakeExpr(ExprKind::kBinary, std::move(op), std::move(left), std::move(right));
    }
    return left;
  }
  absl::StatusOr<ExprPtr> ParseAdditive() {
    return ParseBinaryLevel(TokenType::kAdditiveOperator, &Parser::ParseMultiplicative);
  }
  absl::StatusOr<ExprPtr> ParseMultiplicative() {
    return ParseBinaryLevel(TokenType::kMultiplicativeOperator, &Parser::ParsePower);
  }
  // Unlike Python, Jinja's ** is left-associative.
  absl::StatusOr<ExprPtr> ParsePower() {
    return ParseBinaryLevel(TokenType::kExponentiationOperator, &Parser::ParseTest);
  }

  absl::StatusOr<ExprPtr> ParseTest() {
    SPECD_ASSIGN_OR_RETURN(ExprPtr operand, ParseFilter());
    while (IsIdentifier({"is"})) {
      ++current_;
      const bool negate = IsIdentifier({"not"});
      if (negate) ++current_;
      SPECD_ASSIGN_OR_RETURN(ExprPtr test, ParsePrimary());
      if (test->kind != ExprKind::kIdentifier) return Error("expected the name of a test");
      operand = MakeExpr(ExprKind::kTest, test->name, std::move(operand));
      operand->flag = negate;
    }
    return operand;
  }

  absl::StatusOr<ExprPtr> ParseFilter() {
    SPECD_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnarySign());
    while (Is(TokenType::kPipe)) {
      ++current_;
      SPECD_ASSIGN_OR_RETURN(ExprPtr filter, ParsePrimary());
      if (filter->kind != ExprKind::kIdentifier) return Error("expected the name of a filter");
      if (Is(TokenType::kOpenParen)) {
        SPECD_ASSIGN_OR_RETURN(filter, ParseCall(std::move(filter)));
      }
      operand = MakeExpr(ExprKind::kFilter, "", std::move(operand), std::move(filter));
    }
    return operand;
  }

  absl::StatusOr<ExprPtr> ParseUnarySign() {
    const DepthGuard guard(depth_);
    if (guard.exceeded()) return Error("expression nested too deeply");
    const Token* t = Peek();
    if (t != nullptr &&
        (t->type == TokenType::kUnaryOperator || t->type == TokenType::kAdditiveOperator) &&
        (t->value == "-" || t->value == "+")) {
      std::string op = t->value;
      ++current_;
      SPECD_ASSIGN_OR_RETURN(ExprPtr arg, ParseUnarySign());
      return MakeExpr(ExprKind::kUnary, std::move(op), std::move(arg));
    }
    SPECD_ASSIGN_OR_RETURN(ExprPtr primary, ParsePrimary());
    SPECD_ASSIGN_OR_RETURN(ExprPtr member, ParseMember(std::move(primary)));
    if (Is(TokenType::kOpenParen)) return ParseCall(std::move(member));
    return member;
  }

  // callee(args), then any .member, [index] and further calls.
  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    const DepthGuard guard(depth_);
    if (guard.exceeded()) return Error("calls chained too deeply");
    ExprPtr call = MakeExpr(ExprKind::kCall);
    call->children.push_back(std::move(callee));
    SPECD_ASSIGN_OR_RETURN(std::vector<ExprPtr> args, ParseArgs(ArgsMode::kCall));
    for (ExprPtr& a : args) call->children.push_back(std::move(a));
    SPECD_ASSIGN_OR_RETURN(ExprPtr expr, ParseMember(std::move(call)));
    if (Is(TokenType::kOpenParen)) return ParseCall(std::move(expr));
    return expr;
  }

  absl::StatusOr<std::vector<ExprPtr>> ParseArgs(ArgsMode mode) {
    SPECD_RETURN_IF_ERROR(Expect(TokenType::kOpenParen, "'('"));
    std::vector<ExprPtr> args;
    absl::flat_hash_set<std::string> names;
    bool saw_keyword = false;
    bool saw_spread = false;
    while (!Is(TokenType::kCloseParen)) {
      const bool keyword_spread = Is(TokenType::kExponentiationOperator);
      const bool spread = Is(TokenType::kMultiplicativeOperator) && Peek()->value == "*";
      if (mode == ArgsMode::kParameters && (keyword_spread || spread)) {
        return Error("argument unpacking is not allowed in parameter declarations");
      }
      if (keyword_spread) {
        ++current_;
        SPECD_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
        args.push_back(MakeExpr(ExprKind::kKeywordSpread, "", std::move(value)));
        if (Is(TokenType::kComma)) ++current_;
        if (!Is(TokenType::kCloseParen)) return Error("`**` must be the final argument");
        break;
      }
      ExprPtr argument;
      if (spread) {
        if (saw_spread) return Error("only one `*` argument unpacking is allowed");
        saw_spread = true;
        ++current_;
        SPECD_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
        argument = MakeExpr(ExprKind::kSpread, "", std::move(value));
      } else {
        SPECD_ASSIGN_OR_RETURN(argument, ParseExpression());
        if (Is(TokenType::kEquals)) {
          ++current_;
          if (argument->kind != ExprKind::kIdentifier) {
            return Error(mode == ArgsMode::kParameters ? "expected a parameter name"
                                                       : "expected a keyword argument name");
          }
          SPECD_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
          argument = MakeExpr(ExprKind::kKeywordArgument, argument->name, std::move(value));
        }
        if (mode == ArgsMode::kParameters) {
          if (argument->kind != ExprKind::kIdentifier &&
              argument->kind != ExprKind::kKeywordArgument) {
            return Error("expected a parameter name");
          }
          if (!names.insert(argument->name).second) {
            return Error(absl::StrCat("duplicate parameter name '", argument->name, "'"));
          }
        }
        if (argument->kind == ExprKind::kKeywordArgument) {
          saw_keyword = true;
        } else if (saw_keyword) {
          return Error(mode == ArgsMode::kCall
                           ? "positional arguments must come before keyword arguments"
                           : "a parameter without default follows one with a default");
        } else if (saw_spread) {
          return Error("positional arguments must not follow `*` argument unpacking");
        }
      }
      args.push_back(std::move(argument));
      if (Is(TokenType::kComma)) ++current_;
    }
    SPECD_RETURN_IF_ERROR(Expect(TokenType::kCloseParen, "')'"));
    return args;
  }

  // The inside of obj[...]: an index expression or a slice start:stop:step.
  absl::StatusOr<ExprPtr> ParseSubscript() {
    std::vector<ExprPtr> parts;
    bool is_slice = false;
    while (!Is(TokenType::kCloseSquareBracket)) {
      if (Is(TokenType::kColon)) {
        parts.push_back(nullptr);
        ++current_;
        is_slice = true;
      } else {
        SPECD_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression());
        parts.push_back(std::move(e));
        if (Is(TokenType::kColon)) {
          ++current_;
          is_slice = true;
        }
      }
    }
    if (parts.empty()) return Error("expected an index or a slice inside []");
    if (!is_slice) return std::move(parts[0]);
    if (parts.size() > 3) return Error("a slice takes at most 3 parts");
    ExprPtr slice = MakeExpr(ExprKind::kSlice);
    parts.resize(3);
    slice->children = std::move(parts);
    return slice;
  }

  absl::StatusOr<ExprPtr> ParseMember(ExprPtr object) {
    while (Is(TokenType::kDot) || Is(TokenType::kOpenSquareBracket)) {
      const bool computed = Is(TokenType::kOpenSquareBracket);
      ++current_;
      ExprPtr property;
      if (computed) {
        SPECD_ASSIGN_OR_RETURN(property, ParseSubscript());
        SPECD_RETURN_IF_ERROR(Expect(TokenType::kCloseSquareBracket, "']'"));
      } else {
        SPECD_ASSIGN_OR_RETURN(property, ParsePrimary());
        if (property->kind != ExprKind::kIdentifier &&
            property->kind != ExprKind::kIntegerLiteral) {
          return Error("expected a name or an integer after '.'");
        }
      }
      object = MakeExpr(ExprKind::kMember, "", std::move(object), std::move(property));
      object->flag = computed;
    }
    return object;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token* t = Peek();
    if (t == nullptr) return Error("unexpected end of template in an expression");
    ++current_;
    switch (t->type) {
      case TokenType::kNumericLiteral: {
        if (t->value.find('.') != std::string::npos) {
          ExprPtr e = MakeExpr(ExprKind::kFloatLiteral);
          if (!absl::SimpleAtod(t->value, &e->number)) return Error("bad number");
          return e;
        }
        ExprPtr e = MakeExpr(ExprKind::kIntegerLiteral);
        if (!absl::SimpleAtoi(t->value, &e->integer)) {
          return Error(absl::StrCat("integer literal ", t->value, " is out of range"));
        }
        return e;
      }
      case TokenType::kStringLiteral: {
        // Adjacent string literals are one string.
        std::string value = t->value;
        while (Is(TokenType::kStringLiteral)) value += tokens_[current_++].value;
        return MakeExpr(ExprKind::kStringLiteral, std::move(value));
      }
      case TokenType::kIdentifier:
        return MakeExpr(ExprKind::kIdentifier, t->value);
      case TokenType::kOpenParen: {
        SPECD_ASSIGN_OR_RETURN(ExprPtr e, ParseExpressionSequence(/*primary=*/false));
        SPECD_RETURN_IF_ERROR(Expect(TokenType::kCloseParen, "')'"));
        return e;
      }
      case TokenType::kOpenSquareBracket: {
        ExprPtr e = MakeExpr(ExprKind::kArrayLiteral);
        while (!Is(TokenType::kCloseSquareBracket)) {
          SPECD_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
          e->children.push_back(std::move(item));
          if (Is(TokenType::kComma)) ++current_;
        }
        ++current_;
        return e;
      }
      case TokenType::kOpenCurlyBracket: {
        ExprPtr e = MakeExpr(ExprKind::kObjectLiteral);
        while (!Is(TokenType::kCloseCurlyBracket)) {
          SPECD_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression());
          SPECD_RETURN_IF_ERROR(Expect(TokenType::kColon, "':' in an object literal"));
          SPECD_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
          e->children.push_back(std::move(key));
          e->children.push_back(std::move(value));
          if (Is(TokenType::kComma)) ++current_;
        }
        ++current_;
        return e;
      }
      default:
        --current_;
        return Error("unexpected token in an expression");
    }
  }

  const std::vector<Token>& tokens_;
  size_t current_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<Block> Parse(const std::vector<Token>& tokens) { return Parser(tokens).Run(); }

}  // namespace specd::chat
