#include "common/synth/synth.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/math.h"
#include "base/status_macros.h"
#include "common/model/checkpoint.h"
#include "common/model/safetensors_writer.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

using kernels::DType;

// Shards stay under this size so a multi-GB synthetic model never sits in memory at once.
constexpr int64_t kMaxShardBytes = int64_t{1} << 30;

// xoshiro256** seeded by splitmix64: fast, and the same stream on every platform (unlike
// std::normal_distribution, whose algorithm is the library's choice).
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& s : s_) {
      seed += 0x9e3779b97f4a7c15ULL;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      s = z ^ (z >> 31);
    }
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Box-Muller; both outputs used.
  double Normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - Uniform();
    const double u2 = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * M_PI * u2);
    have_spare_ = true;
    return r * std::cos(2.0 * M_PI * u2);
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
  bool have_spare_ = false;
  double spare_ = 0.0;
};

std::string EncodeValues(const std::vector<float>& v, DType dtype) {
  std::string out(v.size() * static_cast<size_t>(kernels::DTypeSize(dtype)), '\0');
  if (dtype == DType::kF32) {
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  }
  auto* dst = reinterpret_cast<uint16_t*>(out.data());
  for (size_t i = 0; i < v.size(); ++i) {
    dst[i] = dtype == DType::kBF16 ? kernels::F32ToBf16(v[i]) : kernels::F32ToF16(v[i]);
  }
  return out;
}

struct TensorBytes {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::string bytes;
};

struct TensorPlan {
  std::string name;
  std::vector<int64_t> shape;
  enum class Init { kNormal, kNorm } init = Init::kNormal;
  double std = 0.0;
  int64_t bytes(DType d) const {
    int64_t n = kernels::DTypeSize(d);
    for (const int64_t s : shape) n *= s;
    return n;
  }
};

std::vector<TensorPlan> PlanTensors(const SynthSpec& spec) {
  const ModelConfig& c = spec.config;
  const double in_std = 1.0 / std::sqrt(static_cast<double>(c.hidden_size));
  const double ffn_std = 1.0 / std::sqrt(static_cast<double>(c.intermediate_size));
  const double att_std = 1.0 / std::sqrt(static_cast<double>(c.q_dim()));
  const double s = spec.residual_scale;
  std::vector<TensorPlan> plan;
  plan.push_back({"model.embed_tokens.weight",
                  {c.vocab_size, c.hidden_size},
                  TensorPlan::Init::kNormal,
                  spec.embed_std});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    plan.push_back({p + "input_layernorm.weight", {c.hidden_size}, TensorPlan::Init::kNorm, 0.1});
    plan.push_back({p + "self_attn.q_proj.weight",
                    {c.q_dim(), c.hidden_size},
                    TensorPlan::Init::kNormal,
                    in_std});
    plan.push_back({p + "self_attn.k_proj.weight",
                    {c.kv_dim(), c.hidden_size},
                    TensorPlan::Init::kNormal,
                    in_std});
    plan.push_back({p + "self_attn.v_proj.weight",
                    {c.kv_dim(), c.hidden_size},
                    TensorPlan::Init::kNormal,
                    in_std});
    plan.push_back({p + "self_attn.o_proj.weight",
                    {c.hidden_size, c.q_dim()},
                    TensorPlan::Init::kNormal,
                    s * att_std});
    plan.push_back(
        {p + "post_attention_layernorm.weight", {c.hidden_size}, TensorPlan::Init::kNorm, 0.1});
    plan.push_back({p + "mlp.gate_proj.weight",
                    {c.intermediate_size, c.hidden_size},
                    TensorPlan::Init::kNormal,
                    in_std});
    plan.push_back({p + "mlp.up_proj.weight",
                    {c.intermediate_size, c.hidden_size},
                    TensorPlan::Init::kNormal,
                    in_std});
    plan.push_back({p + "mlp.down_proj.weight",
                    {c.hidden_size, c.intermediate_size},
                    TensorPlan::Init::kNormal,
                    s * ffn_std});
  }
  plan.push_back({"model.norm.weight", {c.hidden_size}, TensorPlan::Init::kNorm, 0.1});
  if (!c.tie_word_embeddings) {
    plan.push_back(
        {"lm_head.weight", {c.vocab_size, c.hidden_size}, TensorPlan::Init::kNormal, in_std});
  }
  return plan;
}

absl::Status WriteText(const std::filesystem::path& path, std::string_view text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path.string()));
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.close();
  if (!f) return absl::DataLossError(absl::StrCat("failed writing ", path.string()));
  return absl::OkStatus();
}

