// --listen parsing shared by the three services: TCP host:port and gRPC's Unix socket forms.
#include "services/common/listen_address.h"

#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace specd {
namespace {

TEST(ListenAddress, TcpKeepsHostAndBindsThePortGrpcPicked) {
  const absl::StatusOr<ListenAddress> a = ParseListenAddress("listen", "0.0.0.0:0");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->unix_socket);
  EXPECT_EQ(a->grpc, "0.0.0.0:0");
  EXPECT_EQ(a->host, "0.0.0.0");
  EXPECT_EQ(a->metrics_host, "0.0.0.0");
  EXPECT_EQ(a->Bound(43210), "0.0.0.0:43210");
  const absl::StatusOr<ListenAddress> v6 = ParseListenAddress("listen", "[::1]:50051");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "[::1]");
  EXPECT_EQ(v6->Bound(50051), "[::1]:50051");
}

// civetweb (under prometheus-cpp) is built without IPv6 on Debian, so an IPv6 service serves
// /metrics on IPv4: every interface for every interface, else loopback.
TEST(ListenAddress, AnIpv6ServiceServesMetricsOnIpv4) {
  for (const auto& [given, metrics] : std::vector<std::pair<std::string, std::string>>{
           {"[::]:7002", "0.0.0.0"}, {"[::1]:7002", "127.0.0.1"}, {"[fd00::2]:0", "127.0.0.1"}}) {
    const absl::StatusOr<ListenAddress> a = ParseListenAddress("listen", given);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->Bound(7002), given.substr(0, given.rfind(':')) + ":7002");
    EXPECT_EQ(a->metrics_host, metrics) << given;
  }
}

TEST(ListenAddress, UnixSocketsAreDialledAsGivenAndServeMetricsOnLoopback) {
  for (const char* given : {"unix:/tmp/specd/target.sock", "unix-abstract:specd-target"}) {
    const absl::StatusOr<ListenAddress> a = ParseListenAddress("listen", given);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(a->unix_socket);
    EXPECT_EQ(a->grpc, given);
    EXPECT_EQ(a->host, "127.0.0.1");
    EXPECT_EQ(a->metrics_host, "127.0.0.1");
    EXPECT_EQ(a->Bound(1), given);  // gRPC reports port 1 for a Unix socket
  }
}

TEST(ListenAddress, AnythingElseIsInvalidArgumentNamingTheFlag) {
  for (const char* bad : {"localhost", "127.0.0.1:", ":50051", "127.0.0.1:http", "host:70000",
                          "host:-1", "unix:", "unix-abstract:"}) {
    const absl::StatusOr<ListenAddress> a = ParseListenAddress("listen", bad);
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(a.status().message().find("--listen"), absl::string_view::npos) << a.status();
    EXPECT_NE(a.status().message().find(bad), absl::string_view::npos) << a.status();
  }
}

}  // namespace
}  // namespace specd
