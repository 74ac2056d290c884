#include "common/convert/llama2c.h"

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "common/model/config.h"
#include "common/model/mapped_file.h"
#include "common/model/safetensors_writer.h"
#include "common/tokenizer/llama2c_import.h"

namespace specd {
namespace {

struct Llama2cHeader {
  int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

absl::Status WriteText(const std::filesystem::path& path, std::string_view text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  f.close();
  if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

// Sequential reader over the checkpoint's f32 arrays that refuses to run past the end.
class Reader {
 public:
  Reader(std::string_view bytes, std::string file) : bytes_(bytes), file_(std::move(file)) {}
  absl::StatusOr<std::vector<float>> Floats(int64_t n, std::string_view what) {
    const uint64_t need = static_cast<uint64_t>(n) * sizeof(float);
    if (n < 0 || need > bytes_.size() - offset_) {
      return absl::InvalidArgumentError(absl::StrCat(
          file_, ": truncated: ", std::string(what), " needs ", need, " bytes at offset ", offset_,
          " but the file has ", bytes_.size(), " bytes"));
    }
    std::vector<float> out(static_cast<size_t>(n));
    std::memcpy(out.data(), bytes_.data() + offset_, need);
    offset_ += need;
    return out;
  }
  void Skip(uint64_t n) { offset_ = std::min<uint64_t>(offset_ + n, bytes_.size()); }
  uint64_t remaining() const { return bytes_.size() - offset_; }

 private:
  std::string_view bytes_;
  std::string file_;
  uint64_t offset_ = sizeof(Llama2cHeader);
};

std::string Encode(const std::vector<float>& v, kernels::DType dtype) {
  std::string out(v.size() * static_cast<size_t>(kernels::DTypeSize(dtype)), '\0');
  if (dtype == kernels::DType::kF32) {
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  }
  auto* dst = reinterpret_cast<uint16_t*>(out.data());
  for (size_t i = 0; i < v.size(); ++i) {
    dst[i] = dtype == kernels::DType::kBF16 ? kernels::F32ToBf16(v[i]) : kernels::F32ToF16(v[i]);
  }
  return out;
}

// llama2.c rotates interleaved pairs (2i, 2i+1) of each head; Hugging Face rotates (i, i+half).
// Row (head, 2i + a) moves to (head, a * half + i).
std::vector<float> PermuteForRotateHalf(const std::vector<float>& w, int64_t n_heads,
                                        int64_t head_dim, int64_t cols) {
  std::vector<float> out(w.size());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t a = 0; a < 2; ++a) {
        const int64_t src = h * head_dim + 2 * i + a;
        const int64_t dst = h * head_dim + a * half + i;
        std::memcpy(out.data() + dst * cols, w.data() + src * cols,
                    static_cast<size_t>(cols) * sizeof(float));
      }
    }
  }
  return out;
}

}  // namespace

