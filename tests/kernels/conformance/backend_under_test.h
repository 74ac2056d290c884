// The conformance suite's view of a back end (in the spirit of ggml's test-backend-ops): every
// available back end, made by the same factory the engine uses, and a small helper that moves
// test data in and out of its memory through its own Upload/Download, with guard zones around
// every output so an out-of-bounds write shows.
#ifndef SPECD_TESTS_KERNELS_CONFORMANCE_BACKEND_UNDER_TEST_H_
#define SPECD_TESTS_KERNELS_CONFORMANCE_BACKEND_UNDER_TEST_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/kernels/cuda_emulation/emulated_cuda.h"

namespace specd::kernels::conformance {

struct BackendCase {
  std::string name;
  std::function<absl::StatusOr<std::unique_ptr<Backend>>()> make;
};

// The CPU back end with each of its kernel tables (2 threads, so the thread pool is exercised),
// the CUDA back end, and the CUDA back end over the CUDA emulator. Cases this machine or build
// cannot run skip with the factory's reason.
inline std::vector<BackendCase> AllBackends() {
  std::vector<BackendCase> cases;
  for (const cpu::CpuIsa isa : {cpu::CpuIsa::kScalar, cpu::CpuIsa::kAvx2, cpu::CpuIsa::kAvx512}) {
    cases.push_back({std::string("cpu_") + std::string(cpu::CpuIsaName(isa)),
                     [isa] { return CreateCpuBackendWithIsa(2, isa); }});
  }
  cases.push_back({"cuda", [] {
                     BackendOptions options;
                     options.kind = BackendKind::kCuda;
                     return CreateBackend(options);
                   }});
  // The same CUDA code over the emulator, so that it runs where no GPU is (CI).
  cases.push_back(
      {"cuda_emulated", [] { return CreateEmulatedCudaBackend(CudaBackendOptions()); }});
  return cases;
}

// Test data in a back end's memory. Every array sits between two guard zones of a sentinel byte
// pattern. Outputs start as NaN (all bits set) when they are floats and as the sentinel
// otherwise, so an element an op forgets to write shows up as a NaN, which no comparison passes,
// or as an absurd value.
class Device {
 public:
  static constexpr int64_t kGuardBytes = 256;
  static constexpr uint8_t kSentinel = 0xa5;
  static constexpr uint8_t kUnwrittenFloat = 0xff;

  explicit Device(Backend& backend) : backend_(backend) {}

  // A copy of `host` in back-end memory.
  template <typename T>
  T* Put(const std::vector<T>& host) {
    return static_cast<T*>(
        Place(host.data(), static_cast<int64_t>(host.size() * sizeof(T)), kSentinel));
  }
  // `n` elements of unwritten output.
  template <typename T>
  T* Output(int64_t n) {
    return static_cast<T*>(Place(nullptr, n * static_cast<int64_t>(sizeof(T)),
                                 std::is_floating_point_v<T> ? kUnwrittenFloat : kSentinel));
  }
  // `n` elements read back (synchronizes).
  template <typename T>
  std::vector<T> Get(const T* device, int64_t n) {
    std::vector<T> out(static_cast<size_t>(n));
    if (n == 0) return out;
    const int64_t bytes = n * static_cast<int64_t>(sizeof(T));
    absl::StatusOr<Buffer> staging = backend_.Allocate(bytes, MemoryKind::kStaging, "test read");
    EXPECT_TRUE(staging.ok()) << staging.status();
    if (!staging.ok()) return out;
    EXPECT_TRUE(backend_.Download(staging->data(), device, bytes).ok());
    const absl::Status sync = backend_.Synchronize();
    EXPECT_TRUE(sync.ok()) << sync;
    std::memcpy(out.data(), staging->data(), static_cast<size_t>(bytes));
    return out;
  }

