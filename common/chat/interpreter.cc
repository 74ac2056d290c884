#include "common/chat/interpreter.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/absl_string.h"
#include "base/status_macros.h"
#include "common/chat/builtins.h"
#include "common/chat/js_text.h"

namespace specd::chat {
namespace {

// {% break %} and {% continue %} travel up to their loop as a status with this payload, through
// if blocks, set blocks and macro calls alike (the reference throws an exception).
constexpr char kLoopControlPayload[] = "specd.chat/loop-control";

absl::Status LoopControl(bool is_break) {
  absl::Status status(absl::StatusCode::kAborted, is_break ? "break" : "continue");
  status.SetPayload(kLoopControlPayload, absl::Cord(is_break ? "break" : "continue"));
  return status;
}

std::optional<bool> LoopControlIsBreak(const absl::Status& status) {
  const auto payload = status.GetPayload(kLoopControlPayload);
  if (!payload) return std::nullopt;
  return *payload == "break";
}

absl::StatusOr<Value> CheckedInt(double value, std::string_view what) {
  if (!std::isfinite(value) || std::fabs(value) >= 9.2e18) {
    return TemplateError(absl::StrCat(ToAbsl(what), " is out of the supported integer range"));
  }
  return Value::Int(static_cast<int64_t>(value));
}

bool MentionsName(const Expr& expr, std::string_view name) {
  if (expr.kind == ExprKind::kIdentifier && expr.name == name) return true;
  // A filter's or test's name is syntax, not a variable.
  for (const ExprPtr& child : expr.children) {
    if (child != nullptr && MentionsName(*child, name)) return true;
  }
  return false;
}

bool MentionsName(const Block& block, std::string_view name) {
  for (const StmtPtr& s : block) {
    for (const Expr* e : {s->expr.get(), s->target.get()}) {
      if (e != nullptr && MentionsName(*e, name)) return true;
    }
    for (const ExprPtr& p : s->params) {
      if (MentionsName(*p, name)) return true;
    }
    if (MentionsName(s->body, name) || MentionsName(s->alternate, name)) return true;
  }
  return false;
}

// Python-style slice bounds as the reference's slice() computes them.
std::vector<int64_t> SliceIndices(int64_t length, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, int64_t step) {
  std::vector<int64_t> out;
  if (step > 0 || step == 0) {
    int64_t b = start.value_or(0);
    b = b < 0 ? std::max<int64_t>(length + b, 0) : std::min(b, length);
    int64_t e = stop.value_or(length);
    e = e < 0 ? std::max<int64_t>(length + e, 0) : std::min(e, length);
    if (step == 0) return out;  // the reference's loop never runs
    for (int64_t i = b; i < e; i += step) out.push_back(i);
  } else {
    int64_t b = start.value_or(length - 1);
    b = b < 0 ? std::max<int64_t>(length + b, -1) : std::min(b, length - 1);
    int64_t e = stop.value_or(-1);
    e = e < -1 ? std::max<int64_t>(length + e, -1) : std::min(e, length - 1);
    for (int64_t i = b; i > e; i += step) out.push_back(i);
  }
  return out;
}

}  // namespace

absl::Status TemplateError(std::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("chat template error: ", ToAbsl(message)));
}

Value Scope::Lookup(std::string_view name) const {
  if (name == "namespace" && !HasOwn(name)) return NamespaceFunction();
  for (const Scope* s = this; s != nullptr; s = s->parent) {
    const auto it = s->vars.find(ToAbsl(name));
    if (it != s->vars.end()) return it->second;
  }
  return Value();
}

Interpreter::~Interpreter() {
  for (const Value& ns : namespaces_) ns.mutable_object().entries.clear();
}

absl::StatusOr<std::string> Interpreter::Run(const Block& program, Scope& global) {
  absl::StatusOr<std::string> out = ExecBlock(program, global);
  if (out.ok()) return out;
  const absl::Status& status = out.status();
  if (LoopControlIsBreak(status).has_value()) {
    return TemplateError(absl::StrCat("{% ", status.message(), " %} outside a loop"));
  }
  if (status.GetPayload(kRaisedPayload).has_value()) {
    return absl::InvalidArgumentError(status.message());  // the template's words, unprefixed
  }
  if (!absl::StartsWith(status.message(), "chat template error: ")) {
    return TemplateError(std::string(status.message()));
  }
  return status;
}

