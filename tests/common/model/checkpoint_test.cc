// MappedFile and Checkpoint over files written by an independent Python writer (st_write.py):
// the bytes and shapes we return must be exactly what numpy wrote.
#include "common/model/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/model/mapped_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/model/model_test_util.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// Writes the files described by `spec` (st_write.py's "files" format) into `dir` and returns the
// manifest of what was written.
json WriteWithPython(const std::filesystem::path& dir, const json& spec) {
  const auto spec_path = dir / "spec.json";
  testing::WriteFileBytes(spec_path, spec.dump());
  testing::RunPython("st_write.py", {"files", spec_path.string(), dir.string()});
  std::filesystem::remove(spec_path);
  const json manifest = testing::ReadJson(dir / "manifest.json");
  std::filesystem::remove(dir / "manifest.json");
  return manifest;
}

json Tensor(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape) {
  json t = json::object();
  t["name"] = name;
  t["dtype"] = dtype;
  t["shape"] = shape;
  return t;
}

// An st_write.py spec: {"files": {file: [tensors]}} plus optional "index" and "metadata".
json Spec(const std::vector<std::pair<std::string, std::vector<json>>>& files,
          const std::map<std::string, std::string>& index = {},
          const std::map<std::string, std::string>& metadata = {}) {
  json spec = json::object();
  spec["files"] = json::object();
  for (const auto& [file, tensors] : files) spec["files"][file] = tensors;
  if (!index.empty()) spec["index"] = index;
  if (!metadata.empty()) spec["metadata"] = metadata;
  return spec;
}

TEST(MappedFileTest, MapsContents) {
  testing::ScopedTempDir dir;
  testing::WriteFileBytes(dir.path() / "f", std::string("ab\0cd", 5));
  const absl::StatusOr<std::unique_ptr<MappedFile>> f = MappedFile::Open(dir.path() / "f");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->bytes(), std::string_view("ab\0cd", 5));
  EXPECT_EQ((*f)->size(), 5u);
  EXPECT_EQ((*f)->path(), dir.path() / "f");
}

TEST(MappedFileTest, EmptyFileMapsToNoBytes) {
  testing::ScopedTempDir dir;
  testing::WriteFileBytes(dir.path() / "empty", "");
  const absl::StatusOr<std::unique_ptr<MappedFile>> f = MappedFile::Open(dir.path() / "empty");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE((*f)->bytes().empty());
}

TEST(MappedFileTest, ErrorsNameThePath) {
  testing::ScopedTempDir dir;
  absl::StatusOr<std::unique_ptr<MappedFile>> f = MappedFile::Open(dir.path() / "missing");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(f.status()), HasSubstr((dir.path() / "missing").string()));
  f = MappedFile::Open(dir.path());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(f.status()), HasSubstr("not a regular file"));
}