absl::Status ConvertLlama2c(const Llama2cConvertOptions& options) {
  const std::string file = options.checkpoint.string();
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped, MappedFile::Open(options.checkpoint));
  const std::string_view bytes = mapped->bytes();
  if (bytes.size() < sizeof(Llama2cHeader)) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": too short for a llama2.c header (", bytes.size(), " bytes)"));
  }
  Llama2cHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  // A negative vocab_size marks an untied classifier in llama2.c's format.
  const bool shared_classifier = h.vocab_size > 0;
  const int64_t vocab = h.vocab_size > 0 ? h.vocab_size : -static_cast<int64_t>(h.vocab_size);
  const int64_t limit = int64_t{1} << 24;
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"dim", h.dim},
                                {"hidden_dim", h.hidden_dim},
                                {"n_layers", h.n_layers},
                                {"n_heads", h.n_heads},
                                {"n_kv_heads", h.n_kv_heads},
                                {"vocab_size", vocab},
                                {"seq_len", h.seq_len}}) {
    if (v <= 0 || v > limit) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": header field ", name, " = ", v, " is not in [1, ", limit, "]"));
    }
  }
  if (h.dim % h.n_heads != 0 || h.n_heads % h.n_kv_heads != 0 || (h.dim / h.n_heads) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": inconsistent heads: dim ", h.dim, ", n_heads ", h.n_heads, ", n_kv_heads ",
        h.n_kv_heads, " (need dim % n_heads == 0, n_heads % n_kv_heads == 0, even head size)"));
  }
  ModelConfig c;
  c.vocab_size = vocab;
  c.hidden_size = h.dim;
  c.intermediate_size = h.hidden_dim;
  c.num_layers = h.n_layers;
  c.num_heads = h.n_heads;
  c.num_kv_heads = h.n_kv_heads;
  c.head_dim = h.dim / h.n_heads;
  c.max_position_embeddings = h.seq_len;
  c.rms_norm_eps = 1e-5;  // llama2.c's rmsnorm constant
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = shared_classifier;
  c.bos_token_ids = {1};
  c.eos_token_ids = {2};
  c.torch_dtype = options.dtype;

  const int64_t L = c.num_layers, D = c.hidden_size, F = c.intermediate_size, KV = c.kv_dim();
  Reader r(bytes, file);
  SPECD_ASSIGN_OR_RETURN(auto embed, r.Floats(vocab * D, "token_embedding_table"));
  SPECD_ASSIGN_OR_RETURN(auto rms_att, r.Floats(L * D, "rms_att_weight"));
  SPECD_ASSIGN_OR_RETURN(auto wq, r.Floats(L * D * D, "wq"));
  SPECD_ASSIGN_OR_RETURN(auto wk, r.Floats(L * KV * D, "wk"));
  SPECD_ASSIGN_OR_RETURN(auto wv, r.Floats(L * KV * D, "wv"));
  SPECD_ASSIGN_OR_RETURN(auto wo, r.Floats(L * D * D, "wo"));
  SPECD_ASSIGN_OR_RETURN(auto rms_ffn, r.Floats(L * D, "rms_ffn_weight"));
  SPECD_ASSIGN_OR_RETURN(auto w1, r.Floats(L * F * D, "w1"));
  SPECD_ASSIGN_OR_RETURN(auto w2, r.Floats(L * D * F, "w2"));
  SPECD_ASSIGN_OR_RETURN(auto w3, r.Floats(L * F * D, "w3"));
  SPECD_ASSIGN_OR_RETURN(auto rms_final, r.Floats(D, "rms_final_weight"));
  // freq_cis_real and freq_cis_imag: llama2.c's precomputed RoPE tables, which we recompute.
  SPECD_ASSIGN_OR_RETURN(auto freq_tables, r.Floats(int64_t{h.seq_len} * c.head_dim, "freq_cis"));
  (void)freq_tables;
  std::vector<float> wcls;
  if (!shared_classifier) {
    SPECD_ASSIGN_OR_RETURN(wcls, r.Floats(vocab * D, "wcls"));
  }

  std::error_code ec;
  std::filesystem::create_directories(options.out_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", options.out_dir.string(), ": ", ec.message()));
  }
  SafetensorsWriter writer;
  auto slice = [](const std::vector<float>& all, int64_t l, int64_t n) {
    return std::vector<float>(all.begin() + l * n, all.begin() + (l + 1) * n);
  };
  // Every tensor in one dtype, norms included, as Hugging Face checkpoints are.
  auto add = [&](const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    return writer.Add(name, options.dtype, std::move(shape), Encode(v, options.dtype));
  };
  SPECD_RETURN_IF_ERROR(add("model.embed_tokens.weight", {vocab, D}, embed));
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    SPECD_RETURN_IF_ERROR(add(p + "input_layernorm.weight", {D}, slice(rms_att, l, D)));
    SPECD_RETURN_IF_ERROR(
        add(p + "self_attn.q_proj.weight", {D, D},
            PermuteForRotateHalf(slice(wq, l, D * D), c.num_heads, c.head_dim, D)));
    SPECD_RETURN_IF_ERROR(
        add(p + "self_attn.k_proj.weight", {KV, D},
            PermuteForRotateHalf(slice(wk, l, KV * D), c.num_kv_heads, c.head_dim, D)));
    SPECD_RETURN_IF_ERROR(add(p + "self_attn.v_proj.weight", {KV, D}, slice(wv, l, KV * D)));
    SPECD_RETURN_IF_ERROR(add(p + "self_attn.o_proj.weight", {D, D}, slice(wo, l, D * D)));
    SPECD_RETURN_IF_ERROR(add(p + "post_attention_layernorm.weight", {D}, slice(rms_ffn, l, D)));
    SPECD_RETURN_IF_ERROR(add(p + "mlp.gate_proj.weight", {F, D}, slice(w1, l, F * D)));
    SPECD_RETURN_IF_ERROR(add(p + "mlp.down_proj.weight", {D, F}, slice(w2, l, D * F)));
    SPECD_RETURN_IF_ERROR(add(p + "mlp.up_proj.weight", {F, D}, slice(w3, l, F * D)));
  }
  SPECD_RETURN_IF_ERROR(add("model.norm.weight", {D}, rms_final));
  if (!shared_classifier) SPECD_RETURN_IF_ERROR(add("lm_head.weight", {vocab, D}, wcls));
  SPECD_RETURN_IF_ERROR(writer.WriteFile(options.out_dir / "model.safetensors"));
  SPECD_RETURN_IF_ERROR(WriteText(options.out_dir / "config.json", ModelConfigToJson(c)));

  if (options.tokenizer) {
    SPECD_ASSIGN_OR_RETURN(
        const HfTokenizerFiles tok,
        ConvertLlama2cTokenizer(*options.tokenizer, static_cast<int32_t>(vocab)));
    SPECD_RETURN_IF_ERROR(WriteText(options.out_dir / "tokenizer.json", tok.tokenizer_json));
    SPECD_RETURN_IF_ERROR(
        WriteText(options.out_dir / "tokenizer_config.json", tok.tokenizer_config_json));
    SPECD_RETURN_IF_ERROR(
        WriteText(options.out_dir / "generation_config.json", tok.generation_config_json));
  } else {
    SPECD_RETURN_IF_ERROR(WriteText(options.out_dir / "generation_config.json",
                                    "{\"bos_token_id\": 1, \"eos_token_id\": 2}\n"));
  }
  return absl::OkStatus();
}

}  // namespace specd
