// Decoders: Replace, ByteFallback, Fuse, Strip, ByteLevel and Metaspace, applied in order to the
// list of token strings (a Sequence is flattened at load), then concatenated.
#ifndef SPECD_COMMON_TOKENIZER_DECODER_H_
#define SPECD_COMMON_TOKENIZER_DECODER_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace specd::tokenizer {

struct DecoderStep {
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip, kByteLevel, kMetaspace };
  Kind kind;
  std::string pattern;            // kReplace: every occurrence in each token ...
  std::string content;            // ... becomes this; kStrip: the one character stripped
  size_t strip_start = 0;         // kStrip: at most this many leading `content` characters
  size_t strip_stop = 0;          // kStrip: at most this many trailing ones
  std::string replacement;        // kMetaspace, e.g. "▁"
  bool metaspace_prepend = true;  // kMetaspace: the scheme is not "never"
};

class Decoder {
 public:
  Decoder() = default;
  explicit Decoder(std::vector<DecoderStep> steps) : steps_(std::move(steps)) {}
  // Without a decoder, Hugging Face joins the tokens with spaces.
  static Decoder None();

  std::string Decode(std::vector<std::string> tokens) const;

  std::string Describe() const;

 private:
  bool none_ = false;
  std::vector<DecoderStep> steps_;
};

// The byte a "<0xXX>" token stands for, as Hugging Face's ByteFallback decoder reads it.
std::optional<unsigned char> ParseByteToken(std::string_view token);

}  // namespace specd::tokenizer

#endif  // SPECD_COMMON_TOKENIZER_DECODER_H_
