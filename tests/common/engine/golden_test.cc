// stories260K converted by `specd convert llama2c` reproduces llama2.c's greedy outputs
// (../shared/models/stories260K/golden-greedy.json) token for token.
#include <fstream>
#include <vector>

#include "common/convert/llama2c.h"
#include "common/engine/decode_loop.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/engine/engine_test_util.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::ScopedTempDir;

struct GoldenCase {
  std::string prompt;
  std::vector<int32_t> ids;
};

std::vector<GoldenCase> LoadCases(const std::filesystem::path& file) {
  std::ifstream f(file);
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  std::vector<GoldenCase> cases;
  if (j.is_discarded()) return cases;
  for (const auto& c : j["cases"]) {
    cases.push_back({c["prompt"].get<std::string>(), c["token_ids"].get<std::vector<int32_t>>()});
  }
  return cases;
}

// The prompt's length in tokens, found without a tokenizer: llama2.c forces prompt tokens and
// then appends argmaxes, so under teacher forcing every token after the prompt is the argmax of the
// previous position's logits, and the last prompt token is not (or is BOS).
size_t PromptLength(const std::vector<float>& logits, const std::vector<int32_t>& ids,
                    int64_t vocab) {
  size_t n = 1;
  for (size_t j = 1; j < ids.size(); ++j) {
    const float* row = logits.data() + (j - 1) * static_cast<size_t>(vocab);
    const int32_t argmax = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
    if (argmax != ids[j]) n = j + 1;
  }
  return n;
}

TEST(GoldenTest, Stories260KGreedyMatchesLlama2c) {
  SPECD_REQUIRE_SHARED_DIR(shared);
  const std::filesystem::path src = shared / "models/stories260K";
  ScopedTempDir tmp;
  Llama2cConvertOptions options;
  options.checkpoint = src / "stories260K.bin";
  options.tokenizer = src / "tok512.bin";
  options.out_dir = tmp.path();
  const absl::Status st = ConvertLlama2c(options);
  ASSERT_TRUE(st.ok()) << st;

  const std::vector<GoldenCase> cases = LoadCases(src / "golden-greedy.json");
  ASSERT_EQ(cases.size(), 5u);
  for (const int threads : {1, 2}) {
    auto engine = testing::MakeEngine(tmp.path(), threads, /*kv_tokens=*/1024);
    ASSERT_NE(engine, nullptr);
    const int64_t vocab = engine->config().vocab_size;
    for (size_t c = 0; c < cases.size(); ++c) {
      const std::vector<int32_t>& ids = cases[c].ids;
      ASSERT_EQ(ids.size(), 257u);
      const std::vector<int32_t> all(ids.begin(), ids.end() - 1);
      const std::vector<float> logits = testing::PrefillAll(*engine, 100 + c, all);
      ASSERT_TRUE(engine->Release(100 + c).ok());
      const size_t n = PromptLength(logits, ids, vocab);
      if (cases[c].prompt.empty()) {
        EXPECT_EQ(n, 1u) << "the empty prompt is BOS alone";
      }

      // The real check: autoregressive greedy decoding from the prompt alone.
      DecodeRequest req;
      req.prompt.assign(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n));
      req.sampling.temperature = 0.0f;
      req.max_new_tokens = static_cast<int64_t>(ids.size() - n);
      absl::StatusOr<DecodeResult> out = DecodePlain(*engine, c, req);
      ASSERT_TRUE(out.ok()) << out.status();
      const std::vector<int32_t> expected(ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end());
      EXPECT_EQ(out->tokens, expected)
          << "case " << c << " ('" << cases[c].prompt << "'), " << threads << " threads";
      EXPECT_EQ(engine->kv().used_blocks(), 0);
    }
    // A GPU back end (SPECD_TEST_BACKEND) has no host threads to vary.
    if (engine->backend().num_threads() == 0) break;
  }
}

}  // namespace
}  // namespace specd
