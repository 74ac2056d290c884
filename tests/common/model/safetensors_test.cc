// ParseSafetensorsHeader on hand-made byte strings (every rejection the format requires) and
// SafetensorsWriter checked by an independent Python reader (st_read.py).
#include "common/model/safetensors.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/model/safetensors_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model/model_test_util.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kFile[] = "dir/weights.safetensors";

std::string LengthPrefix(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out;
}

// A file with `header` as its JSON text followed by `data_bytes` zero bytes.
std::string MakeFile(const std::string& header, size_t data_bytes) {
  return LengthPrefix(header.size()) + header + std::string(data_bytes, '\0');
}

// Expects `bytes` to be rejected with `code` and a message naming the file and each of `parts`.
void ExpectRejected(const std::string& bytes, absl::StatusCode code,
                    const std::vector<std::string>& parts) {
  const absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(bytes, kFile);
  ASSERT_FALSE(header.ok()) << "accepted: " << bytes.substr(8);
  EXPECT_EQ(header.status().code(), code) << header.status();
  EXPECT_THAT(std::string(header.status().message()), StartsWith(kFile));
  for (const std::string& part : parts) {
    EXPECT_THAT(std::string(header.status().message()), HasSubstr(part));
  }
}

TEST(SafetensorsDTypeTest, SizesMatchTheFormat) {
  // Element sizes from the safetensors specification's dtype list.
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"BOOL", 1}, {"U8", 1},   {"I8", 1},  {"I16", 2},     {"U16", 2},
      {"F16", 2},  {"BF16", 2}, {"I32", 4}, {"U32", 4},     {"F32", 4},
      {"F64", 8},  {"I64", 8},  {"U64", 8}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (const auto& [name, size] : expected) {
    const std::optional<SafetensorsDType> dtype = SafetensorsDTypeFromName(name);
    ASSERT_TRUE(dtype.has_value()) << name;
    EXPECT_EQ(SafetensorsDTypeSize(*dtype), size) << name;
    EXPECT_EQ(SafetensorsDTypeName(*dtype), name);
  }
  EXPECT_FALSE(SafetensorsDTypeFromName("F128").has_value());
  EXPECT_FALSE(SafetensorsDTypeFromName("f32").has_value());
  EXPECT_EQ(ToKernelDType(SafetensorsDType::kBF16), kernels::DType::kBF16);
  EXPECT_EQ(ToKernelDType(SafetensorsDType::kF16), kernels::DType::kF16);
  EXPECT_EQ(ToKernelDType(SafetensorsDType::kF32), kernels::DType::kF32);
  EXPECT_FALSE(ToKernelDType(SafetensorsDType::kF64).has_value());
}

TEST(ParseSafetensorsHeaderTest, ParsesTensorsInDataOrder) {
  // "b" comes first in the data although the JSON lists "a" first.
  const std::string header = R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]},)"
                             R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},)"
                             R"("__metadata__":{"format":"pt"}})";
  const std::string bytes = MakeFile(header + "   ", 32);
  const absl::StatusOr<SafetensorsHeader> parsed = ParseSafetensorsHeader(bytes, kFile);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->tensors.size(), 2u);
  EXPECT_EQ(parsed->tensors[0].name, "b");
  EXPECT_EQ(parsed->tensors[1].name, "a");
  EXPECT_EQ(parsed->data_start, 8 + header.size() + 3);
  const SafetensorsTensor* a = parsed->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, SafetensorsDType::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->numel, 6);
  EXPECT_EQ(a->data_begin, 8u);
  EXPECT_EQ(a->data_end, 32u);
  EXPECT_EQ(parsed->TensorBytes(bytes, *a).size(), 24u);
  EXPECT_EQ(parsed->TensorBytes(bytes, *a).data(), bytes.data() + parsed->data_start + 8);
  EXPECT_EQ(parsed->Find("c"), nullptr);
  EXPECT_EQ(parsed->metadata.at("format"), "pt");
}

TEST(ParseSafetensorsHeaderTest, AcceptsEmptyScalarAndZeroSizedTensors) {
  const absl::StatusOr<SafetensorsHeader> empty = ParseSafetensorsHeader(MakeFile("{}", 0), kFile);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->tensors.empty());

  const std::string header = R"({"scalar":{"dtype":"F64","shape":[],"data_offsets":[0,8]},)"
                             R"("none":{"dtype":"F32","shape":[0,5],"data_offsets":[8,8]},)"
                             R"("end":{"dtype":"U8","shape":[0],"data_offsets":[8,8]},)"
                             R"("__metadata__":null})";
  const absl::StatusOr<SafetensorsHeader> parsed =
      ParseSafetensorsHeader(MakeFile(header, 8), kFile);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->tensors.size(), 3u);
  EXPECT_EQ(parsed->Find("scalar")->numel, 1);
  EXPECT_EQ(parsed->Find("none")->numel, 0);
}

