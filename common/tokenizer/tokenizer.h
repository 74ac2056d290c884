// Hugging Face `tokenizer.json` tokenizers: byte-level BPE (Llama 3) and SentencePiece-style BPE
// with byte fallback (Llama 2, TinyStories). Loading rejects any declared component it does not
// implement, so output is never silently different from the reference.
#ifndef SPECD_COMMON_TOKENIZER_TOKENIZER_H_
#define SPECD_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specd {

struct EncodeOptions {
  // Prepend BOS. Unset means what tokenizer_config.json says (`add_bos_token`, or the
  // post-processor's template).
  std::optional<bool> add_bos;
  // Recognise special/added tokens such as "<|eot_id|>" written in the text. Off by default, so
  // user text cannot inject control tokens. Added tokens that are not special are always
  // recognised, as Hugging Face does.
  bool parse_special = false;
  // The text continues text before it (the predicted rest of an output, say): no dummy prefix
  // (a Prepend normalizer's or Metaspace's "▁") goes at its start, so it encodes as it would
  // inside the longer text. add_bos is usually false with it.
  bool continuation = false;
};

// Encode and Decode may be called from several threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // `dir` holds tokenizer.json and optionally tokenizer_config.json and generation_config.json.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> LoadFromDir(const std::filesystem::path& dir);

  // The same from file contents; the two config texts may be empty.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      std::string_view tokenizer_json, std::string_view tokenizer_config_json,
      std::string_view generation_config_json);

  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                      const EncodeOptions& options = {}) const = 0;

  // Full decode. Out-of-range ids are INVALID_ARGUMENT naming the id. Invalid UTF-8 produced by
  // byte tokens becomes U+FFFD, as Hugging Face does. transformers' clean_up_tokenization_spaces
  // is never applied: it is a lossy edit that streamed output could not reproduce.
  virtual absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                             bool skip_special_tokens = false) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  // Every id that ends generation (generation_config.json's eos_token_id may be a list).
  virtual const std::vector<int32_t>& eos_ids() const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;
  // The token's string as written in the vocabulary (e.g. "▁the", "Ġthe", "<0x0A>").
  virtual absl::StatusOr<std::string> IdToPiece(int32_t id) const = 0;
  // A stable hash of the vocabulary, merges and special tokens; two workers must agree on it.
  virtual std::string Fingerprint() const = 0;
};

// Streaming detokenizer: feed ids as they are generated; it returns only complete UTF-8 text, and
// the concatenation of every Push and the final Flush equals Decode(all ids) exactly.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  absl::StatusOr<std::string> Push(std::span<const int32_t> ids);
  // Takes `ids` as text the reader already has (a prompt): later pieces continue it (keeping,
  // e.g., SentencePiece's leading space) and never repeat any of it, even when it ends in a
  // byte-fallback run that Push would hold back (that run is left out of the context).
  absl::Status Skip(std::span<const int32_t> ids);
  // Whatever is still held back (e.g. an incomplete UTF-8 tail, emitted as U+FFFD as Decode would).
  // Call it once, at the end of the stream.
  absl::StatusOr<std::string> Flush();

 private:
  absl::StatusOr<std::string> DecodeRange(size_t begin, size_t end) const;

  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;  // kept from the window's start; emitted ids are trimmed away
  size_t prefix_offset_ = 0;  // start of the decode window in ids_
  size_t read_offset_ = 0;    // ids_ before this have been emitted
  std::string prefix_text_;   // Decode(ids_[prefix_offset_, read_offset_))
  // Emission points from prefix_offset_ to read_offset_: where a window may start.
  std::vector<size_t> boundaries_;
};

}  // namespace specd

#endif  // SPECD_COMMON_TOKENIZER_TOKENIZER_H_
