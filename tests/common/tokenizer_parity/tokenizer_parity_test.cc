// Parity of specd's tokenizers with reference libraries over a committed corpus of ~3000 strings
// (tests/data/tokenizer/corpus.jsonl): encoding, decoding, special-token handling, BOS defaults
// and streaming detokenization, for Llama 3 (byte-level BPE; reference: Hugging Face
// `tokenizers`, cross-checked with transformers.js and llama3-tokenizer-js) and Llama 2
// (SentencePiece BPE with byte fallback; reference: SentencePiece itself). See reference_data.h.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/tokenizer_parity/reference_data.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using ::specd::testing::ReferenceData;
using ::testing::HasSubstr;

constexpr int kMaxReported = 8;
constexpr uint32_t kStreamSeeds[] = {1, 2, 3};

struct Loaded {
  ReferenceData reference;
  std::unique_ptr<Tokenizer> tokenizer;
};

// Each model's reference and tokenizer, loaded once per test process.
// `shared_dir` is needed for Llama 2 only (its tokenizer.model lives in the shared data).
absl::StatusOr<const Loaded*> Load(const std::string& model,
                                   const std::filesystem::path& shared_dir) {
  static std::map<std::string, absl::StatusOr<std::unique_ptr<Loaded>>> cache;
  auto it = cache.find(model);
  if (it == cache.end()) {
    auto load = [&]() -> absl::StatusOr<std::unique_ptr<Loaded>> {
      auto loaded = std::make_unique<Loaded>();
      const std::filesystem::path source = ::specd::testing::SourceDir();
      if (model == "llama3") {
        SPECD_ASSIGN_OR_RETURN(loaded->reference, ::specd::testing::Llama3Reference(source));
      } else {
        SPECD_ASSIGN_OR_RETURN(loaded->reference,
                               ::specd::testing::Llama2Reference(
                                   source, shared_dir / "tokenizers/llama2/tokenizer.model"));
      }
      SPECD_ASSIGN_OR_RETURN(loaded->tokenizer,
                             Tokenizer::LoadFromDir(loaded->reference.tokenizer_dir));
      return loaded;
    };
    it = cache.emplace(model, load()).first;
  }
  if (!it->second.ok()) return it->second.status();
  return it->second->get();
}

// A string as a JSON literal with every non-ASCII character escaped, so whitespace, combining
// marks and broken UTF-8 are visible in a failure message.
std::string Show(std::string_view text, size_t max_bytes = 160) {
  const std::string shown =
      nlohmann::json(std::string(text.substr(0, max_bytes)))
          .dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  return text.size() > max_bytes ? absl::StrCat(shown, "... (", text.size(), " bytes)") : shown;
}

std::string ShowIds(std::span<const int32_t> ids) {
  constexpr size_t kMaxIds = 48;
  const std::string shown = absl::StrJoin(ids.subspan(0, std::min(ids.size(), kMaxIds)), ", ");
  return ids.size() > kMaxIds ? absl::StrCat("[", shown, ", ... (", ids.size(), " ids)]")
                              : absl::StrCat("[", shown, "]");
}

// Counts mismatches and keeps the first few descriptions for one failure message.
class Mismatches {
 public:
  explicit Mismatches(std::string what) : what_(std::move(what)) {}
  void Add(std::string description) {
    if (++count_ <= kMaxReported) details_ += absl::StrCat("\n  ", description);
  }
  void Check(size_t total) const {
    EXPECT_EQ(count_, 0) << count_ << " of " << total << " " << what_ << " differ; the first "
                         << kMaxReported << ":" << details_;
  }

