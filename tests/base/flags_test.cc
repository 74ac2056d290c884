#include "base/flags.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::vector<FlagSpec> kSpecs = {
    {"listen", "address", "127.0.0.1:0"},
    {"threads", "threads", "2"},
    {"scale", "a number", ""},
    {"model", "model dir", "", false, /*required=*/true},
    {"verbose", "a switch", "", /*is_bool=*/true},
    {"caching", "on or off", "on"},
};

TEST(FlagsTest, ParsesBothValueFormsDefaultsAndBools) {
  absl::StatusOr<Flags> f =
      Flags::Parse({"--model", "m", "--threads=8", "--verbose", "--scale=0.5"}, kSpecs);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->Get("model"), "m");
  EXPECT_EQ(*f->GetInt("threads", 1, 16), 8);
  EXPECT_EQ(f->Get("listen"), "127.0.0.1:0");
  EXPECT_TRUE(f->GetBool("verbose"));
  EXPECT_DOUBLE_EQ(*f->GetDouble("scale", 0, 1), 0.5);
  EXPECT_TRUE(f->Has("listen"));
}

TEST(FlagsTest, UnsetFlagWithoutDefaultIsAbsent) {
  absl::StatusOr<Flags> f = Flags::Parse({"--model", "m"}, kSpecs);
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->Has("scale"));
  EXPECT_EQ(f->Get("scale"), "");
  EXPECT_FALSE(f->GetBool("verbose"));
  EXPECT_THAT(f->GetDouble("scale").status().message(), HasSubstr("--scale must be a number"));
}

TEST(FlagsTest, ErrorsNameTheFlag) {
  EXPECT_THAT(Flags::Parse({"--model", "m", "--nope", "1"}, kSpecs).status().message(),
              HasSubstr("unknown flag --nope"));
  EXPECT_THAT(Flags::Parse({"--threads", "2"}, kSpecs).status().message(),
              HasSubstr("--model is required"));
  EXPECT_THAT(Flags::Parse({"--model"}, kSpecs).status().message(),
              HasSubstr("--model needs a value"));
  // A forgotten value is an error, not a model named "--threads".
  EXPECT_THAT(Flags::Parse({"--model", "--threads", "2"}, kSpecs).status().message(),
              HasSubstr("--model needs a value"));
  EXPECT_THAT(Flags::Parse({"--model", "m", "--verbose=yes"}, kSpecs).status().message(),
              HasSubstr("--verbose takes true or false"));
  absl::StatusOr<Flags> f = Flags::Parse({"--model", "m", "--threads", "x"}, kSpecs);
  ASSERT_TRUE(f.ok());
  EXPECT_THAT(f->GetInt("threads").status().message(),
              HasSubstr("--threads must be an integer, got 'x'"));
  f = Flags::Parse({"--model", "m", "--threads", "99"}, kSpecs);
  EXPECT_THAT(f->GetInt("threads", 1, 16).status().message(),
              HasSubstr("--threads must be in [1, 16], got 99"));
  f = Flags::Parse({"--model", "m", "--scale", "nan"}, kSpecs);
  EXPECT_FALSE(f->GetDouble("scale").ok());
}

TEST(FlagsTest, OnOffSwitchesTakeOnlyOnOrOff) {
  absl::StatusOr<Flags> f = Flags::Parse({"--model", "m"}, kSpecs);
  ASSERT_TRUE(f.ok());
  absl::StatusOr<bool> on = f->GetOnOff("caching");
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(*on);
  f = Flags::Parse({"--model", "m", "--caching", "off"}, kSpecs);
  absl::StatusOr<bool> off = f->GetOnOff("caching");
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(*off);
  f = Flags::Parse({"--model", "m", "--caching=yes"}, kSpecs);
  EXPECT_THAT(f->GetOnOff("caching").status().message(),
              HasSubstr("--caching must be on or off, got 'yes'"));
}

TEST(FlagsTest, PositionalArgumentsOnlyWhenAllowed) {
  EXPECT_THAT(Flags::Parse({"--model", "m", "extra"}, kSpecs).status().message(),
              HasSubstr("unexpected argument 'extra'"));
  absl::StatusOr<Flags> f = Flags::Parse({"llama2c", "--model", "m", "x"}, kSpecs, true);
  ASSERT_TRUE(f.ok());
  EXPECT_THAT(f->positional(), ElementsAre("llama2c", "x"));
  // A value that starts with "--" is still possible with '='.
  f = Flags::Parse({"--model=--odd"}, kSpecs);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->Get("model"), "--odd");
}

TEST(FlagsTest, UsageListsEveryFlag) {
  const std::string usage = Flags::Usage(kSpecs);
  EXPECT_THAT(usage, HasSubstr("--listen VALUE"));
  EXPECT_THAT(usage, HasSubstr("(default: 127.0.0.1:0)"));
  EXPECT_THAT(usage, HasSubstr("--model VALUE\n      model dir (required)"));
  EXPECT_THAT(usage, HasSubstr("--verbose\n"));
}

}  // namespace
}  // namespace specd