TEST(CheckpointTest, ReturnsExactlyWhatPythonWroteForEveryDtype) {
  testing::ScopedTempDir dir;
  // Widest first so every tensor is aligned, as the reference writer arranges.
  const json spec =
      Spec({{"model.safetensors",
             {Tensor("f64", "F64", {3}), Tensor("i64", "I64", {2, 1}), Tensor("u64", "U64", {1}),
              Tensor("f32", "F32", {4, 5}), Tensor("i32", "I32", {3}), Tensor("u32", "U32", {1}),
              Tensor("f16", "F16", {2, 3}), Tensor("bf16", "BF16", {7}), Tensor("i16", "I16", {1}),
              Tensor("u16", "U16", {2}), Tensor("u8", "U8", {3}), Tensor("i8", "I8", {2}),
              Tensor("bool", "BOOL", {}), Tensor("f8a", "F8_E4M3", {2}),
              Tensor("f8b", "F8_E5M2", {1, 1, 1}), Tensor("empty", "F32", {0})}}},
           {}, {{"format", "pt"}});
  const json manifest = WriteWithPython(dir.path(), spec);
  ASSERT_EQ(manifest.size(), 16u);

  const absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  std::vector<std::string> names;
  for (const auto& [name, t] : manifest.items()) names.push_back(name);
  const std::vector<std::string> listed = (*ckpt)->Names();
  EXPECT_THAT(listed, UnorderedElementsAreArray(names));
  EXPECT_TRUE(std::is_sorted(listed.begin(), listed.end()));
  for (const auto& [name, t] : manifest.items()) {
    SCOPED_TRACE(name);
    EXPECT_TRUE((*ckpt)->Has(name));
    const absl::StatusOr<RawTensorView> raw = (*ckpt)->GetRaw(name);
    ASSERT_TRUE(raw.ok()) << raw.status();
    EXPECT_EQ(raw->bytes, testing::HexToBytes(t["hex"].get<std::string>()));
    EXPECT_EQ(raw->shape, t["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(SafetensorsDTypeName(raw->dtype), t["dtype"].get<std::string>());
    EXPECT_EQ((*ckpt)->FileOf(name), (dir.path() / "model.safetensors").string());

    const absl::StatusOr<TensorView> view = (*ckpt)->Get(name);
    const std::string dtype = t["dtype"];
    if (dtype == "F32" || dtype == "F16" || dtype == "BF16") {
      ASSERT_TRUE(view.ok()) << view.status();
      EXPECT_EQ(kernels::DTypeName(view->dtype), dtype);
      EXPECT_EQ(view->shape, raw->shape);
      EXPECT_EQ(view->data, raw->bytes.data());
      const std::vector<double> values = t["values"];
      ASSERT_EQ(view->numel(), static_cast<int64_t>(values.size()));
      for (int64_t i = 0; i < view->numel(); ++i) {
        EXPECT_EQ(kernels::LoadAsF32(view->data, view->dtype, i), values[i]) << i;
      }
    } else {
      ASSERT_FALSE(view.ok());
      EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(Message(view.status()), HasSubstr("tensor " + name + " has dtype " + dtype +
                                                    "; specd loads F32, F16 or BF16 weights"));
    }
  }
  const absl::StatusOr<TensorView> missing = (*ckpt)->Get("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(missing.status()), HasSubstr("tensor nope not found in"));
  EXPECT_THAT(Message(missing.status()), HasSubstr("model.safetensors"));
  EXPECT_FALSE((*ckpt)->Has("nope"));
}

TEST(CheckpointTest, LoadsShardsThroughTheIndex) {
  testing::ScopedTempDir dir;
  const json spec = Spec(
      {{"model-00001-of-00002.safetensors", {Tensor("a", "F32", {2, 2}), Tensor("b", "BF16", {3})}},
       {"model-00002-of-00002.safetensors", {Tensor("c", "F16", {5})}}},
      {{"a", "model-00001-of-00002.safetensors"},
       {"b", "model-00001-of-00002.safetensors"},
       {"c", "model-00002-of-00002.safetensors"}});
  const json manifest = WriteWithPython(dir.path(), spec);
  const absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ((*ckpt)->source(), (dir.path() / "model.safetensors.index.json").string());
  for (const auto& [name, t] : manifest.items()) {
    SCOPED_TRACE(name);
    const absl::StatusOr<RawTensorView> raw = (*ckpt)->GetRaw(name);
    ASSERT_TRUE(raw.ok()) << raw.status();
    EXPECT_EQ(raw->bytes, testing::HexToBytes(t["hex"].get<std::string>()));
    EXPECT_EQ((*ckpt)->FileOf(name), (dir.path() / t["file"].get<std::string>()).string());
  }
}

TEST(CheckpointTest, SingleFileWinsOverIndex) {
  testing::ScopedTempDir dir;
  WriteWithPython(dir.path(), Spec({{"model.safetensors", {Tensor("x", "F32", {1})}}}));
  testing::WriteFileBytes(dir.path() / "model.safetensors.index.json", "not even json");
  const absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->Names(), std::vector<std::string>{"x"});
}

TEST(CheckpointTest, MissingFilesAreNotFound) {
  testing::ScopedTempDir dir;
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(
      Message(ckpt.status()),
      HasSubstr("no model.safetensors or model.safetensors.index.json in " + dir.path().string()));
  ckpt = Checkpoint::Open(dir.path() / "nowhere");
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(ckpt.status()), HasSubstr("nowhere does not exist"));

  // The index names a shard that is not there.
  testing::WriteFileBytes(dir.path() / "model.safetensors.index.json",
                          R"({"weight_map": {"w": "model-00001-of-00002.safetensors"}})");
  ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(ckpt.status()), HasSubstr("model-00001-of-00002.safetensors"));
}