std::string GenerationConfigJson(const ModelConfig& c) {
  nlohmann::json j;
  j["_from_model_config"] = true;
  if (!c.bos_token_ids.empty()) j["bos_token_id"] = c.bos_token_ids[0];
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else if (!c.eos_token_ids.empty()) {
    j["eos_token_id"] = c.eos_token_ids;
  }
  return j.dump(2) + "\n";
}

// Writes tensors one shard at a time (each <= kMaxShardBytes or 1/num_shards of the total), with
// an index when there is more than one shard. `fill(plan[i], i)` produces tensor i's bytes on
// demand; a shard's tensors are produced on parallel threads (each from its own inputs, so the
// bytes do not depend on the thread count).
template <typename Plan, typename Fill>
absl::Status WriteShards(const std::vector<Plan>& plan, const std::vector<int64_t>& sizes,
                         int requested_shards, const std::filesystem::path& out_dir, Fill fill,
                         const SynthProgress& progress) {
  int64_t total = 0;
  for (const int64_t b : sizes) total += b;
  const int64_t target = std::min(
      kMaxShardBytes, requested_shards > 1 ? CeilDiv(total, requested_shards) : kMaxShardBytes);
  std::vector<std::vector<size_t>> shards(1);
  int64_t cur = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (cur > 0 && cur + sizes[i] > target) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += sizes[i];
  }
  nlohmann::json weight_map = nlohmann::json::object();
  int64_t done = 0;
  const size_t threads = std::max(1u, std::thread::hardware_concurrency());
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file =
        shards.size() == 1
            ? "model.safetensors"
            : absl::StrCat("model-", absl::Dec(s + 1, absl::kZeroPad5), "-of-",
                           absl::Dec(shards.size(), absl::kZeroPad5), ".safetensors");
    const std::vector<size_t>& members = shards[s];
    std::vector<absl::StatusOr<TensorBytes>> made(members.size(),
                                                  absl::InternalError("tensor not made"));
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t j = next++; j < members.size(); j = next++)
        made[j] = fill(plan[members[j]], members[j]);
    };
    std::vector<std::thread> pool;
    for (size_t t = 1; t < std::min(threads, members.size()); ++t) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
    SafetensorsWriter writer;
    for (size_t j = 0; j < members.size(); ++j) {
      if (!made[j].ok()) return made[j].status();
      TensorBytes& t = *made[j];
      SPECD_RETURN_IF_ERROR(writer.Add(t.name, t.dtype, t.shape, std::move(t.bytes)));
      weight_map[t.name] = file;
      done += sizes[members[j]];
      if (progress) progress(done, total);
    }
    SPECD_RETURN_IF_ERROR(writer.WriteFile(out_dir / file));
  }
  if (shards.size() > 1) {
    nlohmann::json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    SPECD_RETURN_IF_ERROR(WriteText(out_dir / "model.safetensors.index.json", index.dump(2)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ShapePreset(std::string_view name) {
  ModelConfig c;
  c.bos_token_ids = {1};
  c.eos_token_ids = {2};
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  auto set = [&](int64_t vocab, int64_t dim, int64_t hidden, int64_t layers, int64_t heads,
                 int64_t kv_heads, int64_t max_pos) {
    c.vocab_size = vocab;
    c.hidden_size = dim;
    c.intermediate_size = hidden;
    c.num_layers = layers;
    c.num_heads = heads;
    c.num_kv_heads = kv_heads;
    c.head_dim = dim / heads;
    c.max_position_embeddings = max_pos;
  };
  if (name == "tiny") {
    set(512, 64, 172, 4, 8, 4, 512);
  } else if (name == "stories15M") {
    set(32000, 288, 768, 6, 6, 6, 1024);
  } else if (name == "stories42M") {
    set(32000, 512, 1376, 8, 8, 8, 1024);
  } else if (name == "stories110M") {
    set(32000, 768, 2048, 12, 12, 12, 1024);
  } else if (name == "llama-3.2-1b" || name == "llama-3.2-3b") {
    if (name == "llama-3.2-1b") {
      set(128256, 2048, 8192, 16, 32, 8, 131072);
      c.tie_word_embeddings = true;
    } else {
      set(128256, 3072, 8192, 28, 24, 8, 131072);
      c.tie_word_embeddings = true;
    }
    c.rope_theta = 500000.0;
    c.rope_scaling = {RopeScaling::Type::kLlama3, 32.0, 1.0, 4.0, 8192};
    // bos/eos stay 1/2: a synthetic model carries the synthetic tokenizer, not Llama 3's.
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown shape preset '", std::string(name),
                     "'; known: ", absl::StrJoin(ShapePresetNames(), ", ")));
  }
  return c;
}

std::vector<std::string> ShapePresetNames() {
  return {"tiny", "stories15M", "stories42M", "stories110M", "llama-3.2-1b", "llama-3.2-3b"};
}

absl::Status WriteSyntheticModel(const SynthSpec& spec, const std::filesystem::path& out_dir,
                                 const SynthProgress& progress) {
  const ModelConfig& c = spec.config;
  if (!(spec.residual_scale >= 0.0) || !(spec.embed_std > 0.0)) {
    return absl::InvalidArgumentError("synth: residual_scale must be >= 0 and embed_std > 0");
  }
  // Round-trip the config through the validating parser so a synthetic model is never invalid.
  SPECD_ASSIGN_OR_RETURN(const ModelConfig checked, ParseModelConfig(ModelConfigToJson(c)));
  (void)checked;
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("synth: cannot create ", out_dir.string(), ": ", ec.message()));
  }
  ModelConfig written = c;
  written.torch_dtype = spec.dtype;
  SPECD_RETURN_IF_ERROR(WriteText(out_dir / "config.json", ModelConfigToJson(written)));
  SPECD_RETURN_IF_ERROR(WriteText(out_dir / "generation_config.json", GenerationConfigJson(c)));
  // A tokenizer needs 3 special and 256 byte tokens; smaller vocabularies (used by the exact
  // distribution tests) make a model driven by token ids alone.
  if (c.vocab_size >= kMinTokenizerVocab) {
    SPECD_ASSIGN_OR_RETURN(const HfTokenizerFiles tok, SyntheticTokenizer(c.vocab_size));
    SPECD_RETURN_IF_ERROR(WriteText(out_dir / "tokenizer.json", tok.tokenizer_json));
    SPECD_RETURN_IF_ERROR(WriteText(out_dir / "tokenizer_config.json", tok.tokenizer_config_json));
  }

  const std::vector<TensorPlan> plan = PlanTensors(spec);
  std::vector<int64_t> sizes;
  for (const TensorPlan& t : plan) sizes.push_back(t.bytes(spec.dtype));
  // Each tensor draws from its own stream (keyed by its place in the plan), so shapes of other
  // tensors never change its values.
  auto fill = [&](const TensorPlan& t, size_t tensor_index) -> absl::StatusOr<TensorBytes> {
    Rng rng(spec.seed * 0x100000001b3ULL + tensor_index);
    int64_t n = 1;
    for (const int64_t s : t.shape) n *= s;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {
      x = t.init == TensorPlan::Init::kNorm ? static_cast<float>(1.0 + t.std * rng.Normal())
                                            : static_cast<float>(t.std * rng.Normal());
    }
    return TensorBytes{t.name, spec.dtype, t.shape, EncodeValues(v, spec.dtype)};
  };
  return WriteShards(plan, sizes, spec.num_shards, out_dir, fill, progress);
}

