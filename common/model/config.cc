#include "common/model/config.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <numbers>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/absl_string.h"
#include "base/status_macros.h"
#include "common/model/mapped_file.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr std::string_view kArchitecture = "LlamaForCausalLM";

// Limits far above any real Llama (405B: hidden 16384, intermediate 53248, 126 layers) that keep
// every product below in 64 bits and every allocation sized from the config sane.
constexpr int64_t kMaxLayers = int64_t{1} << 20;
constexpr int64_t kMaxHeads = int64_t{1} << 20;
constexpr int64_t kMaxHeadDim = int64_t{1} << 16;
constexpr int64_t kMaxWidth = int64_t{1} << 24;  // hidden_size, intermediate_size
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxMatrixElements = int64_t{1} << 40;
// A config.json is a few kB; this only bounds what a hostile file can make us read.
constexpr size_t kMaxConfigBytes = 16 << 20;

std::string Short(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr size_t kMax = 80;
  if (text.size() > kMax) text = absl::StrCat(text.substr(0, kMax), "...");
  return text;
}

// Typed access to the fields of one JSON object, with errors that name `source` and the field.
class Fields {
 public:
  Fields(const json& object, absl::string_view source, std::string prefix = "")
      : object_(object), source_(source), prefix_(std::move(prefix)) {}

  absl::Status Error(std::string_view field, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": ", prefix_, ToAbsl(field), " ", what));
  }

  // The field, or nullptr when absent or null (transformers treats null as unset).
  const json* Find(std::string_view field) const {
    const auto it = object_.find(field);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  absl::StatusOr<std::optional<int64_t>> OptionalInt(std::string_view field, int64_t min,
                                                     int64_t max) const {
    const json* v = Find(field);
    if (v == nullptr) return std::nullopt;
    // Only integers: 2048.0 or true would be read differently by other tools.
    if (!v->is_number_integer()) {
      return Error(field, absl::StrCat("must be an integer, got ", Short(*v)));
    }
    if (v->is_number_unsigned() ? v->get<uint64_t>() > static_cast<uint64_t>(max)
                                : v->get<int64_t>() > max) {
      return Error(field, absl::StrCat("(", Short(*v), ") exceeds the limit of ", max));
    }
    const int64_t x = v->get<int64_t>();
    if (x < min) return Error(field, absl::StrCat("(", x, ") must be at least ", min));
    return x;
  }

  absl::StatusOr<int64_t> RequiredInt(std::string_view field, int64_t min, int64_t max) const {
    SPECD_ASSIGN_OR_RETURN(const std::optional<int64_t> v, OptionalInt(field, min, max));
    if (!v) return Error(field, "is missing");
    return *v;
  }

  // A finite number > 0.
  absl::StatusOr<std::optional<double>> OptionalPositive(std::string_view field) const {
    const json* v = Find(field);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number()) return Error(field, absl::StrCat("must be a number, got ", Short(*v)));
    const double x = v->get<double>();
    if (!(x > 0.0) || !std::isfinite(x)) {
      return Error(field, absl::StrCat("(", Short(*v), ") must be a finite number > 0"));
    }
    return x;
  }

  absl::StatusOr<double> RequiredPositive(std::string_view field) const {
    SPECD_ASSIGN_OR_RETURN(const std::optional<double> v, OptionalPositive(field));
    if (!v) return Error(field, "is missing");
    return *v;
  }

  absl::StatusOr<std::optional<bool>> OptionalBool(std::string_view field) const {
    const json* v = Find(field);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean())
      return Error(field, absl::StrCat("must be true or false, got ", Short(*v)));
    return v->get<bool>();
  }

  absl::StatusOr<std::optional<std::string>> OptionalString(std::string_view field) const {
    const json* v = Find(field);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) return Error(field, absl::StrCat("must be a string, got ", Short(*v)));
    return v->get<std::string>();
  }

  // null, an integer, or a list of integers, each in [0, vocab_size).
  absl::StatusOr<std::vector<int32_t>> TokenIds(std::string_view field, int64_t vocab_size) const {
    const json* v = Find(field);
    std::vector<int32_t> ids;
    if (v == nullptr) return ids;
    const json list = v->is_array() ? *v : json::array({*v});
    for (const json& id : list) {
      if (!id.is_number_integer() || (!id.is_number_unsigned() && id.get<int64_t>() < 0) ||
          id.get<uint64_t>() >= static_cast<uint64_t>(vocab_size)) {
        return Error(field, absl::StrCat("must be a token id or a list of token ids in [0, ",
                                         vocab_size, ") (vocab_size), got ", Short(*v)));
      }
      ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    return ids;
  }

 private:
  const json& object_;
  absl::string_view source_;
  std::string prefix_;
};

