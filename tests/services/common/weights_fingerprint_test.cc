// The weights fingerprint a target worker reports in Info (weights_fingerprint.h): it follows the
// tensors, not the files they are stored in, and equals an independent Python implementation of
// its documented rule (weights_fingerprint_reference.py).
#include "services/common/weights_fingerprint.h"

#include <array>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "common/model/checkpoint.h"
#include "common/synth/synth.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace specd {
namespace {

class WeightsFingerprintTest : public ::testing::Test {
 protected:
  // The tiny shape has tensors on both sides of the 64 KiB whole-tensor limit (the 128 KiB
  // embedding is sampled, the 44 KiB MLP matrices are hashed whole).
  static SynthSpec Tiny() {
    SynthSpec spec;
    absl::StatusOr<ModelConfig> c = ShapePreset("tiny");
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) spec.config = *c;
    return spec;
  }

  std::string Write(const SynthSpec& spec) {
    const std::filesystem::path dir = tmp_.path() / std::to_string(written_++);
    const absl::Status st = WriteSyntheticModel(spec, dir);
    EXPECT_TRUE(st.ok()) << st;
    return dir.string();
  }

  static std::string Fingerprint(const std::string& dir) {
    absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
    EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
    return checkpoint.ok() ? WeightsFingerprint(**checkpoint) : std::string();
  }

  static std::string PythonFingerprint(const std::string& dir) {
    const std::string cmd =
        testing::Python() + " " +
        (testing::SourceDir() / "tests/services/common/weights_fingerprint_reference.py").string() +
        " " + dir;
    std::string out;
    FILE* pipe = popen(cmd.c_str(), "r");
    EXPECT_NE(pipe, nullptr) << cmd;
    if (pipe == nullptr) return out;
    std::array<char, 256> buf{};
    while (fgets(buf.data(), buf.size(), pipe) != nullptr) out += buf.data();
    EXPECT_EQ(pclose(pipe), 0) << cmd;
    return std::string(absl::StripAsciiWhitespace(out));
  }

  testing::ScopedTempDir tmp_;
  int written_ = 0;
};

TEST_F(WeightsFingerprintTest, EqualsThePythonReferenceForOneFileAndForShards) {
  SynthSpec spec = Tiny();
  const std::string single = Write(spec);
  spec.num_shards = 3;
  const std::string sharded = Write(spec);
  const std::string fingerprint = Fingerprint(single);
  EXPECT_EQ(fingerprint.size(), 64u);
  EXPECT_EQ(fingerprint, PythonFingerprint(single));
  EXPECT_EQ(Fingerprint(sharded), PythonFingerprint(sharded));
  // The same tensors, however the files split them.
  EXPECT_EQ(Fingerprint(sharded), fingerprint);
}

TEST_F(WeightsFingerprintTest, OtherWeightsOfTheSameShapeAndConfigChangeIt) {
  const SynthSpec base = Tiny();
  const std::string reference = Fingerprint(Write(base));
  EXPECT_EQ(Fingerprint(Write(base)), reference);  // deterministic
  SynthSpec reseeded = base;                       // every tensor differs
  reseeded.seed = base.seed + 1;
  SynthSpec rescaled = base;  // only o_proj and down_proj differ
  rescaled.residual_scale = base.residual_scale * 1.01;
  SynthSpec bf16 = base;  // the same numbers, rounded and stored as bf16
  bf16.dtype = kernels::DType::kBF16;
  for (const SynthSpec* other : {&reseeded, &rescaled, &bf16}) {
    EXPECT_NE(Fingerprint(Write(*other)), reference);
  }
}

}  // namespace
}  // namespace specd
