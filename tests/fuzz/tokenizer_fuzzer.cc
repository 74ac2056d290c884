// libFuzzer target for the tokenizer. The first input byte picks what the rest drives:
//   0: Tokenizer::FromJson on the rest as tokenizer.json (an accepted one must then encode and
//      decode without crashing and reject out-of-range ids);
//   1: FromJson of the fixed Llama 2 style tokenizer with the rest as tokenizer_config.json and
//      generation_config.json;
//   2: Encode of the rest with a fixed tokenizer: invalid UTF-8 must be INVALID_ARGUMENT, valid
//      text must give in-range ids that Decode back to the text;
//   3: Decode of the rest read as int32 ids: out-of-range ids must be INVALID_ARGUMENT;
//   4: IncrementalDetokenizer over random splits of ids: the concatenated output must equal
//      Decode of all ids;
//   5: ConvertLlama2cTokenizerBytes of the rest after a little-endian int32 vocab_size; an
//      accepted tokenizer.bin must give files that FromJson loads with that vocab_size.
// Any broken property traps, so libFuzzer saves the input.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/llama2c_import.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/common/tokenizer/mini_tokenizers.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using specd::fuzz::Check;
using specd::fuzz::CheckRefusal;

// RFC 3629, written here independently of the tokenizer's own UTF-8 code.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t min = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      n = 1, cp = c;
    } else if (c >= 0xc2 && c <= 0xdf) {
      n = 2, min = 0x80, cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      n = 3, min = 0x800, cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 4, min = 0x10000, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

const std::string& SpmJson() {
  static const std::string json = specd::testing::MiniSpmTokenizerJson().dump();
  return json;
}

std::unique_ptr<specd::Tokenizer> Load(const std::string& json) {
  absl::StatusOr<std::unique_ptr<specd::Tokenizer>> t = specd::Tokenizer::FromJson(json, "", "");
  Check(t.ok());
  return *std::move(t);
}

// The fixed tokenizers: 0 is Llama 2 style (ids 0..271, all used), 1 Llama 3 style byte-level.
const specd::Tokenizer& Fixed(int which) {
  static const std::unique_ptr<specd::Tokenizer> spm = Load(SpmJson());
  static const std::unique_ptr<specd::Tokenizer> byte_level =
      Load(specd::testing::MiniByteLevelTokenizerJson().dump());
  return which == 0 ? *spm : *byte_level;
}

// Exercises a tokenizer that loaded: none of this may crash, and ids outside the vocabulary
// must be rejected.
void Exercise(const specd::Tokenizer& t) {
  const int32_t vocab = t.vocab_size();
  Check(vocab >= 0);
  CheckRefusal(t.IdToPiece(-1).status());
  CheckRefusal(t.IdToPiece(vocab).status());
  const int32_t bad[] = {vocab};
  CheckRefusal(t.Decode(bad).status());
  for (const std::string_view text : {"Hello world", " a  b\n\xC3\xA9\xE2\x96\x81", "<s></s>"}) {
    const absl::StatusOr<std::vector<int32_t>> ids = t.Encode(text, {.parse_special = true});
    if (!ids.ok()) continue;
    for (const int32_t id : *ids) Check(id >= 0 && id < vocab);
    Check(t.Decode(*ids).ok());
  }
  for (const int32_t id : t.eos_ids()) Check(id >= 0 && id < vocab);
  if (t.bos_id().has_value()) Check(*t.bos_id() >= 0 && *t.bos_id() < vocab);
  t.Fingerprint();
}

void FuzzFromJson(std::string_view rest) {
  const absl::StatusOr<std::unique_ptr<specd::Tokenizer>> t =
      specd::Tokenizer::FromJson(rest, "", "");
  if (!t.ok()) {
    Check(!t.status().message().empty());
    return;
  }
  Exercise(**t);
}

void FuzzConfigs(std::string_view rest) {
  FuzzedDataProvider provider(reinterpret_cast<const uint8_t*>(rest.data()), rest.size());
  const std::string tokenizer_config = provider.ConsumeRandomLengthString();
  const std::string generation_config = provider.ConsumeRemainingBytesAsString();
  const absl::StatusOr<std::unique_ptr<specd::Tokenizer>> t =
      specd::Tokenizer::FromJson(SpmJson(), tokenizer_config, generation_config);
  if (!t.ok()) {
    Check(!t.status().message().empty());
    return;
  }
  Exercise(**t);
}

void FuzzEncode(std::string_view rest) {
  if (rest.empty()) return;
  const auto flags = static_cast<uint8_t>(rest[0]);
  const std::string_view text = rest.substr(1);
  const int which = flags & 1;
  const specd::Tokenizer& t = Fixed(which);
  const specd::EncodeOptions options{.add_bos = false, .parse_special = (flags & 2) != 0};
  const absl::StatusOr<std::vector<int32_t>> ids = t.Encode(text, options);
  if (!IsValidUtf8(text)) {
    CheckRefusal(ids.status());
    return;
  }
  Check(ids.ok());
  for (const int32_t id : *ids) Check(id >= 0 && id < t.vocab_size());
  const absl::StatusOr<std::string> back = t.Decode(*ids);
  Check(back.ok());
  // Both tokenizers are lossless on valid UTF-8, except that the SentencePiece normalizer
  // writes spaces as "▁", so a literal "▁" decodes as a space, and that it prepends "▁" to each
  // run of text between special tokens, so "a</s>b" decodes as "a</s> b" (as in transformers).
  if (which == 1 ||
      (!options.parse_special && text.find(specd::testing::kSpm) == std::string_view::npos)) {
    Check(*back == text);
  }
}

void FuzzDecode(std::string_view rest) {
  if (rest.empty()) return;
  const auto flags = static_cast<uint8_t>(rest[0]);
  const specd::Tokenizer& t = Fixed(flags & 1);
  std::vector<int32_t> ids((rest.size() - 1) / sizeof(int32_t));
  if (!ids.empty()) std::memcpy(ids.data(), rest.data() + 1, ids.size() * sizeof(int32_t));
  bool in_range = true;
  for (const int32_t id : ids) in_range = in_range && id >= 0 && id < t.vocab_size();
  const absl::StatusOr<std::string> text = t.Decode(ids, (flags & 2) != 0);
  if (!in_range) {
    CheckRefusal(text.status());
    return;
  }
  // The mini byte-level vocabulary has unused ids between 262 and 300; those may be rejected.
  if ((flags & 1) == 1 && !text.ok()) {
    CheckRefusal(text.status());
    return;
  }
  Check(text.ok());
  Check(IsValidUtf8(*text));
}

void FuzzIncremental(std::string_view rest) {
  FuzzedDataProvider provider(reinterpret_cast<const uint8_t*>(rest.data()), rest.size());
  const int which = provider.ConsumeBool() ? 1 : 0;
  const bool skip_special = provider.ConsumeBool();
  const specd::Tokenizer& t = Fixed(which);
  std::vector<int32_t> all;
  specd::IncrementalDetokenizer detokenizer(t, skip_special);
  std::string streamed;
  while (provider.remaining_bytes() > 0) {
    const size_t n = provider.ConsumeIntegralInRange<size_t>(0, 8);
    std::vector<int32_t> chunk;
    for (size_t i = 0; i < n && provider.remaining_bytes() > 0; ++i) {
      // Mostly ids of the vocabulary; now and then anything, to hit the range checks.
      chunk.push_back(provider.ConsumeBool()
                          ? provider.ConsumeIntegralInRange<int32_t>(0, t.vocab_size() - 1)
                          : provider.ConsumeIntegral<int32_t>());
    }
    const absl::StatusOr<std::string> piece = detokenizer.Push(chunk);
    if (!piece.ok()) {
      // A rejected push leaves the stream as it was.
      CheckRefusal(piece.status());
      continue;
    }
    all.insert(all.end(), chunk.begin(), chunk.end());
    streamed += *piece;
  }
  const absl::StatusOr<std::string> tail = detokenizer.Flush();
  Check(tail.ok());
  streamed += *tail;
  const absl::StatusOr<std::string> full = t.Decode(all, skip_special);
  Check(full.ok());
  Check(streamed == *full);
}

void FuzzLlama2c(std::string_view rest) {
  if (rest.size() < sizeof(int32_t)) return;
  int32_t vocab_size = 0;
  std::memcpy(&vocab_size, rest.data(), sizeof(vocab_size));
  const absl::StatusOr<specd::HfTokenizerFiles> files =
      specd::ConvertLlama2cTokenizerBytes(rest.substr(sizeof(int32_t)), vocab_size, "tok.bin");
  if (!files.ok()) {
    CheckRefusal(files.status());
    Check(files.status().message().find("tok.bin") != std::string_view::npos);
    return;
  }
  const absl::StatusOr<std::unique_ptr<specd::Tokenizer>> t = specd::Tokenizer::FromJson(
      files->tokenizer_json, files->tokenizer_config_json, files->generation_config_json);
  Check(t.ok());
  Check((*t)->vocab_size() == vocab_size);
  Exercise(**t);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 6) {
    case 0:
      FuzzFromJson(rest);
      break;
    case 1:
      FuzzConfigs(rest);
      break;
    case 2:
      FuzzEncode(rest);
      break;
    case 3:
      FuzzDecode(rest);
      break;
    case 4:
      FuzzIncremental(rest);
      break;
    case 5:
      FuzzLlama2c(rest);
      break;
  }
  return 0;
}
