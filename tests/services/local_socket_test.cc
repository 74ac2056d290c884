// The same-host path between the coordinator and a worker (services/common/local_frame.h): its
// framing over a socket pair, and real worker processes serving --local-socket to the
// coordinator's client (LocalChannel) and to a client that breaks every rule. A malformed request
// gets its status and the connection serves on; a frame that breaks the framing closes that
// connection only; the worker's replies equal gRPC's, and nothing it holds leaks.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/protocol/worker_protocol.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/common/local_frame.h"
#include "services/coordinator/local_channel.h"
#include "tests/services/worker_fixture.h"
#include "tests/services/worker_process.h"
#include "tests/test_util.h"

namespace specd::testing {
namespace {

using ::testing::HasSubstr;

// Both ends of a connected socket pair, closed at the end of the test.
struct SocketPair {
  SocketPair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fd), 0); }
  ~SocketPair() {
    for (const int f : fd) {
      if (f >= 0) close(f);
    }
  }
  void CloseWriter() {
    close(fd[0]);
    fd[0] = -1;
  }
  int fd[2] = {-1, -1};
};

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

void WriteRaw(int fd, const std::string& bytes) {
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
}

std::string LengthPrefix(uint32_t length) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return out;
}

TEST(LocalFrameTest, FramesGoThroughWhole) {
  SocketPair p;
  const std::string big(300 * 1024, 'x');  // past the one-send size
  ASSERT_TRUE(local::WriteFrame(p.fd[0], 7, "hello", Soon()).ok());
  ASSERT_TRUE(local::WriteFrame(p.fd[0], 0, "", Soon()).ok());
  // A big frame needs the reader to drain the socket while it is written.
  std::thread writer([&] { EXPECT_TRUE(local::WriteFrame(p.fd[0], 9, big, Soon()).ok()); });
  absl::StatusOr<local::Frame> a = local::ReadFrame(p.fd[1], Soon());
  absl::StatusOr<local::Frame> b = local::ReadFrame(p.fd[1], Soon());
  absl::StatusOr<local::Frame> c = local::ReadFrame(p.fd[1], Soon());
  writer.join();
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->tag, 7);
  EXPECT_EQ(a->payload, "hello");
  EXPECT_EQ(b->tag, 0);
  EXPECT_EQ(b->payload, "");
  EXPECT_EQ(c->tag, 9);
  EXPECT_EQ(c->payload, big);
}

TEST(LocalFrameTest, BrokenFramesAreErrorsNeverCrashes) {
  {
    SocketPair p;  // a length of 0 has no room for the tag
    WriteRaw(p.fd[0], LengthPrefix(0) + "x");
    const absl::StatusOr<local::Frame> f = local::ReadFrame(p.fd[1], Soon());
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(f.status().message(), HasSubstr("a frame length of 0 bytes"));
  }
  {
    SocketPair p;  // over the limit: nothing is allocated for it
    WriteRaw(p.fd[0], LengthPrefix(0xffffffffu) + "x");
    const absl::StatusOr<local::Frame> f = local::ReadFrame(p.fd[1], Soon());
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(f.status().message(), HasSubstr("4294967295"));
  }
  {
    SocketPair p;  // the writer goes away mid-frame
    WriteRaw(p.fd[0], LengthPrefix(100) + "\x01partial");
    p.CloseWriter();
    const absl::StatusOr<local::Frame> f = local::ReadFrame(p.fd[1], Soon());
    EXPECT_EQ(f.status().code(), absl::StatusCode::kUnavailable);
  }
  {
    SocketPair p;  // nothing comes
    const absl::StatusOr<local::Frame> f =
        local::ReadFrame(p.fd[1], absl::Now() + absl::Milliseconds(50));
    EXPECT_EQ(f.status().code(), absl::StatusCode::kDeadlineExceeded);
  }
  {
    SocketPair p;  // the reader is gone
    close(p.fd[1]);
    p.fd[1] = -1;
    EXPECT_EQ(local::WriteFrame(p.fd[0], 1, "x", Soon()).code(), absl::StatusCode::kUnavailable);
  }
}

