// The public API's security (issue 9) with real clients over real processes: TLS with a test CA
// made by `openssl` at test time (no key is ever committed), the bearer token on every Generation
// call, the flags' error messages, and the limits on request size, prompt length, max_new_tokens
// and streams per connection. The clients are the C++ gRPC client, Python's grpcio and the
// `specd` CLI.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/synth/synth.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "specd/v1/generation.grpc.pb.h"
#include "tests/services/worker_fixture.h"
#include "tests/services/worker_process.h"
#include "tests/test_util.h"

namespace specd {
namespace {

using testing::ChildProcess;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ScopedTempDir;

constexpr char kToken[] = "0123456789abcdef-test-token-0123456789";

std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteText(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

// Runs a shell command; its exit code, with stdout and stderr in `*output`.
int Shell(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  output->clear();
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) output->append(buf, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A throwaway CA, a server certificate it signs for localhost and 127.0.0.1, and a second CA
// that signs nothing the server has, all made by the openssl command line.
struct TestPki {
  std::filesystem::path ca, cert, key, other_ca;
};

absl::StatusOr<TestPki> MakePki(const std::filesystem::path& dir) {
  const std::string d = dir.string();
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  WriteText(dir / "server.ext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
            "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n");
  const std::vector<std::string> commands = {
      absl::StrCat("openssl req -x509 ", ec, " -days 2 -subj /CN=specd-test-ca -keyout ", d,
                   "/ca.key -out ", d,
                   "/ca.pem -addext basicConstraints=critical,CA:TRUE -addext "
                   "keyUsage=critical,keyCertSign,cRLSign"),
      absl::StrCat("openssl req -x509 ", ec, " -days 2 -subj /CN=specd-other-ca -keyout ", d,
                   "/other-ca.key -out ", d, "/other-ca.pem"),
      absl::StrCat("openssl req ", ec, " -subj /CN=localhost -keyout ", d, "/server.key -out ", d,
                   "/server.csr"),
      absl::StrCat("openssl x509 -req -in ", d, "/server.csr -CA ", d, "/ca.pem -CAkey ", d,
                   "/ca.key -CAcreateserial -days 2 -out ", d, "/server.pem -extfile ", d,
                   "/server.ext"),
  };
  for (const std::string& c : commands) {
    std::string out;
    if (Shell(c, &out) != 0) {
      return absl::InternalError(absl::StrCat("`", c,
                                              "` failed (is openssl installed? "
                                              "scripts/setup.sh installs it):\n",
                                              out));
    }
  }
  return TestPki{dir / "ca.pem", dir / "server.pem", dir / "server.key", dir / "other-ca.pem"};
}

std::shared_ptr<grpc::Channel> TlsChannel(int port, const std::filesystem::path& ca_file) {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ReadText(ca_file);
  return grpc::CreateChannel(absl::StrCat("localhost:", port), grpc::SslCredentials(options));
}

std::shared_ptr<grpc::Channel> PlainChannel(int port, bool own_connection = false) {
  grpc::ChannelArguments args;
  // Channels to one address share a connection unless told otherwise; the per-connection limit
  // tests need connections of their own.
  if (own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials(), args);
}

bool WaitServing(const std::shared_ptr<grpc::Channel>& channel) {
  auto health = grpc::health::v1::Health::NewStub(channel);
  for (int i = 0; i < 600; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc::health::v1::HealthCheckResponse reply;
    if (health->Check(&ctx, {}, &reply).ok() &&
        reply.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// A synthetic model: `tiny`'s shape, with room for very long generations when `max_seq_len` is
// raised (the per-connection test holds streams open with them).
absl::Status WriteModel(const std::filesystem::path& dir, int64_t max_seq_len) {
  SynthSpec spec;
  absl::StatusOr<ModelConfig> c = ShapePreset("tiny");
  if (!c.ok()) return c.status();
  spec.config = *c;
  spec.config.max_position_embeddings = max_seq_len;
  return WriteSyntheticModel(spec, dir);
}

struct Call {
  grpc::Status status;
  std::vector<int32_t> tokens;
};

v1::GenerateRequest IdsRequest(std::vector<int32_t> ids, uint32_t max_new) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  r.mutable_stopping()->set_max_new_tokens(max_new);
  r.mutable_stopping()->set_ignore_eos(true);
  return r;
}

Call Generate(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
              const std::string& authorization, int deadline_ms = 30000) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
  Call out;
  auto reader = stub.Generate(&ctx, request);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    out.tokens.insert(out.tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
  }
  out.status = reader->Finish();
  return out;
}

std::string Bearer(const std::string& token) { return "Bearer " + token; }

// ---------------------------------------------------------------------------------------------
// Flags: every bad value stops the coordinator before it serves, with a message naming the flag
// or file (exit code 2, or 1 when gRPC refuses the key). None of these reach the worker address.

TEST(SecurityFlagsTest, BadValuesFailClearlyAndNeverEchoTheToken) {
  ScopedTempDir tmp;
  absl::StatusOr<TestPki> pki = MakePki(tmp.path());
  ASSERT_TRUE(pki.ok()) << pki.status();
  WriteText(tmp.path() / "short-token", "abcde\n");
  WriteText(tmp.path() / "spaced-token", "0123456789 abcdef0123456789\n");
  WriteText(tmp.path() / "good-token", absl::StrCat(kToken, "\n"));
  WriteText(tmp.path() / "not-pem", "hello\n");
  WriteText(tmp.path() / "broken.jinja", "{% for m in %}{{ m }}");
  const std::string cert = pki->cert.string();
  const std::string key = pki->key.string();
  struct Case {
    std::vector<std::string> flags;
    std::string message;
    const char* env_token = nullptr;
    int exit_code = 2;  // 1: flags that parse but that gRPC refuses when it starts listening
  };
  const std::vector<Case> cases = {
      {{"--tls-cert", cert}, "--tls-cert and --tls-key go together"},
      {{"--tls-key", key}, "--tls-cert and --tls-key go together"},
      {{"--tls-cert", (tmp.path() / "nope.pem").string(), "--tls-key", key},
       "--tls-cert: cannot read '"},
      {{"--tls-cert", (tmp.path() / "not-pem").string(), "--tls-key", key},
       "is not a PEM file with a CERTIFICATE"},
      {{"--tls-cert", cert, "--tls-key", cert}, "--tls-key: '"},
      {{"--tls-cert", cert, "--tls-key", (tmp.path() / "other-ca.key").string()},
       "--tls-cert and --tls-key are not a certificate chain and its private key",
       nullptr,
       1},
      {{"--auth-token-file", (tmp.path() / "nope").string()}, "cannot read it"},
      {{"--auth-token-file", (tmp.path() / "short-token").string()},
       "the token has 5 characters; use 16 to 4096"},
      {{"--auth-token-file", (tmp.path() / "spaced-token").string()},
       "printable ASCII without spaces"},
      {{"--auth-token-file", (tmp.path() / "good-token").string()},
       "--auth-token-file and $SPECD_AUTH_TOKEN are both set",
       kToken},
      {{}, "$SPECD_AUTH_TOKEN: the token has 5 characters", "abcde"},
      {{"--max-streams-per-connection", "-1"},
       "--max-streams-per-connection must be in [0, 1048576], got -1"},
      {{"--max-request-bytes", "10"}, "--max-request-bytes must be in [1024, 1073741824], got 10"},
      {{"--max-prompt-tokens", "many"}, "--max-prompt-tokens must be an integer, got 'many'"},
      {{"--prefix-sharing", "yes"}, "--prefix-sharing must be on or off, got 'yes'"},
      {{"--max-new-tokens-limit", "100"},
       "--default-max-new-tokens (256) exceeds --max-new-tokens-limit (100)"},
      {{"--http-listen", "nowhere"}, "--http-listen: 'nowhere' is not HOST:PORT", nullptr, 1},
      {{"--chat-template", (tmp.path() / "nope.jinja").string()}, "--chat-template: cannot read"},
      {{"--chat-template", (tmp.path() / "broken.jinja").string()}, "--chat-template: "},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {
        "--listen", "127.0.0.1:0",    "--target", "127.0.0.1:1", "--worker-wait-seconds",
        "1",        "--metrics-port", "-1"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    if (c.env_token != nullptr) setenv("SPECD_AUTH_TOKEN", c.env_token, 1);
    std::string err;
    const absl::StatusOr<int> code = ChildProcess::Run(
        testing::BuiltBinary("services/coordinator/specd-coordinator"), args, &err);
    unsetenv("SPECD_AUTH_TOKEN");
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, c.exit_code) << c.message << "\n" << err;
    EXPECT_THAT(err, HasSubstr(c.message));
    EXPECT_THAT(err, Not(HasSubstr(kToken)));
    EXPECT_THAT(err, Not(HasSubstr("abcde")));
  }
}

// ---------------------------------------------------------------------------------------------
// A coordinator with TLS and a token, over one target worker (K = 0: these tests are about the
// API, not speculation). Started once for the suite.

class TlsTokenTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    unsetenv("SPECD_AUTH_TOKEN");
    tmp_ = new ScopedTempDir();
    absl::StatusOr<TestPki> pki = MakePki(tmp_->path());
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = new TestPki(*pki);
    ASSERT_TRUE(WriteModel(tmp_->path() / "model", 512).ok());
    WriteText(tmp_->path() / "token", absl::StrCat(kToken, "\n"));
    auto target = ChildProcess::Start(testing::TargetWorkerBinary(),
                                      testing::WorkerArgs(tmp_->path() / "model"));
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = target->release();
    auto coordinator = ChildProcess::Start(
        testing::BuiltBinary("services/coordinator/specd-coordinator"),
        {"--listen", "127.0.0.1:0", "--target", target_->address(), "--metrics-port", "-1",
         "--tls-cert", pki_->cert.string(), "--tls-key", pki_->key.string(), "--auth-token-file",
         (tmp_->path() / "token").string(), "--http-listen", "127.0.0.1:0"});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = coordinator->release();
    ASSERT_TRUE(WaitServing(TlsChannel(coordinator_->port(), pki_->ca)))
        << coordinator_->StderrText();
  }
  static void TearDownTestSuite() {
    delete coordinator_;
    delete target_;
    delete pki_;
    delete tmp_;
  }
  void SetUp() override { ASSERT_NE(coordinator_, nullptr); }

  static std::unique_ptr<v1::Generation::Stub> TrustedStub() {
    return v1::Generation::NewStub(TlsChannel(coordinator_->port(), pki_->ca));
  }

  static ScopedTempDir* tmp_;
  static TestPki* pki_;
  static ChildProcess* target_;
  static ChildProcess* coordinator_;
};
ScopedTempDir* TlsTokenTest::tmp_ = nullptr;
TestPki* TlsTokenTest::pki_ = nullptr;
ChildProcess* TlsTokenTest::target_ = nullptr;
ChildProcess* TlsTokenTest::coordinator_ = nullptr;

TEST_F(TlsTokenTest, ClientTrustingTheCaWithTheTokenUsesEveryCall) {
  auto stub = TrustedStub();
  const Call g = Generate(*stub, IdsRequest({1, 50, 60}, 8), Bearer(kToken));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens.size(), 8u);
  // The scheme is case-insensitive (RFC 7235).
  EXPECT_TRUE(
      Generate(*stub, IdsRequest({1, 50, 60}, 2), absl::StrCat("bearer ", kToken)).status.ok());

  grpc::ClientContext c1;
  c1.AddMetadata("authorization", Bearer(kToken));
  v1::TokenizeRequest treq;
  treq.set_text("hello world");
  v1::TokenizeResponse tresp;
  ASSERT_TRUE(stub->Tokenize(&c1, treq, &tresp).ok());
  grpc::ClientContext c2;
  c2.AddMetadata("authorization", Bearer(kToken));
  v1::DetokenizeRequest dreq;
  *dreq.mutable_token_ids() = tresp.token_ids();
  v1::DetokenizeResponse dresp;
  ASSERT_TRUE(stub->Detokenize(&c2, dreq, &dresp).ok());
  EXPECT_EQ(dresp.text(), "hello world");
  grpc::ClientContext c3;
  c3.AddMetadata("authorization", Bearer(kToken));
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(stub->GetServerInfo(&c3, {}, &info).ok());
  EXPECT_EQ(info.target().vocab_size(), 512);
}

TEST_F(TlsTokenTest, MissingOrWrongTokenIsUnauthenticatedOnEveryGenerationCall) {
  auto stub = TrustedStub();
  struct Case {
    std::string authorization;  // "" = no metadata
    std::string message;
  };
  const std::string wrong_same_length(sizeof(kToken) - 1, 'x');
  const std::vector<Case> cases = {
      {"", "this server requires a bearer token"},
      {Bearer(wrong_same_length), "the bearer token is not valid"},
      {Bearer("short"), "the bearer token is not valid"},
      {Bearer(absl::StrCat(kToken, "x")), "the bearer token is not valid"},
      {absl::StrCat("Basic ", kToken), "must be 'Bearer <token>'"},
      {"Bearer", "must be 'Bearer <token>'"},
      {kToken, "must be 'Bearer <token>'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.authorization);
    const Call g = Generate(*stub, IdsRequest({1, 50, 60}, 4), c.authorization);
    EXPECT_EQ(g.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(g.status.error_message(), HasSubstr(c.message));
    EXPECT_THAT(g.status.error_message(), Not(HasSubstr(kToken)));
    EXPECT_TRUE(g.tokens.empty());

    auto with_auth = [&](grpc::ClientContext* ctx) {
      if (!c.authorization.empty()) ctx->AddMetadata("authorization", c.authorization);
    };
    grpc::ClientContext c1;
    with_auth(&c1);
    v1::TokenizeRequest treq;
    treq.set_text("hello");
    v1::TokenizeResponse tresp;
    EXPECT_EQ(stub->Tokenize(&c1, treq, &tresp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    grpc::ClientContext c2;
    with_auth(&c2);
    v1::DetokenizeResponse dresp;
    EXPECT_EQ(stub->Detokenize(&c2, {}, &dresp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    grpc::ClientContext c3;
    with_auth(&c3);
    v1::GetServerInfoResponse info;
    EXPECT_EQ(stub->GetServerInfo(&c3, {}, &info).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
}

TEST_F(TlsTokenTest, HealthNeedsTlsButNoToken) {
  // Load balancers and container health checks probe health without credentials.
  auto health = grpc::health::v1::Health::NewStub(TlsChannel(coordinator_->port(), pki_->ca));
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse reply;
  ASSERT_TRUE(health->Check(&ctx, {}, &reply).ok());
  EXPECT_EQ(reply.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(TlsTokenTest, PlaintextClientAndClientTrustingAnotherCaFail) {
  auto plain = v1::Generation::NewStub(PlainChannel(coordinator_->port()));
  const Call p = Generate(*plain, IdsRequest({1, 50, 60}, 4), Bearer(kToken), 10000);
  EXPECT_EQ(p.status.error_code(), grpc::StatusCode::UNAVAILABLE) << p.status.error_message();
  EXPECT_TRUE(p.tokens.empty());

  auto untrusting = v1::Generation::NewStub(TlsChannel(coordinator_->port(), pki_->other_ca));
  const Call u = Generate(*untrusting, IdsRequest({1, 50, 60}, 4), Bearer(kToken), 10000);
  EXPECT_EQ(u.status.error_code(), grpc::StatusCode::UNAVAILABLE) << u.status.error_message();
  EXPECT_TRUE(u.tokens.empty());

  // The failed handshakes harmed nothing.
  EXPECT_TRUE(Generate(*TrustedStub(), IdsRequest({1, 50, 60}, 2), Bearer(kToken)).status.ok());
}

// Python's grpcio, an independent client implementation, as a user would configure it.
constexpr char kPythonClient[] = R"py(
import json, sys
source_dir, stub_dir, target, ca_file, token = sys.argv[1:6]
sys.path.insert(0, source_dir + "/tests/clients")
import python_client
python_client.generate_stubs(source_dir, stub_dir)
import grpc
from specd.v1 import generation_pb2, generation_pb2_grpc

def generate(channel, metadata):
    stub = generation_pb2_grpc.GenerationStub(channel)
    request = generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=[1, 50, 60]),
        stopping=generation_pb2.StoppingCriteria(max_new_tokens=8, ignore_eos=True))
    tokens = []
    try:
        for msg in stub.Generate(request, metadata=metadata, timeout=20):
            tokens.extend(msg.token_ids)
        return {"code": "OK", "token_ids": tokens}
    except grpc.RpcError as e:
        return {"code": e.code().name, "details": e.details()}

with open(ca_file, "rb") as f:
    credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
out = {}
with grpc.secure_channel(target, credentials) as channel:
    out["token"] = generate(channel, [("authorization", "Bearer " + token)])
    out["no_token"] = generate(channel, [])
    out["wrong_token"] = generate(channel, [("authorization", "Bearer " + "y" * len(token))])
with grpc.insecure_channel(target) as channel:
    out["plaintext"] = generate(channel, [("authorization", "Bearer " + token)])
print(json.dumps(out))
)py";

TEST_F(TlsTokenTest, PythonGrpcioClient) {
  const Call expected = Generate(*TrustedStub(), IdsRequest({1, 50, 60}, 8), Bearer(kToken));
  ASSERT_TRUE(expected.status.ok());
  ScopedTempDir tmp;
  WriteText(tmp.path() / "client.py", kPythonClient);
  const std::string src = testing::SourceDir().string();
  std::string out;
  const int code =
      Shell(absl::StrCat(testing::Python(), " ", (tmp.path() / "client.py").string(), " ", src, " ",
                         (tmp.path() / "stubs").string(), " localhost:", coordinator_->port(), " ",
                         pki_->ca.string(), " ", kToken),
            &out);
  ASSERT_EQ(code, 0) << out;
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["token"]["code"], "OK") << out;
  EXPECT_EQ(j["token"]["token_ids"].get<std::vector<int32_t>>(), expected.tokens);
  EXPECT_EQ(j["no_token"]["code"], "UNAUTHENTICATED") << out;
  EXPECT_EQ(j["wrong_token"]["code"], "UNAUTHENTICATED") << out;
  EXPECT_EQ(j["plaintext"]["code"], "UNAVAILABLE") << out;
}

TEST_F(TlsTokenTest, SpecdCliWithTlsCaAndToken) {
  const std::string specd = testing::BuiltBinary("tools/specd").string();
  const std::string server = absl::StrCat("localhost:", coordinator_->port());
  const std::string ca = pki_->ca.string();
  const std::string generate = absl::StrCat(specd, " generate --server ", server,
                                            " --prompt-ids 1,50,60 --max-tokens 6 --ignore-eos");
  std::string out;
  // The token from the environment, so it stays out of `ps`.
  EXPECT_EQ(Shell(absl::StrCat("SPECD_TOKEN=", kToken, " ", generate, " --tls-ca ", ca), &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("6 generated"));
  EXPECT_EQ(Shell(absl::StrCat(generate, " --tls-ca ", ca, " --token ", kToken), &out), 0) << out;
  EXPECT_EQ(Shell(absl::StrCat("env -u SPECD_TOKEN ", generate, " --tls-ca ", ca), &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("this server requires a bearer token"));
  EXPECT_EQ(
      Shell(absl::StrCat(generate, " --tls-ca ", pki_->key.string(), " --token ", kToken), &out), 2)
      << out;
  EXPECT_THAT(out, HasSubstr("--tls-ca: '"));

  EXPECT_EQ(Shell(absl::StrCat(specd, " health --server ", server, " --tls-ca ", ca), &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("SERVING"));
  EXPECT_EQ(Shell(absl::StrCat(specd, " health --timeout 2 --server ", server), &out), 1) << out;
}

// The HTTP API (issue 15) takes the same certificate, key and token as the gRPC port.
TEST_F(TlsTokenTest, HttpApiTakesTheSameTlsAndToken) {
  ASSERT_GT(coordinator_->http_port(), 0);
  const std::string url = absl::StrCat("https://localhost:", coordinator_->http_port());
  const std::string curl =
      absl::StrCat("curl -sS --max-time 30 -w '\nHTTP %{http_code}' --cacert ", pki_->ca.string());
  const std::string auth = absl::StrCat(" -H 'Authorization: Bearer ", kToken, "'");
  std::string out;
  EXPECT_EQ(Shell(absl::StrCat(curl, auth, " ", url, "/v1/models"), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("\"object\":\"list\""));
  EXPECT_THAT(out, HasSubstr("HTTP 200"));
  // A streamed completion over TLS.
  EXPECT_EQ(Shell(absl::StrCat(curl, auth,
                               " -N -d '{\"prompt\": [1, 50, 60], \"max_tokens\": 4, "
                               "\"stream\": true}' ",
                               url, "/v1/completions"),
                  &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("data: [DONE]"));
  // No token, or a wrong one: 401 in OpenAI's error shape.
  EXPECT_EQ(Shell(absl::StrCat(curl, " -d '{\"prompt\": [1, 2]}' ", url, "/v1/completions"), &out),
            0);
  EXPECT_THAT(out, HasSubstr("HTTP 401"));
  EXPECT_THAT(out, HasSubstr("this server requires a bearer token"));
  EXPECT_EQ(Shell(absl::StrCat(curl, " -H 'Authorization: Bearer ", std::string(40, 'x'), "' ", url,
                               "/v1/models"),
                  &out),
            0);
  EXPECT_THAT(out, HasSubstr("HTTP 401"));
  EXPECT_THAT(out, Not(HasSubstr(kToken)));
  // Health needs TLS but no token, as gRPC health does.
  EXPECT_EQ(Shell(absl::StrCat(curl, " ", url, "/health"), &out), 0);
  EXPECT_THAT(out, HasSubstr("HTTP 200"));
  // A client trusting another CA, and plaintext HTTP to the TLS port, get nothing.
  EXPECT_NE(Shell(absl::StrCat("curl -sS --max-time 10 --cacert ", pki_->other_ca.string(), auth,
                               " ", url, "/v1/models"),
                  &out),
            0);
  EXPECT_NE(Shell(absl::StrCat("curl -sS --max-time 10", auth,
                               " http://127.0.0.1:", coordinator_->http_port(), "/v1/models"),
                  &out),
            0)
      << out;
}

// ---------------------------------------------------------------------------------------------
// Limits, on a plaintext coordinator that runs one request at a time, so queued requests hold
// their streams open for as long as a test needs.

class ApiLimitsTest : public ::testing::Test {
 protected:
  static constexpr int kStreamsPerConnection = 3;

  static void SetUpTestSuite() {
    unsetenv("SPECD_AUTH_TOKEN");
    tmp_ = new ScopedTempDir();
    ASSERT_TRUE(WriteModel(tmp_->path() / "model", 65536).ok());
    auto target =
        ChildProcess::Start(testing::TargetWorkerBinary(),
                            testing::WorkerArgs(tmp_->path() / "model", {"--kv-tokens", "32768"}));
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = target->release();
    auto coordinator = ChildProcess::Start(
        testing::BuiltBinary("services/coordinator/specd-coordinator"),
        {"--listen", "127.0.0.1:0", "--target", target_->address(), "--max-running", "1",
         "--max-request-bytes", "65536", "--max-prompt-tokens", "32", "--max-new-tokens-limit",
         "60000", "--max-streams-per-connection", std::to_string(kStreamsPerConnection)});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = coordinator->release();
    ASSERT_TRUE(WaitServing(PlainChannel(coordinator_->port()))) << coordinator_->StderrText();
  }
  static void TearDownTestSuite() {
    delete coordinator_;
    delete target_;
    delete tmp_;
  }
  void SetUp() override { ASSERT_NE(coordinator_, nullptr); }

  // The coordinator's queue length, from its /metrics.
  static int64_t Waiting() {
    absl::StatusOr<std::string> text = testing::HttpGet(coordinator_->metrics_port(), "/metrics");
    if (!text.ok()) return -1;
    const std::string name = "\nspecd_num_requests_waiting ";
    const size_t at = text->find(name);
    return at == std::string::npos ? -1 : std::atoll(text->c_str() + at + name.size());
  }

  static ScopedTempDir* tmp_;
  static ChildProcess* target_;
  static ChildProcess* coordinator_;
};
ScopedTempDir* ApiLimitsTest::tmp_ = nullptr;
ChildProcess* ApiLimitsTest::target_ = nullptr;
ChildProcess* ApiLimitsTest::coordinator_ = nullptr;

TEST_F(ApiLimitsTest, OversizedRequestIsResourceExhaustedAndHarmsNothing) {
  auto stub = v1::Generation::NewStub(PlainChannel(coordinator_->port()));
  v1::GenerateRequest big = IdsRequest({1}, 4);
  big.clear_token_ids();
  big.set_text(std::string(100000, 'a'));
  const Call c = Generate(*stub, big, "");
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << c.status.error_message();
  const Call after = Generate(*stub, IdsRequest({1, 50, 60}, 4), "");
  EXPECT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens.size(), 4u);
}

TEST_F(ApiLimitsTest, PromptLengthAndMaxNewTokensAreCapped) {
  auto stub = v1::Generation::NewStub(PlainChannel(coordinator_->port()));
  std::vector<int32_t> ids(33, 7);
  ids[0] = 1;
  const Call long_prompt = Generate(*stub, IdsRequest(ids, 4), "");
  EXPECT_EQ(long_prompt.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(long_prompt.status.error_message(),
              HasSubstr("the prompt has 33 tokens; this server accepts at most 32"));
  // The limit is on tokens after tokenization, whatever the text's length in bytes.
  std::string words;
  for (int i = 0; i < 40; ++i) absl::StrAppend(&words, i % 2 ? "once " : "upon ");
  grpc::ClientContext tctx;
  v1::TokenizeRequest treq;
  treq.set_text(words);
  v1::TokenizeResponse tresp;
  ASSERT_TRUE(stub->Tokenize(&tctx, treq, &tresp).ok());
  ASSERT_GT(tresp.token_ids_size(), 32);
  ASSERT_LT(words.size(), 1000u);
  v1::GenerateRequest text = IdsRequest({1}, 4);
  text.set_text(words);
  const Call long_text = Generate(*stub, text, "");
  EXPECT_EQ(long_text.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(long_text.status.error_message(), HasSubstr("this server accepts at most 32"));

  const Call too_many = Generate(*stub, IdsRequest({1, 50}, 60001), "");
  EXPECT_EQ(too_many.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(too_many.status.error_message(),
              HasSubstr("max_new_tokens is 60001; this server allows at most 60000"));

  ids.pop_back();
  const Call at_limit = Generate(*stub, IdsRequest(ids, 4), "");
  EXPECT_TRUE(at_limit.status.ok()) << at_limit.status.error_message();
  EXPECT_EQ(at_limit.tokens.size(), 4u);
}

TEST_F(ApiLimitsTest, StreamsPerConnectionAreCappedAndFreedOnEveryPath) {
  // Finished and failed streams give their place back before the client has their status: many
  // more than the limit, one after another on one connection, are never refused.
  auto fresh = v1::Generation::NewStub(PlainChannel(coordinator_->port(), true));
  auto call = [&](const v1::GenerateRequest& request) {
    return Generate(*fresh, request, "").status.error_code();
  };
  for (int i = 0; i < 10 * kStreamsPerConnection; ++i) {
    EXPECT_EQ(call(IdsRequest({1, 50}, 2)), grpc::StatusCode::OK);
    EXPECT_EQ(call(IdsRequest({1, 5000}, 2)), grpc::StatusCode::INVALID_ARGUMENT);
  }

  // One long request runs; the next two wait behind it (--max-running 1), holding their streams.
  auto a = v1::Generation::NewStub(PlainChannel(coordinator_->port(), true));
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>>> readers;
  for (int i = 0; i < kStreamsPerConnection; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    readers.push_back(a->Generate(contexts.back().get(), IdsRequest({1, 50 + i}, 60000)));
    if (i == 0) {
      v1::GenerateResponse first;
      ASSERT_TRUE(readers[0]->Read(&first));
    }
  }
  for (int i = 0; i < 400 && Waiting() != kStreamsPerConnection - 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_EQ(Waiting(), kStreamsPerConnection - 1);

  const Call over = Generate(*a, IdsRequest({1, 50}, 2), "");
  EXPECT_EQ(over.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(over.status.error_message(),
              HasSubstr("this connection already has 3 Generate streams open"));

  // Another connection has its own allowance: its request is admitted to the queue and waits
  // there until its deadline.
  auto b = v1::Generation::NewStub(PlainChannel(coordinator_->port(), true));
  EXPECT_EQ(Generate(*b, IdsRequest({1, 50}, 2), "", 500).status.error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);

  // A cancelled queued stream gives its place back (soon after; the server notices within a
  // poll), and so does one whose deadline passed in the queue.
  contexts[1]->TryCancel();
  EXPECT_EQ(readers[1]->Finish().error_code(), grpc::StatusCode::CANCELLED);
  grpc::StatusCode code = grpc::StatusCode::RESOURCE_EXHAUSTED;
  for (int i = 0; i < 200 && code == grpc::StatusCode::RESOURCE_EXHAUSTED; ++i) {
    code = Generate(*a, IdsRequest({1, 50}, 2), "", 300).status.error_code();
    if (code == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  }
  EXPECT_EQ(code, grpc::StatusCode::DEADLINE_EXCEEDED);
  for (int i = 0; i < 400 && Waiting() != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_EQ(Waiting(), 1);  // only readers[2]: the cancelled and expired ones left the queue

  for (size_t i : {0u, 2u}) {
    contexts[i]->TryCancel();
    EXPECT_EQ(readers[i]->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // Everything was released on the worker as well.
  auto t = worker::v1::TargetWorker::NewStub(target_->Channel());
  int64_t used = -1;
  for (int i = 0; i < 200 && used != 0; ++i) {
    grpc::ClientContext ctx;
    worker::v1::InfoResponse info;
    ASSERT_TRUE(t->Info(&ctx, {}, &info).ok());
    used = info.kv_total_blocks() - info.kv_free_blocks();
    if (used != 0) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_EQ(used, 0);
}

// ---------------------------------------------------------------------------------------------
// `specd serve` takes every coordinator flag but the addresses and passes it on: a user who
// serves with one command gets the same TLS, token and limits.

// The flag names of a `--help` text ("  --name VALUE" lines).
std::set<std::string> HelpFlags(const std::string& help) {
  std::set<std::string> names;
  std::istringstream lines(help);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("  --", 0) != 0) continue;
    names.insert(line.substr(4, line.find(' ', 4) - 4));
  }
  return names;
}

TEST(SpecdServeFlagsTest, ServeTakesEveryCoordinatorFlagButItsAddresses) {
  std::string coordinator_help, serve_help;
  ASSERT_EQ(
      Shell(absl::StrCat(testing::BuiltBinary("services/coordinator/specd-coordinator").string(),
                         " --help"),
            &coordinator_help),
      0);
  ASSERT_EQ(Shell(absl::StrCat(testing::BuiltBinary("tools/specd").string(), " serve --help"),
                  &serve_help),
            0);
  const std::set<std::string> serve = HelpFlags(serve_help);
  const std::set<std::string> coordinator = HelpFlags(coordinator_help);
  ASSERT_GT(coordinator.size(), 20u) << coordinator_help;
  for (const std::string& flag : coordinator) {
    // The addresses are serve's to choose: the workers' it learns, the metrics port per child.
    if (flag == "target" || flag == "draft") continue;
    EXPECT_TRUE(serve.count(flag)) << "specd serve has no --" << flag;
  }
}

TEST(SpecdServeFlagsTest, TlsTokenAndLimitsReachTheCoordinator) {
  unsetenv("SPECD_AUTH_TOKEN");
  ScopedTempDir tmp;
  absl::StatusOr<TestPki> pki = MakePki(tmp.path());
  ASSERT_TRUE(pki.ok()) << pki.status();
  ASSERT_TRUE(WriteModel(tmp.path() / "model", 512).ok());
  WriteText(tmp.path() / "token", absl::StrCat(kToken, "\n"));
  auto serve =
      ChildProcess::Start(testing::BuiltBinary("tools/specd"), {"serve",
                                                                "--target",
                                                                (tmp.path() / "model").string(),
                                                                "--listen",
                                                                "127.0.0.1:0",
                                                                "--threads",
                                                                "1",
                                                                "--kv-tokens",
                                                                "2048",
                                                                "--tls-cert",
                                                                pki->cert.string(),
                                                                "--tls-key",
                                                                pki->key.string(),
                                                                "--auth-token-file",
                                                                (tmp.path() / "token").string(),
                                                                "--max-new-tokens-limit",
                                                                "8",
                                                                "--default-max-new-tokens",
                                                                "8",
                                                                "--drain-seconds",
                                                                "2"});
  ASSERT_TRUE(serve.ok()) << serve.status();
  // Serve announces its address once the coordinator serves, which it learns without a probe
  // that TLS would refuse: the first call is served.
  auto stub = v1::Generation::NewStub(TlsChannel((*serve)->port(), pki->ca));
  const Call ok = Generate(*stub, IdsRequest({1, 50, 60}, 8), Bearer(kToken));
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message() << (*serve)->StderrText();
  EXPECT_EQ(ok.tokens.size(), 8u);
  EXPECT_EQ(Generate(*stub, IdsRequest({1, 50, 60}, 8), "").status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  const Call over = Generate(*stub, IdsRequest({1, 50, 60}, 9), Bearer(kToken));
  EXPECT_EQ(over.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(over.status.error_message(), HasSubstr("max_new_tokens"));
  // Plaintext is refused: the public address speaks only TLS.
  auto plain = v1::Generation::NewStub(PlainChannel((*serve)->port()));
  EXPECT_EQ(Generate(*plain, IdsRequest({1, 50, 60}, 2), Bearer(kToken), 3000).status.error_code(),
            grpc::StatusCode::UNAVAILABLE);
  stub.reset();
  plain.reset();
  EXPECT_EQ((*serve)->Terminate(), 0) << (*serve)->StderrText();
}

}  // namespace
}  // namespace specd
