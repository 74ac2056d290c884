// Typed access to JSON object fields with errors that name the file and field, so a malformed
// tokenizer.json or config says exactly what is wrong instead of throwing.
#ifndef SPECD_COMMON_TOKENIZER_JSON_FIELDS_H_
#define SPECD_COMMON_TOKENIZER_JSON_FIELDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace specd::tokenizer {

using Json = nlohmann::json;

// Parses `text` without exceptions; INVALID_ARGUMENT "<file>: invalid JSON ..." on failure.
absl::StatusOr<Json> ParseJson(std::string_view text, std::string_view file);

// A field that is absent or null gives nullopt; a field of the wrong type is INVALID_ARGUMENT
// "<where>: field '<key>' must be a <type>". `obj` must be an object.
absl::StatusOr<std::optional<std::string>> OptionalString(const Json& obj, std::string_view key,
                                                          std::string_view where);
absl::StatusOr<std::optional<bool>> OptionalBool(const Json& obj, std::string_view key,
                                                 std::string_view where);
absl::StatusOr<std::optional<int64_t>> OptionalInt(const Json& obj, std::string_view key,
                                                   std::string_view where);
absl::StatusOr<std::optional<double>> OptionalNumber(const Json& obj, std::string_view key,
                                                     std::string_view where);

// The same, but absence is INVALID_ARGUMENT "<where>: missing field '<key>'".
absl::StatusOr<std::string> RequiredString(const Json& obj, std::string_view key,
                                           std::string_view where);
absl::StatusOr<int64_t> RequiredInt(const Json& obj, std::string_view key, std::string_view where);
absl::StatusOr<const Json*> RequiredField(const Json& obj, std::string_view key,
                                          std::string_view where);

}  // namespace specd::tokenizer

#endif  // SPECD_COMMON_TOKENIZER_JSON_FIELDS_H_
