// A deterministic SentencePiece-style BPE tokenizer for synthetic models, in the same
// tokenizer.json layout as Llama 2's, so synthetic checkpoints are complete model directories.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/synth/synth.h"
#include "common/tokenizer/llama2c_import.h"

namespace specd {
namespace {

constexpr char kSpace[] = "\xe2\x96\x81";  // U+2581 "▁", SentencePiece's visible space

// Counts code points; every piece here is ASCII apart from the leading "▁".
size_t CodePoints(const std::string& s) {
  size_t n = 0;
  for (const unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

}  // namespace

absl::StatusOr<HfTokenizerFiles> SyntheticTokenizer(int64_t vocab_size) {
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) pieces.push_back(absl::StrFormat("<0x%02X>", b));
  absl::flat_hash_set<std::string> seen(pieces.begin(), pieces.end());
  std::vector<std::string> letters;
  const std::string common = "etaoinshrdlucmfwypvbgkjqxz";
  for (const char ch : common) letters.emplace_back(1, ch);
  std::vector<std::string> base = {kSpace};
  for (int ch = 0x21; ch < 0x7f; ++ch) base.emplace_back(1, static_cast<char>(ch));
  for (const std::string& p : base) {
    if (static_cast<int64_t>(pieces.size()) >= vocab_size) break;
    if (seen.insert(p).second) pieces.push_back(p);
  }
  // Merges grow words from "▁" + letters, favouring frequent English letters, so that decoded
  // synthetic text reads as word-like strings.
  std::vector<std::string> words = {kSpace};
  uint64_t state = 0x2545f4914f6cdd1dULL;
  auto next = [&state]() {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  int64_t attempts = 0;
  while (static_cast<int64_t>(pieces.size()) < vocab_size) {
    ++attempts;
    const std::string& left = words[next() % words.size()];
    // Skewed letter choice: the square of a uniform index favours the front of `common`.
    const uint64_t r = next() % 1000;
    const std::string& right = letters[(r * r / 1000) * letters.size() / 1000];
    std::string merged = left + right;
    const bool fresh = CodePoints(merged) <= 12 && !seen.contains(merged);
    if (fresh) {
      seen.insert(merged);
      pieces.push_back(merged);
      words.push_back(std::move(merged));
    } else if (attempts % 64 == 0) {
      // Rare fallback so that large vocabularies always complete: extend with a numbered piece.
      std::string piece = absl::StrFormat("%s%s%lld", kSpace, left.size() > 3 ? "w" : "v",
                                          static_cast<long long>(pieces.size()));
      if (seen.insert(piece).second) {
        // Numbered pieces are reachable only by id (no merge), which is fine for a random model.
        pieces.push_back(std::move(piece));
      }
    }
  }

  // Written as a llama2.c tokenizer.bin (score, length, bytes per piece; spaces instead of "▁")
  // and imported like any llama2.c tokenizer, so synthetic and converted models share one
  // tokenizer.json writer. Earlier merges score higher, as BPE training would rank them.
  std::string bin(4, '\0');
  int32_t max_len = 0;
  for (size_t id = 0; id < pieces.size(); ++id) {
    const std::string piece = absl::StrReplaceAll(pieces[id], {{kSpace, " "}});
    const float score = id < 259 ? 0.0f : -static_cast<float>(id);
    const int32_t len = static_cast<int32_t>(piece.size());
    max_len = std::max(max_len, len);
    bin.append(reinterpret_cast<const char*>(&score), sizeof score);
    bin.append(reinterpret_cast<const char*>(&len), sizeof len);
    bin += piece;
  }
  std::memcpy(bin.data(), &max_len, sizeof max_len);
  return ConvertLlama2cTokenizerBytes(bin, static_cast<int32_t>(vocab_size), "synthetic tokenizer");
}
}  // namespace specd
