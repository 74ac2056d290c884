// The builtin filters, tests, methods and global functions of @huggingface/jinja, with its
// semantics (its runtime.ts and utils.ts): what a filter does depends on the operand's type, and
// an unknown filter or test is an error when evaluated, not when the template is loaded.
#ifndef SPECD_COMMON_CHAT_BUILTINS_H_
#define SPECD_COMMON_CHAT_BUILTINS_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/civil_time.h"
#include "common/chat/ast.h"
#include "common/chat/interpreter.h"
#include "common/chat/value.h"

namespace specd::chat {

// `operand | filter`, where `filter` is a name or a call on a name.
absl::StatusOr<Value> ApplyFilter(Interpreter& interp, const Value& operand, const Expr& filter,
                                  Scope& scope);

// `operand is name`; `arg` is the second operand where selectattr/rejectattr pass one.
absl::StatusOr<bool> ApplyTest(std::string_view name, const Value& operand, const Value* arg);

// `object.name` for names that are not keys: string methods (strip, split, startswith...),
// `length` of strings and arrays, dict methods (get, items, keys, values, dictsort).
// Undefined where there is none.
Value MemberBuiltin(const Value& object, std::string_view name);

// namespace(...): a mutable attribute container.
Value NamespaceFunction();

// true/false/none (and True/False/None), raise_exception, range and strftime_now.
void AddGlobals(Scope& global);

// The reference's strftime: %Y %m %d %b %B %H %M %% (English month names); any other
// directive is left as written.
std::string Strftime(const absl::CivilSecond& time, std::string_view format);

}  // namespace specd::chat

#endif  // SPECD_COMMON_CHAT_BUILTINS_H_
