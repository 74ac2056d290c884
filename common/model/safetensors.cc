#include "common/model/safetensors.h"

#include <algorithm>
#include <array>
#include <exception>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/absl_string.h"
#include "base/json_brackets.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

using json = nlohmann::json;

struct DTypeInfo {
  SafetensorsDType dtype;
  std::string_view name;
  int64_t size;
};

constexpr std::array<DTypeInfo, 15> kDTypes = {{
    {SafetensorsDType::kBool, "BOOL", 1},
    {SafetensorsDType::kU8, "U8", 1},
    {SafetensorsDType::kI8, "I8", 1},
    {SafetensorsDType::kI16, "I16", 2},
    {SafetensorsDType::kU16, "U16", 2},
    {SafetensorsDType::kF16, "F16", 2},
    {SafetensorsDType::kBF16, "BF16", 2},
    {SafetensorsDType::kI32, "I32", 4},
    {SafetensorsDType::kU32, "U32", 4},
    {SafetensorsDType::kF32, "F32", 4},
    {SafetensorsDType::kF64, "F64", 8},
    {SafetensorsDType::kI64, "I64", 8},
    {SafetensorsDType::kU64, "U64", 8},
    {SafetensorsDType::kF8E4M3, "F8_E4M3", 1},
    {SafetensorsDType::kF8E5M2, "F8_E5M2", 1},
}};

// A valid header nests 3 deep (header > tensor entry > shape). The limit leaves room for unknown
// keys, which the reference implementation ignores, while bounding the parser's memory on hostile
// input such as 100 MB of '['.
constexpr int kMaxJsonDepth = 8;

// Deepest bracket nesting outside strings; the JSON parser reports every other syntax error.
int JsonNestingDepth(std::string_view text) {
  int max_depth = 0;
  WalkJsonBrackets(text, 0, [&](size_t, int depth) {
    max_depth = std::max(max_depth, depth);
    return true;
  });
  return max_depth;
}

// `value` as JSON for an error message, cut short so a hostile header cannot flood the log.
std::string Short(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr size_t kMax = 80;
  if (text.size() > kMax) text = absl::StrCat(text.substr(0, kMax), "...");
  return text;
}

// A JSON integer >= 0 (not a float such as 2.0, not a bool).
std::optional<uint64_t> AsNonNegativeInteger(const json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v >= 0) return static_cast<uint64_t>(v);
  }
  return std::nullopt;
}

class HeaderParser {
 public:
  HeaderParser(absl::string_view file, uint64_t data_size) : file_(file), data_size_(data_size) {}

  absl::Status ParseEntry(const std::string& name, const json& entry, SafetensorsHeader& header) {
    if (name == "__metadata__") return ParseMetadata(entry, header);
    if (!entry.is_object()) {
      return Invalid(name, absl::StrCat("entry must be an object with dtype, shape and "
                                        "data_offsets, got ",
                                        entry.type_name()));
    }
    SafetensorsTensor tensor;
    tensor.name = name;

    const auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end()) return Invalid(name, "missing \"dtype\"");
    if (!dtype_it->is_string()) return Invalid(name, "\"dtype\" must be a string");
    const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
    const std::optional<SafetensorsDType> dtype = SafetensorsDTypeFromName(dtype_name);
    if (!dtype) {
      return Invalid(
          name, absl::StrCat("unknown dtype \"", dtype_name, "\"; known: ",
                             absl::StrJoin(kDTypes, ", ", [](std::string* out, const DTypeInfo& d) {
                               out->append(d.name);
                             })));
    }
    tensor.dtype = *dtype;

    const auto shape_it = entry.find("shape");
    if (shape_it == entry.end()) return Invalid(name, "missing \"shape\"");
    if (!shape_it->is_array()) return Invalid(name, "\"shape\" must be an array of integers");
    int64_t numel = 1;
    for (const json& dim : *shape_it) {
      const std::optional<uint64_t> d = AsNonNegativeInteger(dim);
      if (!d || *d > static_cast<uint64_t>(INT64_MAX)) {
        return Invalid(name, absl::StrCat("shape ", Short(*shape_it),
                                          " must hold non-negative integers; got ", Short(dim)));
      }
      tensor.shape.push_back(static_cast<int64_t>(*d));
      if (__builtin_mul_overflow(numel, static_cast<int64_t>(*d), &numel)) {
        return Invalid(name, absl::StrCat("shape ", Short(*shape_it),
                                          " has more elements than fit in 64 bits"));
      }
    }
    tensor.numel = numel;
    int64_t nbytes = 0;
    if (__builtin_mul_overflow(numel, SafetensorsDTypeSize(tensor.dtype), &nbytes)) {
      return Invalid(name, absl::StrCat("shape ", Short(*shape_it), " of ", dtype_name,
                                        " has more bytes than fit in 64 bits"));
    }

