// JavaScript string and number semantics. Expected values are what ECMAScript specifies (and
// node prints) for these inputs.
#include "common/chat/js_text.h"

#include <cmath>
#include <string>

#include "gtest/gtest.h"

namespace specd::chat {
namespace {

TEST(JsNumberToString, FollowsNumberToString) {
  EXPECT_EQ(JsNumberToString(0.0), "0");
  EXPECT_EQ(JsNumberToString(-0.0), "0");
  EXPECT_EQ(JsNumberToString(1.0), "1");
  EXPECT_EQ(JsNumberToString(-2.5), "-2.5");
  EXPECT_EQ(JsNumberToString(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(JsNumberToString(123456789012345680000.0), "123456789012345680000");
  EXPECT_EQ(JsNumberToString(1e21), "1e+21");
  EXPECT_EQ(JsNumberToString(1.5e300), "1.5e+300");
  EXPECT_EQ(JsNumberToString(0.000001), "0.000001");
  EXPECT_EQ(JsNumberToString(1e-7), "1e-7");
  EXPECT_EQ(JsNumberToString(-1.25e-8), "-1.25e-8");
  EXPECT_EQ(JsNumberToString(NAN), "NaN");
  EXPECT_EQ(JsNumberToString(-INFINITY), "-Infinity");
}

TEST(JsFloatDisplay, IntegralFloatsKeepOneDecimal) {
  EXPECT_EQ(JsFloatDisplay(1.0), "1.0");
  EXPECT_EQ(JsFloatDisplay(-0.0), "-0.0");
  EXPECT_EQ(JsFloatDisplay(2.5), "2.5");
  EXPECT_EQ(JsFloatDisplay(1e20), "100000000000000000000.0");
  EXPECT_EQ(JsFloatDisplay(1e21), "1e+21");
  EXPECT_EQ(JsFloatDisplay(INFINITY), "Infinity");
}

TEST(JsStringToNumber, FollowsStringToNumber) {
  EXPECT_EQ(JsStringToNumber(""), 0);
  EXPECT_EQ(JsStringToNumber("  \n"), 0);
  EXPECT_EQ(JsStringToNumber(" 12 "), 12);
  EXPECT_EQ(JsStringToNumber("0x10"), 16);
  EXPECT_EQ(JsStringToNumber("-1.5e2"), -150);
  EXPECT_EQ(JsStringToNumber(".5"), 0.5);
  EXPECT_EQ(JsStringToNumber("-Infinity"), -INFINITY);
  EXPECT_TRUE(std::isnan(JsStringToNumber("1a")));
  EXPECT_TRUE(std::isnan(JsStringToNumber("-0x10")));
  EXPECT_TRUE(std::isnan(JsStringToNumber("true")));
}

TEST(JsParse, ParseIntAndParseFloatReadAPrefix) {
  EXPECT_EQ(JsParseInt(" -42px"), -42);
  EXPECT_EQ(JsParseInt("4.9"), 4);
  EXPECT_FALSE(JsParseInt("px").has_value());
  EXPECT_EQ(JsParseFloat("4.7abc"), 4.7);
  EXPECT_EQ(JsParseFloat("1e"), 1);
  EXPECT_EQ(JsParseFloat("-.5"), -0.5);
  EXPECT_FALSE(JsParseFloat(".").has_value());
}

TEST(JsTrim, UsesTheJavaScriptWhitespaceSet) {
  EXPECT_EQ(JsTrim(" \t\n\v\f\r x \u00a0\u3000\ufeff\u2028\u2029\u202f"), "x");
  // NEL, ZERO WIDTH SPACE and the ASCII separators are not whitespace in JavaScript (Python's
  // str.strip would remove NEL and the separators).
  EXPECT_EQ(JsTrim("\u0085x\u0085"), "\u0085x\u0085");
  EXPECT_EQ(JsTrim("\u200bx"), "\u200bx");
  EXPECT_EQ(JsTrim("\x1cx\x1f"), "\x1cx\x1f");
  EXPECT_EQ(JsTrimStart("  a  "), "a  ");
  EXPECT_EQ(JsTrimEnd("  a  "), "  a");
  EXPECT_EQ(JsTrim("   "), "");
}

TEST(Utf16, LengthAndIndexCountCodeUnits) {
  EXPECT_EQ(Utf16Length("a\u00e9\u4e2d"), 3);
  EXPECT_EQ(Utf16Length("\U0001F600"), 2);
  EXPECT_EQ(Utf16At("h\u00e9llo", 1).value(), "\u00e9");
  EXPECT_EQ(Utf16At("abc", -1).value(), "c");
  EXPECT_FALSE(Utf16At("abc", 3).value().has_value());
  EXPECT_FALSE(Utf16At("a\U0001F600", 1).ok());        // half of a surrogate pair
  EXPECT_LT(CompareUtf16("\U0001F600", "\uffff"), 0);  // surrogates sort below U+E000..U+FFFF
  EXPECT_GT(CompareUtf16("b", "a"), 0);
}

TEST(JsCase, MapsAsciiAndRefusesOtherLetters) {
  EXPECT_EQ(JsToUpper("abc-\u4e2d-\U0001F600").value(), "ABC-\u4e2d-\U0001F600");
  EXPECT_EQ(JsToLower("ABC").value(), "abc");
  EXPECT_FALSE(JsToUpper("\u00e9").ok());
  EXPECT_FALSE(JsToLower("\u00b5").ok());
}

TEST(JsonQuote, EscapesAsJsonStringify) {
  EXPECT_EQ(JsonQuote("a\"b\\c\n\t\x01\x7f\u00e9", false),
            "\"a\\\"b\\\\c\\n\\t\\u0001\x7f\u00e9\"");
  EXPECT_EQ(JsonQuote("\x7f\u00e9\U0001F600", true), "\"\\u007f\\u00e9\\ud83d\\ude00\"");
}

}  // namespace
}  // namespace specd::chat