TEST(ParseSafetensorsHeaderTest, RejectsTruncatedFiles) {
  ExpectRejected("", absl::StatusCode::kDataLoss, {"0 bytes", "8-byte"});
  ExpectRejected(std::string("\x10\0\0", 3), absl::StatusCode::kDataLoss, {"3 bytes"});
  // The header claims 100 bytes; the file holds 10.
  ExpectRejected(LengthPrefix(100) + "{}        ", absl::StatusCode::kDataLoss,
                 {"header length 100", "truncated"});
  // A tensor whose data runs past the end of the file.
  ExpectRejected(MakeFile(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12),
                 absl::StatusCode::kDataLoss, {"\"w\"", "[0,16]", "12 bytes"});
}

TEST(ParseSafetensorsHeaderTest, RejectsAbsurdHeaderLength) {
  ExpectRejected(LengthPrefix(uint64_t{1} << 63) + "{}", absl::StatusCode::kInvalidArgument,
                 {"header length 9223372036854775808", "100000000"});
  ExpectRejected(LengthPrefix(100'000'001) + "{}", absl::StatusCode::kInvalidArgument, {"exceeds"});
}

TEST(ParseSafetensorsHeaderTest, RejectsMalformedJson) {
  ExpectRejected(MakeFile("{\"w\": ", 0), absl::StatusCode::kInvalidArgument, {"not valid JSON"});
  ExpectRejected(MakeFile("not json", 0), absl::StatusCode::kInvalidArgument, {"not valid JSON"});
  // Invalid UTF-8 in a tensor name.
  ExpectRejected(MakeFile("{\"\xff\xfe\":{}}", 0), absl::StatusCode::kInvalidArgument,
                 {"not valid JSON"});
  ExpectRejected(MakeFile("[1, 2]", 0), absl::StatusCode::kInvalidArgument,
                 {"must be a JSON object", "array"});
  ExpectRejected(MakeFile(std::string(1000, '[') + std::string(1000, ']'), 0),
                 absl::StatusCode::kInvalidArgument, {"nests JSON 1000 levels"});
}

TEST(ParseSafetensorsHeaderTest, RejectsBadEntries) {
  const auto k = absl::StatusCode::kInvalidArgument;
  ExpectRejected(MakeFile(R"({"w":3})", 0), k, {"\"w\"", "must be an object"});
  ExpectRejected(MakeFile(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4), k,
                 {"\"w\"", "missing \"dtype\""});
  ExpectRejected(MakeFile(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4), k,
                 {"\"w\"", "missing \"shape\""});
  ExpectRejected(MakeFile(R"({"w":{"dtype":"F32","shape":[1]}})", 4), k,
                 {"\"w\"", "missing \"data_offsets\""});
  ExpectRejected(MakeFile(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4), k,
                 {"\"w\"", "\"dtype\" must be a string"});
  ExpectRejected(MakeFile(R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,4]}})", 4), k,
                 {"\"w\"", "unknown dtype \"F128\"", "BF16"});
  ExpectRejected(MakeFile(R"({"w":{"dtype":"F32","shape":5,"data_offsets":[0,4]}})", 4), k,
                 {"\"w\"", "\"shape\" must be an array"});
}

TEST(ParseSafetensorsHeaderTest, RejectsBadShapes) {
  const auto k = absl::StatusCode::kInvalidArgument;
  ExpectRejected(MakeFile(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), k,
                 {"\"w\"", "non-negative integers", "-1"});
  ExpectRejected(MakeFile(R"({"w":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", 4), k,
                 {"\"w\"", "non-negative integers"});
  ExpectRejected(MakeFile(R"({"w":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", 4), k,
                 {"\"w\"", "non-negative integers"});
  ExpectRejected(MakeFile(R"({"w":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}})", 4), k,
                 {"\"w\"", "non-negative integers"});
  ExpectRejected(
      MakeFile(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,4],"data_offsets":[0,4]}})", 4),
      k, {"\"w\"", "more elements than fit in 64 bits"});
  // 2^61 elements fit; 2^61 * 8 bytes does not.
  ExpectRejected(
      MakeFile(R"({"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,4]}})", 4), k,
      {"\"w\"", "more bytes than fit in 64 bits"});
  ExpectRejected(
      MakeFile(R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})", 4),
      k, {"\"w\"", "non-negative integers"});
}

