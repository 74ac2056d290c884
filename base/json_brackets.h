// JSON's bracket structure without parsing: how deep a text nests, or where a value ends, read
// before handing text to a recursive parser, whose depth hostile input would otherwise choose.
#ifndef SPECD_BASE_JSON_BRACKETS_H_
#define SPECD_BASE_JSON_BRACKETS_H_

#include <cstddef>
#include <string_view>

namespace specd {

// Walks `text` from `pos`, skipping the contents of strings, and after each bracket ('{', '[',
// '}' or ']') calls `on_bracket(index, depth)` with the depth it leaves (an opening bracket at
// depth 0 leaves 1). Stops early when `on_bracket` returns false.
template <typename OnBracket>
void WalkJsonBrackets(std::string_view text, size_t pos, OnBracket on_bracket) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = pos; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (!on_bracket(i, ++depth)) return;
    } else if (c == '}' || c == ']') {
      if (!on_bracket(i, --depth)) return;
    }
  }
}

}  // namespace specd

#endif  // SPECD_BASE_JSON_BRACKETS_H_
