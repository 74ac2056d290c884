#include "common/chat/lexer.h"

#include <array>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/absl_string.h"
#include "common/chat/js_text.h"

namespace specd::chat {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsWordChar(char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

// Bytes of the JavaScript whitespace character at `pos`, 0 if there is none.
size_t WhitespaceAt(std::string_view s, size_t pos) {
  if (pos >= s.size()) return 0;
  const CodePoint cp = DecodeUtf8(s, pos);
  return IsJsWhitespace(cp.value) ? cp.size : 0;
}

// Where JavaScript's multiline `^` matches: after \n, \r, U+2028 and U+2029.
bool IsLineStart(std::string_view s, size_t pos) {
  if (pos == 0) return true;
  const char prev = s[pos - 1];
  if (prev == '\n' || prev == '\r') return true;
  return pos >= 3 && s.substr(pos - 3, 2) == "\xE2\x80" &&
         (s[pos - 1] == '\xA8' || s[pos - 1] == '\xA9');
}

// lstrip_blocks: `/^[ \t]*({[#%-])/gm` -> "$1".
std::string LstripBlocks(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    if (IsLineStart(s, pos)) {
      size_t end = pos;
      while (end < s.size() && (s[end] == ' ' || s[end] == '\t')) ++end;
      if (end + 1 < s.size() && s[end] == '{' &&
          (s[end + 1] == '#' || s[end + 1] == '%' || s[end + 1] == '-')) {
        pos = end;  // drop the indentation
      }
    }
    out.push_back(s[pos++]);
  }
  return out;
}

// trim_blocks: `/([#%-]})\n/g` -> "$1".
std::string TrimBlocks(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    if (pos + 2 < s.size() && (s[pos] == '#' || s[pos] == '%' || s[pos] == '-') &&
        s[pos + 1] == '}' && s[pos + 2] == '\n') {
      out.append(s.substr(pos, 2));
      pos += 3;
      continue;
    }
    out.push_back(s[pos++]);
  }
  return out;
}

// Matches `{%(-?)\s*(?:end)?generation\s*(-?)%}` at `pos`; returns the end and the two flags.
bool MatchGenerationTag(std::string_view s, size_t pos, size_t& end, bool& lstrip, bool& rstrip) {
  if (s.substr(pos, 2) != "{%") return false;
  size_t i = pos + 2;
  lstrip = i < s.size() && s[i] == '-';
  if (lstrip) ++i;
  while (size_t n = WhitespaceAt(s, i)) i += n;
  if (s.substr(i, 3) == "end") i += 3;
  if (s.substr(i, 10) != "generation") return false;
  i += 10;
  while (size_t n = WhitespaceAt(s, i)) i += n;
  rstrip = i < s.size() && s[i] == '-';
  if (rstrip) ++i;
  if (s.substr(i, 2) != "%}") return false;
  end = i + 2;
  return true;
}