TEST(LocalFrameTest, HelloCarriesEpochAndVersion) {
  const local::Hello h{0x0123456789abcdefULL, 7};
  local::Frame f{local::kHelloTag, local::EncodeHello(h)};
  const absl::StatusOr<local::Hello> back = local::DecodeHello(f);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->epoch, h.epoch);
  EXPECT_EQ(back->protocol_version, 7u);
  f.tag = 1;
  EXPECT_EQ(local::DecodeHello(f).status().code(), absl::StatusCode::kInvalidArgument);
  f = {local::kHelloTag, "short"};
  EXPECT_EQ(local::DecodeHello(f).status().code(), absl::StatusCode::kInvalidArgument);
}

class LocalSocketWorkerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = std::make_unique<ScopedTempDir>();
    const absl::Status st = PrepareModel(ModelKind::kSynthetic, model());
    ASSERT_TRUE(st.ok()) << st;
  }
  static void TearDownTestSuite() { tmp_.reset(); }
  static std::filesystem::path model() { return tmp_->path() / "model"; }
  static std::string SocketPath(const std::string& name) { return (tmp_->path() / name).string(); }

  static std::unique_ptr<ChildProcess> Start(bool draft, const std::string& socket) {
    absl::StatusOr<std::unique_ptr<ChildProcess>> p =
        ChildProcess::Start(draft ? DraftWorkerBinary() : TargetWorkerBinary(),
                            WorkerArgs(model(), {"--local-socket", socket, "--threads", "1"}));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }

  // The worker's Info over gRPC.
  static pb::InfoResponse Info(const ChildProcess& worker, bool draft) {
    pb::InfoRequest request;
    request.set_omit_tokenizer_files(true);
    pb::InfoResponse info;
    grpc::ClientContext ctx;
    const grpc::Status st =
        draft ? pb::DraftWorker::NewStub(worker.Channel())->Info(&ctx, request, &info)
              : pb::TargetWorker::NewStub(worker.Channel())->Info(&ctx, request, &info);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return info;
  }

  // A raw connection to `path`, or -1.
  static int RawConnect(const std::string& path) {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    const absl::StatusOr<sockaddr_un> addr = local::UnixAddress(path);
    if (!addr.ok() || connect(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  }

  // A raw connection whose hello has been read.
  static int Connect(const std::string& path) {
    const int fd = RawConnect(path);
    EXPECT_GE(fd, 0) << "cannot connect to " << path;
    const absl::StatusOr<local::Frame> hello = local::ReadFrame(fd, Soon());
    EXPECT_TRUE(hello.ok() && local::DecodeHello(*hello).ok()) << hello.status();
    return fd;
  }

  // One raw call: the reply's status code and payload.
  static std::pair<absl::StatusCode, std::string> RawCall(int fd, uint8_t tag,
                                                          const std::string& payload) {
    EXPECT_TRUE(local::WriteFrame(fd, tag, payload, Soon()).ok());
    const absl::StatusOr<local::Frame> reply = local::ReadFrame(fd, Soon());
    EXPECT_TRUE(reply.ok()) << reply.status();
    if (!reply.ok()) return {absl::StatusCode::kUnknown, ""};
    return {static_cast<absl::StatusCode>(reply->tag), reply->payload};
  }

  static std::unique_ptr<ScopedTempDir> tmp_;
};

std::unique_ptr<ScopedTempDir> LocalSocketWorkerTest::tmp_;

SamplingParams Greedy() { return SamplingParams(); }

TEST_F(LocalSocketWorkerTest, InfoNamesTheSocketAndItsRepliesEqualGrpcs) {
  const std::string path = SocketPath("target.sock");
  auto target = Start(false, path);
  ASSERT_NE(target, nullptr);
  const pb::InfoResponse info = Info(*target, false);
  EXPECT_EQ(info.local_socket(), path);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);  // this user's only

  absl::StatusOr<std::unique_ptr<LocalChannel>> channel =
      LocalChannel::Open(path, info.epoch(), absl::Seconds(5));
  ASSERT_TRUE(channel.ok()) << channel.status();
  // Two sequences with the same prompt: one verified over the socket, one over gRPC.
  auto stub = pb::TargetWorker::NewStub(target->Channel());
  pb::VerifyResponse via_socket;
  pb::VerifyRequest request;
  *request.add_sequences() = VerifySeq(1, {1, 17, 23, 42}, 0, {5, 6}, Greedy(), 1, 1, 2);
  ASSERT_TRUE((*channel)->Call(local::Method::kVerify, request, &via_socket, Soon()).ok());
  request.mutable_sequences(0)->set_seq_id(2);
  const VerifyCall via_grpc = CallVerify(*stub, request);
  ASSERT_TRUE(via_grpc.status.ok()) << via_grpc.status.error_message();
  ASSERT_EQ(via_socket.results_size(), 1);
  ASSERT_EQ(via_grpc.response.results_size(), 1);
  pb::VerifyResult a = via_socket.results(0);
  pb::VerifyResult b = via_grpc.response.results(0);
  a.clear_seq_id();
  b.clear_seq_id();
  a.clear_cache();  // the free counts differ by the other sequence's blocks
  b.clear_cache();
  EXPECT_EQ(a.SerializeAsString(), b.SerializeAsString());

  // Truncate and Release over the socket; the KV pool is whole again.
  pb::TruncateRequest truncate;
  auto* t = truncate.add_sequences();
  t->set_seq_id(1);
  t->set_new_len(3);
  pb::TruncateResponse truncated;
  ASSERT_TRUE((*channel)->Call(local::Method::kTruncate, truncate, &truncated, Soon()).ok());
  ASSERT_EQ(truncated.results_size(), 1);
  EXPECT_EQ(truncated.results(0).cache().cached_len(), 3);
  for (const uint64_t seq : {1, 2}) {
    pb::ReleaseRequest release;
    release.set_seq_id(seq);
    pb::ReleaseResponse released;
    ASSERT_TRUE((*channel)->Call(local::Method::kRelease, release, &released, Soon()).ok());
  }
  EXPECT_EQ(Info(*target, false).kv_free_blocks(), info.kv_total_blocks());
}