 private:
  std::string what_;
  int count_ = 0;
  std::string details_;
};

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int len = 0;
    uint32_t min = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2, min = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3, min = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4, min = 0x10000;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    uint32_t cp = c & (0x7f >> len);
    for (int k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

// Seeded random batch sizes covering `n` ids: mostly 1-4, sometimes up to 16, sometimes 0 (a
// speculative round may accept nothing).
std::vector<size_t> RandomBatches(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<size_t> batches;
  size_t pos = 0;
  while (pos < n) {
    size_t size = 1 + rng() % 4;
    if (rng() % 8 == 0) size = 1 + rng() % 16;
    if (rng() % 16 == 0) size = 0;
    size = std::min(size, n - pos);
    batches.push_back(size);
    pos += size;
  }
  return batches;
}

// Streams `ids` through an IncrementalDetokenizer in the given batches, checking every chunk is
// complete UTF-8; returns the concatenated text.
absl::StatusOr<std::string> Stream(const Tokenizer& tokenizer, std::span<const int32_t> ids,
                                   bool skip_special, const std::vector<size_t>& batches) {
  IncrementalDetokenizer detokenizer(tokenizer, skip_special);
  std::string text;
  size_t pos = 0;
  for (const size_t n : batches) {
    SPECD_ASSIGN_OR_RETURN(const std::string chunk, detokenizer.Push(ids.subspan(pos, n)));
    if (!IsValidUtf8(chunk)) {
      return absl::InternalError(
          absl::StrCat("Push returned incomplete UTF-8 ", Show(chunk), " after ", pos + n, " ids"));
    }
    text += chunk;
    pos += n;
  }
  SPECD_ASSIGN_OR_RETURN(const std::string tail, detokenizer.Flush());
  if (!IsValidUtf8(tail)) {
    return absl::InternalError(absl::StrCat("Flush returned invalid UTF-8 ", Show(tail)));
  }
  return text + tail;
}

class TokenizerParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::filesystem::path shared_dir;
    if (GetParam() == "llama2") {
      SPECD_REQUIRE_SHARED_DIR(shared);
      shared_dir = shared;
    }
    absl::StatusOr<const Loaded*> loaded = Load(GetParam(), shared_dir);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    loaded_ = *loaded;
  }
  const ReferenceData& ref() const { return loaded_->reference; }
  const Tokenizer& tok() const { return *loaded_->tokenizer; }
  std::string Where(size_t i) const {
    return absl::StrCat("corpus #", ref().corpus[i].id, " (", ref().corpus[i].category, ") ",
                        Show(ref().corpus[i].text));
  }

 private:
  const Loaded* loaded_ = nullptr;
};

TEST_P(TokenizerParityTest, EncodeMatchesReference) {
  Mismatches mismatches(absl::StrCat("encodings (add_bos=false) against ", ref().reference));
  for (size_t i = 0; i < ref().corpus.size(); ++i) {
    const absl::StatusOr<std::vector<int32_t>> ids =
        tok().Encode(ref().corpus[i].text, {.add_bos = false});
    if (!ids.ok()) {
      mismatches.Add(absl::StrCat(Where(i), ": Encode failed: ", ids.status().ToString()));
    } else if (*ids != ref().encodings[i].ids) {
      mismatches.Add(absl::StrCat(Where(i), "\n    expected ", ShowIds(ref().encodings[i].ids),
                                  "\n    got      ", ShowIds(*ids)));
    }
  }
  mismatches.Check(ref().corpus.size());
  // Not a failure: where a cross-check library disagrees with the reference asserted above.
  const auto& disagreements = ref().cross_check_disagreements;
  if (!disagreements.empty()) {
    std::cout << "note: " << disagreements.size()
              << " cases where a cross-check library disagrees with " << ref().reference << ":\n";
  }
  for (size_t k = 0; k < disagreements.size() && k < kMaxReported; ++k) {
    const auto& d = disagreements[k];
    if (d.index >= 0 && static_cast<size_t>(d.index) < ref().corpus.size()) {
      std::cout << "  corpus #" << ref().corpus[d.index].id << " "
                << Show(ref().corpus[d.index].text, 40) << ": " << d.summary << "\n";
    }
  }
}

TEST_P(TokenizerParityTest, BosFollowsReferenceDefaultsAndOptions) {
  ASSERT_TRUE(ref().bos_id.has_value()) << "the reference tokenizer_config.json names no bos_token";
  EXPECT_EQ(tok().bos_id(), ref().bos_id);
  Mismatches mismatches("encodings with default/explicit BOS");
  for (size_t i = 0; i < ref().corpus.size(); i += 7) {
    const std::vector<int32_t>& plain = ref().encodings[i].ids;
    std::vector<int32_t> with_default = ref().default_prefix_ids;
    with_default.insert(with_default.end(), plain.begin(), plain.end());
    std::vector<int32_t> with_bos = {*ref().bos_id};
    with_bos.insert(with_bos.end(), plain.begin(), plain.end());
    const auto by_default = tok().Encode(ref().corpus[i].text);
    const auto forced = tok().Encode(ref().corpus[i].text, {.add_bos = true});
    if (!by_default.ok() || *by_default != with_default) {
      mismatches.Add(
          absl::StrCat(Where(i), " default: expected ", ShowIds(with_default), " got ",
                       by_default.ok() ? ShowIds(*by_default) : by_default.status().ToString()));
    }
    if (!forced.ok() || *forced != with_bos) {
      mismatches.Add(absl::StrCat(Where(i), " add_bos=true: expected ", ShowIds(with_bos), " got ",
                                  forced.ok() ? ShowIds(*forced) : forced.status().ToString()));
    }
  }
  mismatches.Check(ref().corpus.size() / 7);
}