// transformers' {% generation %} / {% endgeneration %} markers are dropped, with the
// whitespace around them unless the tag's `-` strips it:
// `/(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs`.
std::string RemoveGenerationTags(std::string_view s) {
  std::string out;
  size_t copied = 0;  // end of the previous match
  size_t search = 0;
  while (true) {
    const size_t tag = s.find("{%", search);
    if (tag == std::string_view::npos) break;
    size_t end = 0;
    bool lstrip = false;
    bool rstrip = false;
    if (!MatchGenerationTag(s, tag, end, lstrip, rstrip)) {
      search = tag + 1;
      continue;
    }
    // The whitespace run just before the tag, back to the previous match at most.
    size_t before = tag;
    while (before > copied) {
      size_t start = before - 1;
      while (start > copied && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      if (WhitespaceAt(s, start) != before - start) break;
      before = start;
    }
    size_t after = end;
    while (size_t n = WhitespaceAt(s, after)) after += n;
    out.append(s.substr(copied, before - copied));
    if (!lstrip) out.append(s.substr(before, tag - before));
    if (!rstrip) out.append(s.substr(end, after - end));
    copied = after;
    search = after;
  }
  out.append(s.substr(copied));
  return out;
}

constexpr std::array<std::pair<std::string_view, TokenType>, 29> kOperators = {{
    {"{%", TokenType::kOpenStatement},
    {"%}", TokenType::kCloseStatement},
    {"{{", TokenType::kOpenExpression},
    {"}}", TokenType::kCloseExpression},
    {"(", TokenType::kOpenParen},
    {")", TokenType::kCloseParen},
    {"{", TokenType::kOpenCurlyBracket},
    {"}", TokenType::kCloseCurlyBracket},
    {"[", TokenType::kOpenSquareBracket},
    {"]", TokenType::kCloseSquareBracket},
    {",", TokenType::kComma},
    {".", TokenType::kDot},
    {":", TokenType::kColon},
    {"|", TokenType::kPipe},
    {"<=", TokenType::kComparisonOperator},
    {">=", TokenType::kComparisonOperator},
    {"==", TokenType::kComparisonOperator},
    {"!=", TokenType::kComparisonOperator},
    {"<", TokenType::kComparisonOperator},
    {">", TokenType::kComparisonOperator},
    {"+", TokenType::kAdditiveOperator},
    {"-", TokenType::kAdditiveOperator},
    {"~", TokenType::kAdditiveOperator},
    {"**", TokenType::kExponentiationOperator},  // before "*"
    {"*", TokenType::kMultiplicativeOperator},
    {"//", TokenType::kMultiplicativeOperator},  // before "/"
    {"/", TokenType::kMultiplicativeOperator},
    {"%", TokenType::kMultiplicativeOperator},
    {"=", TokenType::kEquals},
}};

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  absl::StatusOr<std::vector<Token>> Run() {
    while (pos_ < src_.size()) {
      const bool after_tag = tokens_.empty() || Last() == TokenType::kCloseStatement ||
                             Last() == TokenType::kCloseExpression || Last() == TokenType::kComment;
      if (after_tag) {
        const size_t start = pos_;
        while (pos_ < src_.size() &&
               !(src_[pos_] == '{' &&
                 (At(pos_ + 1) == '%' || At(pos_ + 1) == '{' || At(pos_ + 1) == '#'))) {
          ++pos_;
        }
        if (pos_ > start) {
          Push(TokenType::kText, src_.substr(start, pos_ - start));
          continue;
        }
      }
      if (StartsWith("{#")) {
        if (absl::Status s = LexComment(); !s.ok()) return s;
        continue;
      }
      if (StartsWith("{%-")) {
        StripTrailingWhitespace();
        Push(TokenType::kOpenStatement, "{%");
        pos_ += 3;
        continue;
      }
      if (StartsWith("{{-")) {
        StripTrailingWhitespace();
        Push(TokenType::kOpenExpression, "{{");
        curly_depth_ = 0;
        pos_ += 3;
        continue;
      }
      // Whitespace inside a tag separates tokens.
      while (size_t n = WhitespaceAt(src_, pos_)) {
        pos_ += n;
        if (pos_ >= src_.size()) return Error("unexpected end of template");
      }
      if (StartsWith("-%}")) {
        Push(TokenType::kCloseStatement, "%}");
        pos_ += 3;
        SkipLeadingWhitespace();
        continue;
      }
      if (StartsWith("-}}")) {
        Push(TokenType::kCloseExpression, "}}");
        pos_ += 3;
        SkipLeadingWhitespace();
        continue;
      }
      if (absl::StatusOr<bool> lexed = LexNext(); !lexed.ok()) {
        return lexed.status();
      } else if (!*lexed) {
        return Error(absl::StrCat("unexpected character '", CharAt(pos_), "'"));
      }
    }
    return std::move(tokens_);
  }

 private:
  char At(size_t i) const { return i < src_.size() ? src_[i] : '\0'; }
  std::string CharAt(size_t i) const {
    return i < src_.size() ? std::string(src_.substr(i, DecodeUtf8(src_, i).size)) : "";
  }
  bool StartsWith(std::string_view s) const {
    return pos_ <= src_.size() && std::string_view(src_).substr(pos_).starts_with(s);
  }
  TokenType Last() const { return tokens_.back().type; }
  void Push(TokenType type, std::string value) { tokens_.push_back({type, std::move(value)}); }
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template syntax error at offset ", pos_, ": ", ToAbsl(what)));
  }

  void StripTrailingWhitespace() {
    if (tokens_.empty() || Last() != TokenType::kText) return;
    Token& text = tokens_.back();
    text.value = std::string(JsTrimEnd(text.value));
    if (text.value.empty()) tokens_.pop_back();
  }
  void SkipLeadingWhitespace() {
    while (size_t n = WhitespaceAt(src_, pos_)) pos_ += n;
  }

  absl::Status LexComment() {
    pos_ += 2;
    const bool strip_before = At(pos_) == '-';
    if (strip_before) ++pos_;
    std::string comment;
    while (At(pos_) != '#' || At(pos_ + 1) != '}') {
      if (pos_ + 2 >= src_.size()) return Error("missing end of comment tag");
      comment.push_back(src_[pos_++]);
    }
    const bool strip_after = absl::EndsWith(comment, "-");
    if (strip_after) comment.pop_back();
    if (strip_before) StripTrailingWhitespace();
    Push(TokenType::kComment, std::move(comment));
    pos_ += 2;
    if (strip_after) SkipLeadingWhitespace();
    return absl::OkStatus();
  }

  // Digits at pos_; reaching the end of the template while consuming is an error, as in the
  // reference lexer.
  absl::StatusOr<std::string> ConsumeDigits() {
    const size_t start = pos_;
    while (IsDigit(At(pos_))) {
      ++pos_;
      if (pos_ >= src_.size()) return Error("unexpected end of template");
    }
    return src_.substr(start, pos_ - start);
  }

  // A number: digits, then ".digits" when `allow_fraction`.
  absl::StatusOr<std::string> ConsumeNumber(bool allow_fraction) {
    auto digits = ConsumeDigits();
    if (!digits.ok()) return digits.status();
    std::string num = *std::move(digits);
    if (allow_fraction && !num.empty() && At(pos_) == '.' && IsDigit(At(pos_ + 1))) {
      ++pos_;
      auto frac = ConsumeDigits();
      if (!frac.ok()) return frac.status();
      num = absl::StrCat(num, ".", *frac);
    }
    return num;
  }

  absl::StatusOr<std::string> ConsumeString(char quote) {
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) return Error("unterminated string literal");
      const char c = src_[pos_];
      if (c == quote) return out;
      if (c != '\\') {
        out.push_back(c);
        ++pos_;
        if (pos_ >= src_.size()) return Error("unterminated string literal");
        continue;
      }
      ++pos_;
      if (pos_ >= src_.size()) return Error("unexpected end of template in an escape");
      const char escaped = src_[pos_++];
      switch (escaped) {
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case 'x':
        case 'u': {
          auto unit = HexEscape(escaped == 'x' ? 2 : 4, escaped);
          if (!unit.ok()) return unit.status();
          char32_t c32 = *unit;
          if (c32 >= 0xD800 && c32 <= 0xDBFF && StartsWith("\\u")) {
            // A surrogate pair written as two escapes is one character.
            const size_t save = pos_;
            pos_ += 2;
            auto low = HexEscape(4, 'u');
            if (low.ok() && *low >= 0xDC00 && *low <= 0xDFFF) {
              c32 = 0x10000 + ((c32 - 0xD800) << 10) + (*low - 0xDC00);
            } else {
              pos_ = save;
            }
          }
          if (c32 >= 0xD800 && c32 <= 0xDFFF) {
            return Error("a lone UTF-16 surrogate escape cannot be written as UTF-8");
          }
          AppendUtf8(c32, out);
          break;
        }
        default:
          return Error(
              absl::StrCat("unexpected escaped character '", std::string(1, escaped), "'"));
      }
    }
  }

  absl::StatusOr<char32_t> HexEscape(size_t length, char kind) {
    char32_t value = 0;
    for (size_t k = 0; k < length; ++k) {
      const char c = At(pos_ + k);
      int digit = -1;
      if (IsDigit(c)) digit = c - '0';
      if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
      if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
      if (digit < 0) {
        return Error(absl::StrCat("invalid hexadecimal escape sequence \\", std::string(1, kind)));
      }
      value = value * 16 + digit;
    }
    pos_ += length;
    return value;
  }

  // Operators, literals and identifiers; false when nothing matches.
  absl::StatusOr<bool> LexNext() {
    const char c = src_[pos_];
    if (c == '-' || c == '+') {
      if (tokens_.empty() || Last() == TokenType::kText) {
        return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
      }
      switch (Last()) {
        case TokenType::kIdentifier:
        case TokenType::kNumericLiteral:
        case TokenType::kStringLiteral:
        case TokenType::kCloseParen:
        case TokenType::kCloseSquareBracket:
          break;  // a binary operator
        default: {
          ++pos_;
          auto num = ConsumeNumber(/*allow_fraction=*/true);
          if (!num.ok()) return num.status();
          if (num->empty()) {
            Push(TokenType::kUnaryOperator, std::string(1, c));
          } else {
            Push(TokenType::kNumericLiteral, absl::StrCat(std::string(1, c), *num));
          }
          return true;
        }
      }
    }
    for (const auto& [seq, type] : kOperators) {
      if (seq == "}}" && curly_depth_ > 0) continue;  // closes an object literal instead
      if (!StartsWith(seq)) continue;
      Push(type, std::string(seq));
      if (type == TokenType::kOpenExpression) curly_depth_ = 0;
      if (type == TokenType::kOpenCurlyBracket) ++curly_depth_;
      if (type == TokenType::kCloseCurlyBracket) --curly_depth_;
      pos_ += seq.size();
      return true;
    }
    if (c == '\'' || c == '"') {
      ++pos_;
      auto str = ConsumeString(c);
      if (!str.ok()) return str.status();
      Push(TokenType::kStringLiteral, *std::move(str));
      ++pos_;
      return true;
    }
    if (IsDigit(c)) {
      const bool after_dot = !tokens_.empty() && Last() == TokenType::kDot;
      auto num = ConsumeNumber(/*allow_fraction=*/!after_dot);
      if (!num.ok()) return num.status();
      Push(TokenType::kNumericLiteral, *std::move(num));
      return true;
    }
    if (IsWordChar(c)) {
      const size_t start = pos_;
      while (IsWordChar(At(pos_))) {
        ++pos_;
        if (pos_ >= src_.size()) return Error("unexpected end of template");
      }
      Push(TokenType::kIdentifier, src_.substr(start, pos_ - start));
      return true;
    }
    return false;
  }

  std::string src_;
  size_t pos_ = 0;
  int curly_depth_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

std::string PreprocessTemplate(std::string_view source) {
  if (source.ends_with('\n')) source.remove_suffix(1);
  return RemoveGenerationTags(TrimBlocks(LstripBlocks(source)));
}

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source) {
  return Lexer(PreprocessTemplate(source)).Run();
}

}  // namespace specd::chat
