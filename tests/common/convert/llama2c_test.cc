// The llama2.c importer rejects damaged checkpoints with a clear status and writes a loadable
// directory from a good one.
#include "common/convert/llama2c.h"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/model/weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using ::testing::HasSubstr;
using testing::ScopedTempDir;

// A tiny llama2.c checkpoint: dim 8, hidden 12, 1 layer, 2 heads, 1 kv head, vocab 16, seq 4.
std::string TinyCheckpoint(int32_t vocab_field = 16) {
  const int32_t header[7] = {8, 12, 1, 2, 1, vocab_field, 4};
  std::string bytes(reinterpret_cast<const char*>(header), sizeof header);
  const int64_t vocab = vocab_field < 0 ? -vocab_field : vocab_field;
  const int64_t floats = vocab * 8 + 8 + 8 * 8 + 2 * 4 * 8 + 8 * 8 + 8 + 3 * 12 * 8 + 8 +
                         4 * 4 /* freq_cis: seq_len * head_dim */ +
                         (vocab_field < 0 ? vocab * 8 : 0);
  for (int64_t i = 0; i < floats; ++i) {
    const float v = static_cast<float>((i % 17) - 8) / 16.0f;
    bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  return bytes;
}

std::filesystem::path Write(const std::filesystem::path& dir, const std::string& bytes) {
  const std::filesystem::path p = dir / "model.bin";
  std::ofstream(p, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return p;
}

absl::Status Convert(const std::filesystem::path& ckpt, const std::filesystem::path& out) {
  Llama2cConvertOptions o;
  o.checkpoint = ckpt;
  o.out_dir = out;
  return ConvertLlama2c(o);
}

TEST(Llama2cConvertTest, GoodCheckpointLoads) {
  for (const int32_t vocab_field : {16, -16}) {  // shared and untied classifier
    ScopedTempDir tmp;
    ASSERT_TRUE(Convert(Write(tmp.path(), TinyCheckpoint(vocab_field)), tmp.path() / "out").ok());
    absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModelWeights(tmp.path() / "out");
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ((*w)->config.num_kv_heads, 1);
    EXPECT_EQ((*w)->config.tie_word_embeddings, vocab_field > 0);
  }
}

TEST(Llama2cConvertTest, TruncatedFileNamesTheMissingTensor) {
  ScopedTempDir tmp;
  std::string bytes = TinyCheckpoint();
  bytes.resize(bytes.size() - 40);
  const absl::Status st = Convert(Write(tmp.path(), bytes), tmp.path() / "out");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("truncated: freq_cis"));
}

TEST(Llama2cConvertTest, TooShortForHeader) {
  ScopedTempDir tmp;
  const absl::Status st = Convert(Write(tmp.path(), "abc"), tmp.path() / "out");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("too short"));
}

TEST(Llama2cConvertTest, AbsurdOrInconsistentHeader) {
  ScopedTempDir tmp;
  std::string bytes = TinyCheckpoint();
  int32_t layers = 1 << 30;
  std::memcpy(bytes.data() + 8, &layers, 4);
  absl::Status st = Convert(Write(tmp.path(), bytes), tmp.path() / "out");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("n_layers"));

  bytes = TinyCheckpoint();
  int32_t heads = 3;  // does not divide dim 8
  std::memcpy(bytes.data() + 12, &heads, 4);
  st = Convert(Write(tmp.path(), bytes), tmp.path() / "out");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("inconsistent heads"));
}

TEST(Llama2cConvertTest, MissingFileIsNotFound) {
  ScopedTempDir tmp;
  EXPECT_EQ(Convert(tmp.path() / "nope.bin", tmp.path() / "out").code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace specd