  // Every guard zone still holds the sentinel.
  ::testing::AssertionResult GuardsIntact() {
    for (size_t i = 0; i < buffers_.size(); ++i) {
      const Buffer& b = buffers_[i];
      const std::vector<uint8_t> all = Get(b.as<const uint8_t>(), b.bytes());
      for (int64_t at = 0; at < b.bytes(); ++at) {
        const bool guard = at < kGuardBytes || at >= b.bytes() - kGuardBytes;
        if (guard && all[static_cast<size_t>(at)] != kSentinel) {
          return ::testing::AssertionFailure()
                 << "array " << i << ": write outside its " << b.bytes() - 2 * kGuardBytes
                 << " bytes, at offset " << at - kGuardBytes;
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  void* Place(const void* host, int64_t bytes, uint8_t payload_fill) {
    const int64_t total = bytes + 2 * kGuardBytes;
    absl::StatusOr<Buffer> buffer = backend_.Allocate(total, MemoryKind::kScratch, "test array");
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    if (!buffer.ok()) return nullptr;
    std::vector<uint8_t> image(static_cast<size_t>(total), kSentinel);
    if (host != nullptr && bytes > 0) {
      std::memcpy(image.data() + kGuardBytes, host, bytes);
    } else {
      std::fill_n(image.begin() + kGuardBytes, bytes, payload_fill);
    }
    absl::StatusOr<Buffer> staging = backend_.Allocate(total, MemoryKind::kStaging, "test write");
    EXPECT_TRUE(staging.ok()) << staging.status();
    if (!staging.ok()) return nullptr;
    std::memcpy(staging->data(), image.data(), image.size());
    EXPECT_TRUE(backend_.Upload(buffer->data(), staging->data(), total).ok());
    EXPECT_TRUE(backend_.Synchronize().ok());
    void* payload = buffer->as<uint8_t>() + kGuardBytes;
    buffers_.push_back(*std::move(buffer));
    return payload;
  }

  Backend& backend_;
  std::vector<Buffer> buffers_;
};

// Fixture base: one back end per parameter, skipped with its factory's reason when absent.
class BackendTest : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> backend = GetParam().make();
    if (!backend.ok()) GTEST_SKIP() << GetParam().name << " is absent: " << backend.status();
    backend_ = *std::move(backend);
    device_ = std::make_unique<Device>(*backend_);
  }
  void TearDown() override {
    if (device_ != nullptr) {
      EXPECT_TRUE(device_->GuardsIntact());
    }
  }

  Backend& backend() { return *backend_; }
  Device& device() { return *device_; }
  // A call's verdict on its arguments: its own status, or, where the back end checks them on the
  // device (CUDA reports a bad index at the next Synchronize), that Synchronize's.
  absl::Status Checked(const absl::Status& launched) {
    return launched.ok() ? backend_->Synchronize() : launched;
  }
  // The one back end every other is compared with where no closed form exists.
  bool IsCpu() const { return GetParam().name.rfind("cpu_", 0) == 0; }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Device> device_;
  std::mt19937 rng_{20261123};
};

// A bad call's status as every back end must return it: INVALID_ARGUMENT with exactly `message`
// (the checks of kernels/validate.h, which every back end shares).
inline ::testing::AssertionResult IsInvalidArgument(const absl::Status& status,
                                                    absl::string_view message) {
  if (status.code() == absl::StatusCode::kInvalidArgument && status.message() == message) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "got " << status << ", want INVALID_ARGUMENT: " << message;
}

inline std::string CaseName(const ::testing::TestParamInfo<BackendCase>& info) {
  return info.param.name;
}

// Batches that put row `r` of `n` rows alone, and at different positions among 1..63 others,
// for the invariance checks. Each batch lists row indices in the order they are fed.
inline std::vector<std::vector<int>> InvarianceBatches(int n, int r, std::mt19937& rng) {
  std::vector<std::vector<int>> batches = {{r}};
  for (const int size : {2, 5, 17, 64}) {
    if (size > n) break;
    std::vector<int> others;
    for (int i = 0; i < n; ++i) {
      if (i != r) others.push_back(i);
    }
    std::shuffle(others.begin(), others.end(), rng);
    others.resize(static_cast<size_t>(size - 1));
    const int at = std::uniform_int_distribution<int>(0, size - 1)(rng);
    others.insert(others.begin() + at, r);
    batches.push_back(others);
  }
  return batches;
}

}  // namespace specd::kernels::conformance

#endif  // SPECD_TESTS_KERNELS_CONFORMANCE_BACKEND_UNDER_TEST_H_
