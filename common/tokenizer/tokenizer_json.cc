#include "common/tokenizer/tokenizer_json.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "common/tokenizer/json_fields.h"
#include "common/tokenizer/string_util.h"
#include "common/tokenizer/utf8.h"

namespace specd::tokenizer {
namespace {

constexpr std::string_view kFile = "tokenizer.json";

absl::Status Invalid(std::string_view where, std::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat(ToAbsl(kFile), ": ", ToAbsl(where), ": ", ToAbsl(message)));
}

// Every component is an object with a "type"; `where` is its path, e.g. "pre_tokenizer".
absl::StatusOr<std::string> ComponentType(const Json& j, std::string_view where) {
  if (!j.is_object()) return Invalid(where, absl::StrCat("must be an object, got ", j.type_name()));
  const auto it = j.find("type");
  if (it == j.end() || !it->is_string()) return Invalid(where, "missing string field 'type'");
  return it->get<std::string>();
}

absl::Status UnsupportedType(std::string_view where, std::string_view type,
                             std::string_view supported) {
  return absl::InvalidArgumentError(
      absl::StrCat(ToAbsl(kFile), ": ", ToAbsl(where), " type '", ToAbsl(type),
                   "' is not supported (supported: ", ToAbsl(supported), ")"));
}

// Reads `key` of a component with the component's path in errors.
std::string FieldPath(std::string_view where) {
  return absl::StrCat(ToAbsl(kFile), ": ", ToAbsl(where));
}

absl::StatusOr<const Json*> ArrayField(const Json& j, std::string_view key,
                                       std::string_view where) {
  SPECD_ASSIGN_OR_RETURN(const Json* v, RequiredField(j, key, FieldPath(where)));
  if (!v->is_array())
    return Invalid(where, absl::StrCat("field '", ToAbsl(key), "' must be an array"));
  return v;
}

// A single character given as a string (Metaspace replacement, Strip content).
absl::StatusOr<std::string> SingleChar(const Json& j, std::string_view key,
                                       std::string_view where) {
  SPECD_ASSIGN_OR_RETURN(std::string s, RequiredString(j, key, FieldPath(where)));
  SPECD_RETURN_IF_ERROR(ValidateUtf8(s, absl::StrCat(FieldPath(where), ": ", ToAbsl(key))));
  size_t pos = 0;
  if (s.empty() || (DecodeUtf8(s, &pos), pos != s.size())) {
    return Invalid(where, absl::StrCat("field '", ToAbsl(key),
                                       "' must be exactly one character, got '", s, "'"));
  }
  return s;
}

// Pattern objects are {"String": "..."} or {"Regex": "..."}.
struct Pattern {
  bool is_regex;
  std::string text;
};

absl::StatusOr<Pattern> ParsePattern(const Json& j, std::string_view where) {
  SPECD_ASSIGN_OR_RETURN(const Json* p, RequiredField(j, "pattern", FieldPath(where)));
  if (p->is_object() && p->size() == 1) {
    const auto s = p->find("String");
    if (s != p->end() && s->is_string()) return Pattern{false, s->get<std::string>()};
    const auto r = p->find("Regex");
    if (r != p->end() && r->is_string()) return Pattern{true, r->get<std::string>()};
  }
  return Invalid(where, "field 'pattern' must be {\"String\": ...} or {\"Regex\": ...}");
}

absl::StatusOr<std::string> StringPattern(const Json& j, std::string_view where) {
  SPECD_ASSIGN_OR_RETURN(Pattern p, ParsePattern(j, where));
  if (p.is_regex) return Invalid(where, "Regex patterns are not supported here, only String");
  if (p.text.empty()) return Invalid(where, "the String pattern is empty");
  return p.text;
}

// A literal string as a PCRE2 pattern.
std::string EscapeRegex(std::string_view s) {
  std::string out;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    const bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (u < 0x80 && !alnum) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

absl::StatusOr<PrependScheme> ParsePrependScheme(const Json& j, std::string_view where) {
  // Newer files say prepend_scheme; older ones only add_prefix_space (true means "always").
  SPECD_ASSIGN_OR_RETURN(const std::optional<std::string> scheme,
                         OptionalString(j, "prepend_scheme", FieldPath(where)));
  if (scheme) {
    if (*scheme == "always") return PrependScheme::kAlways;
    if (*scheme == "first") return PrependScheme::kFirst;
    if (*scheme == "never") return PrependScheme::kNever;
    return Invalid(
        where, absl::StrCat("prepend_scheme '", *scheme, "' is not one of always, first, never"));
  }
  SPECD_ASSIGN_OR_RETURN(const std::optional<bool> add_prefix_space,
                         OptionalBool(j, "add_prefix_space", FieldPath(where)));
  return add_prefix_space.value_or(true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

// ---- normalizer ----

absl::Status ParseNormalizer(const Json& j, const std::string& where,
                             std::vector<NormalizerStep>* steps) {
  SPECD_ASSIGN_OR_RETURN(const std::string type, ComponentType(j, where));
  if (type == "Sequence") {
    SPECD_ASSIGN_OR_RETURN(const Json* list, ArrayField(j, "normalizers", where));
    for (size_t i = 0; i < list->size(); ++i) {
      SPECD_RETURN_IF_ERROR(
          ParseNormalizer((*list)[i], absl::StrCat(ToAbsl(where), ".normalizers[", i, "]"), steps));
    }
    return absl::OkStatus();
  }
  if (type == "Prepend") {
    SPECD_ASSIGN_OR_RETURN(std::string prepend, RequiredString(j, "prepend", FieldPath(where)));
    steps->push_back({NormalizerStep::Kind::kPrepend, std::move(prepend), "", ""});
    return absl::OkStatus();
  }
  if (type == "Replace") {
    SPECD_ASSIGN_OR_RETURN(std::string pattern, StringPattern(j, where));
    SPECD_ASSIGN_OR_RETURN(std::string content, RequiredString(j, "content", FieldPath(where)));
    steps->push_back({NormalizerStep::Kind::kReplace, "", std::move(pattern), std::move(content)});
    return absl::OkStatus();
  }
  // NFC and the other Unicode normalizations would need tables matching the Rust crate's
  // Unicode version exactly; no Llama tokenizer declares them.
  return UnsupportedType(where, type, "Sequence, Prepend, Replace");
}

// ---- pre-tokenizer ----

absl::Status ParsePreTokenizer(const Json& j, const std::string& where,
                               std::vector<PreTokenizerStep>* steps) {
  SPECD_ASSIGN_OR_RETURN(const std::string type, ComponentType(j, where));
  const std::string path = FieldPath(where);
  if (type == "Sequence") {
    SPECD_ASSIGN_OR_RETURN(const Json* list, ArrayField(j, "pretokenizers", where));
    for (size_t i = 0; i < list->size(); ++i) {
      SPECD_RETURN_IF_ERROR(ParsePreTokenizer(
          (*list)[i], absl::StrCat(ToAbsl(where), ".pretokenizers[", i, "]"), steps));
    }
    return absl::OkStatus();
  }
  if (type == "Split") {
    SPECD_ASSIGN_OR_RETURN(const Pattern pattern, ParsePattern(j, where));
    SPECD_ASSIGN_OR_RETURN(const std::string behavior, RequiredString(j, "behavior", path));
    if (behavior != "Isolated") {
      return Invalid(
          where, absl::StrCat("Split behavior '", behavior, "' is not supported (only Isolated)"));
    }
    SPECD_ASSIGN_OR_RETURN(const std::optional<bool> invert, OptionalBool(j, "invert", path));
    if (invert.value_or(false)) return Invalid(where, "Split with invert true is not supported");
    SPECD_ASSIGN_OR_RETURN(
        std::unique_ptr<Regex> regex,
        Regex::Compile(pattern.is_regex ? pattern.text : EscapeRegex(pattern.text), path));
    PreTokenizerStep step;
    step.kind = PreTokenizerStep::Kind::kSplit;
    step.regex = std::move(regex);
    steps->push_back(std::move(step));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    SPECD_ASSIGN_OR_RETURN(const std::optional<bool> add_prefix_space,
                           OptionalBool(j, "add_prefix_space", path));
    SPECD_ASSIGN_OR_RETURN(const std::optional<bool> use_regex, OptionalBool(j, "use_regex", path));
    PreTokenizerStep step;
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    step.add_prefix_space = add_prefix_space.value_or(true);
    if (use_regex.value_or(true)) {
      SPECD_ASSIGN_OR_RETURN(step.regex, Regex::Compile(kGpt2Pattern, path));
    }
    steps->push_back(std::move(step));
    return absl::OkStatus();
  }
  if (type == "Metaspace") {
    PreTokenizerStep step;
    step.kind = PreTokenizerStep::Kind::kMetaspace;
    SPECD_ASSIGN_OR_RETURN(step.replacement, SingleChar(j, "replacement", where));
    SPECD_ASSIGN_OR_RETURN(step.prepend_scheme, ParsePrependScheme(j, where));
    SPECD_ASSIGN_OR_RETURN(const std::optional<bool> split, OptionalBool(j, "split", path));
    step.split = split.value_or(true);
    steps->push_back(std::move(step));
    return absl::OkStatus();
  }
  return UnsupportedType(where, type, "Sequence, Split, ByteLevel, Metaspace");
}

// ---- decoder ----

absl::Status ParseDecoder(const Json& j, const std::string& where,
                          std::vector<DecoderStep>* steps) {
  SPECD_ASSIGN_OR_RETURN(const std::string type, ComponentType(j, where));
  const std::string path = FieldPath(where);
  if (type == "Sequence") {
    SPECD_ASSIGN_OR_RETURN(const Json* list, ArrayField(j, "decoders", where));
    for (size_t i = 0; i < list->size(); ++i) {
      SPECD_RETURN_IF_ERROR(
          ParseDecoder((*list)[i], absl::StrCat(ToAbsl(where), ".decoders[", i, "]"), steps));
    }
    return absl::OkStatus();
  }
  DecoderStep step{};
  if (type == "Replace") {
    step.kind = DecoderStep::Kind::kReplace;
    SPECD_ASSIGN_OR_RETURN(step.pattern, StringPattern(j, where));
    SPECD_ASSIGN_OR_RETURN(step.content, RequiredString(j, "content", path));
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = DecoderStep::Kind::kStrip;
    SPECD_ASSIGN_OR_RETURN(step.content, SingleChar(j, "content", where));
    SPECD_ASSIGN_OR_RETURN(const int64_t start, RequiredInt(j, "start", path));
    SPECD_ASSIGN_OR_RETURN(const int64_t stop, RequiredInt(j, "stop", path));
    if (start < 0 || stop < 0) return Invalid(where, "Strip start and stop must be >= 0");
    step.strip_start = static_cast<size_t>(start);
    step.strip_stop = static_cast<size_t>(stop);
  } else if (type == "ByteLevel") {
    // add_prefix_space, trim_offsets and use_regex only affect encoding offsets.
    step.kind = DecoderStep::Kind::kByteLevel;
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::Kind::kMetaspace;
    SPECD_ASSIGN_OR_RETURN(step.replacement, SingleChar(j, "replacement", where));
    SPECD_ASSIGN_OR_RETURN(const PrependScheme scheme, ParsePrependScheme(j, where));
    step.metaspace_prepend = scheme != PrependScheme::kNever;
  } else {
    return UnsupportedType(where, type,
                           "Sequence, Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace");
  }
  steps->push_back(std::move(step));
  return absl::OkStatus();
}

// ---- post-processor ----

// TemplateProcessing: the special tokens the single template puts before $A.
absl::StatusOr<std::vector<int32_t>> ParseTemplate(const Json& j, const std::string& where) {
  SPECD_ASSIGN_OR_RETURN(const Json* single, ArrayField(j, "single", where));
  SPECD_ASSIGN_OR_RETURN(const Json* specials,
                         RequiredField(j, "special_tokens", FieldPath(where)));
  if (!specials->is_object()) return Invalid(where, "field 'special_tokens' must be an object");
  std::vector<int32_t> prefix;
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& item = (*single)[i];
    const std::string item_where = absl::StrCat(ToAbsl(where), ".single[", i, "]");
    if (item.is_object() && item.contains("Sequence")) {
      SPECD_ASSIGN_OR_RETURN(const std::string id,
                             RequiredString(item["Sequence"], "id", FieldPath(item_where)));
      if (id != "A") return Invalid(item_where, absl::StrCat("single template uses $", id));
      if (seen_sequence) return Invalid(item_where, "single template uses $A twice");
      seen_sequence = true;
      continue;
    }
    if (!item.is_object() || !item.contains("SpecialToken")) {
      return Invalid(item_where, "must be {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    }
    if (seen_sequence) {
      return Invalid(item_where,
                     "special tokens after $A (appended to every prompt) are not supported");
    }
    SPECD_ASSIGN_OR_RETURN(const std::string name,
                           RequiredString(item["SpecialToken"], "id", FieldPath(item_where)));
    const auto special = specials->find(name);
    if (special == specials->end() || !special->is_object()) {
      return Invalid(item_where, absl::StrCat("special token '", ToAbsl(name),
                                              "' is not listed in special_tokens"));
    }
    SPECD_ASSIGN_OR_RETURN(
        const Json* ids,
        ArrayField(*special, "ids", absl::StrCat(ToAbsl(where), ".special_tokens.", ToAbsl(name))));
    for (const Json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        return Invalid(where, absl::StrCat("special token '", ToAbsl(name), "' has an invalid id"));
      }
      prefix.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  if (!seen_sequence) return Invalid(where, "single template has no $A");
  if (prefix.size() > 1) {
    return Invalid(where,
                   "single template adds more than one token before $A; only a BOS is "
                   "supported");
  }
  return prefix;
}

absl::Status ParsePostProcessor(const Json& j, const std::string& where,
                                std::optional<std::vector<int32_t>>* prefix) {
  SPECD_ASSIGN_OR_RETURN(const std::string type, ComponentType(j, where));
  if (type == "Sequence") {
    SPECD_ASSIGN_OR_RETURN(const Json* list, ArrayField(j, "processors", where));
    for (size_t i = 0; i < list->size(); ++i) {
      SPECD_RETURN_IF_ERROR(ParsePostProcessor(
          (*list)[i], absl::StrCat(ToAbsl(where), ".processors[", i, "]"), prefix));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") return absl::OkStatus();  // it only trims offsets
  if (type == "TemplateProcessing") {
    if (prefix->has_value()) return Invalid(where, "more than one TemplateProcessing");
    SPECD_ASSIGN_OR_RETURN(*prefix, ParseTemplate(j, where));
    return absl::OkStatus();
  }
  return UnsupportedType(where, type, "Sequence, TemplateProcessing, ByteLevel");
}

// ---- model ----

struct ModelJson {
  absl::flat_hash_map<std::string, int32_t> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  BpeOptions options;
  std::optional<std::string> unk_token;
};

absl::StatusOr<ModelJson> ParseModelJson(const Json& j) {
  const std::string where = "model";
  const std::string path = FieldPath(where);
  SPECD_ASSIGN_OR_RETURN(const std::string type, ComponentType(j, where));
  if (type != "BPE") return UnsupportedType(where, type, "BPE");
  ModelJson m;
  SPECD_ASSIGN_OR_RETURN(const std::optional<double> dropout, OptionalNumber(j, "dropout", path));
  if (dropout.value_or(0.0) != 0.0) return Invalid(where, "dropout must be null or 0");
  for (const std::string_view key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    SPECD_ASSIGN_OR_RETURN(const std::optional<std::string> v, OptionalString(j, key, path));
    if (v.has_value() && !v->empty()) {
      return Invalid(where,
                     absl::StrCat(ToAbsl(key), " '", *v, "' is not supported (must be null)"));
    }
  }
  SPECD_ASSIGN_OR_RETURN(const std::optional<bool> byte_fallback,
                         OptionalBool(j, "byte_fallback", path));
  SPECD_ASSIGN_OR_RETURN(const std::optional<bool> fuse_unk, OptionalBool(j, "fuse_unk", path));
  SPECD_ASSIGN_OR_RETURN(const std::optional<bool> ignore_merges,
                         OptionalBool(j, "ignore_merges", path));
  m.options.byte_fallback = byte_fallback.value_or(false);
  m.options.fuse_unk = fuse_unk.value_or(false);
  m.options.ignore_merges = ignore_merges.value_or(false);
  SPECD_ASSIGN_OR_RETURN(m.unk_token, OptionalString(j, "unk_token", path));

  SPECD_ASSIGN_OR_RETURN(const Json* vocab, RequiredField(j, "vocab", path));
  if (!vocab->is_object()) return Invalid(where, "field 'vocab' must be an object");
  m.vocab.reserve(vocab->size());
  for (const auto& [piece, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= INT32_MAX) {
      return Invalid(where,
                     absl::StrCat("vocab entry '", piece, "' must have a non-negative integer id"));
    }
    SPECD_RETURN_IF_ERROR(ValidateUtf8(piece, absl::StrCat(path, ": vocab entry")));
    m.vocab.emplace(piece, static_cast<int32_t>(id.get<int64_t>()));
  }

  SPECD_ASSIGN_OR_RETURN(const Json* merges, ArrayField(j, "merges", where));
  m.merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& merge = (*merges)[i];
    if (merge.is_string()) {
      // Older files write "a b"; a part containing a space cannot be written that way.
      const std::vector<std::string> parts = absl::StrSplit(merge.get<std::string>(), ' ');
      if (parts.size() != 2) {
        return Invalid(where, absl::StrCat("merges[", i, "] '", merge.get<std::string>(),
                                           "' must be two tokens separated by one space"));
      }
      m.merges.emplace_back(parts[0], parts[1]);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      m.merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      return Invalid(
          where, absl::StrCat("merges[", i, "] must be a string \"a b\" or a pair [\"a\", \"b\"]"));
    }
  }
  return m;
}

absl::StatusOr<std::vector<AddedToken>> ParseAddedTokens(const Json& root) {
  std::vector<AddedToken> tokens;
  const auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return tokens;
  if (!it->is_array()) return Invalid("added_tokens", "must be an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& t = (*it)[i];
    const std::string where = absl::StrCat("added_tokens[", i, "]");
    const std::string path = FieldPath(where);
    if (!t.is_object()) return Invalid(where, "must be an object");
    AddedToken token;
    SPECD_ASSIGN_OR_RETURN(const int64_t id, RequiredInt(t, "id", path));
    if (id < 0 || id >= INT32_MAX)
      return Invalid(where, absl::StrCat("id ", id, " is out of range"));
    token.id = static_cast<int32_t>(id);
    SPECD_ASSIGN_OR_RETURN(token.content, RequiredString(t, "content", path));
    if (token.content.empty()) return Invalid(where, "content is empty");
    SPECD_RETURN_IF_ERROR(ValidateUtf8(token.content, absl::StrCat(path, ": content")));
    SPECD_ASSIGN_OR_RETURN(const std::optional<bool> special, OptionalBool(t, "special", path));
    SPECD_ASSIGN_OR_RETURN(const std::optional<bool> normalized,
                           OptionalBool(t, "normalized", path));
    SPECD_ASSIGN_OR_RETURN(const std::optional<bool> lstrip, OptionalBool(t, "lstrip", path));
    SPECD_ASSIGN_OR_RETURN(const std::optional<bool> rstrip, OptionalBool(t, "rstrip", path));
    SPECD_ASSIGN_OR_RETURN(const std::optional<bool> single_word,
                           OptionalBool(t, "single_word", path));
    token.special = special.value_or(false);
    token.normalized = normalized.value_or(!token.special);
    token.lstrip = lstrip.value_or(false);
    token.rstrip = rstrip.value_or(false);
    token.single_word = single_word.value_or(false);
    tokens.push_back(std::move(token));
  }
  return tokens;
}

// Fills pieces/piece_to_id from the model vocabulary and the added tokens, rejecting ids or
// contents that two entries claim.
absl::Status BuildPieceTables(const ModelJson& model, TokenizerDefinition* def) {
  int32_t max_id = -1;
  for (const auto& [piece, id] : model.vocab) max_id = std::max(max_id, id);
  for (const AddedToken& t : def->added_tokens) max_id = std::max(max_id, t.id);
  def->pieces.assign(static_cast<size_t>(max_id) + 1, std::nullopt);
  for (const auto& [piece, id] : model.vocab) {
    if (def->pieces[id].has_value()) {
      return Invalid("model", absl::StrCat("vocab maps both '", *def->pieces[id], "' and '", piece,
                                           "' to id ", id));
    }
    def->pieces[id] = piece;
  }
  def->piece_to_id = model.vocab;
  absl::flat_hash_set<std::string> added_contents;
  for (size_t i = 0; i < def->added_tokens.size(); ++i) {
    const AddedToken& t = def->added_tokens[i];
    const std::string where = absl::StrCat("added_tokens[", i, "]");
    if (!added_contents.insert(t.content).second) {
      return Invalid(where, absl::StrCat("'", t.content, "' is listed twice"));
    }
    if (const auto it = model.vocab.find(t.content);
        it != model.vocab.end() && it->second != t.id) {
      return Invalid(where, absl::StrCat("'", t.content, "' has id ", t.id,
                                         " but the vocabulary gives it id ", it->second));
    }
    if (def->pieces[t.id].has_value() && *def->pieces[t.id] != t.content) {
      return Invalid(where, absl::StrCat("id ", t.id, " of '", t.content, "' already belongs to '",
                                         *def->pieces[t.id], "'"));
    }
    def->pieces[t.id] = t.content;
    def->piece_to_id[t.content] = t.id;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenizerDefinition> ParseTokenizerJson(std::string_view text) {
  SPECD_ASSIGN_OR_RETURN(const Json root, ParseJson(text, kFile));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(kFile), ": must be a JSON object"));
  }
  for (const std::string_view key : {"truncation", "padding"}) {
    const auto it = root.find(key);
    if (it != root.end() && !it->is_null()) {
      return Invalid(key, "must be null (specd never truncates or pads a prompt)");
    }
  }
  TokenizerDefinition def;
  SPECD_ASSIGN_OR_RETURN(const Json* model_json, RequiredField(root, "model", kFile));
  SPECD_ASSIGN_OR_RETURN(ModelJson model, ParseModelJson(*model_json));
  SPECD_ASSIGN_OR_RETURN(def.added_tokens, ParseAddedTokens(root));
  SPECD_RETURN_IF_ERROR(BuildPieceTables(model, &def));

  const auto component = [&](std::string_view key) -> const Json* {
    const auto it = root.find(key);
    return it == root.end() || it->is_null() ? nullptr : &*it;
  };
  std::vector<NormalizerStep> normalizer_steps;
  if (const Json* j = component("normalizer")) {
    SPECD_RETURN_IF_ERROR(ParseNormalizer(*j, "normalizer", &normalizer_steps));
  }
  def.normalizer = Normalizer(std::move(normalizer_steps));
  std::vector<PreTokenizerStep> pre_tokenizer_steps;
  if (const Json* j = component("pre_tokenizer")) {
    SPECD_RETURN_IF_ERROR(ParsePreTokenizer(*j, "pre_tokenizer", &pre_tokenizer_steps));
  }
  def.pre_tokenizer = PreTokenizer(std::move(pre_tokenizer_steps));
  if (const Json* j = component("post_processor")) {
    SPECD_RETURN_IF_ERROR(ParsePostProcessor(*j, "post_processor", &def.template_prefix));
  }
  if (const Json* j = component("decoder")) {
    std::vector<DecoderStep> decoder_steps;
    SPECD_RETURN_IF_ERROR(ParseDecoder(*j, "decoder", &decoder_steps));
    def.decoder = Decoder(std::move(decoder_steps));
  } else {
    def.decoder = Decoder::None();
  }
  if (def.template_prefix) {
    for (const int32_t id : *def.template_prefix) {
      if (static_cast<size_t>(id) >= def.pieces.size() || !def.pieces[id].has_value()) {
        return Invalid("post_processor",
                       absl::StrCat("template token id ", id, " is not in the vocabulary"));
      }
    }
  }

  if (model.unk_token) {
    const auto it = model.vocab.find(*model.unk_token);
    if (it == model.vocab.end()) {
      return Invalid("model",
                     absl::StrCat("unk_token '", *model.unk_token, "' is not in the vocabulary"));
    }
    model.options.unk_id = it->second;
  }
  def.raw_byte_input = def.pre_tokenizer.ends_with_byte_level();
  model.options.raw_byte_input = def.raw_byte_input;
  // Without a pre-tokenizer a "word" is a whole prompt, which would never hit the cache.
  model.options.cache_words = !def.pre_tokenizer.empty();
  // SentencePiece's visible space: BpeModel checks that chunking there is exact.
  model.options.chunk_before = "\xE2\x96\x81";
  SPECD_ASSIGN_OR_RETURN(
      def.model, BpeModel::Create(model.vocab, model.merges, model.options, FieldPath("model")));

  def.description = absl::StrCat(
      "model=BPE(byte_fallback=", model.options.byte_fallback, ",fuse_unk=", model.options.fuse_unk,
      ",ignore_merges=", model.options.ignore_merges, ",unk=", model.options.unk_id.value_or(-1),
      ");normalizer=", def.normalizer.Describe(), ";pre_tokenizer=", def.pre_tokenizer.Describe(),
      ";decoder=", def.decoder.Describe(), ";template=");
  if (def.template_prefix) {
    for (const int32_t id : *def.template_prefix) absl::StrAppend(&def.description, id, ",");
  } else {
    absl::StrAppend(&def.description, "none");
  }
  return def;
}

}  // namespace specd::tokenizer