    const auto offsets_it = entry.find("data_offsets");
    if (offsets_it == entry.end()) return Invalid(name, "missing \"data_offsets\"");
    const json& offsets = *offsets_it;
    std::optional<uint64_t> begin, end;
    if (offsets.is_array() && offsets.size() == 2) {
      begin = AsNonNegativeInteger(offsets[0]);
      end = AsNonNegativeInteger(offsets[1]);
    }
    if (!begin || !end) {
      return Invalid(name, absl::StrCat("\"data_offsets\" must be [begin, end] with non-negative "
                                        "integers, got ",
                                        Short(offsets)));
    }
    if (*end < *begin) {
      return Invalid(name, absl::StrCat("data_offsets ", Short(offsets), " end before they begin"));
    }
    if (*end - *begin != static_cast<uint64_t>(nbytes)) {
      return Invalid(name, absl::StrCat("data_offsets ", Short(offsets), " span ", *end - *begin,
                                        " bytes but shape ", Short(*shape_it), " of ", dtype_name,
                                        " needs ", nbytes));
    }
    if (*end > data_size_) {
      return absl::DataLossError(
          absl::StrCat(file_, ": tensor \"", name, "\": data_offsets ", Short(offsets),
                       " reach past the end of the data section (", data_size_,
                       " bytes); the file is truncated or its header is wrong"));
    }
    tensor.data_begin = *begin;
    tensor.data_end = *end;
    header.tensors.push_back(std::move(tensor));
    return absl::OkStatus();
  }

 private:
  absl::Status ParseMetadata(const json& entry, SafetensorsHeader& header) {
    // The reference implementation reads "__metadata__" as an optional map.
    if (entry.is_null()) return absl::OkStatus();
    if (!entry.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          file_, ": \"__metadata__\" must be an object of strings, got ", entry.type_name()));
    }
    for (const auto& [key, value] : entry.items()) {
      if (!value.is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(
            file_, ": \"__metadata__\".\"", key, "\" must be a string, got ", value.type_name()));
      }
      header.metadata.emplace(key, value.get<std::string>());
    }
    return absl::OkStatus();
  }

  absl::Status Invalid(absl::string_view tensor, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ": tensor \"", tensor, "\": ", what));
  }

  absl::string_view file_;
  uint64_t data_size_;
};

// Parses the header text, rejecting duplicate keys, which nlohmann::json would silently merge.
absl::StatusOr<json> ParseJsonRejectingDuplicates(std::string_view text, absl::string_view file) {
  std::vector<std::set<std::string>> open_objects;
  std::optional<std::string> duplicate;
  std::string tensor;  // the current top-level key, to say where a duplicate is
  const json::parser_callback_t callback = [&](int /*depth*/, json::parse_event_t event,
                                               json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string()) {
          const std::string& key = parsed.get_ref<const std::string&>();
          if (open_objects.size() == 1) tensor = key;
          if (!open_objects.back().insert(key).second && !duplicate) {
            duplicate = open_objects.size() == 1
                            ? absl::StrCat("tensor name \"", key, "\" appears twice")
                            : absl::StrCat("key \"", key, "\" appears twice in the entry of \"",
                                           tensor, "\"");
          }
        }
        break;
      default:
        break;
    }
    return true;
  };
  json parsed = json::parse(text, callback, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": the safetensors header is not valid JSON (or not UTF-8)"));
  }
  if (duplicate) return absl::InvalidArgumentError(absl::StrCat(file, ": header: ", *duplicate));
  return parsed;
}

