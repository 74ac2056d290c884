// Tokenizer::LoadFromDir/FromJson and the Hugging Face tokenizer.json implementation.
#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "common/tokenizer/added_tokens.h"
#include "common/tokenizer/sha256.h"
#include "common/tokenizer/string_util.h"
#include "common/tokenizer/tokenizer_config.h"
#include "common/tokenizer/tokenizer_json.h"
#include "common/tokenizer/utf8.h"

namespace specd {
namespace {

using tokenizer::AddedToken;
using tokenizer::AddedTokenMatcher;
using tokenizer::Piece;
using tokenizer::PieceArena;
using tokenizer::Segment;
using tokenizer::TokenizerDefinition;

// Reads a whole file; an absent optional file gives "".
absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path, bool required) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (!required) return std::string();
    return absl::NotFoundError(absl::StrCat(path.string(), ": file not found"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(absl::StrCat(path.string(), ": cannot open"));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path.string(), ": read error"));
  return std::move(buffer).str();
}

class HfTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Create(
      TokenizerDefinition def, const tokenizer::SpecialTokenConfig& config);

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              const EncodeOptions& options) const override;
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                     bool skip_special_tokens) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(def_.pieces.size()); }
  std::optional<int32_t> bos_id() const override { return bos_id_; }
  const std::vector<int32_t>& eos_ids() const override { return eos_ids_; }
  bool IsSpecial(int32_t id) const override { return special_ids_.contains(id); }
  absl::StatusOr<std::string> IdToPiece(int32_t id) const override;
  std::string Fingerprint() const override { return fingerprint_; }

 private:
  explicit HfTokenizer(TokenizerDefinition def) : def_(std::move(def)) {}

  absl::StatusOr<int32_t> IdOfContent(std::string_view content, std::string_view what) const;
  absl::Status ResolveSpecialTokens(const tokenizer::SpecialTokenConfig& config);
  void ComputeFingerprint();
  // Normalizes, pre-tokenizes and runs the model on one text segment between added tokens.
  absl::Status EncodeSegment(std::string_view text, bool at_start, bool continuation,
                             bool parse_special, std::vector<int32_t>* ids) const;

  TokenizerDefinition def_;
  AddedTokenMatcher raw_matcher_;         // added tokens with normalized == false
  AddedTokenMatcher normalized_matcher_;  // the others, matched after normalization
  absl::flat_hash_set<int32_t> special_ids_;
  std::optional<int32_t> bos_id_;
  bool add_bos_default_ = false;
  std::vector<int32_t> eos_ids_;
  std::string fingerprint_;
};

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Create(
    TokenizerDefinition def, const tokenizer::SpecialTokenConfig& config) {
  auto tok = std::unique_ptr<HfTokenizer>(new HfTokenizer(std::move(def)));
  std::vector<std::pair<std::string, const AddedToken*>> raw;
  std::vector<std::pair<std::string, const AddedToken*>> normalized;
  // Hugging Face builds its matchers from the special tokens first, then the others.
  for (const bool special_pass : {true, false}) {
    for (const AddedToken& t : tok->def_.added_tokens) {
      if (t.special != special_pass) continue;
      if (t.normalized) {
        normalized.emplace_back(tok->def_.normalizer.Apply(t.content), &t);
      } else {
        raw.emplace_back(t.content, &t);
      }
    }
  }
  for (const AddedToken& t : tok->def_.added_tokens) {
    if (t.special) tok->special_ids_.insert(t.id);
  }
  tok->raw_matcher_ = AddedTokenMatcher(std::move(raw));
  tok->normalized_matcher_ = AddedTokenMatcher(std::move(normalized));
  SPECD_RETURN_IF_ERROR(tok->ResolveSpecialTokens(config));
  tok->ComputeFingerprint();
  return tok;
}

absl::StatusOr<int32_t> HfTokenizer::IdOfContent(std::string_view content,
                                                 std::string_view what) const {
  const auto it = def_.piece_to_id.find(ToAbsl(content));
  if (it == def_.piece_to_id.end()) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(what), " '", ToAbsl(content),
                                                   "' is not in the tokenizer's vocabulary"));
  }
  return it->second;
}