TEST(CheckpointTest, RejectsShardPathsOutsideTheDirectory) {
  testing::ScopedTempDir root;
  const auto dir = root.path() / "model";
  std::filesystem::create_directories(dir / "sub");
  // Valid files exist at every target, so only the name check can stop them.
  const json one = Spec({{"x.safetensors", {Tensor("w", "F32", {1})}}});
  WriteWithPython(root.path(), one);
  WriteWithPython(dir / "sub", one);
  for (const std::string& shard :
       {std::string("../x.safetensors"), (root.path() / "x.safetensors").string(),
        std::string("sub/x.safetensors"), std::string(".."), std::string("."), std::string(""),
        std::string("sub\\x.safetensors")}) {
    SCOPED_TRACE(shard);
    json index = json::object();
    index["weight_map"]["w"] = shard;
    testing::WriteFileBytes(dir / "model.safetensors.index.json", index.dump());
    const absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
    ASSERT_FALSE(ckpt.ok());
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(ckpt.status()), HasSubstr("tensor \"w\""));
    EXPECT_THAT(Message(ckpt.status()), HasSubstr("not a plain file name"));
  }
}

TEST(CheckpointTest, RejectsBadIndexes) {
  testing::ScopedTempDir dir;
  WriteWithPython(dir.path(), Spec({{"shard.safetensors", {Tensor("a", "F32", {1})}}}));
  const auto index = dir.path() / "model.safetensors.index.json";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{", "not valid JSON"},
      {"[]", "\"weight_map\""},
      {R"({"metadata": {}})", "\"weight_map\""},
      {R"({"weight_map": ["shard.safetensors"]})", "\"weight_map\""},
      {R"({"weight_map": {"a": 3}})", "weight_map[\"a\"] must be a file name"},
  };
  for (const auto& [text, expected] : cases) {
    SCOPED_TRACE(text);
    testing::WriteFileBytes(index, text);
    const absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.path());
    ASSERT_FALSE(ckpt.ok());
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(ckpt.status()), HasSubstr(expected));
    EXPECT_THAT(Message(ckpt.status()), HasSubstr(index.string()));
  }
  // The index maps a tensor to a shard that does not hold it.
  testing::WriteFileBytes(index, R"({"weight_map": {"b": "shard.safetensors"}})");
  const absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Message(ckpt.status()), HasSubstr("maps tensor \"b\" to"));
  EXPECT_THAT(Message(ckpt.status()), HasSubstr("shard.safetensors, which has no such tensor"));
}

TEST(CheckpointTest, TruncatedShardIsDataLossNamingTheFile) {
  testing::ScopedTempDir dir;
  WriteWithPython(dir.path(), Spec({{"model.safetensors", {Tensor("w", "F32", {64})}}}));
  const auto path = dir.path() / "model.safetensors";
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 1);
  const absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(Message(ckpt.status()), HasSubstr(path.string()));
  EXPECT_THAT(Message(ckpt.status()), HasSubstr("\"w\""));
}

TEST(CheckpointTest, MisalignedWeightsAreRejectedButReadableRaw) {
  testing::ScopedTempDir dir;
  // 3 bytes of U8 push the F32 tensor off its 4-byte alignment (valid safetensors all the same).
  const json manifest = WriteWithPython(
      dir.path(),
      Spec({{"model.safetensors", {Tensor("bytes", "U8", {3}), Tensor("w", "F32", {2})}}}));
  const absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const absl::StatusOr<TensorView> view = (*ckpt)->Get("w");
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(view.status()), HasSubstr("tensor w starts at byte"));
  EXPECT_THAT(Message(view.status()), HasSubstr("not a multiple of its 4-byte F32"));
  const absl::StatusOr<RawTensorView> raw = (*ckpt)->GetRaw("w");
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->bytes, testing::HexToBytes(manifest["w"]["hex"].get<std::string>()));
}

}  // namespace
}  // namespace specd