TEST_P(TokenizerParityTest, ParseSpecialMatchesReference) {
  Mismatches mismatches("encodings with parse_special=true");
  int special_strings = 0;
  for (size_t i = 0; i < ref().corpus.size(); ++i) {
    const std::vector<int32_t>& expected =
        ref().encodings[i].ids_parse_special.value_or(ref().encodings[i].ids);
    special_strings += ref().encodings[i].ids_parse_special.has_value();
    const auto ids = tok().Encode(ref().corpus[i].text, {.add_bos = false, .parse_special = true});
    if (!ids.ok() || *ids != expected) {
      mismatches.Add(absl::StrCat(Where(i), "\n    expected ", ShowIds(expected), "\n    got      ",
                                  ids.ok() ? ShowIds(*ids) : ids.status().ToString()));
    }
  }
  EXPECT_GT(special_strings, 20) << "the corpus should hold special tokens written as text";
  mismatches.Check(ref().corpus.size());
}

TEST_P(TokenizerParityTest, DecodeMatchesReference) {
  Mismatches mismatches(absl::StrCat("decodes of the reference ids against ", ref().reference));
  for (size_t i = 0; i < ref().corpus.size(); ++i) {
    const auto text = tok().Decode(ref().encodings[i].ids);
    if (!text.ok() || *text != ref().encodings[i].decoded) {
      mismatches.Add(absl::StrCat(Where(i), " ids ", ShowIds(ref().encodings[i].ids),
                                  "\n    expected ", Show(ref().encodings[i].decoded),
                                  "\n    got      ",
                                  text.ok() ? Show(*text) : text.status().ToString()));
    }
  }
  mismatches.Check(ref().corpus.size());
}

// Decode(Encode(text)) gives back what the reference's own round trip gives: the text itself,
// except where the reference is lossy too (Llama 2 reads a literal "▁" as a space).
TEST_P(TokenizerParityTest, RoundTripMatchesReference) {
  Mismatches mismatches("round trips");
  int lossless = 0;
  for (size_t i = 0; i < ref().corpus.size(); ++i) {
    lossless += ref().encodings[i].decoded == ref().corpus[i].text;
    const auto ids = tok().Encode(ref().corpus[i].text, {.add_bos = true});
    if (!ids.ok()) {
      mismatches.Add(absl::StrCat(Where(i), ": Encode failed: ", ids.status().ToString()));
      continue;
    }
    const auto text = tok().Decode(*ids, /*skip_special_tokens=*/true);
    if (!text.ok() || *text != ref().encodings[i].decoded) {
      mismatches.Add(absl::StrCat(Where(i), "\n    expected ", Show(ref().encodings[i].decoded),
                                  "\n    got      ",
                                  text.ok() ? Show(*text) : text.status().ToString()));
    }
  }
  EXPECT_GT(lossless, static_cast<int>(ref().corpus.size() * 9 / 10))
      << "the reference should round-trip most text";
  mismatches.Check(ref().corpus.size());
}

TEST_P(TokenizerParityTest, DecodeOfRandomIdsMatchesReference) {
  Mismatches mismatches("decodes of random id sequences (broken UTF-8, special tokens)");
  for (const auto& c : ref().random_decodes) {
    for (const bool skip : {false, true}) {
      const std::string& expected = skip ? c.decoded_skip_special : c.decoded;
      const auto text = tok().Decode(c.ids, skip);
      if (!text.ok() || *text != expected) {
        mismatches.Add(absl::StrCat("ids ", ShowIds(c.ids), " skip_special_tokens=", skip,
                                    "\n    expected ", Show(expected), "\n    got      ",
                                    text.ok() ? Show(*text) : text.status().ToString()));
      }
    }
  }
  mismatches.Check(2 * ref().random_decodes.size());
}