absl::StatusOr<kernels::DType> ParseTorchDType(absl::string_view name, const Fields& fields,
                                               std::string_view field) {
  if (name == "float32") return kernels::DType::kF32;
  if (name == "float16") return kernels::DType::kF16;
  if (name == "bfloat16") return kernels::DType::kBF16;
  return fields.Error(field, absl::StrCat("\"", name,
                                          "\" is not supported; specd loads float32, float16 "
                                          "or bfloat16 models"));
}

std::string_view TorchDTypeName(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kF32:
      return "float32";
    case kernels::DType::kF16:
      return "float16";
    case kernels::DType::kBF16:
      return "bfloat16";
  }
  return "float32";
}

// `rope_scaling` (transformers <= 4.x) or `rope_parameters` (5.x); `object` is either.
absl::StatusOr<RopeScaling> ParseRopeScaling(const json& object, absl::string_view source,
                                             absl::string_view field) {
  const Fields f(object, source, absl::StrCat(field, "."));
  if (!object.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", field, " must be an object or null, got ", Short(object)));
  }
  // Older configs spell the key "type".
  SPECD_ASSIGN_OR_RETURN(std::optional<std::string> type, f.OptionalString("rope_type"));
  if (!type) {
    SPECD_ASSIGN_OR_RETURN(type, f.OptionalString("type"));
  }
  RopeScaling scaling;
  if (!type) return f.Error("rope_type", "is missing");
  if (*type == "default") return scaling;
  if (*type != "llama3") {
    return absl::UnimplementedError(
        absl::StrCat(source, ": ", field, ".rope_type \"", *type,
                     "\" is not supported; specd implements default and llama3 RoPE"));
  }
  scaling.type = RopeScaling::Type::kLlama3;
  SPECD_ASSIGN_OR_RETURN(scaling.factor, f.RequiredPositive("factor"));
  SPECD_ASSIGN_OR_RETURN(scaling.low_freq_factor, f.RequiredPositive("low_freq_factor"));
  SPECD_ASSIGN_OR_RETURN(scaling.high_freq_factor, f.RequiredPositive("high_freq_factor"));
  SPECD_ASSIGN_OR_RETURN(scaling.original_max_position_embeddings,
                         f.RequiredInt("original_max_position_embeddings", 1, kMaxInt32));
  // The smoothing interpolates between the two wavelengths and divides by their difference.
  if (!(scaling.high_freq_factor > scaling.low_freq_factor)) {
    return f.Error("high_freq_factor", absl::StrCat("(", scaling.high_freq_factor,
                                                    ") must be greater than low_freq_factor (",
                                                    scaling.low_freq_factor, ")"));
  }
  return scaling;
}

