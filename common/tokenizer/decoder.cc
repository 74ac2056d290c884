#include "common/tokenizer/decoder.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/string_util.h"
#include "common/tokenizer/utf8.h"

namespace specd::tokenizer {
namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Runs of byte tokens become their bytes when the whole run is valid UTF-8; otherwise every
// byte of the run becomes one U+FFFD (Hugging Face's ByteFallback, not a lossy conversion).
std::vector<std::string> ByteFallback(std::vector<std::string> tokens) {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  std::string run;
  const auto flush = [&] {
    if (run.empty()) return;
    if (!FindInvalidUtf8(run).has_value()) {
      out.push_back(std::move(run));
    } else {
      for (size_t i = 0; i < run.size(); ++i) out.emplace_back(kReplacementChar);
    }
    run.clear();
  };
  for (std::string& token : tokens) {
    if (const std::optional<unsigned char> b = ParseByteToken(token)) {
      run.push_back(static_cast<char>(*b));
      continue;
    }
    flush();
    out.push_back(std::move(token));
  }
  flush();
  return out;
}

// Removes up to `start` leading and `stop` trailing occurrences of the character `c`.
std::string Strip(std::string_view token, std::string_view c, size_t start, size_t stop) {
  size_t begin = 0;
  for (size_t i = 0; i < start && token.substr(begin).starts_with(c); ++i) begin += c.size();
  size_t end = token.size();
  for (size_t i = 0;
       i < stop && end >= begin + c.size() && token.substr(end - c.size(), c.size()) == c; ++i) {
    end -= c.size();
  }
  return std::string(token.substr(begin, end - begin));
}

// Maps every token's characters back to bytes (a token with a character outside the table keeps
// its own UTF-8 bytes), then converts the whole byte string lossily.
std::string ByteLevel(const std::vector<std::string>& tokens) {
  std::string bytes;
  for (const std::string& token : tokens) {
    if (std::optional<std::string> b = ByteLevelDecode(token)) {
      bytes.append(*b);
    } else {
      bytes.append(token);
    }
  }
  return Utf8Lossy(bytes);
}

}  // namespace

std::optional<unsigned char> ParseByteToken(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token.back() != '>') return std::nullopt;
  // Rust's u8::from_str_radix accepts a leading '+', so "<0x+A>" is byte 0x0A there too.
  if (token[3] == '+') {
    const int d = HexDigit(token[4]);
    if (d < 0) return std::nullopt;
    return static_cast<unsigned char>(d);
  }
  const int hi = HexDigit(token[3]);
  const int lo = HexDigit(token[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<unsigned char>(hi * 16 + lo);
}

Decoder Decoder::None() {
  Decoder d;
  d.none_ = true;
  return d;
}

std::string Decoder::Decode(std::vector<std::string> tokens) const {
  if (none_) return absl::StrJoin(tokens, " ");
  for (const DecoderStep& step : steps_) {
    switch (step.kind) {
      case DecoderStep::Kind::kReplace:
        for (std::string& t : tokens) t = ReplaceAll(t, step.pattern, step.content);
        break;
      case DecoderStep::Kind::kByteFallback:
        tokens = ByteFallback(std::move(tokens));
        break;
      case DecoderStep::Kind::kFuse: {
        std::string fused = absl::StrJoin(tokens, "");
        tokens.clear();
        tokens.push_back(std::move(fused));
        break;
      }
      case DecoderStep::Kind::kStrip:
        for (std::string& t : tokens) {
          t = Strip(t, step.content, step.strip_start, step.strip_stop);
        }
        break;
      case DecoderStep::Kind::kByteLevel: {
        std::string text = ByteLevel(tokens);
        tokens.clear();
        tokens.push_back(std::move(text));
        break;
      }
      case DecoderStep::Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          // The first token loses every replacement character, not only a leading one, exactly
          // as Hugging Face's Metaspace decoder does.
          const std::string_view with = i == 0 && step.metaspace_prepend ? "" : " ";
          tokens[i] = ReplaceAll(tokens[i], step.replacement, with);
        }
        break;
    }
  }
  return absl::StrJoin(tokens, "");
}

std::string Decoder::Describe() const {
  if (none_) return "none";
  std::string out;
  for (const DecoderStep& step : steps_) {
    switch (step.kind) {
      case DecoderStep::Kind::kReplace:
        absl::StrAppend(&out, "Replace(", step.pattern.size(), ":", step.pattern, ",",
                        step.content.size(), ":", step.content, ")");
        break;
      case DecoderStep::Kind::kByteFallback:
        absl::StrAppend(&out, "ByteFallback");
        break;
      case DecoderStep::Kind::kFuse:
        absl::StrAppend(&out, "Fuse");
        break;
      case DecoderStep::Kind::kStrip:
        absl::StrAppend(&out, "Strip(", step.content, ",", step.strip_start, ",", step.strip_stop,
                        ")");
        break;
      case DecoderStep::Kind::kByteLevel:
        absl::StrAppend(&out, "ByteLevel");
        break;
      case DecoderStep::Kind::kMetaspace:
        absl::StrAppend(&out, "Metaspace(", step.replacement, ",", step.metaspace_prepend, ")");
        break;
    }
  }
  return out;
}

}  // namespace specd::tokenizer