TEST(ParseSafetensorsHeaderTest, RejectsLyingOffsets) {
  const auto k = absl::StatusCode::kInvalidArgument;
  ExpectRejected(MakeFile(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4), k,
                 {"\"w\"", "span 4 bytes", "needs 8"});
  ExpectRejected(MakeFile(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4), k,
                 {"\"w\"", "end before they begin"});
  ExpectRejected(MakeFile(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4), k,
                 {"\"w\"", "[begin, end]"});
  ExpectRejected(MakeFile(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 8), k,
                 {"\"w\"", "[begin, end]"});
  ExpectRejected(MakeFile(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4), k,
                 {"\"w\"", "[begin, end]"});
  ExpectRejected(MakeFile(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":"0-4"}})", 4), k,
                 {"\"w\"", "[begin, end]"});
}

TEST(ParseSafetensorsHeaderTest, RejectsDataSectionNotCoveredExactly) {
  const auto k = absl::StatusCode::kInvalidArgument;
  // Overlap: b starts inside a.
  ExpectRejected(MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                          12),
                 k, {"\"b\"", "overlaps tensor \"a\""});
  // Two tensors on the same bytes.
  ExpectRejected(MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                          8),
                 k, {"overlaps"});
  // Gap: bytes [8, 12) belong to no tensor.
  ExpectRejected(MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                          20),
                 k, {"bytes [8, 12)", "\"b\"", "contiguous"});
  // Data before the first tensor.
  ExpectRejected(MakeFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), k,
                 {"bytes [0, 4)", "\"a\""});
  // Trailing bytes.
  ExpectRejected(MakeFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 12), k,
                 {"12 bytes", "cover 4", "trailing"});
  ExpectRejected(MakeFile("{}", 1), k, {"1 bytes", "cover 0"});
}

TEST(ParseSafetensorsHeaderTest, RejectsDuplicates) {
  const auto k = absl::StatusCode::kInvalidArgument;
  ExpectRejected(MakeFile(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                          8),
                 k, {"tensor name \"w\" appears twice"});
  ExpectRejected(
      MakeFile(R"({"w":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}})", 4), k,
      {"key \"dtype\" appears twice", "\"w\""});
}

TEST(ParseSafetensorsHeaderTest, RejectsBadMetadata) {
  const auto k = absl::StatusCode::kInvalidArgument;
  ExpectRejected(MakeFile(R"({"__metadata__":[1]})", 0), k, {"__metadata__", "object"});
  ExpectRejected(MakeFile(R"({"__metadata__":{"step":3}})", 0), k,
                 {"\"__metadata__\".\"step\" must be a string"});
}

TEST(WeightDTypeTest, NamesTensorAndDtype) {
  SafetensorsTensor t;
  t.name = "model.layers.0.mlp.up_proj.weight";
  t.dtype = SafetensorsDType::kI64;
  const absl::StatusOr<kernels::DType> dtype = WeightDType(t, "shard.safetensors");
  ASSERT_FALSE(dtype.ok());
  EXPECT_EQ(dtype.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dtype.status().message(),
            "shard.safetensors: tensor model.layers.0.mlp.up_proj.weight has dtype I64; specd "
            "loads F32, F16 or BF16 weights");
  t.dtype = SafetensorsDType::kBF16;
  EXPECT_EQ(*WeightDType(t, "x"), kernels::DType::kBF16);
}

