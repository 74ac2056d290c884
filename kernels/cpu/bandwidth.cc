#include "kernels/cpu/bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/math.h"
#include "base/status_macros.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/thread_pool.h"

namespace specd::kernels {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kChunkBytes = size_t{1} << 20;  // work unit handed to a thread
constexpr int kRuns = 5;

// Where the sums go: an atomic the compiler must assume someone reads.
std::atomic<uint64_t> g_read_sink{0};

int64_t ChunkCount(size_t bytes) {
  return CeilDiv(static_cast<int64_t>(bytes), static_cast<int64_t>(kChunkBytes));
}

}  // namespace

void ReadBandwidthProbe::FreeDeleter::operator()(char* p) const { std::free(p); }

absl::StatusOr<std::unique_ptr<ReadBandwidthProbe>> ReadBandwidthProbe::Create(int num_threads,
                                                                               size_t bytes) {
  bytes = bytes / kPage * kPage;
  if (bytes == 0) {
    return absl::InvalidArgumentError("ReadBandwidthProbe: bytes must be at least 4096");
  }
  if (num_threads <= 0) num_threads = cpu::AvailableCpuCount();
  SPECD_ASSIGN_OR_RETURN(std::unique_ptr<cpu::ThreadPool> pool,
                         cpu::ThreadPool::Create(num_threads));
  std::unique_ptr<char, FreeDeleter> buffer(static_cast<char*>(std::aligned_alloc(kPage, bytes)));
  if (buffer == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("ReadBandwidthProbe: cannot allocate ", bytes, " bytes"));
  }
  // Fault every page in (from the threads that will read it) before timing anything.
  char* const base = buffer.get();
  pool->ParallelFor(ChunkCount(bytes), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const size_t offset = static_cast<size_t>(c) * kChunkBytes;
      std::memset(base + offset, static_cast<int>(c & 0x7f) + 1,
                  std::min(kChunkBytes, bytes - offset));
    }
  });
  return absl::WrapUnique(new ReadBandwidthProbe(std::move(pool), std::move(buffer), bytes));
}

ReadBandwidthProbe::ReadBandwidthProbe(std::unique_ptr<cpu::ThreadPool> pool,
                                       std::unique_ptr<char, FreeDeleter> buffer, size_t bytes)
    : pool_(std::move(pool)), buffer_(std::move(buffer)), bytes_(bytes) {}

ReadBandwidthProbe::~ReadBandwidthProbe() = default;

uint64_t ReadBandwidthProbe::Read(const void* data, size_t n_bytes) {
  const cpu::SimdOps& ops = cpu::SimdOpsFor(cpu::BestCpuIsa());
  const char* const base = static_cast<const char*>(data);
  std::atomic<uint64_t> total{0};
  pool_->ParallelFor(ChunkCount(n_bytes), 1, [&](int64_t begin, int64_t end) {
    uint64_t sum = 0;
    for (int64_t c = begin; c < end; ++c) {
      const size_t offset = static_cast<size_t>(c) * kChunkBytes;
      sum += ops.read_sum(base + offset, std::min(kChunkBytes, n_bytes - offset));
    }
    total.fetch_add(sum, std::memory_order_relaxed);
  });
  return total.load(std::memory_order_relaxed);
}

double ReadBandwidthProbe::MeasureOnceGBps() {
  const auto start = std::chrono::steady_clock::now();
  g_read_sink.fetch_add(Read(buffer_.get(), bytes_), std::memory_order_relaxed);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return seconds > 0.0 ? static_cast<double>(bytes_) / seconds / 1e9 : 0.0;
}

double MeasureReadBandwidthGBps(int num_threads, size_t bytes) {
  auto probe = ReadBandwidthProbe::Create(num_threads, bytes);
  if (!probe.ok()) return 0.0;
  double best = 0.0;
  for (int run = 0; run < kRuns; ++run) best = std::max(best, (*probe)->MeasureOnceGBps());
  return best;
}

}  // namespace specd::kernels