absl::Status WriteEarlyExitDraft(const std::filesystem::path& target_dir, int64_t layers,
                                 const std::filesystem::path& out_dir,
                                 const SynthProgress& progress) {
  SPECD_ASSIGN_OR_RETURN(ModelConfig c, LoadModelConfig(target_dir));
  if (layers < 1 || layers > c.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("early-exit draft: layers must be in [1, ", c.num_layers, "], got ", layers));
  }
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(target_dir));
  std::vector<std::string> names;
  for (const std::string& name : ckpt->Names()) {
    int64_t layer = -1;
    if (std::sscanf(name.c_str(), "model.layers.%ld.", &layer) == 1 && layer >= layers) continue;
    names.push_back(name);
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", out_dir.string(), ": ", ec.message()));
  }
  c.num_layers = layers;
  SPECD_RETURN_IF_ERROR(WriteText(out_dir / "config.json", ModelConfigToJson(c)));
  for (const char* file : {"generation_config.json", "tokenizer.json", "tokenizer_config.json"}) {
    if (std::filesystem::exists(target_dir / file)) {
      std::filesystem::copy_file(target_dir / file, out_dir / file,
                                 std::filesystem::copy_options::overwrite_existing, ec);
      if (ec) return absl::DataLossError(absl::StrCat("cannot copy ", file, ": ", ec.message()));
    }
  }
  std::vector<int64_t> sizes;
  for (const std::string& name : names) {
    SPECD_ASSIGN_OR_RETURN(const TensorView t, ckpt->Get(name));
    sizes.push_back(t.numel() * kernels::DTypeSize(t.dtype));
  }
  auto fill = [&](const std::string& name, size_t) -> absl::StatusOr<TensorBytes> {
    SPECD_ASSIGN_OR_RETURN(const TensorView t, ckpt->Get(name));
    return TensorBytes{name, t.dtype, t.shape,
                       std::string(static_cast<const char*>(t.data),
                                   static_cast<size_t>(t.numel() * kernels::DTypeSize(t.dtype)))};
  };
  return WriteShards(names, sizes, 1, out_dir, fill, progress);
}

}  // namespace specd