std::string Floats(const std::vector<float>& v) {
  std::string out(v.size() * sizeof(float), '\0');
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::string U16s(const std::vector<uint16_t>& v) {
  std::string out(v.size() * sizeof(uint16_t), '\0');
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

TEST(SafetensorsWriterTest, PythonReaderReadsWhatWeWrote) {
  testing::ScopedTempDir dir;
  SafetensorsWriter writer;
  writer.SetMetadata("format", "pt");
  // Added in a non-alphabetical order: the file must keep it.
  ASSERT_TRUE(
      writer.Add("zeta", kernels::DType::kF32, {2, 2}, Floats({1.5f, -2.0f, 0.25f, 1e-3f})).ok());
  ASSERT_TRUE(
      writer.Add("alpha", SafetensorsDType::kI64, {1}, std::string("\x07\0\0\0\0\0\0\0", 8)).ok());
  // F16 1.0 = 0x3c00, -2.0 = 0xc000; BF16 3.0 = 0x4040.
  ASSERT_TRUE(writer.Add("half", kernels::DType::kF16, {2}, U16s({0x3c00, 0xc000})).ok());
  ASSERT_TRUE(writer.Add("brain", kernels::DType::kBF16, {1}, U16s({0x4040})).ok());
  ASSERT_TRUE(writer.Add("empty", kernels::DType::kF32, {0, 3}, "").ok());
  const auto path = dir.path() / "out.safetensors";
  ASSERT_TRUE(writer.WriteFile(path).ok());

  const nlohmann::json read =
      nlohmann::json::parse(testing::RunPython("st_read.py", {path.string()}), nullptr, false);
  ASSERT_FALSE(read.is_discarded());
  EXPECT_EQ(read["order"], nlohmann::json({"zeta", "alpha", "half", "brain", "empty"}));
  EXPECT_EQ(read["metadata"], nlohmann::json({{"format", "pt"}}));
  EXPECT_EQ(read["header_bytes"].get<int>() % 8, 0);
  const nlohmann::json& t = read["tensors"];
  EXPECT_EQ(t["zeta"]["dtype"], "F32");
  EXPECT_EQ(t["zeta"]["shape"], nlohmann::json({2, 2}));
  EXPECT_EQ(t["zeta"]["values"], nlohmann::json({1.5, -2.0, 0.25, static_cast<double>(1e-3f)}));
  EXPECT_EQ(t["alpha"]["dtype"], "I64");
  EXPECT_EQ(t["alpha"]["hex"], "0700000000000000");
  EXPECT_EQ(t["half"]["values"], nlohmann::json({1.0, -2.0}));
  EXPECT_EQ(t["brain"]["values"], nlohmann::json({3.0}));
  EXPECT_EQ(t["empty"]["shape"], nlohmann::json({0, 3}));
  EXPECT_EQ(t["empty"]["data_offsets"][0], t["empty"]["data_offsets"][1]);

  // And our own parser agrees.
  const std::string bytes = testing::ReadFileBytes(path);
  const absl::StatusOr<SafetensorsHeader> parsed = ParseSafetensorsHeader(bytes, "out");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->data_start % 8, 0u);
  EXPECT_EQ(parsed->TensorBytes(bytes, *parsed->Find("zeta")), Floats({1.5f, -2.0f, 0.25f, 1e-3f}));
}

TEST(SafetensorsWriterTest, WritesNoMetadataWhenUnset) {
  SafetensorsWriter writer;
  const absl::StatusOr<std::string> bytes = writer.Serialize();
  ASSERT_TRUE(bytes.ok());
  // "{}" padded to 8 bytes with spaces.
  EXPECT_EQ(*bytes, LengthPrefix(8) + "{}      ");
}

TEST(SafetensorsWriterTest, RejectsBadTensors) {
  SafetensorsWriter writer;
  ASSERT_TRUE(writer.Add("w", kernels::DType::kF32, {1}, Floats({1.0f})).ok());
  absl::Status s = writer.Add("w", kernels::DType::kF32, {1}, Floats({1.0f}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("w was already added"));

  s = writer.Add("x", kernels::DType::kF32, {3}, Floats({1.0f}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("x has 4 bytes but shape [3] of F32 needs 12"));

  s = writer.Add("y", kernels::DType::kF32, {-1}, "");
  EXPECT_THAT(std::string(s.message()), HasSubstr("y has an invalid shape [-1]"));

  s = writer.Add("__metadata__", kernels::DType::kF32, {1}, Floats({1.0f}));
  EXPECT_THAT(std::string(s.message()), HasSubstr("reserved"));

  s = writer.Add("bad\xff", kernels::DType::kF32, {1}, Floats({1.0f}));
  EXPECT_THAT(std::string(s.message()), HasSubstr("not valid UTF-8"));

  ASSERT_TRUE(writer.Add("byte", SafetensorsDType::kU8, {1}, "\x01").ok());
  s = writer.Add("misaligned", kernels::DType::kF16, {1}, U16s({0}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("misaligned (F16) would start at byte 5"));
}

TEST(SafetensorsWriterTest, WriteFileNamesThePathOnFailure) {
  SafetensorsWriter writer;
  const absl::Status s = writer.WriteFile("/nonexistent-dir/sub/model.safetensors");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("/nonexistent-dir/sub/model.safetensors"));
}

}  // namespace
}  // namespace specd
