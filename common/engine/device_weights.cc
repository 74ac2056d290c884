#include "common/engine/device_weights.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "base/math.h"
#include "base/status_macros.h"

namespace specd {
namespace {

constexpr int64_t kAlign = 256;  // every tensor starts on a cache line and a GPU's 256 B

int64_t BytesOf(const kernels::WeightView& w) {
  return w.rows * w.cols * kernels::DTypeSize(w.dtype);
}

}  // namespace

absl::StatusOr<DeviceWeights> UploadWeights(const ModelWeights& host, kernels::Backend& backend,
                                            const std::function<void(int64_t, int64_t)>& progress) {
  const ModelConfig& c = host.config;
  DeviceWeights out;
  std::vector<const kernels::WeightView*> sources = {&host.embed, &host.lm_head};
  std::vector<kernels::WeightView*> targets = {&out.embed, &out.lm_head};
  out.layers.resize(host.layers.size());
  for (size_t i = 0; i < host.layers.size(); ++i) {
    const LayerWeights& h = host.layers[i];
    DeviceLayerWeights& d = out.layers[i];
    for (const auto& [src, dst] :
         {std::pair{&h.wq, &d.wq}, std::pair{&h.wk, &d.wk}, std::pair{&h.wv, &d.wv},
          std::pair{&h.wo, &d.wo}, std::pair{&h.w_gate, &d.w_gate}, std::pair{&h.w_up, &d.w_up},
          std::pair{&h.w_down, &d.w_down}}) {
      sources.push_back(src);
      targets.push_back(dst);
    }
  }
  // A tied classifier shares the embedding's memory: each source goes up once.
  absl::flat_hash_map<const void*, int64_t> offset_of;
  int64_t total = 0;
  for (const kernels::WeightView* w : sources) {
    if (offset_of.contains(w->data)) continue;
    offset_of[w->data] = total;
    total = RoundUpTo(total + BytesOf(*w), kAlign);
  }
  SPECD_ASSIGN_OR_RETURN(out.matrices,
                         backend.Allocate(total, kernels::MemoryKind::kWeights, "model weights"));
  int64_t done = 0;
  for (const auto& [src, offset] : offset_of) {
    for (const kernels::WeightView* w : sources) {
      if (w->data != src) continue;
      SPECD_RETURN_IF_ERROR(backend.Upload(out.matrices.as<char>() + offset, src, BytesOf(*w)));
      done += BytesOf(*w);
      if (progress) progress(done, total);
      break;
    }
  }
  for (size_t i = 0; i < sources.size(); ++i) {
    *targets[i] = *sources[i];
    targets[i]->data = out.matrices.as<char>() + offset_of[sources[i]->data];
  }

  // The vectors: per layer attn_norm and ffn_norm, then final_norm, then inv_freq.
  std::vector<float> vectors;
  for (const LayerWeights& l : host.layers) {
    vectors.insert(vectors.end(), l.attn_norm.begin(), l.attn_norm.end());
    vectors.insert(vectors.end(), l.ffn_norm.begin(), l.ffn_norm.end());
  }
  vectors.insert(vectors.end(), host.final_norm.begin(), host.final_norm.end());
  const std::vector<float> inv_freq = RopeInvFreq(c);
  vectors.insert(vectors.end(), inv_freq.begin(), inv_freq.end());
  const int64_t vector_bytes = static_cast<int64_t>(vectors.size() * sizeof(float));
  SPECD_ASSIGN_OR_RETURN(
      out.vectors, backend.Allocate(vector_bytes, kernels::MemoryKind::kWeights, "norm weights"));
  SPECD_RETURN_IF_ERROR(backend.Upload(out.vectors.data(), vectors.data(), vector_bytes));
  const float* v = out.vectors.as<const float>();
  for (DeviceLayerWeights& l : out.layers) {
    l.attn_norm = v;
    l.ffn_norm = v + c.hidden_size;
    v += 2 * c.hidden_size;
  }
  out.final_norm = v;
  out.inv_freq = v + c.hidden_size;
  // The host copies (file mapping, `vectors`) may go away once this returns.
  SPECD_RETURN_IF_ERROR(backend.Synchronize());
  return out;
}

}  // namespace specd
