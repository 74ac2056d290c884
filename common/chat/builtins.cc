#include "common/chat/builtins.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/absl_string.h"
#include "base/status_macros.h"
#include "common/chat/js_text.h"

namespace specd::chat {
namespace {

absl::Status UnknownFilter(std::string_view name, const Value& operand) {
  return TemplateError(
      absl::StrCat("unknown filter '", ToAbsl(name), "' for a ", operand.TypeName()));
}

// Positional argument `i`, else keyword `name`, else null.
const Value* Arg(const CallArgs& args, size_t i, std::string_view name) {
  if (i < args.positional.size()) return &args.positional[i];
  return args.Keyword(name);
}

absl::Status NoKeywords(const CallArgs& args, std::string_view function) {
  if (args.keywords.empty()) return absl::OkStatus();
  return TemplateError(absl::StrCat(ToAbsl(function), "() takes no keyword argument '",
                                    args.keywords[0].first, "'"));
}

absl::StatusOr<bool> BoolArg(const CallArgs& args, size_t i, std::string_view name, bool fallback) {
  const Value* v = Arg(args, i, name);
  if (v == nullptr) return fallback;
  if (v->type() != Value::Type::kBool) {
    return TemplateError(absl::StrCat("'", ToAbsl(name), "' must be a boolean"));
  }
  return v->bool_value();
}

// The text Array.prototype.join writes for an item's underlying value.
absl::StatusOr<std::string> JoinPiece(const Value& v) {
  if (v.is_null() || v.is_undefined()) return std::string();
  return v.ToJsString();
}

// JavaScript truthiness of the underlying value (arrays and objects are always true).
bool RawTruthy(const Value& v) {
  switch (v.type()) {
    case Value::Type::kArray:
    case Value::Type::kObject:
    case Value::Type::kNamespace:
    case Value::Type::kFunction:
      return true;
    default:
      return v.Truthy();
  }
}

absl::StatusOr<Value> CheckedInt(double value) {
  if (!std::isfinite(value) || std::fabs(value) >= 9.2e18) {
    return TemplateError("number is out of the supported integer range");
  }
  return Value::Int(static_cast<int64_t>(value));
}

// compareRuntimeValues: numbers (and booleans) with numbers, strings with strings.
absl::StatusOr<int> Compare(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_null() && b.is_null()) return 0;
  if (a.is_undefined() && b.is_undefined()) return 0;
  if (a.is_null() || b.is_null() || a.is_undefined() || b.is_undefined()) {
    return TemplateError(absl::StrCat("cannot compare a ", a.TypeName(), " with a ", b.TypeName()));
  }
  const auto numeric = [](const Value& v) {
    return v.is_number() || v.type() == Value::Type::kBool;
  };
  if (numeric(a) && numeric(b)) {
    const auto num = [](const Value& v) {
      return v.type() == Value::Type::kBool ? (v.bool_value() ? 1.0 : 0.0) : v.number();
    };
    return num(a) < num(b) ? -1 : (num(a) > num(b) ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    if (case_sensitive) return CompareUtf16(a.str(), b.str());
    SPECD_ASSIGN_OR_RETURN(const std::string la, JsToLower(a.str()));
    SPECD_ASSIGN_OR_RETURN(const std::string lb, JsToLower(b.str()));
    return CompareUtf16(la, lb);
  }
  return TemplateError(absl::StrCat("cannot compare a ", a.TypeName(), " with a ", b.TypeName()));
}

// Stable sort (as Array.prototype.sort) with a comparator that can fail.
absl::StatusOr<ValueList> SortValues(
    ValueList items, bool reverse,
    const std::function<absl::StatusOr<int>(const Value&, const Value&)>& cmp) {
  absl::Status error;
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    if (!error.ok()) return false;
    absl::StatusOr<int> c = cmp(a, b);
    if (!c.ok()) {
      error = c.status();
      return false;
    }
    return reverse ? *c > 0 : *c < 0;
  });
  if (!error.ok()) return error;
  return items;
}

// "details.priority" or "items.0" inside objects and arrays.
Value AttributePath(const Value& item, std::string_view path) {
  Value v = item;
  for (const absl::string_view piece : absl::StrSplit(ToAbsl(path), '.')) {
    const std::string_view part(piece.data(), piece.size());
    if (v.is_attribute_container()) {
      const Value* found = v.object().Find(part);
      if (found == nullptr) return Value();
      v = *found;
    } else if (v.is_array()) {
      const std::optional<double> index = JsParseInt(part);
      if (!index || *index < 0 || *index >= static_cast<double>(v.array().items.size())) {
        return Value();
      }
      v = v.array().items[static_cast<size_t>(*index)];
    } else {
      return Value();
    }
  }
  return v;
}

