#include "common/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/string_util.h"
#include "common/tokenizer/utf8.h"

namespace specd::tokenizer {
namespace {

struct CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* context) const { pcre2_match_context_free(context); }
};
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* stack) const { pcre2_jit_stack_free(stack); }
};

std::string Pcre2ErrorMessage(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) {
    return absl::StrCat("PCRE2 error ", code);
  }
  return std::string(reinterpret_cast<const char*>(buffer));
}

// One JIT stack per thread: the default 32 KiB machine stack is too small for long runs of
// whitespace against `\s+(?!\S)`, and a per-call stack would cost an mmap per Encode.
pcre2_match_context* ThreadMatchContext() {
  struct PerThread {
    std::unique_ptr<pcre2_jit_stack, JitStackDeleter> stack;
    std::unique_ptr<pcre2_match_context, MatchContextDeleter> context;
  };
  thread_local PerThread per_thread = [] {
    PerThread p;
    p.stack.reset(pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr));
    p.context.reset(pcre2_match_context_create(nullptr));
    if (p.stack != nullptr && p.context != nullptr) {
      pcre2_jit_stack_assign(p.context.get(), nullptr, p.stack.get());
    }
    return p;
  }();
  return per_thread.context.get();
}

}  // namespace

struct Regex::Impl {
  std::unique_ptr<pcre2_code, CodeDeleter> code;
};

std::string TranslateWhitespaceClasses(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '\\' || i + 1 == pattern.size()) {
      out.push_back(pattern[i]);
      continue;
    }
    const char next = pattern[i + 1];
    if (next == 's') {
      out.append("\\p{White_Space}");
    } else if (next == 'S') {
      out.append("\\P{White_Space}");
    } else {
      // Any other escape (including "\\\\") is copied whole so its second character is never
      // read as the start of another escape.
      out.push_back('\\');
      out.push_back(next);
    }
    ++i;
  }
  return out;
}

Regex::Regex(std::string pattern, std::unique_ptr<Impl> impl)
    : pattern_(std::move(pattern)), impl_(std::move(impl)) {}

Regex::~Regex() = default;

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern,
                                                      std::string_view what) {
  if (const absl::Status s = ValidateUtf8(pattern, absl::StrCat(ToAbsl(what), ": regex pattern"));
      !s.ok()) {
    return s;
  }
  const std::string translated = TranslateWhitespaceClasses(pattern);
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  std::unique_ptr<pcre2_code, CodeDeleter> code(
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr));
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(ToAbsl(what), ": cannot compile regex pattern '",
                                                   ToAbsl(pattern),
                                                   "': ", Pcre2ErrorMessage(error_code)));
  }
  // JIT is an optimisation: where it is unavailable pcre2_match interprets the same pattern.
  pcre2_jit_compile(code.get(), PCRE2_JIT_COMPLETE);
  auto impl = std::make_unique<Impl>();
  impl->code = std::move(code);
  return std::unique_ptr<Regex>(new Regex(std::string(pattern), std::move(impl)));
}

absl::Status Regex::FindAll(std::string_view text,
                            std::vector<std::pair<size_t, size_t>>* matches) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(
      pcre2_match_data_create_from_pattern(impl_->code.get(), nullptr));
  if (data == nullptr) return absl::ResourceExhaustedError("cannot allocate PCRE2 match data");
  pcre2_match_context* context = ThreadMatchContext();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t search_from = 0;
  bool have_last_end = false;
  size_t last_end = 0;
  while (search_from <= text.size()) {
    int rc = pcre2_match(impl_->code.get(), subject, text.size(), search_from, PCRE2_NO_UTF_CHECK,
                         data.get(), context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // Pathological input: retry this search with the interpreter, which uses the heap.
      rc = pcre2_match(impl_->code.get(), subject, text.size(), search_from,
                       PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, data.get(), context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::ResourceExhaustedError(absl::StrCat("regex '", pattern_, "' failed at byte ",
                                                       search_from, ": ", Pcre2ErrorMessage(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (begin == end && have_last_end && last_end == end) {
      // Oniguruma's iterator steps one character past an empty match that touches the previous
      // match, so the same position is never reported twice.
      if (search_from >= text.size()) break;
      search_from += std::max<size_t>(1, ValidUtf8SequenceLength(text, search_from));
      continue;
    }
    matches->emplace_back(begin, end);
    have_last_end = true;
    last_end = end;
    search_from = end;
    if (begin == end && end >= text.size()) break;
  }
  return absl::OkStatus();
}

}  // namespace specd::tokenizer