absl::StatusOr<SafetensorsHeader> ParseHeaderImpl(std::string_view bytes, absl::string_view file) {
  constexpr uint64_t kLengthBytes = 8;
  if (bytes.size() < kLengthBytes) {
    return absl::DataLossError(absl::StrCat(
        file, ": file is ", bytes.size(),
        " bytes; a safetensors file starts with an 8-byte little-endian header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  }
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": header length ", header_len,
                                                   " exceeds the ", kMaxSafetensorsHeaderBytes,
                                                   "-byte limit; this is not a safetensors file"));
  }
  if (header_len > bytes.size() - kLengthBytes) {
    return absl::DataLossError(absl::StrCat(file, ": header length ", header_len,
                                            " runs past the end of the file (", bytes.size(),
                                            " bytes); the file is truncated"));
  }
  const std::string_view text = bytes.substr(kLengthBytes, header_len);
  if (const int depth = JsonNestingDepth(text); depth > kMaxJsonDepth) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": header nests JSON ", depth,
                                                   " levels deep; a safetensors header has 3"));
  }
  SPECD_ASSIGN_OR_RETURN(const json parsed, ParseJsonRejectingDuplicates(text, file));
  if (!parsed.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": the safetensors header must be a JSON object, got ", parsed.type_name()));
  }

  SafetensorsHeader header;
  header.data_start = kLengthBytes + header_len;
  const uint64_t data_size = bytes.size() - header.data_start;
  HeaderParser parser(file, data_size);
  for (const auto& [name, entry] : parsed.items()) {
    SPECD_RETURN_IF_ERROR(parser.ParseEntry(name, entry, header));
  }

  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return std::tie(a.data_begin, a.data_end, a.name) <
                     std::tie(b.data_begin, b.data_end, b.name);
            });
  uint64_t covered = 0;
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    const SafetensorsTensor& t = header.tensors[i];
    if (t.data_begin < covered) {
      const SafetensorsTensor& prev = header.tensors[i - 1];
      return absl::InvalidArgumentError(absl::StrCat(
          file, ": tensor \"", t.name, "\" (data_offsets [", t.data_begin, ", ", t.data_end,
          "]) overlaps tensor \"", prev.name, "\" ([", prev.data_begin, ", ", prev.data_end, "])"));
    }
    if (t.data_begin > covered) {
      return absl::InvalidArgumentError(absl::StrCat(
          file, ": bytes [", covered, ", ", t.data_begin, ") of the data section before tensor \"",
          t.name, "\" belong to no tensor; safetensors requires contiguous tensors"));
    }
    covered = t.data_end;
  }
  if (covered != data_size) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": the data section has ", data_size,
                                                   " bytes but its tensors cover ", covered,
                                                   "; trailing bytes are not allowed"));
  }
  return header;
}

}  // namespace

std::string_view SafetensorsDTypeName(SafetensorsDType dtype) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "?";
}

int64_t SafetensorsDTypeSize(SafetensorsDType dtype) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.dtype == dtype) return d.size;
  }
  return 0;
}

std::optional<SafetensorsDType> SafetensorsDTypeFromName(std::string_view name) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.name == name) return d.dtype;
  }
  return std::nullopt;
}

SafetensorsDType ToSafetensorsDType(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kF32:
      return SafetensorsDType::kF32;
    case kernels::DType::kF16:
      return SafetensorsDType::kF16;
    case kernels::DType::kBF16:
      return SafetensorsDType::kBF16;
  }
  return SafetensorsDType::kF32;
}

std::optional<kernels::DType> ToKernelDType(SafetensorsDType dtype) {
  switch (dtype) {
    case SafetensorsDType::kF32:
      return kernels::DType::kF32;
    case SafetensorsDType::kF16:
      return kernels::DType::kF16;
    case SafetensorsDType::kBF16:
      return kernels::DType::kBF16;
    default:
      return std::nullopt;
  }
}

const SafetensorsTensor* SafetensorsHeader::Find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors[it->second];
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::string_view file_bytes,
                                                         std::string_view file_name_for_errors) {
  // nlohmann::json reports type errors and allocation failures by exception; none may escape.
  try {
    SPECD_ASSIGN_OR_RETURN(SafetensorsHeader header,
                           ParseHeaderImpl(file_bytes, ToAbsl(file_name_for_errors)));
    for (size_t i = 0; i < header.tensors.size(); ++i) {
      header.index_.emplace(header.tensors[i].name, i);
    }
    return header;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        ToAbsl(file_name_for_errors), ": cannot parse the safetensors header: ", e.what()));
  }
}

absl::StatusOr<kernels::DType> WeightDType(const SafetensorsTensor& tensor,
                                           std::string_view file_name_for_errors) {
  const std::optional<kernels::DType> dtype = ToKernelDType(tensor.dtype);
  if (!dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        ToAbsl(file_name_for_errors), ": tensor ", tensor.name, " has dtype ",
        ToAbsl(SafetensorsDTypeName(tensor.dtype)), "; specd loads F32, F16 or BF16 weights"));
  }
  return *dtype;
}

}  // namespace specd