std::string Title(std::string_view s) {
  std::string out(s);
  const auto word = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  };
  for (size_t i = 0; i < out.size(); ++i) {
    if (word(out[i]) && (i == 0 || !word(s[i - 1])) && out[i] >= 'a' && out[i] <= 'z') {
      out[i] = static_cast<char>(out[i] - 32);
    }
  }
  return out;
}

absl::StatusOr<Value> Indent(const std::string& text, const Value* width_arg, bool first,
                             bool blank) {
  int64_t width = 4;
  if (width_arg != nullptr) {
    if (width_arg->type() != Value::Type::kInt)
      return TemplateError("indent: width must be a number");
    width = width_arg->int_value();
  }
  if (width < 0) return TemplateError("indent: width must not be negative");
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  SPECD_RETURN_IF_ERROR(CheckTextSize(width, "indent's width"));
  SPECD_RETURN_IF_ERROR(CheckTextSize(
      static_cast<int64_t>(text.size()) + width * static_cast<int64_t>(lines.size()), "indent"));
  const std::string pad(width, ' ');
  for (size_t i = 0; i < lines.size(); ++i) {
    if ((!first && i == 0) || (!blank && lines[i].empty())) continue;
    lines[i] = pad + lines[i];
  }
  return Value::String(absl::StrJoin(lines, "\n"));
}

// Python's str.split as the reference implements it.
absl::StatusOr<Value> Split(const std::string& s, const CallArgs& args) {
  SPECD_RETURN_IF_ERROR(NoKeywords(args, "split"));
  const Value sep = args.positional.size() > 0 ? args.positional[0] : Value::Null();
  if (!sep.is_string() && !sep.is_null())
    return TemplateError("split: sep must be a string or none");
  const Value maxsplit_v = args.positional.size() > 1 ? args.positional[1] : Value::Int(-1);
  if (maxsplit_v.type() != Value::Type::kInt)
    return TemplateError("split: maxsplit must be a number");
  const int64_t maxsplit = maxsplit_v.int_value();
  ValueList out;
  if (sep.is_null()) {
    const std::string_view text = JsTrimStart(s);
    size_t i = 0;
    while (i < text.size()) {
      const size_t start = i;
      while (i < text.size()) {
        const CodePoint cp = DecodeUtf8(text, i);
        if (IsJsWhitespace(cp.value)) break;
        i += cp.size;
      }
      if (maxsplit != -1 && static_cast<int64_t>(out.size()) >= maxsplit) {
        out.push_back(Value::String(std::string(text.substr(start))));
        break;
      }
      out.push_back(Value::String(std::string(text.substr(start, i - start))));
      while (i < text.size()) {
        const CodePoint cp = DecodeUtf8(text, i);
        if (!IsJsWhitespace(cp.value)) break;
        i += cp.size;
      }
    }
    return Value::Array(std::move(out));
  }
  if (sep.str().empty()) return TemplateError("split: empty separator");
  std::vector<std::string> parts = absl::StrSplit(s, sep.str());
  if (maxsplit != -1 && static_cast<int64_t>(parts.size()) > maxsplit) {
    // Array.prototype.splice(maxsplit): the tail joined back is the last element.
    const int64_t n = static_cast<int64_t>(parts.size());
    const int64_t at = maxsplit < 0 ? std::max<int64_t>(n + maxsplit, 0) : maxsplit;
    std::string tail = absl::StrJoin(parts.begin() + at, parts.end(), sep.str());
    parts.resize(at);
    parts.push_back(std::move(tail));
  }
  for (std::string& p : parts) out.push_back(Value::String(std::move(p)));
  return Value::Array(std::move(out));
}