absl::StatusOr<std::string> Interpreter::ExecBlock(const Block& block, Scope& scope) {
  std::string out;
  for (const StmtPtr& stmt : block) {
    SPECD_ASSIGN_OR_RETURN(const Value v, Exec(*stmt, scope));
    if (v.is_null() || v.is_undefined()) continue;
    SPECD_ASSIGN_OR_RETURN(const std::string text, v.ToDisplay());
    out += text;
  }
  return out;
}

absl::Status Interpreter::Charge(int64_t units) {
  work_ += units;
  if (work_ <= work_limit_) return absl::OkStatus();
  return TemplateError(absl::StrCat(
      "the template did more than ", work_limit_,
      " units of work (statements, expressions and the bytes or items of their values) for "
      "this conversation; a chat template should take time in proportion to the conversation"));
}

absl::StatusOr<Value> Interpreter::Exec(const Stmt& stmt, Scope& scope) {
  SPECD_RETURN_IF_ERROR(Charge(1));
  switch (stmt.kind) {
    case StmtKind::kOutput:
      return Evaluate(*stmt.expr, scope);
    case StmtKind::kIf: {
      SPECD_ASSIGN_OR_RETURN(const Value test, Evaluate(*stmt.expr, scope));
      SPECD_ASSIGN_OR_RETURN(std::string out,
                             ExecBlock(test.Truthy() ? stmt.body : stmt.alternate, scope));
      return Value::String(std::move(out));
    }
    case StmtKind::kFor:
      return ExecFor(stmt, scope);
    case StmtKind::kSet:
      return ExecSet(stmt, scope);
    case StmtKind::kMacro:
      return ExecMacro(stmt, scope);
    case StmtKind::kCallBlock:
      return ExecCallBlock(stmt, scope);
    case StmtKind::kFilterBlock: {
      SPECD_ASSIGN_OR_RETURN(std::string body, ExecBlock(stmt.body, scope));
      return ApplyFilter(*this, Value::String(std::move(body)), *stmt.expr, scope);
    }
    case StmtKind::kBreak:
      return LoopControl(/*is_break=*/true);
    case StmtKind::kContinue:
      return LoopControl(/*is_break=*/false);
    case StmtKind::kComment:
      return Value::Null();
  }
  return TemplateError("unknown statement");
}

