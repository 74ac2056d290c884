// Runtime values of the template interpreter, with @huggingface/jinja's semantics: its value
// kinds, truthiness, JavaScript loose equality for ==, and its three ways of turning a value into
// text (output, string concatenation, tojson).
#ifndef SPECD_COMMON_CHAT_VALUE_H_
#define SPECD_COMMON_CHAT_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace specd::chat {

class Value;
class Interpreter;
struct Scope;

using ValueList = std::vector<Value>;

// Call arguments: positional, then keyword arguments in call order.
struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keywords;
  const Value* Keyword(std::string_view name) const;
};

// A callable: a macro, a builtin global or a bound method. `scope` is the caller's scope
// (macros see the variables of the place they are called from, as in the reference).
using NativeFunction =
    std::function<absl::StatusOr<Value>(const CallArgs& args, Interpreter& interp, Scope& scope)>;

// Deeper values are refused: they would exhaust the stack when printed or destroyed.
inline constexpr int kMaxValueDepth = 256;

// The most text one conversion (JSON, display, concatenation) or one filter (join, replace,
// indent) may produce: four times the default limit on a request (--max-request-bytes). A list that
// holds itself twice per level, or a huge indent or separator, would otherwise ask for more memory
// than any machine has, before the render's work budget (Interpreter::Charge) could see the result.
inline constexpr int64_t kMaxTextBytes = int64_t{1} << 24;

// INVALID_ARGUMENT "chat template error: ..." when `bytes` is over kMaxTextBytes.
absl::Status CheckTextSize(int64_t bytes, absl::string_view what);

struct ArrayData {
  ValueList items;
  int depth = 1;       // nesting of containers, this one included
  bool tuple = false;  // from a (a, b) literal: not a JSON value, and not `iterable`
};

// Insertion-ordered mapping (a JavaScript Map).
struct ObjectData {
  std::vector<std::pair<std::string, Value>> entries;
  int depth = 1;  // at creation; a namespace's later attributes are checked where they are set
  const Value* Find(std::string_view key) const;
  void Set(std::string key, Value value);
};

class Value {
 public:
  enum class Type {
    kUndefined,
    kNull,
    kBool,
    kInt,
    kFloat,
    kString,
    kArray,
    kObject,
    kNamespace,  // from namespace(): attribute assignment allowed, no dict methods
    kFunction,
  };

  Value() = default;  // undefined
  static Value Null();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value Array(ValueList items, bool tuple = false);
  static Value Object(ObjectData data = {});
  static Value Namespace(ObjectData data = {});
  static Value Function(std::string name, NativeFunction fn);

  // JSON as JavaScript's JSON.parse sees it: integral numbers are integers, and object keys
  // that are array indices come first in ascending order (Object.entries' order).
  static Value FromJson(const nlohmann::ordered_json& json);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::kUndefined; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_number() const { return type_ == Type::kInt || type_ == Type::kFloat; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }
  bool is_attribute_container() const {
    return type_ == Type::kObject || type_ == Type::kNamespace;
  }

  // 0 for scalars, 1 for a flat list or object.
  int depth() const;

  bool bool_value() const { return bool_; }
  int64_t int_value() const { return int_; }
  double float_value() const { return float_; }
  double number() const { return type_ == Type::kInt ? static_cast<double>(int_) : float_; }
  const std::string& str() const { return *string_; }
  const ArrayData& array() const { return *array_; }
  const ObjectData& object() const { return *object_; }
  ObjectData& mutable_object() const { return *object_; }
  const NativeFunction& function() const { return *function_; }
  const std::string& function_name() const { return *string_; }

  const char* TypeName() const;

  // Python-like truthiness as the reference defines it: empty arrays and objects are false,
  // a namespace is always true.
  bool Truthy() const;

  // JavaScript `a == b` on the underlying values ("" == false, 1 == "1", null == undefined;
  // arrays and objects by identity).
  // Comparing an array with a string or number joins its items' display strings, which can fail.
  friend absl::StatusOr<bool> LooseEquals(const Value& a, const Value& b);
  // JavaScript `a === b` on the underlying values (used by `in`, unique, equalto).
  friend bool StrictEquals(const Value& a, const Value& b);

  // What `{{ value }}` writes: "1.0" for a float 1, "true", JSON for arrays and objects.
  absl::StatusOr<std::string> ToDisplay() const;
  // What `+` and `~` concatenate (JavaScript's String(value)): "1" for a float 1, arrays as
  // comma-joined display strings, objects as "[object Map]".
  absl::StatusOr<std::string> ToJsString() const;

 private:
  Type type_ = Type::kUndefined;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<const std::string> string_;  // string, or the function's name
  std::shared_ptr<ArrayData> array_;
  std::shared_ptr<ObjectData> object_;  // object or namespace
  std::shared_ptr<const NativeFunction> function_;

  friend bool SameReference(const Value& a, const Value& b);
};

struct JsonOptions {
  std::optional<int64_t> indent;  // pretty-print with this many spaces (0 or unset: one line)
  bool ensure_ascii = false;
  std::optional<std::pair<std::string, std::string>> separators;  // item, key
  bool undefined_as_null = true;  // false: `undefined`, as the display of containers writes it
};

// The reference's toJSON (Python json.dumps-like separators ", " and ": ").
absl::StatusOr<std::string> ToJson(const Value& value, const JsonOptions& options, int depth = 0);

}  // namespace specd::chat

#endif  // SPECD_COMMON_CHAT_VALUE_H_