// Python's str.replace(old, new, count) as the reference's replace() implements it.
absl::StatusOr<Value> Replace(const std::string& s, const CallArgs& args) {
  if (args.positional.size() < 2) return TemplateError("replace() requires two arguments");
  const Value& from = args.positional[0];
  const Value& to = args.positional[1];
  if (!from.is_string() || !to.is_string())
    return TemplateError("replace() arguments must be strings");
  const Value* count_arg = Arg(args, 2, "count");
  int64_t remaining = -1;
  if (count_arg != nullptr && !count_arg->is_null()) {
    if (count_arg->type() != Value::Type::kInt) {
      return TemplateError("replace() count must be a number or none");
    }
    remaining = count_arg->int_value();
  }
  if (remaining == 0) return Value::String(s);
  const bool unlimited = remaining < 0;
  // Checked as the result grows: an empty pattern with a long replacement would otherwise ask
  // for the replacement once per code point.
  std::string out;
  if (from.str().empty()) {
    // An empty pattern matches at every code point boundary, both ends included.
    size_t i = 0;
    while (true) {
      if (unlimited || remaining > 0) {
        out += to.str();
        --remaining;
        SPECD_RETURN_IF_ERROR(CheckTextSize(static_cast<int64_t>(out.size()), "replace()"));
      }
      if (i >= s.size()) break;
      const size_t n = DecodeUtf8(s, i).size;
      out.append(s, i, n);
      i += n;
    }
    SPECD_RETURN_IF_ERROR(CheckTextSize(static_cast<int64_t>(out.size()), "replace()"));
    return Value::String(std::move(out));
  }
  size_t pos = 0;
  while (unlimited || remaining > 0) {
    const size_t hit = s.find(from.str(), pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to.str();
    pos = hit + from.str().size();
    --remaining;
    SPECD_RETURN_IF_ERROR(CheckTextSize(static_cast<int64_t>(out.size()), "replace()"));
  }
  out.append(s, pos);
  SPECD_RETURN_IF_ERROR(CheckTextSize(static_cast<int64_t>(out.size()), "replace()"));
  return Value::String(std::move(out));
}

absl::StatusOr<Value> AffixTest(const std::string& s, const CallArgs& args, bool prefix) {
  const char* name = prefix ? "startswith" : "endswith";
  if (args.positional.empty()) return TemplateError(absl::StrCat(name, "() requires an argument"));
  const Value& pattern = args.positional[0];
  auto matches = [&](const std::string& p) { return prefix ? s.starts_with(p) : s.ends_with(p); };
  if (pattern.is_string()) return Value::Bool(matches(pattern.str()));
  if (pattern.is_array()) {
    for (const Value& item : pattern.array().items) {
      if (!item.is_string())
        return TemplateError(absl::StrCat(name, "() tuple items must be strings"));
      if (matches(item.str())) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  return TemplateError(absl::StrCat(name, "() argument must be a string or a tuple of strings"));
}

absl::StatusOr<Value> Capitalize(const std::string& s) {
  if (s.empty()) return Value::String(s);
  const CodePoint cp = DecodeUtf8(s, 0);
  if (cp.value >= 0x10000) return Value::String(s);  // charAt(0) is half a pair: unchanged
  SPECD_ASSIGN_OR_RETURN(const std::string first, JsToUpper(s.substr(0, cp.size)));
  return Value::String(first + s.substr(cp.size));
}

ValueList ObjectItems(const ObjectData& data) {
  ValueList items;
  for (const auto& [k, v] : data.entries) items.push_back(Value::Array({Value::String(k), v}));
  return items;
}

absl::StatusOr<Value> DictSort(const ObjectData& data, const CallArgs& args) {
  SPECD_ASSIGN_OR_RETURN(const bool case_sensitive, BoolArg(args, 0, "case_sensitive", false));
  const Value* by = Arg(args, 1, "by");
  if (by != nullptr && !by->is_string()) return TemplateError("dictsort: by must be a string");
  const std::string by_what = by != nullptr ? by->str() : "key";
  if (by_what != "key" && by_what != "value") {
    return TemplateError("dictsort: by must be 'key' or 'value'");
  }
  SPECD_ASSIGN_OR_RETURN(const bool reverse, BoolArg(args, 2, "reverse", false));
  const size_t index = by_what == "key" ? 0 : 1;
  SPECD_ASSIGN_OR_RETURN(
      ValueList sorted, SortValues(ObjectItems(data), reverse, [&](const Value& a, const Value& b) {
        return Compare(a.array().items[index], b.array().items[index], case_sensitive);
      }));
  return Value::Array(std::move(sorted));
}

using Method = absl::StatusOr<Value> (*)(const Value& self, const CallArgs& args);

Value BindMethod(const Value& self, std::string_view name, Method method) {
  return Value::Function(std::string(name), [self, method](const CallArgs& args, Interpreter&,
                                                           Scope&) { return method(self, args); });
}

Value StringMember(const Value& self, std::string_view name) {
  static const std::array<std::pair<std::string_view, Method>, 11> kMethods = {{
      {"upper",
       [](const Value& s, const CallArgs&) -> absl::StatusOr<Value> {
         SPECD_ASSIGN_OR_RETURN(std::string out, JsToUpper(s.str()));
         return Value::String(std::move(out));
       }},
      {"lower",
       [](const Value& s, const CallArgs&) -> absl::StatusOr<Value> {
         SPECD_ASSIGN_OR_RETURN(std::string out, JsToLower(s.str()));
         return Value::String(std::move(out));
       }},
      {"strip",
       [](const Value& s, const CallArgs&) -> absl::StatusOr<Value> {
         return Value::String(std::string(JsTrim(s.str())));
       }},
      {"title",
       [](const Value& s, const CallArgs&) -> absl::StatusOr<Value> {
         return Value::String(Title(s.str()));
       }},
      {"capitalize",
       [](const Value& s, const CallArgs&) -> absl::StatusOr<Value> {
         return Capitalize(s.str());
       }},
      {"rstrip",
       [](const Value& s, const CallArgs&) -> absl::StatusOr<Value> {
         return Value::String(std::string(JsTrimEnd(s.str())));
       }},
      {"lstrip",
       [](const Value& s, const CallArgs&) -> absl::StatusOr<Value> {
         return Value::String(std::string(JsTrimStart(s.str())));
       }},
      {"startswith", [](const Value& s, const CallArgs& a) { return AffixTest(s.str(), a, true); }},
      {"endswith", [](const Value& s, const CallArgs& a) { return AffixTest(s.str(), a, false); }},
      {"split", [](const Value& s, const CallArgs& a) { return Split(s.str(), a); }},
      {"replace", [](const Value& s, const CallArgs& a) { return Replace(s.str(), a); }},
  }};
  if (name == "length") return Value::Int(Utf16Length(self.str()));
  for (const auto& [method_name, method] : kMethods) {
    if (method_name == name) return BindMethod(self, name, method);
  }
  return Value();
}

Method ObjectMethod(std::string_view name) {
  static const std::array<std::pair<std::string_view, Method>, 5> kMethods = {{
      {"get",
       [](const Value& o, const CallArgs& args) -> absl::StatusOr<Value> {
         SPECD_RETURN_IF_ERROR(NoKeywords(args, "get"));
         if (args.positional.empty() || !args.positional[0].is_string()) {
           return TemplateError("get(): the key must be a string");
         }
         if (const Value* v = o.object().Find(args.positional[0].str())) return *v;
         return args.positional.size() > 1 ? args.positional[1] : Value::Null();
       }},
      {"items",
       [](const Value& o, const CallArgs&) -> absl::StatusOr<Value> {
         return Value::Array(ObjectItems(o.object()));
       }},
      {"keys",
       [](const Value& o, const CallArgs&) -> absl::StatusOr<Value> {
         ValueList keys;
         for (const auto& [k, v] : o.object().entries) keys.push_back(Value::String(k));
         return Value::Array(std::move(keys));
       }},
      {"values",
       [](const Value& o, const CallArgs&) -> absl::StatusOr<Value> {
         ValueList values;
         for (const auto& [k, v] : o.object().entries) values.push_back(v);
         return Value::Array(std::move(values));
       }},
      {"dictsort", [](const Value& o, const CallArgs& args) { return DictSort(o.object(), args); }},
  }};
  for (const auto& [method_name, method] : kMethods) {
    if (method_name == name) return method;
  }
  return nullptr;
}

absl::StatusOr<Value> IdentifierFilter(const Value& operand, const std::string& name) {
  if (name == "safe") return operand;
  if (name == "tojson") {
    SPECD_ASSIGN_OR_RETURN(std::string json, ToJson(operand, JsonOptions{}));
    return Value::String(std::move(json));
  }
  switch (operand.type()) {
    case Value::Type::kArray: {
      const ValueList& items = operand.array().items;
      if (name == "list") return operand;
      if (name == "first" || name == "last") {
        if (items.empty()) return TemplateError(absl::StrCat(name, " of an empty list"));
        return name == "first" ? items.front() : items.back();
      }
      if (name == "length") return Value::Int(static_cast<int64_t>(items.size()));
      if (name == "reverse") return Value::Array(ValueList(items.rbegin(), items.rend()));
      if (name == "sort") {
        SPECD_ASSIGN_OR_RETURN(ValueList sorted,
                               SortValues(items, false, [](const Value& a, const Value& b) {
                                 return Compare(a, b, /*case_sensitive=*/false);
                               }));
        return Value::Array(std::move(sorted));
      }
      if (name == "join") {
        std::string out;
        for (const Value& item : items) {
          SPECD_ASSIGN_OR_RETURN(const std::string piece, JoinPiece(item));
          out += piece;
          SPECD_RETURN_IF_ERROR(CheckTextSize(static_cast<int64_t>(out.size()), "join"));
        }
        return Value::String(std::move(out));
      }
      if (name == "string") {
        JsonOptions options;
        options.undefined_as_null = false;
        SPECD_ASSIGN_OR_RETURN(std::string json, ToJson(operand, options));
        return Value::String(std::move(json));
      }
      if (name == "unique") {
        ValueList out;
        for (const Value& item : items) {
          const bool seen = std::any_of(out.begin(), out.end(), [&](const Value& o) {
            const bool both_nan = o.is_number() && item.is_number() && std::isnan(o.number()) &&
                                  std::isnan(item.number());
            return both_nan || StrictEquals(o, item);
          });
          if (!seen) out.push_back(item);
        }
        return Value::Array(std::move(out));
      }
      return UnknownFilter(name, operand);
    }
    case Value::Type::kString: {
      const std::string& s = operand.str();
      if (name == "length") return Value::Int(Utf16Length(s));
      if (name == "upper" || name == "lower") {
        SPECD_ASSIGN_OR_RETURN(std::string out, name == "upper" ? JsToUpper(s) : JsToLower(s));
        return Value::String(std::move(out));
      }
      if (name == "title") return Value::String(Title(s));
      if (name == "capitalize") return Capitalize(s);
      if (name == "trim") return Value::String(std::string(JsTrim(s)));
      if (name == "indent") return Indent(s, nullptr, false, false);
      if (name == "join" || name == "string") return operand;
      if (name == "int") {
        const std::optional<double> v = JsParseInt(s);
        return v ? CheckedInt(*v) : Value::Int(0);
      }
      if (name == "float") return Value::Float(JsParseFloat(s).value_or(0.0));
      return UnknownFilter(name, operand);
    }
    case Value::Type::kInt:
    case Value::Type::kFloat: {
      const bool is_int = operand.type() == Value::Type::kInt;
      if (name == "abs") {
        return is_int ? Value::Int(std::abs(operand.int_value()))
                      : Value::Float(std::fabs(operand.float_value()));
      }
      if (name == "int") return is_int ? operand : CheckedInt(std::floor(operand.float_value()));
      if (name == "float") return Value::Float(operand.number());
      if (name == "string") {
        SPECD_ASSIGN_OR_RETURN(std::string text, operand.ToDisplay());
        return Value::String(std::move(text));
      }
      return UnknownFilter(name, operand);
    }
    case Value::Type::kObject: {
      if (name == "items") return Value::Array(ObjectItems(operand.object()));
      if (name == "length")
        return Value::Int(static_cast<int64_t>(operand.object().entries.size()));
      if (const Method method = ObjectMethod(name)) return method(operand, CallArgs{});
      return UnknownFilter(name, operand);
    }
    case Value::Type::kBool: {
      const bool b = operand.bool_value();
      if (name == "bool") return operand;
      if (name == "int") return Value::Int(b ? 1 : 0);
      if (name == "float") return Value::Float(b ? 1.0 : 0.0);
      if (name == "string") return Value::String(b ? "true" : "false");
      return UnknownFilter(name, operand);
    }
    default:
      return UnknownFilter(name, operand);
  }
}

absl::StatusOr<Value> TojsonFilter(const Value& operand, const CallArgs& args) {
  JsonOptions options;
  if (const Value* indent = args.Keyword("indent"); indent != nullptr && !indent->is_null()) {
    if (indent->type() != Value::Type::kInt)
      return TemplateError("tojson: indent must be a number");
    options.indent = indent->int_value();
  }
  if (const Value* ascii = args.Keyword("ensure_ascii")) {
    if (ascii->type() != Value::Type::kBool) {
      return TemplateError("tojson: ensure_ascii must be a boolean");
    }
    options.ensure_ascii = ascii->bool_value();
  }
  if (const Value* sort = args.Keyword("sort_keys")) {
    if (sort->type() != Value::Type::kBool)
      return TemplateError("tojson: sort_keys must be a boolean");
    // The reference orders keys with the locale's collation (localeCompare), which specd does
    // not reproduce.
    if (sort->bool_value()) return TemplateError("tojson(sort_keys=true) is not supported");
  }
  if (const Value* seps = args.Keyword("separators"); seps != nullptr && !seps->is_null()) {
    if (!seps->is_array() || seps->array().items.size() != 2 ||
        !seps->array().items[0].is_string() || !seps->array().items[1].is_string()) {
      return TemplateError("tojson: separators must be a tuple of two strings");
    }
    options.separators = {seps->array().items[0].str(), seps->array().items[1].str()};
  }
  SPECD_ASSIGN_OR_RETURN(std::string json, ToJson(operand, options));
  return Value::String(std::move(json));
}

absl::StatusOr<Value> SelectAttr(Interpreter& interp, const Value& operand,
                                 std::span<const ExprPtr> arg_exprs, bool select, Scope& scope) {
  const char* name = select ? "selectattr" : "rejectattr";
  for (const Value& item : operand.array().items) {
    if (!item.is_attribute_container()) {
      return TemplateError(absl::StrCat(name, " applies to a list of objects only"));
    }
  }
  ValueList args;
  for (const ExprPtr& e : arg_exprs) {
    if (e->kind != ExprKind::kStringLiteral) {
      return TemplateError(absl::StrCat("the arguments of ", name, " must be string literals"));
    }
    SPECD_ASSIGN_OR_RETURN(Value v, interp.Evaluate(*e, scope));
    args.push_back(std::move(v));
  }
  if (args.empty()) return TemplateError(absl::StrCat(name, " needs an attribute name"));
  const std::string& attr = args[0].str();
  const Value* test_arg = args.size() > 2 ? &args[2] : nullptr;
  ValueList out;
  for (const Value& item : operand.array().items) {
    const Value* a = item.object().Find(attr);
    bool result = false;
    if (a != nullptr) {
      if (args.size() > 1) {
        SPECD_ASSIGN_OR_RETURN(result, ApplyTest(args[1].str(), *a, test_arg));
      } else {
        result = a->Truthy();
      }
    }
    if (result == select) out.push_back(item);
  }
  return Value::Array(std::move(out));
}

absl::StatusOr<Value> CallFilter(Interpreter& interp, const Value& operand, const Expr& filter,
                                 Scope& scope) {
  if (filter.children[0]->kind != ExprKind::kIdentifier) {
    return TemplateError("a filter must be a name");
  }
  const std::string& name = filter.children[0]->name;
  const std::span<const ExprPtr> arg_exprs = std::span<const ExprPtr>(filter.children).subspan(1);
  auto evaluate_args = [&]() { return interp.EvaluateArguments(arg_exprs, scope); };
  if (name == "tojson") {
    SPECD_ASSIGN_OR_RETURN(const CallArgs args, evaluate_args());
    return TojsonFilter(operand, args);
  }
  if (name == "join") {
    std::vector<std::string> pieces;
    if (operand.is_string()) {
      for (const std::string_view c : SplitCodePoints(operand.str())) pieces.emplace_back(c);
    } else if (operand.is_array()) {
      int64_t bytes = 0;
      for (const Value& item : operand.array().items) {
        SPECD_ASSIGN_OR_RETURN(std::string piece, JoinPiece(item));
        bytes += static_cast<int64_t>(piece.size());
        SPECD_RETURN_IF_ERROR(CheckTextSize(bytes, "join"));
        pieces.push_back(std::move(piece));
      }
    } else {
      return UnknownFilter(name, operand);
    }
    SPECD_ASSIGN_OR_RETURN(const CallArgs args, evaluate_args());
    const Value* sep = Arg(args, 0, "separator");
    if (sep != nullptr && !sep->is_string())
      return TemplateError("join: separator must be a string");
    const std::string separator = sep != nullptr ? sep->str() : std::string();
    int64_t bytes = 0;
    for (const std::string& piece : pieces) {
      bytes += static_cast<int64_t>(piece.size() + separator.size());
    }
    SPECD_RETURN_IF_ERROR(CheckTextSize(bytes, "join"));
    return Value::String(absl::StrJoin(pieces, separator));
  }
  if (name == "int" || name == "float") {
    SPECD_ASSIGN_OR_RETURN(const CallArgs args, evaluate_args());
    const bool to_int = name == "int";
    const Value* fallback = Arg(args, 0, "default");
    const Value default_value =
        fallback != nullptr ? *fallback : (to_int ? Value::Int(0) : Value::Float(0.0));
    if (operand.is_string()) {
      const std::optional<double> v =
          to_int ? JsParseInt(operand.str()) : JsParseFloat(operand.str());
      if (!v) return default_value;
      return to_int ? CheckedInt(*v) : Value::Float(*v);
    }
    if (operand.is_number()) return operand;
    if (operand.type() == Value::Type::kBool) {
      const bool b = operand.bool_value();
      return to_int ? Value::Int(b ? 1 : 0) : Value::Float(b ? 1.0 : 0.0);
    }
    return UnknownFilter(name, operand);
  }
  if (name == "default") {
    SPECD_ASSIGN_OR_RETURN(const CallArgs args, evaluate_args());
    const Value default_value = !args.positional.empty() ? args.positional[0] : Value::String("");
    SPECD_ASSIGN_OR_RETURN(const bool boolean, BoolArg(args, 1, "boolean", false));
    if (operand.is_undefined() || (boolean && !operand.Truthy())) return default_value;
    return operand;
  }
  if (operand.is_array()) {
    if (name == "sort") {
      SPECD_ASSIGN_OR_RETURN(const CallArgs args, evaluate_args());
      SPECD_ASSIGN_OR_RETURN(const bool reverse, BoolArg(args, 0, "reverse", false));
      SPECD_ASSIGN_OR_RETURN(const bool case_sensitive, BoolArg(args, 1, "case_sensitive", false));
      const Value* attribute = Arg(args, 2, "attribute");
      std::optional<std::string> path;
      if (attribute != nullptr && !attribute->is_null()) {
        if (attribute->is_string()) {
          path = attribute->str();
        } else if (attribute->type() == Value::Type::kInt) {
          path = absl::StrCat(attribute->int_value());
        } else {
          return TemplateError("sort: attribute must be a string, an integer or none");
        }
      }
      auto key = [&](const Value& v) { return path ? AttributePath(v, *path) : v; };
      SPECD_ASSIGN_OR_RETURN(
          ValueList sorted,
          SortValues(operand.array().items, reverse, [&](const Value& a, const Value& b) {
            return Compare(key(a), key(b), case_sensitive);
          }));
      return Value::Array(std::move(sorted));
    }
    if (name == "selectattr" || name == "rejectattr") {
      return SelectAttr(interp, operand, arg_exprs, name == "selectattr", scope);
    }
    if (name == "map") {
      SPECD_ASSIGN_OR_RETURN(const CallArgs args, evaluate_args());
      const Value* attribute = args.Keyword("attribute");
      if (attribute == nullptr) {
        return TemplateError("map() without attribute= is not supported");
      }
      if (!attribute->is_string()) return TemplateError("map: attribute must be a string");
      const Value* fallback = args.Keyword("default");
      ValueList out;
      for (const Value& item : operand.array().items) {
        if (!item.is_attribute_container()) return TemplateError("map: items must be objects");
        Value v = AttributePath(item, attribute->str());
        if (v.is_undefined() && fallback != nullptr) v = *fallback;
        out.push_back(std::move(v));
      }
      return Value::Array(std::move(out));
    }
    return UnknownFilter(name, operand);
  }
  if (operand.is_string()) {
    if (name == "indent") {
      SPECD_ASSIGN_OR_RETURN(const CallArgs args, evaluate_args());
      const Value* first = Arg(args, 1, "first");
      const Value* blank = Arg(args, 2, "blank");
      return Indent(operand.str(), Arg(args, 0, "width"), first != nullptr && RawTruthy(*first),
                    blank != nullptr && RawTruthy(*blank));
    }
    if (name == "replace") {
      SPECD_ASSIGN_OR_RETURN(const CallArgs args, evaluate_args());
      return Replace(operand.str(), args);
    }
    return UnknownFilter(name, operand);
  }
  if (operand.is_object()) {
    if (const Method method = ObjectMethod(name)) {
      SPECD_ASSIGN_OR_RETURN(const CallArgs args, evaluate_args());
      return method(operand, args);
    }
  }
  return UnknownFilter(name, operand);
}

absl::StatusOr<Value> RaiseException(const CallArgs& args, Interpreter&, Scope&) {
  std::string message;
  if (!args.positional.empty() && !args.positional[0].is_undefined()) {
    SPECD_ASSIGN_OR_RETURN(message, args.positional[0].ToJsString());
  }
  // The template's own message, unprefixed: it is meant for the person who sent the request.
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kRaisedPayload, absl::Cord("1"));
  return status;
}

absl::StatusOr<Value> Range(const CallArgs& args, Interpreter& interp, Scope&) {
  SPECD_RETURN_IF_ERROR(NoKeywords(args, "range"));
  if (args.positional.empty() || args.positional.size() > 3) {
    return TemplateError("range() takes 1 to 3 arguments");
  }
  for (const Value& v : args.positional) {
    if (v.type() != Value::Type::kInt) return TemplateError("range() arguments must be integers");
  }
  int64_t start = 0;
  int64_t stop = args.positional[0].int_value();
  if (args.positional.size() > 1) {
    start = stop;
    stop = args.positional[1].int_value();
  }
  const int64_t step = args.positional.size() > 2 ? args.positional[2].int_value() : 1;
  if (step == 0) return TemplateError("range() step must not be zero");
  // The length comes first, in unsigned arithmetic (the span of two int64 needs 64 bits), so
  // that the render pays for the list before it exists and no element overflows on the way.
  const bool up = step > 0;
  const uint64_t span = up ? static_cast<uint64_t>(stop) - static_cast<uint64_t>(start)
                           : static_cast<uint64_t>(start) - static_cast<uint64_t>(stop);
  const uint64_t stride = up ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
  const uint64_t count = (up ? start < stop : start > stop) ? (span - 1) / stride + 1 : 0;
  constexpr uint64_t kMaxItems = 1 << 20;
  if (count > kMaxItems) {
    return TemplateError(
        absl::StrCat("range() of ", count, " items is too long (at most ", kMaxItems, ")"));
  }
  SPECD_RETURN_IF_ERROR(interp.Charge(static_cast<int64_t>(count)));
  ValueList out;
  out.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    // Modulo 2^64, which is exact here: every element lies between start and stop.
    out.push_back(Value::Int(
        static_cast<int64_t>(static_cast<uint64_t>(start) + i * static_cast<uint64_t>(step))));
  }
  return Value::Array(std::move(out));
}

absl::StatusOr<Value> StrftimeNow(const CallArgs& args, Interpreter& interp, Scope&) {
  if (args.positional.empty() || !args.positional[0].is_string()) {
    return TemplateError("strftime_now() needs a format string");
  }
  return Value::String(Strftime(interp.now(), args.positional[0].str()));
}

absl::StatusOr<Value> MakeNamespace(const CallArgs& args, Interpreter& interp, Scope&) {
  if (args.positional.size() > 1) {
    return TemplateError(
        absl::StrCat("namespace expected at most 1 argument, got ", args.positional.size()));
  }
  ObjectData data;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_object()) {
      for (const auto& [k, v] : source.object().entries) data.Set(k, v);
    } else if (source.is_array()) {
      for (const Value& pair : source.array().items) {
        ValueList kv;
        if (pair.is_array()) {
          kv = pair.array().items;
        } else if (pair.is_string()) {
          for (const std::string_view c : SplitCodePoints(pair.str())) {
            kv.push_back(Value::String(std::string(c)));
          }
        }
        if (kv.size() != 2 || !kv[0].is_string()) {
          return TemplateError("namespace expected an object or a list of [key, value] pairs");
        }
        data.Set(kv[0].str(), kv[1]);
      }
    } else {
      return TemplateError(absl::StrCat("a ", source.TypeName(), " is not iterable"));
    }
  }
  for (const auto& [k, v] : args.keywords) data.Set(k, v);
  Value ns = Value::Namespace(std::move(data));
  interp.TrackNamespace(ns);
  return ns;
}

}  // namespace