absl::StatusOr<Value> Interpreter::ExecFor(const Stmt& stmt, Scope& scope) {
  Scope loop_scope(&scope);
  const Expr* test = nullptr;
  Value iterable;
  if (stmt.expr->kind == ExprKind::kSelect) {
    SPECD_ASSIGN_OR_RETURN(iterable, Evaluate(*stmt.expr->children[0], loop_scope));
    test = stmt.expr->children[1].get();
  } else {
    SPECD_ASSIGN_OR_RETURN(iterable, Evaluate(*stmt.expr, loop_scope));
  }
  if (!iterable.is_array() && !iterable.is_object()) {
    return TemplateError(
        absl::StrCat("a for loop needs a list or an object, got ", iterable.TypeName()));
  }
  ValueList all;
  if (iterable.is_object()) {
    for (const auto& [key, value] : iterable.object().entries) all.push_back(Value::String(key));
  } else {
    all = iterable.array().items;
  }
  const Expr& target = *stmt.target;
  // Checked for every item before the first iteration, as in the reference.
  for (const Value& item : all) {
    if (target.kind != ExprKind::kTupleLiteral) break;
    if (!item.is_array() || item.array().tuple) {
      return TemplateError(absl::StrCat("cannot unpack a ", item.TypeName(), " in a for loop"));
    }
    if (item.array().items.size() != target.children.size()) {
      return TemplateError(
          absl::StrCat("too ", target.children.size() > item.array().items.size() ? "few" : "many",
                       " items to unpack in a for loop"));
    }
  }
  auto bind = [&](const Value& item, Scope& into) -> absl::Status {
    if (target.kind == ExprKind::kIdentifier) {
      into.Set(target.name, item);
      return absl::OkStatus();
    }
    for (size_t j = 0; j < target.children.size(); ++j) {
      if (target.children[j]->kind != ExprKind::kIdentifier) {
        return TemplateError("a for loop can only unpack into names");
      }
      into.Set(target.children[j]->name, item.array().items[j]);
    }
    return absl::OkStatus();
  };
  ValueList items;
  for (const Value& item : all) {
    if (test != nullptr) {
      Scope test_scope(&loop_scope);
      SPECD_RETURN_IF_ERROR(bind(item, test_scope));
      SPECD_ASSIGN_OR_RETURN(const Value keep, Evaluate(*test, test_scope));
      if (!keep.Truthy()) continue;
    }
    items.push_back(item);
  }

  std::string out;
  bool no_iteration = true;
  const auto n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    // An iteration builds the nine-attribute `loop` object before its body runs.
    SPECD_RETURN_IF_ERROR(Charge(10));
    ObjectData loop;
    loop.Set("index", Value::Int(i + 1));
    loop.Set("index0", Value::Int(i));
    loop.Set("revindex", Value::Int(n - i));
    loop.Set("revindex0", Value::Int(n - i - 1));
    loop.Set("first", Value::Bool(i == 0));
    loop.Set("last", Value::Bool(i == n - 1));
    loop.Set("length", Value::Int(n));
    loop.Set("previtem", i > 0 ? items[i - 1] : Value());
    loop.Set("nextitem", i < n - 1 ? items[i + 1] : Value());
    loop_scope.Set("loop", Value::Object(std::move(loop)));
    SPECD_RETURN_IF_ERROR(bind(items[i], loop_scope));
    absl::StatusOr<std::string> body = ExecBlock(stmt.body, loop_scope);
    if (!body.ok()) {
      // An interrupted iteration's partial output is dropped, as in the reference.
      const std::optional<bool> is_break = LoopControlIsBreak(body.status());
      if (!is_break.has_value()) return body.status();
      if (*is_break) break;
      continue;
    }
    out += *body;
    no_iteration = false;
  }
  if (no_iteration) {
    SPECD_ASSIGN_OR_RETURN(std::string alternate, ExecBlock(stmt.alternate, loop_scope));
    out += alternate;
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> Interpreter::ExecSet(const Stmt& stmt, Scope& scope) {
  Value rhs;
  if (stmt.expr != nullptr) {
    SPECD_ASSIGN_OR_RETURN(rhs, Evaluate(*stmt.expr, scope));
  } else {
    SPECD_ASSIGN_OR_RETURN(std::string body, ExecBlock(stmt.body, scope));
    rhs = Value::String(std::move(body));
  }
  if (rhs.depth() >= kMaxValueDepth) {
    return TemplateError(
        absl::StrCat("values nested deeper than ", kMaxValueDepth, " are not supported"));
  }
  const Expr& target = *stmt.target;
  switch (target.kind) {
    case ExprKind::kIdentifier:
      scope.Set(target.name, std::move(rhs));
      break;
    case ExprKind::kTupleLiteral: {
      if (!rhs.is_array()) {
        return TemplateError(absl::StrCat("cannot unpack a ", rhs.TypeName(), " in set"));
      }
      const ValueList& values = rhs.array().items;
      if (values.size() != target.children.size()) {
        return TemplateError(absl::StrCat("too ",
                                          target.children.size() > values.size() ? "few" : "many",
                                          " items to unpack in set"));
      }
      for (size_t i = 0; i < values.size(); ++i) {
        if (target.children[i]->kind != ExprKind::kIdentifier) {
          return TemplateError("set can only unpack into names");
        }
        scope.Set(target.children[i]->name, values[i]);
      }
      break;
    }
    case ExprKind::kMember: {
      SPECD_ASSIGN_OR_RETURN(const Value object, Evaluate(*target.children[0], scope));
      if (object.type() != Value::Type::kNamespace) {
        return TemplateError("cannot assign an attribute of anything but a namespace()");
      }
      if (target.children[1]->kind != ExprKind::kIdentifier) {
        return TemplateError("cannot assign to a member with a non-name property");
      }
      object.mutable_object().Set(target.children[1]->name, std::move(rhs));
      break;
    }
    default:
      return TemplateError("invalid target of set");
  }
  return Value::Null();
}

absl::Status Interpreter::BindParameters(std::string_view name, const std::vector<ExprPtr>& params,
                                         const Block& body, const CallArgs& args, Scope& scope) {
  std::vector<std::pair<std::string, Value>> keywords = args.keywords;
  std::vector<std::pair<std::string, const Expr*>> pending_defaults;
  bool declares_kwargs = false;
  bool declares_varargs = false;
  for (size_t i = 0; i < params.size(); ++i) {
    const Expr& param = *params[i];
    const std::string& pname = param.name;
    declares_kwargs |= pname == "kwargs";
    declares_varargs |= pname == "varargs";
    std::optional<Value> value;
    if (i < args.positional.size()) value = args.positional[i];
    if (!value) {
      const auto it = std::find_if(keywords.begin(), keywords.end(),
                                   [&](const auto& kv) { return kv.first == pname; });
      if (it != keywords.end()) {
        value = std::move(it->second);
        keywords.erase(it);
      }
    }
    if (!value && param.kind == ExprKind::kKeywordArgument) {
      pending_defaults.emplace_back(pname, param.children[0].get());
    }
    scope.Set(pname, value.value_or(Value()));
  }
  // `kwargs` and `varargs` exist where the body reads them (and no parameter has the name).
  if (!declares_kwargs && MentionsName(body, "kwargs")) {
    ObjectData extra;
    for (auto& [k, v] : keywords) extra.Set(k, std::move(v));
    scope.Set("kwargs", Value::Object(std::move(extra)));
  } else if (!keywords.empty()) {
    return TemplateError(absl::StrCat("macro ", ToAbsl(name), " takes no keyword argument '",
                                      keywords[0].first, "'"));
  }
  if (!declares_varargs && MentionsName(body, "varargs")) {
    ValueList rest;
    for (size_t i = params.size(); i < args.positional.size(); ++i) {
      rest.push_back(args.positional[i]);
    }
    scope.Set("varargs", Value::Array(std::move(rest)));
  } else if (args.positional.size() > params.size()) {
    return TemplateError(absl::StrCat("macro ", ToAbsl(name), " takes not more than ",
                                      params.size(), " argument(s)"));
  }
  for (const auto& [pname, expr] : pending_defaults) {
    SPECD_ASSIGN_OR_RETURN(Value v, Evaluate(*expr, scope));
    scope.Set(pname, std::move(v));
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Interpreter::ExecMacro(const Stmt& stmt, Scope& scope) {
  const Stmt* macro = &stmt;
  scope.Set(stmt.target->name,
            Value::Function(stmt.target->name,
                            [macro](const CallArgs& args, Interpreter& interp,
                                    Scope& caller) -> absl::StatusOr<Value> {
                              Scope macro_scope(&caller);
                              SPECD_RETURN_IF_ERROR(interp.BindParameters(
                                  absl::StrCat("'", macro->target->name, "'"), macro->params,
                                  macro->body, args, macro_scope));
                              SPECD_ASSIGN_OR_RETURN(std::string out,
                                                     interp.ExecBlock(macro->body, macro_scope));
                              return Value::String(std::move(out));
                            }));
  return Value::Null();
}

absl::StatusOr<Value> Interpreter::ExecCallBlock(const Stmt& stmt, Scope& scope) {
  const Stmt* block = &stmt;
  Scope* defining = &scope;
  // caller() runs in the call block's scope, so it must not outlive it (a template could store
  // it in a namespace).
  auto alive = std::make_shared<bool>(true);
  struct Expire {
    std::shared_ptr<bool> alive;
    ~Expire() { *alive = false; }
  } expire{alive};
  const Value caller = Value::Function(
      "caller",
      [block, defining, alive](const CallArgs& args, Interpreter& interp,
                               Scope&) -> absl::StatusOr<Value> {
        if (!*alive) return TemplateError("caller() used outside its call block");
        Scope call_scope(defining);
        SPECD_RETURN_IF_ERROR(
            interp.BindParameters("None", block->params, block->body, args, call_scope));
        SPECD_ASSIGN_OR_RETURN(std::string out, interp.ExecBlock(block->body, call_scope));
        return Value::String(std::move(out));
      });
  const Expr& call = *stmt.expr;
  SPECD_ASSIGN_OR_RETURN(
      const CallArgs args,
      EvaluateArguments(std::span<const ExprPtr>(call.children).subspan(1), scope));
  SPECD_ASSIGN_OR_RETURN(const Value fn, Evaluate(*call.children[0], scope));
  Scope call_env(&scope);
  call_env.Set("caller", caller);
  return CallFunction(fn, args, call_env);
}

absl::StatusOr<CallArgs> Interpreter::EvaluateArguments(std::span<const ExprPtr> args,
                                                        Scope& scope) {
  CallArgs out;
  // The whole positional part is evaluated before any keyword value, as in Python.
  for (const ExprPtr& arg : args) {
    if (arg->kind == ExprKind::kSpread) {
      SPECD_ASSIGN_OR_RETURN(const Value v, Evaluate(*arg->children[0], scope));
      if (!v.is_array()) return TemplateError(absl::StrCat("cannot unpack a ", v.TypeName()));
      for (const Value& item : v.array().items) out.positional.push_back(item);
    } else if (arg->kind != ExprKind::kKeywordArgument && arg->kind != ExprKind::kKeywordSpread) {
      SPECD_ASSIGN_OR_RETURN(Value v, Evaluate(*arg, scope));
      out.positional.push_back(std::move(v));
    }
  }
  auto add_keyword = [&](const std::string& key, Value v) -> absl::Status {
    if (out.Keyword(key) != nullptr) {
      return TemplateError(absl::StrCat("got multiple values for keyword argument '", key, "'"));
    }
    out.keywords.emplace_back(key, std::move(v));
    return absl::OkStatus();
  };
  for (const ExprPtr& arg : args) {
    if (arg->kind == ExprKind::kKeywordArgument) {
      SPECD_ASSIGN_OR_RETURN(Value v, Evaluate(*arg->children[0], scope));
      SPECD_RETURN_IF_ERROR(add_keyword(arg->name, std::move(v)));
    } else if (arg->kind == ExprKind::kKeywordSpread) {
      SPECD_ASSIGN_OR_RETURN(const Value v, Evaluate(*arg->children[0], scope));
      if (!v.is_object()) {
        return TemplateError(
            absl::StrCat("argument after ** must be a mapping, not ", v.TypeName()));
      }
      for (const auto& [key, value] : v.object().entries) {
        SPECD_RETURN_IF_ERROR(add_keyword(key, value));
      }
    }
  }
  return out;
}

absl::StatusOr<Value> Interpreter::CallFunction(const Value& fn, const CallArgs& args,
                                                Scope& scope) {
  if (fn.type() != Value::Type::kFunction) {
    return TemplateError(absl::StrCat("cannot call a ", fn.TypeName()));
  }
  // Bounds recursive macros, which would otherwise exhaust the stack.
  if (call_depth_ >= kMaxCallDepth) {
    return TemplateError(
        absl::StrCat("calls nested deeper than ", kMaxCallDepth, " (a recursive macro?)"));
  }
  ++call_depth_;
  absl::StatusOr<Value> result = fn.function()(args, *this, scope);
  --call_depth_;
  return result;
}

absl::StatusOr<Value> Interpreter::Evaluate(const Expr& expr, Scope& scope) {
  SPECD_RETURN_IF_ERROR(Charge(1));
  SPECD_ASSIGN_OR_RETURN(Value value, EvaluateExpr(expr, scope));
  int64_t size = 0;
  if (value.is_string()) {
    size = static_cast<int64_t>(value.str().size());
  } else if (value.is_array()) {
    size = static_cast<int64_t>(value.array().items.size());
  } else if (value.is_attribute_container()) {
    size = static_cast<int64_t>(value.object().entries.size());
  }
  SPECD_RETURN_IF_ERROR(Charge(size));
  return value;
}

absl::StatusOr<Value> Interpreter::EvaluateExpr(const Expr& expr, Scope& scope) {
  switch (expr.kind) {
    case ExprKind::kIdentifier:
      return scope.Lookup(expr.name);
    case ExprKind::kIntegerLiteral:
      return Value::Int(expr.integer);
    case ExprKind::kFloatLiteral:
      return Value::Float(expr.number);
    case ExprKind::kStringLiteral:
      return Value::String(expr.name);
    case ExprKind::kArrayLiteral:
    case ExprKind::kTupleLiteral: {
      ValueList items;
      for (const ExprPtr& child : expr.children) {
        SPECD_ASSIGN_OR_RETURN(Value v, Evaluate(*child, scope));
        items.push_back(std::move(v));
      }
      return Value::Array(std::move(items), expr.kind == ExprKind::kTupleLiteral);
    }
    case ExprKind::kObjectLiteral: {
      ObjectData data;
      for (size_t i = 0; i + 1 < expr.children.size(); i += 2) {
        SPECD_ASSIGN_OR_RETURN(const Value key, Evaluate(*expr.children[i], scope));
        if (!key.is_string()) {
          return TemplateError(absl::StrCat("object keys must be strings, got ", key.TypeName()));
        }
        SPECD_ASSIGN_OR_RETURN(Value value, Evaluate(*expr.children[i + 1], scope));
        data.Set(key.str(), std::move(value));
      }
      return Value::Object(std::move(data));
    }
    case ExprKind::kMember:
      return EvaluateMember(expr, scope);
    case ExprKind::kCall: {
      SPECD_ASSIGN_OR_RETURN(
          const CallArgs args,
          EvaluateArguments(std::span<const ExprPtr>(expr.children).subspan(1), scope));
      SPECD_ASSIGN_OR_RETURN(const Value fn, Evaluate(*expr.children[0], scope));
      return CallFunction(fn, args, scope);
    }
    case ExprKind::kBinary:
      return EvaluateBinary(expr, scope);
    case ExprKind::kUnary:
      return EvaluateUnary(expr, scope);
    case ExprKind::kFilter: {
      SPECD_ASSIGN_OR_RETURN(const Value operand, Evaluate(*expr.children[0], scope));
      return ApplyFilter(*this, operand, *expr.children[1], scope);
    }
    case ExprKind::kTest: {
      SPECD_ASSIGN_OR_RETURN(const Value operand, Evaluate(*expr.children[0], scope));
      SPECD_ASSIGN_OR_RETURN(const bool result, ApplyTest(expr.name, operand, nullptr));
      return Value::Bool(expr.flag ? !result : result);
    }
    case ExprKind::kSelect: {
      SPECD_ASSIGN_OR_RETURN(const Value test, Evaluate(*expr.children[1], scope));
      if (!test.Truthy()) return Value();
      return Evaluate(*expr.children[0], scope);
    }
    case ExprKind::kTernary: {
      SPECD_ASSIGN_OR_RETURN(const Value test, Evaluate(*expr.children[0], scope));
      return Evaluate(*expr.children[test.Truthy() ? 1 : 2], scope);
    }
    default:
      return TemplateError("this expression cannot be evaluated here");
  }
}

absl::StatusOr<Value> Interpreter::EvaluateMember(const Expr& expr, Scope& scope) {
  SPECD_ASSIGN_OR_RETURN(const Value object, Evaluate(*expr.children[0], scope));
  const Expr& prop = *expr.children[1];
  Value property;
  if (expr.flag) {
    if (prop.kind == ExprKind::kSlice) return EvaluateSlice(object, prop, scope);
    SPECD_ASSIGN_OR_RETURN(property, Evaluate(prop, scope));
  } else if (prop.kind == ExprKind::kIntegerLiteral) {
    property = Value::Int(prop.integer);
  } else {
    property = Value::String(prop.name);
  }

  if (object.is_attribute_container()) {
    if (!property.is_string()) {
      return TemplateError(
          absl::StrCat("cannot look up a ", property.TypeName(), " in an ", object.TypeName()));
    }
    if (const Value* v = object.object().Find(property.str())) return *v;
    return object.is_object() ? MemberBuiltin(object, property.str()) : Value();
  }
  if (object.is_array() || object.is_string()) {
    if (property.type() == Value::Type::kInt) {
      if (object.is_string()) {
        SPECD_ASSIGN_OR_RETURN(const std::optional<std::string> c,
                               Utf16At(object.str(), property.int_value()));
        return c ? Value::String(*c) : Value();
      }
      const ValueList& items = object.array().items;
      int64_t i = property.int_value();
      if (i < 0) i += static_cast<int64_t>(items.size());
      if (i < 0 || i >= static_cast<int64_t>(items.size())) return Value();
      return items[i];
    }
    if (property.is_string()) return MemberBuiltin(object, property.str());
    return TemplateError(
        absl::StrCat("cannot index a ", object.TypeName(), " with a ", property.TypeName()));
  }
  if (!property.is_string()) {
    return TemplateError(
        absl::StrCat("cannot look up a ", property.TypeName(), " in a ", object.TypeName()));
  }
  return MemberBuiltin(object, property.str());
}

absl::StatusOr<Value> Interpreter::EvaluateSlice(const Value& object, const Expr& slice,
                                                 Scope& scope) {
  if (!object.is_array() && !object.is_string()) {
    return TemplateError(absl::StrCat("cannot slice a ", object.TypeName()));
  }
  std::optional<int64_t> bounds[3];
  for (int k = 0; k < 3; ++k) {
    if (slice.children[k] == nullptr) continue;
    SPECD_ASSIGN_OR_RETURN(const Value v, Evaluate(*slice.children[k], scope));
    if (v.is_undefined()) continue;
    if (v.type() != Value::Type::kInt) {
      return TemplateError(absl::StrCat("slice bounds must be integers, got ", v.TypeName()));
    }
    bounds[k] = v.int_value();
  }
  const int64_t step = bounds[2].value_or(1);
  if (object.is_array()) {
    const ValueList& items = object.array().items;
    ValueList out;
    for (const int64_t i :
         SliceIndices(static_cast<int64_t>(items.size()), bounds[0], bounds[1], step)) {
      out.push_back(items[i]);
    }
    return Value::Array(std::move(out));
  }
  // Strings slice by code point (Array.from(string)).
  const std::vector<std::string_view> chars = SplitCodePoints(object.str());
  std::string out;
  for (const int64_t i :
       SliceIndices(static_cast<int64_t>(chars.size()), bounds[0], bounds[1], step)) {
    out.append(chars[i]);
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> Interpreter::EvaluateBinary(const Expr& expr, Scope& scope) {
  const std::string& op = expr.name;
  SPECD_ASSIGN_OR_RETURN(const Value left, Evaluate(*expr.children[0], scope));
  if (op == "and") return left.Truthy() ? Evaluate(*expr.children[1], scope) : left;
  if (op == "or") return left.Truthy() ? left : Evaluate(*expr.children[1], scope);
  SPECD_ASSIGN_OR_RETURN(const Value right, Evaluate(*expr.children[1], scope));
  if (op == "==" || op == "!=") {
    SPECD_ASSIGN_OR_RETURN(const bool equal, LooseEquals(left, right));
    return Value::Bool(op == "==" ? equal : !equal);
  }
  const bool membership = op == "in" || op == "not in";
  if (left.is_undefined() || right.is_undefined()) {
    // `x in undefined` is false, and `x not in undefined` true.
    if (right.is_undefined() && membership) return Value::Bool(op == "not in");
    return TemplateError(absl::StrCat("cannot apply '", op, "' to an undefined value"));
  }
  if (left.is_null() || right.is_null()) {
    return TemplateError(absl::StrCat("cannot apply '", op, "' to none"));
  }
  if (op == "~") {
    SPECD_ASSIGN_OR_RETURN(const std::string a, left.ToJsString());
    SPECD_ASSIGN_OR_RETURN(const std::string b, right.ToJsString());
    return Value::String(a + b);
  }
  const auto numeric_like = [](const Value& v) {
    return v.is_number() || v.type() == Value::Type::kBool;
  };
  const auto as_number = [](const Value& v) {
    return v.type() == Value::Type::kBool ? (v.bool_value() ? 1.0 : 0.0) : v.number();
  };
  if (op == "**" && numeric_like(left) && numeric_like(right)) {
    const double a = as_number(left);
    const double b = as_number(right);
    if (a == 0 && b < 0) return TemplateError("0.0 cannot be raised to a negative power");
    const double result = std::pow(a, b);
    if (!std::isfinite(result)) return TemplateError("exponentiation result is not finite");
    if (left.type() == Value::Type::kFloat || right.type() == Value::Type::kFloat || b < 0) {
      return Value::Float(result);
    }
    return CheckedInt(result, "the result of **");
  }
  if (left.is_number() && right.is_number()) {
    const bool is_float = left.type() == Value::Type::kFloat || right.type() == Value::Type::kFloat;
    const double a = left.number();
    const double b = right.number();
    if (op == "+" || op == "-" || op == "*") {
      if (is_float) return Value::Float(op == "+" ? a + b : op == "-" ? a - b : a * b);
      int64_t r = 0;
      const int64_t x = left.int_value();
      const int64_t y = right.int_value();
      const bool overflow = op == "+"   ? __builtin_add_overflow(x, y, &r)
                            : op == "-" ? __builtin_sub_overflow(x, y, &r)
                                        : __builtin_mul_overflow(x, y, &r);
      if (overflow) return TemplateError(absl::StrCat("integer overflow in '", op, "'"));
      return Value::Int(r);
    }
    if (op == "/") return Value::Float(a / b);
    if (op == "//" || op == "%") {
      if (!is_float && b == 0) {
        return TemplateError(absl::StrCat("integer division or modulo by zero ('", op, "')"));
      }
      if (op == "//") {
        const double r = std::floor(a / b);
        return is_float ? Value::Float(r) : CheckedInt(r, "the result of //");
      }
      // JavaScript's % keeps the sign of the dividend.
      if (is_float) return Value::Float(std::fmod(a, b));
      if (right.int_value() == -1) return Value::Int(0);  // INT64_MIN % -1 would trap
      return Value::Int(left.int_value() % right.int_value());
    }
    if (op == "<") return Value::Bool(a < b);
    if (op == ">") return Value::Bool(a > b);
    if (op == "<=") return Value::Bool(a <= b);
    if (op == ">=") return Value::Bool(a >= b);
  } else if (left.is_array() && right.is_array()) {
    if (op == "+") {
      ValueList items = left.array().items;
      items.insert(items.end(), right.array().items.begin(), right.array().items.end());
      return Value::Array(std::move(items));
    }
  } else if (right.is_array()) {
    if (membership) {
      const bool found = std::any_of(right.array().items.begin(), right.array().items.end(),
                                     [&](const Value& item) { return StrictEquals(item, left); });
      return Value::Bool(op == "in" ? found : !found);
    }
  }
  if ((left.is_string() || right.is_string()) && op == "+") {
    SPECD_ASSIGN_OR_RETURN(const std::string a, left.ToJsString());
    SPECD_ASSIGN_OR_RETURN(const std::string b, right.ToJsString());
    return Value::String(a + b);
  }
  if (left.is_string() && right.is_string() && membership) {
    const bool found = right.str().find(left.str()) != std::string::npos;
    return Value::Bool(op == "in" ? found : !found);
  }
  if (left.is_string() && right.is_object() && membership) {
    const bool found = right.object().Find(left.str()) != nullptr;
    return Value::Bool(op == "in" ? found : !found);
  }
  return TemplateError(absl::StrCat("unsupported operator '", op, "' between a ", left.TypeName(),
                                    " and a ", right.TypeName()));
}

absl::StatusOr<Value> Interpreter::EvaluateUnary(const Expr& expr, Scope& scope) {
  SPECD_ASSIGN_OR_RETURN(const Value arg, Evaluate(*expr.children[0], scope));
  if (expr.name == "not") return Value::Bool(!arg.Truthy());
  const bool negate = expr.name == "-";
  switch (arg.type()) {
    case Value::Type::kFloat:
      return Value::Float(negate ? -arg.float_value() : arg.float_value());
    case Value::Type::kInt:
      return Value::Int(negate ? -arg.int_value() : arg.int_value());
    case Value::Type::kBool: {
      const int64_t v = arg.bool_value() ? 1 : 0;
      return Value::Int(negate ? -v : v);
    }
    default:
      return TemplateError(
          absl::StrCat("unary '", expr.name, "' does not apply to a ", arg.TypeName()));
  }
}

}  // namespace specd::chat
