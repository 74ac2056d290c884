#include "common/tokenizer/json_fields.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/string_util.h"

namespace specd::tokenizer {
namespace {

// nullptr when the key is absent or null.
const Json* Find(const Json& obj, std::string_view key) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status WrongType(std::string_view key, std::string_view where, std::string_view type,
                       const Json& value) {
  return absl::InvalidArgumentError(absl::StrCat(ToAbsl(where), ": field '", ToAbsl(key),
                                                 "' must be ", ToAbsl(type), ", got ",
                                                 value.type_name()));
}

}  // namespace

absl::StatusOr<Json> ParseJson(std::string_view text, std::string_view file) {
  // Parsing with exceptions, caught here, is what gives the byte offset of the error.
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(file), ": invalid JSON (parse error at byte ", e.byte, ")"));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(file), ": invalid JSON (", e.what(), ")"));
  }
}

absl::StatusOr<std::optional<std::string>> OptionalString(const Json& obj, std::string_view key,
                                                          std::string_view where) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return WrongType(key, where, "a string", *v);
  return v->get<std::string>();
}

absl::StatusOr<std::optional<bool>> OptionalBool(const Json& obj, std::string_view key,
                                                 std::string_view where) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return WrongType(key, where, "true or false", *v);
  return v->get<bool>();
}

absl::StatusOr<std::optional<int64_t>> OptionalInt(const Json& obj, std::string_view key,
                                                   std::string_view where) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::floor(d) == d && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
  }
  return WrongType(key, where, "an integer", *v);
}

absl::StatusOr<std::optional<double>> OptionalNumber(const Json& obj, std::string_view key,
                                                     std::string_view where) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return WrongType(key, where, "a number", *v);
  return v->get<double>();
}

absl::StatusOr<const Json*> RequiredField(const Json& obj, std::string_view key,
                                          std::string_view where) {
  const auto it = obj.find(key);
  if (it == obj.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(where), ": missing field '", ToAbsl(key), "'"));
  }
  return &*it;
}

absl::StatusOr<std::string> RequiredString(const Json& obj, std::string_view key,
                                           std::string_view where) {
  absl::StatusOr<std::optional<std::string>> v = OptionalString(obj, key, where);
  if (!v.ok()) return v.status();
  if (!v->has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(where), ": missing field '", ToAbsl(key), "'"));
  }
  return **std::move(v);
}

absl::StatusOr<int64_t> RequiredInt(const Json& obj, std::string_view key, std::string_view where) {
  absl::StatusOr<std::optional<int64_t>> v = OptionalInt(obj, key, where);
  if (!v.ok()) return v.status();
  if (!v->has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToAbsl(where), ": missing field '", ToAbsl(key), "'"));
  }
  return **v;
}

}  // namespace specd::tokenizer
