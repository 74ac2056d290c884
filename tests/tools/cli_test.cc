// The `specd` binary as a user runs it: commands, flags, exit codes and messages.
#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace specd {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::ScopedTempDir;

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `specd args`; `output` gets stdout, and stderr too unless `stdout_only`.
RunResult RunSpecd(const std::string& args, bool stdout_only = false) {
  const char* build = std::getenv("SPECD_BUILD_DIR");
  const std::string bin = std::string(build != nullptr ? build : ".") + "/tools/specd";
  const std::string cmd = bin + " " + args + (stdout_only ? " 2>/dev/null" : " 2>&1");
  RunResult r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(CliTest, HelpListsEveryCommand) {
  const RunResult r = RunSpecd("--help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* cmd :
       {"chat", "convert", "detokenize", "generate", "serve", "synth", "tokenize"}) {
    EXPECT_THAT(r.output, HasSubstr(cmd));
  }
  EXPECT_EQ(RunSpecd("").exit_code, 2);
  const RunResult unknown = RunSpecd("frobnicate");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.output, HasSubstr("unknown command 'frobnicate'"));
}

TEST(CliTest, BadFlagsAreUsageErrors) {
  RunResult r = RunSpecd("generate --model /nonexistent --bogus 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("unknown flag --bogus"));
  r = RunSpecd("generate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("give exactly one of --server and --model"));
  r = RunSpecd("generate --server --prompt hi");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--server needs a value"));
  r = RunSpecd("generate --model /nonexistent --prompt-ids 1 --max-tokens many");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--max-tokens must be an integer"));
  r = RunSpecd("chat --max-tokens 5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--server is required"));
  r = RunSpecd("chat --server 127.0.0.1:1 --temperature warm");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--temperature must be a number"));
  r = RunSpecd("chat --server 127.0.0.1:1 --timeout 4 < /dev/null");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("cannot reach 127.0.0.1:1 within 4 s"));
  r = RunSpecd("generate --server 127.0.0.1:1 --timeout 4 --prompt zqxv");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("waiting for 127.0.0.1:1 to accept connections"));
  EXPECT_THAT(r.output, HasSubstr("cannot reach 127.0.0.1:1 within 4 s"));
  EXPECT_THAT(r.output, Not(HasSubstr("zqxv"))) << "the prompt is echoed only once connected";
  r = RunSpecd("synth --shape gigantic --out /tmp/x");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("unknown shape preset 'gigantic'"));
}

TEST(CliTest, MissingModelIsAClearError) {
  const RunResult r = RunSpecd("generate --model /nonexistent/model --prompt-ids 1,2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("/nonexistent/model"));
}

TEST(CliTest, SynthThenGenerate) {
  ScopedTempDir tmp;
  const std::string target = (tmp.path() / "target").string();
  const std::string draft = (tmp.path() / "draft").string();
  RunResult r = RunSpecd("synth --shape tiny --out " + target);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = RunSpecd("synth --early-exit-of " + target + " --layers 2 --out " + draft);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = RunSpecd("generate --model " + target + " --prompt 'the cat' --max-tokens 12 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("12 generated"));
  r = RunSpecd("generate --model " + draft +
               " --prompt-ids 1,40,41 --max-tokens 5 --temperature 0.8 --top-p 0.9 --seed 3 "
               "--ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("5 generated"));
  r = RunSpecd("generate --model " + target + " --prompt-ids 1 --temperature -1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("temperature"));
}

TEST(CliTest, SynthTakesALongerContext) {
  ScopedTempDir tmp;
  const std::string dir = (tmp.path() / "long").string();
  RunResult r = RunSpecd("synth --shape tiny --max-seq-len 4096 --out " + dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f(tmp.path() / "long" / "config.json");
  const nlohmann::json config = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(config.is_discarded());
  EXPECT_EQ(config["max_position_embeddings"].get<int64_t>(), 4096);
  // A prompt longer than the preset's context generates.
  std::string ids = "1";
  for (int i = 0; i < 1500; ++i) ids += "," + std::to_string(3 + i % 200);
  r = RunSpecd("generate --model " + dir + " --prompt-ids " + ids + " --max-tokens 3 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("3 generated"));
  r = RunSpecd("synth --shape tiny --max-seq-len 0 --out " + dir);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--max-seq-len must be in [1, 16777216], got 0"));
}

TEST(CliTest, ConvertedStories260KTellsTheGoldenStory) {
  SPECD_REQUIRE_SHARED_DIR(shared);
  ScopedTempDir tmp;
  const std::filesystem::path src = shared / "models/stories260K";
  const std::string out = (tmp.path() / "stories260K").string();
  RunResult r = RunSpecd("convert llama2c --checkpoint " + (src / "stories260K.bin").string() +
                         " --tokenizer " + (src / "tok512.bin").string() + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f(src / "golden-greedy.json");
  const nlohmann::json golden = nlohmann::json::parse(f);
  // Every golden prompt, the empty one included: the CLI prints the prompt and then exactly the
  // text the independent implementation printed (the served path is held to the same text in
  // coordinator_e2e_test), so "The little cat was" keeps the space before "very".
  for (const auto& c : golden["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    std::string expected = c["text"].get<std::string>();
    expected.pop_back();  // run.c's own final newline
    // Only stdout: the statistics line goes to stderr.
    r = RunSpecd("generate --model " + out + " --prompt '" + prompt +
                     "' --max-tokens 60 --ignore-eos --backend cpu",
                 /*stdout_only=*/true);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string text = r.output.substr(0, r.output.size() - 1);  // the final newline
    ASSERT_GT(text.size(), prompt.size() + 100) << text;
    EXPECT_EQ(expected.substr(0, text.size()), text) << "prompt '" << prompt << "'";
    if (prompt.empty()) continue;
    // The generation's text, tokenized as a continuation (a predicted output's encoding), is
    // run.c's generated ids exactly: no dummy-prefix piece at its start.
    r = RunSpecd("tokenize --model " + out + " --text '" + prompt + "'", /*stdout_only=*/true);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::istringstream prompt_line(r.output);
    size_t prompt_ids = 0;
    for (int32_t id; prompt_line >> id;) ++prompt_ids;
    const std::filesystem::path rest = tmp.path() / "rest.txt";
    std::ofstream(rest, std::ios::binary) << expected.substr(prompt.size());
    r = RunSpecd("tokenize --model " + out + " --continuation --format json < " + rest.string(),
                 /*stdout_only=*/true);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<int32_t> ids = c["token_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(
        nlohmann::json::parse(r.output).get<std::vector<int32_t>>(),
        std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(prompt_ids), ids.end()))
        << "prompt '" << prompt << "'";
  }
}

}  // namespace
}  // namespace specd
