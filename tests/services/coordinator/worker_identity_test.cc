// Which workers a coordinator uses (worker_identity.h): only those of its own worker protocol,
// and after a restart, those whose capacity changed, but not the computation of a target; a
// draft may change anything but its vocabulary and its max_seq_len (not shorter).
#include "services/coordinator/worker_identity.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/protocol/worker_protocol.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specd {
namespace {

namespace pb = worker::v1;
using ::testing::HasSubstr;

pb::InfoResponse Target() {
  pb::InfoResponse info;
  info.set_role(pb::WORKER_ROLE_TARGET);
  info.set_model_name("Llama-3.2-3B");
  info.set_model_config_json(R"({"num_layers": 28})");
  info.set_vocab_size(128256);
  info.set_output_vocab_size(128256);
  info.set_tokenizer_fingerprint("3f2a");
  info.set_weights_fingerprint("c0de");
  info.set_backend("cuda");
  info.set_kv_dtype("bf16");
  info.add_eos_token_ids(128001);
  info.set_max_seq_len(4096);
  info.set_kv_total_blocks(1000);
  info.set_max_pass_tokens(2048);
  info.set_num_threads(1);
  info.set_epoch(1);
  return info;
}

TEST(WorkerIdentityTest, OnlyWorkersOfThisProtocolVersionAreUsed) {
  pb::InfoResponse info = Target();
  info.set_protocol_version(kWorkerProtocolVersion);
  EXPECT_TRUE(CheckProtocolVersion(info).ok());
  info.set_protocol_version(kWorkerProtocolVersion + 1);
  absl::Status newer = CheckProtocolVersion(info);
  EXPECT_EQ(newer.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(newer.message()),
              HasSubstr(absl::StrCat("speaks worker protocol ", kWorkerProtocolVersion + 1,
                                     " and this coordinator version ", kWorkerProtocolVersion,
                                     "; run the coordinator and both workers from one specd "
                                     "release")));
  info.clear_protocol_version();  // a worker from before the field
  absl::Status older = CheckProtocolVersion(info);
  EXPECT_EQ(older.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(older.message()), HasSubstr("speaks no worker protocol version"));
}

TEST(WorkerIdentityTest, CapacityMayChange) {
  const pb::InfoResponse before = Target();
  pb::InfoResponse now = before;
  now.set_epoch(2);
  now.set_kv_total_blocks(3000);
  now.set_kv_free_blocks(3000);
  now.set_max_pass_tokens(8192);
  now.set_num_threads(16);
  now.set_max_seq_len(8192);  // the coordinator keeps the limits it started with
  EXPECT_TRUE(CheckSameComputation(before, now).ok());
}

TEST(WorkerIdentityTest, ATargetThatComputesSomethingElseIsRefusedNamingWhat) {
  const pb::InfoResponse before = Target();
  struct Case {
    void (*change)(pb::InfoResponse&);
    std::string says;
  };
  const Case cases[] = {
      {[](pb::InfoResponse& i) { i.set_kv_dtype("f32"); }, "kv_dtype f32 (was bf16)"},
      {[](pb::InfoResponse& i) { i.set_backend("cpu"); }, "back end cpu (was cuda)"},
      {[](pb::InfoResponse& i) { i.set_model_name("Llama-3.2-1B"); },
       "model Llama-3.2-1B (was Llama-3.2-3B)"},
      {[](pb::InfoResponse& i) { i.set_model_config_json(R"({"num_layers": 14})"); },
       "another model config"},
      {[](pb::InfoResponse& i) { i.set_tokenizer_fingerprint("77aa"); }, "another tokenizer"},
      {[](pb::InfoResponse& i) { i.set_weights_fingerprint("beef"); },
       "another checkpoint (other weights under the same name and config.json)"},
      {[](pb::InfoResponse& i) { i.set_vocab_size(32000); }, "vocab_size 32000 (was 128256)"},
      {[](pb::InfoResponse& i) { i.set_output_vocab_size(32768); },
       "output_vocab_size 32768 (was 128256)"},
      {[](pb::InfoResponse& i) { i.add_eos_token_ids(128009); },
       "eos_token_ids 128001,128009 (was 128001)"},
      {[](pb::InfoResponse& i) { i.set_max_seq_len(2048); }, "max_seq_len 2048 (was 4096)"},
      {[](pb::InfoResponse& i) { i.set_role(pb::WORKER_ROLE_DRAFT); },
       "role WORKER_ROLE_DRAFT (was WORKER_ROLE_TARGET)"},
  };
  for (const Case& c : cases) {
    pb::InfoResponse now = before;
    c.change(now);
    const absl::Status st = CheckSameComputation(before, now);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << c.says;
    EXPECT_THAT(st.message(), HasSubstr(c.says));
    EXPECT_THAT(st.message(), HasSubstr("restart the coordinator"));
  }
}

TEST(WorkerIdentityTest, ADraftMayChangeItsModelButNotItsVocabularyOrLength) {
  pb::InfoResponse before = Target();
  before.set_role(pb::WORKER_ROLE_DRAFT);
  pb::InfoResponse now = before;
  now.set_model_name("Llama-3.2-1B");
  now.set_model_config_json(R"({"num_layers": 16})");
  now.set_backend("cpu");
  now.set_kv_dtype("f32");
  now.set_output_vocab_size(32768);  // --draft-vocab
  now.set_weights_fingerprint("beef");
  EXPECT_TRUE(CheckSameComputation(before, now).ok());
  now.set_max_seq_len(before.max_seq_len() - 1);
  EXPECT_THAT(CheckSameComputation(before, now).message(),
              HasSubstr("max_seq_len 4095 (was 4096)"));
  now.set_max_seq_len(before.max_seq_len());
  now.set_tokenizer_fingerprint("77aa");
  EXPECT_THAT(CheckSameComputation(before, now).message(), HasSubstr("another tokenizer"));
}

}  // namespace
}  // namespace specd