absl::Status HfTokenizer::ResolveSpecialTokens(const tokenizer::SpecialTokenConfig& config) {
  const auto check_id = [&](int64_t id, std::string_view what) -> absl::StatusOr<int32_t> {
    if (id < 0 || id >= vocab_size() || !def_.pieces[id].has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          ToAbsl(what), " ", id, " is not a token id (vocabulary size ", vocab_size(), ")"));
    }
    return static_cast<int32_t>(id);
  };
  // BOS: tokenizer_config.json's bos_token, else generation_config.json's bos_token_id, else
  // the token the post-processor's template prepends.
  if (config.bos_token) {
    SPECD_ASSIGN_OR_RETURN(bos_id_,
                           IdOfContent(*config.bos_token, "tokenizer_config.json: bos_token"));
  } else if (config.bos_token_id) {
    SPECD_ASSIGN_OR_RETURN(bos_id_,
                           check_id(*config.bos_token_id, "generation_config.json: bos_token_id"));
  } else if (def_.template_prefix && !def_.template_prefix->empty()) {
    bos_id_ = def_.template_prefix->front();
  }
  // Whether to prepend BOS: add_bos_token when the config says, else what the template does.
  add_bos_default_ = config.add_bos_token.has_value()
                         ? *config.add_bos_token
                         : def_.template_prefix.has_value() && !def_.template_prefix->empty();
  if (add_bos_default_ && !bos_id_) {
    return absl::InvalidArgumentError(
        "tokenizer_config.json: add_bos_token is true but no BOS token is configured");
  }
  if (config.eos_token) {
    SPECD_ASSIGN_OR_RETURN(const int32_t id,
                           IdOfContent(*config.eos_token, "tokenizer_config.json: eos_token"));
    eos_ids_.push_back(id);
  }
  for (const int64_t id : config.eos_token_ids) {
    SPECD_ASSIGN_OR_RETURN(const int32_t checked,
                           check_id(id, "generation_config.json: eos_token_id"));
    eos_ids_.push_back(checked);
  }
  std::sort(eos_ids_.begin(), eos_ids_.end());
  eos_ids_.erase(std::unique(eos_ids_.begin(), eos_ids_.end()), eos_ids_.end());
  return absl::OkStatus();
}

void HfTokenizer::ComputeFingerprint() {
  // Length-prefixed fields, so no two different tokenizers serialise to the same bytes.
  tokenizer::Sha256 hash;
  const auto field = [&](std::string_view s) {
    hash.Update(absl::StrCat(s.size(), ":"));
    hash.Update(s);
  };
  field(def_.description);
  for (size_t id = 0; id < def_.pieces.size(); ++id) {
    field(def_.pieces[id].has_value() ? absl::StrCat("+", *def_.pieces[id]) : "-");
  }
  for (const auto& [a, b] : def_.model->RankedMerges()) field(absl::StrCat(a, " ", b));
  for (const AddedToken& t : def_.added_tokens) {
    field(absl::StrCat(t.id, ",", t.special, t.normalized, t.lstrip, t.rstrip, t.single_word, ",",
                       t.content));
  }
  field(absl::StrCat("bos=", bos_id_.value_or(-1), ",add_bos=", add_bos_default_));
  for (const int32_t id : eos_ids_) field(absl::StrCat("eos=", id));
  fingerprint_ = hash.HexDigest();
}