TEST_F(LocalSocketWorkerTest, AnotherProcessOnThePathIsRefused) {
  const std::string path = SocketPath("restarted.sock");
  auto target = Start(false, path);
  ASSERT_NE(target, nullptr);
  const uint64_t epoch = Info(*target, false).epoch();
  target.reset();
  target = Start(false, path);  // replaces the stale socket file
  ASSERT_NE(target, nullptr);
  const absl::StatusOr<std::unique_ptr<LocalChannel>> stale =
      LocalChannel::Open(path, epoch, absl::Seconds(5));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stale.status().message(), HasSubstr("started after the caller last read its Info"));
  EXPECT_EQ(LocalChannel::Open(SocketPath("nobody.sock"), epoch, absl::Seconds(5)).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(LocalSocketWorkerTest, MalformedRequestsGetTheirStatusAndHarmNothing) {
  const std::string path = SocketPath("draft.sock");
  auto draft = Start(true, path);
  ASSERT_NE(draft, nullptr);
  const pb::InfoResponse info = Info(*draft, true);
  const int fd = Connect(path);

  // Unknown methods, and the target's calls, on a draft worker.
  auto [code, message] = RawCall(fd, 99, "");
  EXPECT_EQ(code, absl::StatusCode::kUnimplemented);
  EXPECT_THAT(message, HasSubstr("the draft worker serves no method 99"));
  std::tie(code, message) = RawCall(fd, static_cast<uint8_t>(local::Method::kVerify),
                                    pb::VerifyRequest().SerializeAsString());
  EXPECT_EQ(code, absl::StatusCode::kUnimplemented);
  EXPECT_THAT(message, HasSubstr("(Verify)"));
  // Bytes that are no DraftRequest.
  std::tie(code, message) =
      RawCall(fd, static_cast<uint8_t>(local::Method::kDraft), "\xff\xff\xff");
  EXPECT_EQ(code, absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(message, "a malformed Draft request");
  // A request the worker validates, as over gRPC.
  pb::DraftRequest dup;
  *dup.add_sequences() = DraftSeq(5, {1}, 0, 2, Greedy(), 1, 1);
  *dup.add_sequences() = DraftSeq(5, {1}, 0, 2, Greedy(), 1, 1);
  std::tie(code, message) =
      RawCall(fd, static_cast<uint8_t>(local::Method::kDraft), dup.SerializeAsString());
  EXPECT_EQ(code, absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(message, "Draft: seq_id 5 appears more than once in the request");
  // Meant for another process.
  pb::DraftRequest stale;
  stale.set_expected_epoch(info.epoch() + 1);
  *stale.add_sequences() = DraftSeq(6, {1, 2, 3}, 0, 2, Greedy(), 1, 1);
  std::tie(code, message) =
      RawCall(fd, static_cast<uint8_t>(local::Method::kDraft), stale.SerializeAsString());
  EXPECT_EQ(code, absl::StatusCode::kUnavailable);
  EXPECT_THAT(message, HasSubstr("started after the caller last read its Info"));

  // The same connection still serves a valid call.
  pb::DraftRequest valid;
  valid.set_expected_epoch(info.epoch());
  *valid.add_sequences() = DraftSeq(7, {1, 2, 3}, 0, 2, Greedy(), 1, 1);
  std::tie(code, message) =
      RawCall(fd, static_cast<uint8_t>(local::Method::kDraft), valid.SerializeAsString());
  ASSERT_EQ(code, absl::StatusCode::kOk) << message;
  pb::DraftResponse drafted;
  ASSERT_TRUE(drafted.ParseFromString(message));
  EXPECT_EQ(drafted.steps_size(), 2);

  // Frames that break the framing close their own connection only.
  const int oversized = Connect(path);
  WriteRaw(oversized, LengthPrefix(local::kMaxFrameBytes + 1) + "x");
  const int truncated = Connect(path);
  WriteRaw(truncated, LengthPrefix(1000) + "\x01only part of it");
  close(truncated);
  char byte;
  EXPECT_EQ(read(oversized, &byte, 1), 0);  // closed by the worker
  close(oversized);
  // More connections than the worker keeps: the extra ones are closed at once.
  std::vector<int> many;
  for (int i = 0; i < 70; ++i) {
    const int c = RawConnect(path);
    ASSERT_GE(c, 0);
    many.push_back(c);
  }
  int refused = 0;
  for (const int c : many) refused += local::ReadFrame(c, Soon()).ok() ? 0 : 1;
  // `fd` holds one of the 64; the two connections closed above may not have been reaped yet.
  EXPECT_GE(refused, 70 - 64 + 1);
  EXPECT_LE(refused, 70 - 64 + 3);
  for (const int c : many) close(c);

  pb::ReleaseRequest release;
  release.set_seq_id(7);
  std::tie(code, message) =
      RawCall(fd, static_cast<uint8_t>(local::Method::kRelease), release.SerializeAsString());
  EXPECT_EQ(code, absl::StatusCode::kOk) << message;
  close(fd);
  // gRPC still serves, and no KV block is held.
  EXPECT_EQ(Info(*draft, true).kv_free_blocks(), info.kv_total_blocks());
  EXPECT_EQ(draft->Terminate(), 0);
  EXPECT_THAT(draft->StderrText(), HasSubstr("closed a --local-socket connection: a frame length"));
  struct stat st {};
  EXPECT_NE(stat(path.c_str(), &st), 0) << "the socket file outlived its worker";
}

TEST_F(LocalSocketWorkerTest, APathThatIsNoSocketIsAStartError) {
  const std::string path = SocketPath("a-file");
  { std::ofstream(path) << "keep me"; }
  std::string err;
  const absl::StatusOr<int> code =
      ChildProcess::Run(TargetWorkerBinary(), WorkerArgs(model(), {"--local-socket", path}), &err);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 1);
  EXPECT_THAT(err, HasSubstr("--local-socket " + path + " exists and is not a socket"));
  std::ifstream in(path);
  std::string kept;
  std::getline(in, kept);
  EXPECT_EQ(kept, "keep me");
}

}  // namespace
}  // namespace specd::testing