// Rows x cols of a weight matrix must stay addressable.
absl::Status CheckMatrix(absl::string_view source, absl::string_view what, int64_t rows,
                         int64_t cols) {
  int64_t n = 0;
  if (__builtin_mul_overflow(rows, cols, &n) || n > kMaxMatrixElements) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", what, " would have ", rows, " x ",
                                                   cols, " elements, more than the limit of ",
                                                   kMaxMatrixElements));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseConfigObject(const json& j, absl::string_view source) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a JSON object, got ", j.type_name()));
  }
  const Fields f(j, source);
  ModelConfig c;

  const json* architectures = f.Find("architectures");
  SPECD_ASSIGN_OR_RETURN(const std::optional<std::string> model_type,
                         f.OptionalString("model_type"));
  if (architectures == nullptr && !model_type) {
    return f.Error("architectures",
                   "is missing (and so is model_type); specd loads Llama "
                   "models (LlamaForCausalLM)");
  }
  if (architectures != nullptr) {
    bool llama = false;
    if (architectures->is_array()) {
      for (const json& a : *architectures) {
        llama = llama || (a.is_string() && a.get_ref<const std::string&>() == kArchitecture);
      }
    }
    if (!llama) {
      return f.Error("architectures", absl::StrCat("must contain \"", ToAbsl(kArchitecture),
                                                   "\", got ", Short(*architectures)));
    }
  }
  if (model_type && *model_type != "llama") {
    return f.Error("model_type", absl::StrCat("must be \"llama\", got \"", *model_type, "\""));
  }
  c.architecture = std::string(kArchitecture);

  SPECD_ASSIGN_OR_RETURN(c.vocab_size, f.RequiredInt("vocab_size", 1, kMaxInt32));
  SPECD_ASSIGN_OR_RETURN(c.hidden_size, f.RequiredInt("hidden_size", 1, kMaxWidth));
  SPECD_ASSIGN_OR_RETURN(c.intermediate_size, f.RequiredInt("intermediate_size", 1, kMaxWidth));
  SPECD_ASSIGN_OR_RETURN(c.num_layers, f.RequiredInt("num_hidden_layers", 1, kMaxLayers));
  SPECD_ASSIGN_OR_RETURN(c.num_heads, f.RequiredInt("num_attention_heads", 1, kMaxHeads));
  SPECD_ASSIGN_OR_RETURN(const std::optional<int64_t> kv_heads,
                         f.OptionalInt("num_key_value_heads", 1, kMaxHeads));
  c.num_kv_heads = kv_heads.value_or(c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0) {
    return f.Error(
        "num_key_value_heads",
        absl::StrCat("(", c.num_kv_heads, ") must divide num_attention_heads (", c.num_heads, ")"));
  }
  SPECD_ASSIGN_OR_RETURN(const std::optional<int64_t> head_dim,
                         f.OptionalInt("head_dim", 1, kMaxHeadDim));
  if (head_dim) {
    c.head_dim = *head_dim;
  } else {
    if (c.hidden_size % c.num_heads != 0) {
      return f.Error("num_attention_heads",
                     absl::StrCat("(", c.num_heads, ") must divide hidden_size (", c.hidden_size,
                                  ") when head_dim is absent"));
    }
    c.head_dim = c.hidden_size / c.num_heads;
    if (c.head_dim > kMaxHeadDim) {
      return f.Error("hidden_size", absl::StrCat("/ num_attention_heads gives head_dim ",
                                                 c.head_dim, ", above the limit of ", kMaxHeadDim));
    }
  }
  if (c.head_dim % 2 != 0) {
    return f.Error("head_dim", absl::StrCat("(", c.head_dim, ") must be even for RoPE"));
  }
  SPECD_RETURN_IF_ERROR(
      CheckMatrix(source, "embed_tokens (vocab_size x hidden_size)", c.vocab_size, c.hidden_size));
  SPECD_RETURN_IF_ERROR(CheckMatrix(source, "mlp (intermediate_size x hidden_size)",
                                    c.intermediate_size, c.hidden_size));
  int64_t q_dim = 0;
  if (__builtin_mul_overflow(c.num_heads, c.head_dim, &q_dim)) q_dim = kMaxMatrixElements + 1;
  SPECD_RETURN_IF_ERROR(CheckMatrix(source, "q_proj (num_attention_heads * head_dim x hidden_size)",
                                    q_dim, c.hidden_size));

  SPECD_ASSIGN_OR_RETURN(c.max_position_embeddings,
                         f.RequiredInt("max_position_embeddings", 1, kMaxInt32));
  SPECD_ASSIGN_OR_RETURN(c.rms_norm_eps, f.RequiredPositive("rms_norm_eps"));

  SPECD_ASSIGN_OR_RETURN(const std::optional<double> rope_theta, f.OptionalPositive("rope_theta"));
  c.rope_theta = rope_theta.value_or(10000.0);
  if (const json* params = f.Find("rope_parameters")) {
    // transformers 5 moved rope_theta and the scaling into one object.
    SPECD_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(*params, source, "rope_parameters"));
    if (params->is_object()) {
      SPECD_ASSIGN_OR_RETURN(
          const std::optional<double> theta,
          Fields(*params, source, "rope_parameters.").OptionalPositive("rope_theta"));
      if (theta) c.rope_theta = *theta;
    }
  } else if (const json* scaling = f.Find("rope_scaling")) {
    SPECD_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(*scaling, source, "rope_scaling"));
  }

  SPECD_ASSIGN_OR_RETURN(const std::optional<bool> tie, f.OptionalBool("tie_word_embeddings"));
  c.tie_word_embeddings = tie.value_or(false);
  SPECD_ASSIGN_OR_RETURN(c.bos_token_ids, f.TokenIds("bos_token_id", c.vocab_size));
  SPECD_ASSIGN_OR_RETURN(c.eos_token_ids, f.TokenIds("eos_token_id", c.vocab_size));

  // transformers 5 writes "dtype"; earlier versions "torch_dtype".
  for (const std::string_view field : {"torch_dtype", "dtype"}) {
    SPECD_ASSIGN_OR_RETURN(const std::optional<std::string> dtype, f.OptionalString(field));
    if (dtype) {
      SPECD_ASSIGN_OR_RETURN(c.torch_dtype, ParseTorchDType(*dtype, f, field));
    }
  }

  SPECD_ASSIGN_OR_RETURN(const std::optional<std::string> act, f.OptionalString("hidden_act"));
  if (act && *act != "silu") {
    return f.Error("hidden_act", absl::StrCat("\"", *act, "\" is not supported; Llama uses silu"));
  }
  for (const std::string_view field : {"attention_bias", "mlp_bias"}) {
    SPECD_ASSIGN_OR_RETURN(const std::optional<bool> bias, f.OptionalBool(field));
    if (bias.value_or(false)) {
      return f.Error(field, "is true; specd implements Llama without bias terms");
    }
  }
  return c;
}

