// Evaluates a parsed chat template the way @huggingface/jinja's Interpreter does (runtime.ts):
// scoping (a for loop opens one scope for all its iterations, `if` opens none, macros run in a
// child of the caller's scope), output conversion, loop variables and break/continue.
#ifndef SPECD_COMMON_CHAT_INTERPRETER_H_
#define SPECD_COMMON_CHAT_INTERPRETER_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/civil_time.h"
#include "base/absl_string.h"
#include "common/chat/ast.h"
#include "common/chat/value.h"

namespace specd::chat {

// One level of variables. Every scope also holds its own `namespace` function unless the
// template rebinds the name there, as in the reference.
struct Scope {
  explicit Scope(Scope* parent_scope = nullptr) : parent(parent_scope) {}
  Value Lookup(std::string_view name) const;
  void Set(std::string name, Value value) {
    vars.insert_or_assign(std::move(name), std::move(value));
  }
  bool HasOwn(std::string_view name) const { return vars.contains(ToAbsl(name)); }

  Scope* parent;
  absl::flat_hash_map<std::string, Value> vars;
};

class Interpreter {
 public:
  // `now` is what strftime_now() formats (local time of the caller's choosing). `work_limit`
  // bounds the render's work (see Charge), so a template that loops without end or builds values
  // that double fails instead of hanging the caller or exhausting its memory.
  Interpreter(absl::CivilSecond now, int64_t work_limit) : now_(now), work_limit_(work_limit) {}
  // Empties the namespaces of the render, breaking any reference cycle a template made through
  // them (`{% set ns.self = ns %}`); nothing else is mutable, so nothing else can form one.
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders `program` in `global` (which holds the globals and the caller's variables).
  // raise_exception() gives INVALID_ARGUMENT with exactly the template's message; other runtime
  // failures give INVALID_ARGUMENT starting with "chat template error: ".
  absl::StatusOr<std::string> Run(const Block& program, Scope& global);

  // Every evaluation costs one unit of work plus the size of its value (a string's bytes, a
  // list's or mapping's items), which is also what any operation on the value reads, and every
  // statement one unit: work bounds both the render's time and the memory its values take.
  absl::StatusOr<Value> Evaluate(const Expr& expr, Scope& scope);
  // Call arguments from argument expressions (positional, *spread, key=value, **spread).
  absl::StatusOr<CallArgs> EvaluateArguments(std::span<const ExprPtr> args, Scope& scope);
  absl::StatusOr<Value> CallFunction(const Value& fn, const CallArgs& args, Scope& scope);
  // The concatenated output of `block`.
  absl::StatusOr<std::string> ExecBlock(const Block& block, Scope& scope);

  absl::CivilSecond now() const { return now_; }
  void TrackNamespace(const Value& ns) { namespaces_.push_back(ns); }
  // Adds `units` of work, failing once the render has done more than its limit. A builtin whose
  // result's size comes from its arguments (range) charges that size before building it.
  absl::Status Charge(int64_t units);

 private:
  absl::StatusOr<Value> EvaluateExpr(const Expr& expr, Scope& scope);
  absl::StatusOr<Value> Exec(const Stmt& stmt, Scope& scope);
  absl::StatusOr<Value> ExecFor(const Stmt& stmt, Scope& scope);
  absl::StatusOr<Value> ExecSet(const Stmt& stmt, Scope& scope);
  absl::StatusOr<Value> ExecMacro(const Stmt& stmt, Scope& scope);
  absl::StatusOr<Value> ExecCallBlock(const Stmt& stmt, Scope& scope);
  absl::StatusOr<Value> EvaluateMember(const Expr& expr, Scope& scope);
  absl::StatusOr<Value> EvaluateSlice(const Value& object, const Expr& slice, Scope& scope);
  absl::StatusOr<Value> EvaluateBinary(const Expr& expr, Scope& scope);
  absl::StatusOr<Value> EvaluateUnary(const Expr& expr, Scope& scope);
  // Binds a macro's (or call block's) parameters in `scope`.
  absl::Status BindParameters(std::string_view name, const std::vector<ExprPtr>& params,
                              const Block& body, const CallArgs& args, Scope& scope);

  static constexpr int kMaxCallDepth = 100;

  absl::CivilSecond now_;
  const int64_t work_limit_;
  int64_t work_ = 0;
  int call_depth_ = 0;
  std::vector<Value> namespaces_;
};

// An error of the template's evaluation (INVALID_ARGUMENT "chat template error: ...").
absl::Status TemplateError(std::string_view message);

// Marks the status of raise_exception(), whose message Run returns as written.
inline constexpr char kRaisedPayload[] = "specd.chat/raised";

}  // namespace specd::chat

#endif  // SPECD_COMMON_CHAT_INTERPRETER_H_
