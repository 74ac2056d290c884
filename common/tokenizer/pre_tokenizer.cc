#include "common/tokenizer/pre_tokenizer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/string_util.h"

namespace specd::tokenizer {
namespace {

// Splits every piece on the regex's matches; matches and the text between them become pieces
// (Hugging Face's SplitDelimiterBehavior::Isolated). Empty pieces are dropped.
absl::Status SplitIsolated(const Regex& regex, std::vector<Piece>* pieces) {
  std::vector<Piece> out;
  out.reserve(pieces->size() * 4);
  std::vector<std::pair<size_t, size_t>> matches;
  for (const Piece& piece : *pieces) {
    matches.clear();
    if (const absl::Status s = regex.FindAll(piece.text, &matches); !s.ok()) return s;
    size_t prev = 0;
    bool first = true;
    const auto emit = [&](size_t begin, size_t end) {
      if (begin == end) return;
      out.push_back({piece.text.substr(begin, end - begin), piece.at_start && first,
                     piece.continues && first});
      first = false;
    };
    for (const auto& [begin, end] : matches) {
      emit(prev, begin);
      emit(begin, end);
      prev = end;
    }
    emit(prev, piece.text.size());
  }
  *pieces = std::move(out);
  return absl::OkStatus();
}

// Splits on every occurrence of `delimiter`, each delimiter starting the next piece
// (SplitDelimiterBehavior::MergedWithNext): "a▁▁b" gives "a", "▁", "▁b".
void SplitMergedWithNext(std::string_view delimiter, std::vector<Piece>* pieces) {
  std::vector<Piece> out;
  for (const Piece& piece : *pieces) {
    const std::string_view text = piece.text;
    size_t start = 0;
    size_t search = 0;
    bool first = true;
    while (true) {
      const size_t hit = text.find(delimiter, search);
      if (hit == std::string_view::npos) break;
      if (hit > start) {
        out.push_back(
            {text.substr(start, hit - start), piece.at_start && first, piece.continues && first});
        first = false;
      }
      start = hit;
      search = hit + delimiter.size();
    }
    if (start < text.size()) {
      out.push_back({text.substr(start), piece.at_start && first, piece.continues && first});
    }
  }
  *pieces = std::move(out);
}

}  // namespace

absl::Status PreTokenizer::Apply(std::vector<Piece>* pieces, PieceArena* arena,
                                 bool raw_bytes_out) const {
  for (size_t i = 0; i < steps_.size(); ++i) {
    const PreTokenizerStep& step = steps_[i];
    switch (step.kind) {
      case PreTokenizerStep::Kind::kSplit:
        if (const absl::Status s = SplitIsolated(*step.regex, pieces); !s.ok()) return s;
        break;
      case PreTokenizerStep::Kind::kByteLevel: {
        if (step.add_prefix_space) {
          for (Piece& piece : *pieces) {
            if (!piece.text.empty() && piece.text.front() != ' ') {
              piece.text = arena->Store(absl::StrCat(" ", ToAbsl(piece.text)));
            }
          }
        }
        if (step.regex != nullptr) {
          if (const absl::Status s = SplitIsolated(*step.regex, pieces); !s.ok()) return s;
        }
        const bool last = i + 1 == steps_.size();
        if (!(last && raw_bytes_out)) {
          for (Piece& piece : *pieces) piece.text = arena->Store(ByteLevelEncode(piece.text));
        }
        break;
      }
      case PreTokenizerStep::Kind::kMetaspace: {
        for (Piece& piece : *pieces) {
          std::string s = ReplaceAll(piece.text, " ", step.replacement);
          const bool prepend = !s.empty() && !s.starts_with(step.replacement) && !piece.continues &&
                               (step.prepend_scheme == PrependScheme::kAlways ||
                                (step.prepend_scheme == PrependScheme::kFirst && piece.at_start));
          if (prepend) s.insert(0, step.replacement);
          piece.text = arena->Store(std::move(s));
        }
        if (step.split) SplitMergedWithNext(step.replacement, pieces);
        break;
      }
    }
  }
  return absl::OkStatus();
}

std::string PreTokenizer::Describe() const {
  std::string out;
  for (const PreTokenizerStep& step : steps_) {
    switch (step.kind) {
      case PreTokenizerStep::Kind::kSplit:
        absl::StrAppend(&out, "Split(", step.regex->pattern().size(), ":", step.regex->pattern(),
                        ")");
        break;
      case PreTokenizerStep::Kind::kByteLevel:
        absl::StrAppend(&out, "ByteLevel(", step.add_prefix_space, ",", step.regex != nullptr, ")");
        break;
      case PreTokenizerStep::Kind::kMetaspace:
        absl::StrAppend(&out, "Metaspace(", step.replacement, ",",
                        static_cast<int>(step.prepend_scheme), ",", step.split, ")");
        break;
    }
  }
  return out;
}

}  // namespace specd::tokenizer