absl::StatusOr<Value> ApplyFilter(Interpreter& interp, const Value& operand, const Expr& filter,
                                  Scope& scope) {
  if (filter.kind == ExprKind::kIdentifier) return IdentifierFilter(operand, filter.name);
  if (filter.kind == ExprKind::kCall) return CallFilter(interp, operand, filter, scope);
  return TemplateError("a filter must be a name or a call");
}

absl::StatusOr<bool> ApplyTest(std::string_view name, const Value& operand, const Value* arg) {
  const Value::Type t = operand.type();
  if (name == "boolean") return t == Value::Type::kBool;
  if (name == "callable") return t == Value::Type::kFunction;
  if (name == "odd" || name == "even") {
    if (t != Value::Type::kInt)
      return TemplateError(
          absl::StrCat("cannot test ", ToAbsl(name), " on a ", operand.TypeName()));
    const bool odd = operand.int_value() % 2 != 0;
    return name == "odd" ? odd : !odd;
  }
  if (name == "false") return t == Value::Type::kBool && !operand.bool_value();
  if (name == "true") return t == Value::Type::kBool && operand.bool_value();
  if (name == "none") return t == Value::Type::kNull;
  if (name == "string") return t == Value::Type::kString;
  if (name == "number") return operand.is_number();
  if (name == "integer") return t == Value::Type::kInt;
  if (name == "iterable")
    return (operand.is_array() && !operand.array().tuple) || operand.is_string();
  if (name == "mapping") return operand.is_object();
  if (name == "sequence") return operand.is_array() || operand.is_object() || operand.is_string();
  if (name == "lower" || name == "upper") {
    if (!operand.is_string()) return false;
    SPECD_ASSIGN_OR_RETURN(const std::string mapped,
                           name == "lower" ? JsToLower(operand.str()) : JsToUpper(operand.str()));
    return mapped == operand.str();
  }
  if (name == "defined") return t != Value::Type::kUndefined;
  if (name == "undefined") return t == Value::Type::kUndefined;
  if (name == "equalto" || name == "eq") {
    if (arg == nullptr)
      return TemplateError(absl::StrCat("the test '", ToAbsl(name), "' needs a value"));
    return StrictEquals(operand, *arg);
  }
  return TemplateError(absl::StrCat("unknown test '", ToAbsl(name), "'"));
}