absl::Status HfTokenizer::EncodeSegment(std::string_view text, bool at_start, bool continuation,
                                        bool parse_special, std::vector<int32_t>* ids) const {
  PieceArena arena;
  // A continuation's start takes no dummy prefix; the rest of it is as any text.
  const bool continues = continuation && at_start;
  const std::string_view normalized =
      def_.normalizer.empty() ? text : arena.Store(def_.normalizer.Apply(text, !continues));
  std::vector<Piece> pieces;
  // Pre-tokenizes the pending pieces and runs the model on them.
  const auto flush = [&]() -> absl::Status {
    SPECD_RETURN_IF_ERROR(def_.pre_tokenizer.Apply(&pieces, &arena, def_.raw_byte_input));
    for (const Piece& p : pieces) SPECD_RETURN_IF_ERROR(def_.model->Tokenize(p.text, ids));
    pieces.clear();
    return absl::OkStatus();
  };
  std::vector<Segment> segments;
  normalized_matcher_.Split(normalized, parse_special, &segments);
  for (const Segment& s : segments) {
    if (s.token_id >= 0) {
      SPECD_RETURN_IF_ERROR(flush());
      ids->push_back(s.token_id);
    } else {
      pieces.push_back({normalized.substr(s.begin, s.end - s.begin),
                        at_start && !continues && s.begin == 0, continues && s.begin == 0});
    }
  }
  return flush();
}

absl::StatusOr<std::vector<int32_t>> HfTokenizer::Encode(std::string_view text,
                                                         const EncodeOptions& options) const {
  SPECD_RETURN_IF_ERROR(tokenizer::ValidateUtf8(text, "text to encode"));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (options.add_bos.value_or(add_bos_default_)) {
    if (!bos_id_) {
      return absl::FailedPreconditionError("add_bos was requested but the tokenizer has no BOS");
    }
    ids.push_back(*bos_id_);
  }
  std::vector<Segment> segments;
  raw_matcher_.Split(text, options.parse_special, &segments);
  for (const Segment& s : segments) {
    if (s.token_id >= 0) {
      ids.push_back(s.token_id);
      continue;
    }
    SPECD_RETURN_IF_ERROR(EncodeSegment(text.substr(s.begin, s.end - s.begin), s.begin == 0,
                                        options.continuation, options.parse_special, &ids));
  }
  return ids;
}

absl::StatusOr<std::string> HfTokenizer::Decode(std::span<const int32_t> ids,
                                                bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size() || !def_.pieces[id].has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " at position ", i,
                                                     " is out of range (vocabulary size ",
                                                     vocab_size(), ")"));
    }
    if (skip_special_tokens && special_ids_.contains(id)) continue;
    tokens.push_back(*def_.pieces[id]);
  }
  return def_.decoder.Decode(std::move(tokens));
}

absl::StatusOr<std::string> HfTokenizer::IdToPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !def_.pieces[id].has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token id ", id, " is out of range (vocabulary size ", vocab_size(), ")"));
  }
  return *def_.pieces[id];
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(
    std::string_view tokenizer_json, std::string_view tokenizer_config_json,
    std::string_view generation_config_json) {
  SPECD_ASSIGN_OR_RETURN(
      const tokenizer::SpecialTokenConfig config,
      tokenizer::ParseSpecialTokenConfig(tokenizer_config_json, generation_config_json));
  SPECD_ASSIGN_OR_RETURN(TokenizerDefinition def, tokenizer::ParseTokenizerJson(tokenizer_json));
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> tok,
                         HfTokenizer::Create(std::move(def), config));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::LoadFromDir(
    const std::filesystem::path& dir) {
  SPECD_ASSIGN_OR_RETURN(const std::string tokenizer_json,
                         ReadFile(dir / "tokenizer.json", /*required=*/true));
  SPECD_ASSIGN_OR_RETURN(const std::string tokenizer_config,
                         ReadFile(dir / "tokenizer_config.json", /*required=*/false));
  SPECD_ASSIGN_OR_RETURN(const std::string generation_config,
                         ReadFile(dir / "generation_config.json", /*required=*/false));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      FromJson(tokenizer_json, tokenizer_config, generation_config);
  if (!tok.ok()) {
    // Name the directory too: the messages name the file within it.
    return absl::Status(tok.status().code(),
                        absl::StrCat(dir.string(), ": ", tok.status().message()));
  }
  return tok;
}

}  // namespace specd
