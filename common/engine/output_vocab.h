// The tokens a model's classifier computes logits for. A draft with a reduced head (FR-Spec,
// Zhao et al. 2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via Frequency-Ranked
// Speculative Sampling") keeps only the rows of its N most frequent tokens, so its logits, and
// every processed row made from them, are N wide: row index i is token ids()[i]. The ids ascend,
// so token-id order (ties to the lower id, the inverse CDF) is row order. Tokens outside the set
// have probability 0 in such a row.
#ifndef SPECD_COMMON_ENGINE_OUTPUT_VOCAB_H_
#define SPECD_COMMON_ENGINE_OUTPUT_VOCAB_H_

#include <cstdint>
#include <span>
#include <vector>

namespace specd {

class OutputVocab {
 public:
  // `ids` ascending, inside [0, vocab_size); empty means every token (index i is token i).
  OutputVocab(int64_t vocab_size, std::span<const int32_t> ids)
      : vocab_size_(vocab_size), ids_(ids.begin(), ids.end()) {
    if (ids_.empty()) return;
    index_of_.assign(static_cast<size_t>(vocab_size), -1);
    for (size_t i = 0; i < ids_.size(); ++i) index_of_[static_cast<size_t>(ids_[i])] = int32_t(i);
  }

  bool full() const { return ids_.empty(); }
  int64_t width() const { return full() ? vocab_size_ : static_cast<int64_t>(ids_.size()); }
  int32_t ToId(int32_t index) const { return full() ? index : ids_[static_cast<size_t>(index)]; }
  // -1 for a token outside the set.
  int32_t ToIndex(int32_t id) const {
    if (full()) return id;
    return id >= 0 && id < vocab_size_ ? index_of_[static_cast<size_t>(id)] : -1;
  }
  // `tokens` as row indices, leaving out those outside the set.
  std::vector<int32_t> ToIndices(std::span<const int32_t> tokens) const {
    std::vector<int32_t> out;
    out.reserve(tokens.size());
    for (const int32_t t : tokens) {
      const int32_t i = ToIndex(t);
      if (i >= 0) out.push_back(i);
    }
    return out;
  }

 private:
  int64_t vocab_size_;
  std::vector<int32_t> ids_;
  std::vector<int32_t> index_of_;
};

}  // namespace specd

#endif  // SPECD_COMMON_ENGINE_OUTPUT_VOCAB_H_