Value MemberBuiltin(const Value& object, std::string_view name) {
  if (object.is_string()) return StringMember(object, name);
  if (object.is_array()) {
    return name == "length" ? Value::Int(static_cast<int64_t>(object.array().items.size()))
                            : Value();
  }
  if (object.is_object()) {
    if (const Method method = ObjectMethod(name)) return BindMethod(object, name, method);
  }
  return Value();
}

Value NamespaceFunction() {
  static const Value* const kNamespace = new Value(Value::Function("namespace", MakeNamespace));
  return *kNamespace;
}

void AddGlobals(Scope& global) {
  global.Set("false", Value::Bool(false));
  global.Set("true", Value::Bool(true));
  global.Set("none", Value::Null());
  global.Set("False", Value::Bool(false));
  global.Set("True", Value::Bool(true));
  global.Set("None", Value::Null());
  global.Set("raise_exception", Value::Function("raise_exception", RaiseException));
  global.Set("range", Value::Function("range", Range));
  global.Set("strftime_now", Value::Function("strftime_now", StrftimeNow));
}

std::string Strftime(const absl::CivilSecond& time, std::string_view format) {
  static constexpr std::array<std::string_view, 12> kMonths = {
      "January", "February", "March",     "April",   "May",      "June",
      "July",    "August",   "September", "October", "November", "December"};
  const std::string_view month = kMonths[time.month() - 1];
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out.push_back(format[i]);
      continue;
    }
    switch (format[i + 1]) {
      case 'Y':
        out += absl::StrCat(time.year());
        break;
      case 'm':
        out += absl::StrFormat("%02d", time.month());
        break;
      case 'd':
        out += absl::StrFormat("%02d", time.day());
        break;
      case 'b':
        out += month.substr(0, 3);
        break;
      case 'B':
        out += month;
        break;
      case 'H':
        out += absl::StrFormat("%02d", time.hour());
        break;
      case 'M':
        out += absl::StrFormat("%02d", time.minute());
        break;
      case '%':
        out += '%';
        break;
      default:
        out.push_back('%');
        continue;  // the next character is copied as it is
    }
    ++i;
  }
  return out;
}

}  // namespace specd::chat
