#include "tools/bench/tokenizer/sentencepiece_encoder.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sentencepiece_processor.h"

namespace specd::bench {

struct SentencePieceEncoder::Impl {
  sentencepiece::SentencePieceProcessor processor;
};

SentencePieceEncoder::SentencePieceEncoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SentencePieceEncoder::~SentencePieceEncoder() = default;

std::unique_ptr<SentencePieceEncoder> SentencePieceEncoder::Load(const std::string& model_file,
                                                                 std::string* error) {
  auto impl = std::make_unique<Impl>();
  const auto status = impl->processor.Load(model_file);
  if (!status.ok()) {
    *error = "sentencepiece cannot load " + model_file + ": " + status.ToString();
    return nullptr;
  }
  return std::make_unique<SentencePieceEncoder>(std::move(impl));
}

bool SentencePieceEncoder::Encode(const std::string& text, std::vector<int>* ids) const {
  return impl_->processor.Encode(text, ids).ok();
}

}  // namespace specd::bench