// The streaming contract: the concatenated chunks equal Decode(all ids), however the ids arrive.
TEST_P(TokenizerParityTest, StreamingConcatenatesToDecode) {
  Mismatches mismatches("streamed decodes");
  int cases = 0;
  auto check = [&](std::span<const int32_t> ids, bool skip, const std::string& where) {
    const auto full = tok().Decode(ids, skip);
    if (!full.ok()) {
      mismatches.Add(absl::StrCat(where, ": Decode failed: ", full.status().ToString()));
      return;
    }
    for (const uint32_t seed : kStreamSeeds) {
      ++cases;
      const std::vector<size_t> batches =
          RandomBatches(ids.size(), seed * 7919 + static_cast<uint32_t>(ids.size()));
      const auto streamed = Stream(tok(), ids, skip, batches);
      if (!streamed.ok() || *streamed != *full) {
        mismatches.Add(absl::StrCat(
            where, " skip_special_tokens=", skip, " ids ", ShowIds(ids), " pushed in batches of [",
            absl::StrJoin(batches, ", "), "] then Flush\n    Decode   ", Show(*full),
            "\n    streamed ", streamed.ok() ? Show(*streamed) : streamed.status().ToString()));
        return;
      }
    }
  };
  for (size_t i = 0; i < ref().corpus.size(); ++i) {
    check(ref().encodings[i].ids, false, Where(i));
  }
  for (const auto& c : ref().random_decodes) {
    check(c.ids, false, "random ids");
    check(c.ids, true, "random ids");
  }
  mismatches.Check(cases);
}

TEST_P(TokenizerParityTest, VocabularyMatchesReference) {
  EXPECT_EQ(tok().vocab_size(), ref().vocab_size);
  ASSERT_TRUE(ref().eos_id.has_value());
  EXPECT_THAT(tok().eos_ids(), ::testing::Contains(*ref().eos_id));
  for (const int32_t id : ref().special_ids) {
    EXPECT_TRUE(tok().IsSpecial(id)) << "id " << id;
  }
  // Ids that plain text encodes to are never special.
  for (size_t i = 0; i < ref().corpus.size(); i += 50) {
    for (const int32_t id : ref().encodings[i].ids) {
      EXPECT_FALSE(tok().IsSpecial(id)) << "id " << id << " from " << Where(i);
    }
  }
}

TEST_P(TokenizerParityTest, OutOfRangeIdsAreRejected) {
  for (const int32_t id : {-1, ref().vocab_size, ref().vocab_size + 1000}) {
    const std::vector<int32_t> ids = {
        ref().encodings[0].ids.empty() ? 0 : ref().encodings[0].ids[0], id};
    const auto text = tok().Decode(ids);
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << "id " << id;
    EXPECT_THAT(text.status().message(), HasSubstr(std::to_string(id)));
    IncrementalDetokenizer detokenizer(tok());
    EXPECT_FALSE(detokenizer.Push(ids).ok()) << "id " << id;
  }
}

// Byte strings that are not UTF-8 (JSON cannot hold them, so they are not in the corpus).
TEST_P(TokenizerParityTest, InvalidUtf8IsRejected) {
  const std::string_view kInvalid[] = {
      "\xff",
      "\xfe\xff",
      "abc\x80",
      "\xc3",                  // truncated 2-byte sequence
      "caf\xc3",               // truncated at the end of a word
      "\xe4\xbd",              // truncated 3-byte sequence
      "\xf0\x9f\x98",          // truncated 4-byte sequence
      "\xc0\xaf",              // overlong "/"
      "\xe0\x80\xaf",          // overlong 3-byte
      "\xed\xa0\x80",          // UTF-16 surrogate D800
      "\xf4\x90\x80\x80",      // above U+10FFFF
      "\xf8\x88\x80\x80\x80",  // 5-byte form
      "ok \xa0 then ok",       // lone continuation byte
      "<|eot_id|>\xff",
      "\xe2\x82\xac\xe2\x82",  // valid euro then truncated
  };
  for (const std::string_view text : kInvalid) {
    for (const bool parse_special : {false, true}) {
      const auto ids = tok().Encode(text, {.add_bos = false, .parse_special = parse_special});
      EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument)
          << Show(text) << " parse_special=" << parse_special << ": " << ids.status();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TokenizerParityTest, ::testing::Values("llama2", "llama3"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace specd
