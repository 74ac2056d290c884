#include "common/chat/value.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "common/chat/js_text.h"

namespace specd::chat {
namespace {

// JavaScript's types of the underlying values, for == and ===.
enum class JsType { kUndefined, kNull, kBoolean, kNumber, kString, kObject };

JsType JsTypeOf(const Value& v) {
  switch (v.type()) {
    case Value::Type::kUndefined:
      return JsType::kUndefined;
    case Value::Type::kNull:
      return JsType::kNull;
    case Value::Type::kBool:
      return JsType::kBoolean;
    case Value::Type::kInt:
    case Value::Type::kFloat:
      return JsType::kNumber;
    case Value::Type::kString:
      return JsType::kString;
    default:
      return JsType::kObject;
  }
}

// A canonical array index ("0", "17"; not "017" or "-1"), which JavaScript objects order first.
std::optional<uint32_t> ArrayIndex(std::string_view key) {
  if (key.empty() || key.size() > 10 || (key.size() > 1 && key[0] == '0')) return std::nullopt;
  uint64_t n = 0;
  for (const char c : key) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  if (n >= 0xFFFFFFFFull) return std::nullopt;
  return static_cast<uint32_t>(n);
}

std::string IntToString(int64_t i) { return absl::StrCat(i); }

}  // namespace

const Value* CallArgs::Keyword(std::string_view name) const {
  for (const auto& [key, value] : keywords) {
    if (key == name) return &value;
  }
  return nullptr;
}

const Value* ObjectData::Find(std::string_view key) const {
  for (const auto& [k, v] : entries) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ObjectData::Set(std::string key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

Value Value::Null() {
  Value v;
  v.type_ = Type::kNull;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.type_ = Type::kBool;
  v.bool_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.type_ = Type::kInt;
  v.int_ = i;
  return v;
}
Value Value::Float(double d) {
  Value v;
  v.type_ = Type::kFloat;
  v.float_ = d;
  return v;
}
Value Value::String(std::string s) {
  Value v;
  v.type_ = Type::kString;
  v.string_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::Array(ValueList items, bool tuple) {
  int depth = 1;
  for (const Value& item : items) depth = std::max(depth, item.depth() + 1);
  Value v;
  v.type_ = Type::kArray;
  v.array_ = std::make_shared<ArrayData>();
  v.array_->items = std::move(items);
  v.array_->tuple = tuple;
  v.array_->depth = depth;
  return v;
}
Value Value::Object(ObjectData data) {
  data.depth = 1;
  for (const auto& [key, item] : data.entries) data.depth = std::max(data.depth, item.depth() + 1);
  Value v;
  v.type_ = Type::kObject;
  v.object_ = std::make_shared<ObjectData>(std::move(data));
  return v;
}
Value Value::Namespace(ObjectData data) {
  Value v = Object(std::move(data));
  v.type_ = Type::kNamespace;
  return v;
}
Value Value::Function(std::string name, NativeFunction fn) {
  Value v;
  v.type_ = Type::kFunction;
  v.string_ = std::make_shared<const std::string>(std::move(name));
  v.function_ = std::make_shared<const NativeFunction>(std::move(fn));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& json) {
  using Json = nlohmann::ordered_json;
  switch (json.type()) {
    case Json::value_t::null:
      return Null();
    case Json::value_t::boolean:
      return Bool(json.get<bool>());
    case Json::value_t::number_integer:
      return Int(json.get<int64_t>());
    case Json::value_t::number_unsigned: {
      const uint64_t u = json.get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Int(static_cast<int64_t>(u));
      }
      return Float(static_cast<double>(u));
    }
    case Json::value_t::number_float: {
      // JSON.parse makes every number a double; Number.isInteger decides the kind.
      const double d = json.get<double>();
      if (std::isfinite(d) && std::fmod(d, 1.0) == 0 && std::fabs(d) < 9.2e18) {
        return Int(static_cast<int64_t>(d));
      }
      return Float(d);
    }
    case Json::value_t::string:
      return String(json.get<std::string>());
    case Json::value_t::array: {
      ValueList items;
      items.reserve(json.size());
      for (const Json& item : json) items.push_back(FromJson(item));
      return Array(std::move(items));
    }
    case Json::value_t::object: {
      std::vector<std::pair<uint32_t, std::string>> index_keys;
      ObjectData data;
      for (const auto& [key, value] : json.items()) {
        if (const auto index = ArrayIndex(key)) index_keys.emplace_back(*index, key);
      }
      std::sort(index_keys.begin(), index_keys.end());
      for (const auto& [index, key] : index_keys) data.Set(key, FromJson(json.at(key)));
      for (const auto& [key, value] : json.items()) {
        if (!ArrayIndex(key)) data.Set(key, FromJson(value));
      }
      return Object(std::move(data));
    }
    default:
      return Value();
  }
}

int Value::depth() const {
  switch (type_) {
    case Type::kArray:
      return array_->depth;
    case Type::kObject:
    case Type::kNamespace:
      return object_->depth;
    default:
      return 0;
  }
}

const char* Value::TypeName() const {
  switch (type_) {
    case Type::kUndefined:
      return "undefined";
    case Type::kNull:
      return "none";
    case Type::kBool:
      return "boolean";
    case Type::kInt:
      return "integer";
    case Type::kFloat:
      return "float";
    case Type::kString:
      return "string";
    case Type::kArray:
      return array_->tuple ? "tuple" : "list";
    case Type::kObject:
      return "object";
    case Type::kNamespace:
      return "namespace";
    case Type::kFunction:
      return "function";
  }
  return "value";
}

bool Value::Truthy() const {
  switch (type_) {
    case Type::kUndefined:
    case Type::kNull:
      return false;
    case Type::kBool:
      return bool_;
    case Type::kInt:
      return int_ != 0;
    case Type::kFloat:
      return float_ != 0 && !std::isnan(float_);
    case Type::kString:
      return !string_->empty();
    case Type::kArray:
      return !array_->items.empty();
    case Type::kObject:
      return !object_->entries.empty();
    case Type::kNamespace:
    case Type::kFunction:
      return true;
  }
  return false;
}

bool SameReference(const Value& a, const Value& b) {
  if (a.type_ != b.type_) return false;
  switch (a.type_) {
    case Value::Type::kArray:
      return a.array_ == b.array_;
    case Value::Type::kObject:
    case Value::Type::kNamespace:
      return a.object_ == b.object_;
    case Value::Type::kFunction:
      return a.function_ == b.function_;
    default:
      return false;
  }
}

bool StrictEquals(const Value& a, const Value& b) {
  const JsType ta = JsTypeOf(a);
  if (ta != JsTypeOf(b)) return false;
  switch (ta) {
    case JsType::kUndefined:
    case JsType::kNull:
      return true;
    case JsType::kBoolean:
      return a.bool_value() == b.bool_value();
    case JsType::kNumber:
      if (a.type() == Value::Type::kInt && b.type() == Value::Type::kInt) {
        return a.int_value() == b.int_value();
      }
      return a.number() == b.number();
    case JsType::kString:
      return a.str() == b.str();
    case JsType::kObject:
      return SameReference(a, b);
  }
  return false;
}

absl::StatusOr<bool> LooseEquals(const Value& a, const Value& b) {
  const JsType ta = JsTypeOf(a);
  const JsType tb = JsTypeOf(b);
  if (ta == tb) return StrictEquals(a, b);
  const auto nullish = [](JsType t) { return t == JsType::kNull || t == JsType::kUndefined; };
  if (nullish(ta) || nullish(tb)) return nullish(ta) && nullish(tb);
  if (ta == JsType::kNumber && tb == JsType::kString) {
    return a.number() == JsStringToNumber(b.str());
  }
  if (ta == JsType::kString && tb == JsType::kNumber) {
    return JsStringToNumber(a.str()) == b.number();
  }
  if (ta == JsType::kBoolean) return LooseEquals(Value::Int(a.bool_value() ? 1 : 0), b);
  if (tb == JsType::kBoolean) return LooseEquals(a, Value::Int(b.bool_value() ? 1 : 0));
  // An object against a string or number: compare its primitive (string) form. A function's
  // would be its JavaScript source text, which equals no template value.
  const Value& object = ta == JsType::kObject ? a : b;
  const Value& primitive = ta == JsType::kObject ? b : a;
  if (object.type() == Value::Type::kFunction) return false;
  SPECD_ASSIGN_OR_RETURN(std::string text, object.ToJsString());
  return LooseEquals(Value::String(std::move(text)), primitive);
}

absl::StatusOr<std::string> Value::ToDisplay() const {
  switch (type_) {
    case Type::kUndefined:
      return std::string("undefined");
    case Type::kNull:
      return std::string("null");
    case Type::kBool:
      return std::string(bool_ ? "true" : "false");
    case Type::kInt:
      return IntToString(int_);
    case Type::kFloat:
      return JsFloatDisplay(float_);
    case Type::kString:
      return *string_;
    case Type::kArray:
    case Type::kObject:
    case Type::kNamespace: {
      JsonOptions options;
      options.undefined_as_null = false;
      return ToJson(*this, options);
    }
    case Type::kFunction:
      return absl::InvalidArgumentError(
          absl::StrCat("cannot write the function '", *string_, "' as text"));
  }
  return std::string();
}

absl::StatusOr<std::string> Value::ToJsString() const {
  switch (type_) {
    case Type::kInt:
      return IntToString(int_);
    case Type::kFloat:
      return JsNumberToString(float_);
    case Type::kArray: {
      std::vector<std::string> parts;
      int64_t bytes = 0;
      for (const Value& item : array_->items) {
        SPECD_ASSIGN_OR_RETURN(std::string part, item.ToDisplay());
        bytes += static_cast<int64_t>(part.size()) + 1;
        SPECD_RETURN_IF_ERROR(CheckTextSize(bytes, "converting a list to a string"));
        parts.push_back(std::move(part));
      }
      return absl::StrJoin(parts, ",");
    }
    case Type::kObject:
    case Type::kNamespace:
      return std::string("[object Map]");
    default:
      return ToDisplay();
  }
}

absl::Status CheckTextSize(int64_t bytes, absl::string_view what) {
  if (bytes <= kMaxTextBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("chat template error: ", what, " would be over ",
                                                 kMaxTextBytes >> 20, " MiB of text"));
}

namespace {

// ToJson with the bytes it may still produce in `*left`: children are converted first, so the
// check after each keeps the work of a value that shares itself many times bounded too.
absl::StatusOr<std::string> ToJsonBounded(const Value& value, const JsonOptions& options, int depth,
                                          int64_t* left);

absl::StatusOr<std::string> Spend(absl::StatusOr<std::string> text, int64_t* left) {
  if (!text.ok()) return text;
  *left -= static_cast<int64_t>(text->size());
  if (*left < 0) return CheckTextSize(kMaxTextBytes + 1, "converting a value to JSON");
  return text;
}

}  // namespace

absl::StatusOr<std::string> ToJson(const Value& value, const JsonOptions& options, int depth) {
  int64_t left = kMaxTextBytes;
  return ToJsonBounded(value, options, depth, &left);
}

namespace {

absl::StatusOr<std::string> ToJsonBounded(const Value& value, const JsonOptions& options, int depth,
                                          int64_t* left) {
  switch (value.type()) {
    case Value::Type::kUndefined:
      return std::string(options.undefined_as_null ? "null" : "undefined");
    case Value::Type::kNull:
      return std::string("null");
    case Value::Type::kBool:
      return std::string(value.bool_value() ? "true" : "false");
    case Value::Type::kInt:
      return IntToString(value.int_value());
    case Value::Type::kFloat:
      return std::isfinite(value.float_value()) ? JsNumberToString(value.float_value())
                                                : std::string("null");
    case Value::Type::kString:
      return JsonQuote(value.str(), options.ensure_ascii);
    case Value::Type::kFunction:
      return absl::InvalidArgumentError(
          absl::StrCat("cannot convert the function '", value.function_name(), "' to JSON"));
    default:
      break;
  }
  if (depth > kMaxValueDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot convert values nested deeper than ", kMaxValueDepth, " to JSON"));
  }
  if (value.is_array() && value.array().tuple) {
    return absl::InvalidArgumentError("cannot convert a tuple to JSON");
  }
  const int64_t indent = options.indent.value_or(0);
  if (indent < 0) return absl::InvalidArgumentError("tojson: indent must not be negative");
  SPECD_RETURN_IF_ERROR(CheckTextSize(indent, "tojson's indent"));
  SPECD_RETURN_IF_ERROR(CheckTextSize(indent * (depth + 1), "tojson's indent"));
  const std::string indent_str(indent, ' ');
  std::string base_pad = "\n";
  for (int i = 0; i < depth; ++i) base_pad += indent_str;
  const std::string child_pad = base_pad + indent_str;
  std::string item_sep = indent > 0 ? "," : ", ";
  std::string key_sep = ": ";
  if (options.separators) std::tie(item_sep, key_sep) = *options.separators;

  std::vector<std::string> core;
  if (value.is_array()) {
    for (const Value& item : value.array().items) {
      SPECD_ASSIGN_OR_RETURN(std::string s,
                             Spend(ToJsonBounded(item, options, depth + 1, left), left));
      if (indent > 0) {
        SPECD_ASSIGN_OR_RETURN(s, Spend(child_pad + s, left));
      }
      core.push_back(std::move(s));
    }
    if (indent > 0 && !core.empty()) {
      return absl::StrCat("[", absl::StrJoin(core, item_sep), base_pad, "]");
    }
    return absl::StrCat("[", absl::StrJoin(core, item_sep), "]");
  }
  for (const auto& [key, item] : value.object().entries) {
    SPECD_ASSIGN_OR_RETURN(std::string s,
                           Spend(ToJsonBounded(item, options, depth + 1, left), left));
    SPECD_ASSIGN_OR_RETURN(std::string entry,
                           Spend(absl::StrCat(indent > 0 ? child_pad : "",
                                              JsonQuote(key, options.ensure_ascii), key_sep, s),
                                 left));
    core.push_back(std::move(entry));
  }
  if (indent > 0 && !core.empty()) {
    return absl::StrCat("{", absl::StrJoin(core, item_sep), base_pad, "}");
  }
  return absl::StrCat("{", absl::StrJoin(core, item_sep), "}");
}

}  // namespace

}  // namespace specd::chat
