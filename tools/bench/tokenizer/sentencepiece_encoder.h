// SentencePiece's C++ encoder behind a plain interface. sentencepiece_processor.h declares its own
// `absl::string_view`, which clashes with Abseil's, so it is only included by
// sentencepiece_encoder.cc, and this header uses neither library.
#ifndef SPECD_TOOLS_BENCH_TOKENIZER_SENTENCEPIECE_ENCODER_H_
#define SPECD_TOOLS_BENCH_TOKENIZER_SENTENCEPIECE_ENCODER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace specd::bench {

class SentencePieceEncoder {
 public:
  // nullptr, with `*error` set, when the model cannot be loaded.
  static std::unique_ptr<SentencePieceEncoder> Load(const std::string& model_file,
                                                    std::string* error);

  struct Impl;  // defined in the .cc, so only Load can make one
  explicit SentencePieceEncoder(std::unique_ptr<Impl> impl);
  ~SentencePieceEncoder();

  // Encodes into `ids` (no BOS); false on failure.
  bool Encode(const std::string& text, std::vector<int>* ids) const;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace specd::bench

#endif  // SPECD_TOOLS_BENCH_TOKENIZER_SENTENCEPIECE_ENCODER_H_