absl::StatusOr<ModelConfig> ParseConfigText(std::string_view text, absl::string_view source) {
  // nlohmann::json reports type errors and allocation failures by exception; none may escape.
  try {
    const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat(source, " is not valid JSON"));
    }
    return ParseConfigObject(j, source);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": cannot parse: ", e.what()));
  }
}

ordered_json TokenIdsJson(const std::vector<int32_t>& ids) {
  if (ids.size() == 1) return ids[0];
  return ids;
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text) {
  return ParseConfigText(json_text, "config.json");
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::filesystem::path& dir) {
  std::error_code error;
  if (std::filesystem::is_regular_file(dir, error)) {
    // The commonest mistake: a single-file checkpoint given where a model directory goes.
    return absl::InvalidArgumentError(absl::StrCat(
        dir.string(),
        " is a file; a model is a directory with config.json and .safetensors (a llama2.c "
        "checkpoint converts to one with `specd convert llama2c`)"));
  }
  const std::filesystem::path path = dir / "config.json";
  SPECD_ASSIGN_OR_RETURN(const std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  if (file->size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path.string(), " is ", file->size(), " bytes; a config.json is at most ", kMaxConfigBytes));
  }
  return ParseConfigText(file->bytes(), path.string());
}

std::string ModelConfigToJson(const ModelConfig& c) {
  ordered_json j;
  j["architectures"] = ordered_json::array({c.architecture});
  j["model_type"] = "llama";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    j["rope_scaling"] = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling.factor},
        {"low_freq_factor", c.rope_scaling.low_freq_factor},
        {"high_freq_factor", c.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings},
    };
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (!c.bos_token_ids.empty()) j["bos_token_id"] = TokenIdsJson(c.bos_token_ids);
  if (!c.eos_token_ids.empty()) j["eos_token_id"] = TokenIdsJson(c.eos_token_ids);
  j["torch_dtype"] = TorchDTypeName(c.torch_dtype);
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  return j.dump(2) + "\n";
}

std::vector<float> RopeInvFreq(const ModelConfig& config) {
  const int64_t dim = config.head_dim;
  std::vector<float> inv_freq(static_cast<size_t>(std::max<int64_t>(dim, 0) / 2));
  // transformers' _compute_default_rope_parameters, in f32 as torch runs it:
  //   1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
  const float base = static_cast<float>(config.rope_theta);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv_freq[i] = 1.0f / std::pow(base, exponent);
  }
  if (config.rope_scaling.type != RopeScaling::Type::kLlama3) return inv_freq;

  // transformers' _compute_llama3_parameters. Python scalars meet f32 tensors, so each is rounded
  // to f32 first; `scalar / tensor` is torch's Tensor.__rtruediv__, tensor.reciprocal() * scalar.
  const RopeScaling& s = config.rope_scaling;
  const float factor = static_cast<float>(s.factor);
  const double old_context_len = static_cast<double>(s.original_max_position_embeddings);
  const float low_freq_wavelen = static_cast<float>(old_context_len / s.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(old_context_len / s.high_freq_factor);
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  const float old_context_len_f = static_cast<float>(old_context_len);
  const float low_freq_factor = static_cast<float>(s.low_freq_factor);
  const float factor_span = static_cast<float>(s.high_freq_factor - s.low_freq_factor);
  for (float& f : inv_freq) {
    const float wavelen = (1.0f / f) * two_pi;
    const float llama = wavelen > low_freq_wavelen ? f / factor : f;
    const float smooth = ((1.0f / wavelen) * old_context_len_f - low_freq_factor) / factor_span;
    const float smoothed = (1.0f - smooth) * llama / factor + smooth * llama;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    f = medium ? smoothed : llama;
  }
  return inv_freq;
}

}  // namespace specd
