#include "common/tokenizer/normalizer.h"

#include "absl/strings/str_cat.h"
#include "common/tokenizer/string_util.h"

namespace specd::tokenizer {

std::string Normalizer::Apply(std::string_view text, bool prepend) const {
  std::string s(text);
  for (const NormalizerStep& step : steps_) {
    switch (step.kind) {
      case NormalizerStep::Kind::kPrepend:
        if (prepend && !s.empty()) s.insert(0, step.prepend);
        break;
      case NormalizerStep::Kind::kReplace:
        s = ReplaceAll(s, step.pattern, step.content);
        break;
    }
  }
  return s;
}

std::string Normalizer::Describe() const {
  std::string out;
  for (const NormalizerStep& step : steps_) {
    switch (step.kind) {
      case NormalizerStep::Kind::kPrepend:
        absl::StrAppend(&out, "Prepend(", step.prepend.size(), ":", step.prepend, ")");
        break;
      case NormalizerStep::Kind::kReplace:
        absl::StrAppend(&out, "Replace(", step.pattern.size(), ":", step.pattern, ",",
                        step.content.size(), ":", step.content, ")");
        break;
    }
  }
  return out;
}

}  // namespace specd::tokenizer
