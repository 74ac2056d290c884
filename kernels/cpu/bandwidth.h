// Peak read bandwidth of this machine, so decode throughput can be stated as a fraction of the
// memory-bandwidth bound (tokens/s <= bandwidth / bytes of weights read per token).
#ifndef SPECD_KERNELS_CPU_BANDWIDTH_H_
#define SPECD_KERNELS_CPU_BANDWIDTH_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace specd::kernels {

namespace cpu {
class ThreadPool;
}  // namespace cpu

// Reads a `bytes`-byte buffer (choose one well beyond the last-level cache, e.g. 1 GiB) with
// `num_threads` threads of the CPU back end's thread pool and its fastest SIMD loads, and returns
// the best of a few runs in GB/s (1e9 bytes per second). num_threads <= 0 means one per CPU.
// Every byte is summed into a result the program keeps, so no read can be optimised away.
// Returns 0 when the buffer or the threads cannot be had, or when bytes < 4096.
double MeasureReadBandwidthGBps(int num_threads, size_t bytes);

// The same measurement, one pass at a time over a buffer and threads kept between passes, so a
// benchmark can interleave it with its own passes and compare the two under the same load.
class ReadBandwidthProbe {
 public:
  // bytes is rounded down to whole 4 KiB pages and must leave at least one.
  static absl::StatusOr<std::unique_ptr<ReadBandwidthProbe>> Create(int num_threads, size_t bytes);

  ~ReadBandwidthProbe();
  ReadBandwidthProbe(const ReadBandwidthProbe&) = delete;
  ReadBandwidthProbe& operator=(const ReadBandwidthProbe&) = delete;

  // Reads the whole buffer once; GB/s of that pass.
  double MeasureOnceGBps();

  // Reads [data, data + n_bytes) once the same way and returns a sum of its bytes. Lets a
  // benchmark time plain reads of the very memory its kernel reads: on a virtual machine two
  // buffers can sit on host memory of different speed.
  uint64_t Read(const void* data, size_t n_bytes);

  size_t bytes() const { return bytes_; }

 private:
  struct FreeDeleter {
    void operator()(char* p) const;
  };

  ReadBandwidthProbe(std::unique_ptr<cpu::ThreadPool> pool,
                     std::unique_ptr<char, FreeDeleter> buffer, size_t bytes);

  std::unique_ptr<cpu::ThreadPool> pool_;
  std::unique_ptr<char, FreeDeleter> buffer_;
  size_t bytes_;
};

}  // namespace specd::kernels

#endif  // SPECD_KERNELS_CPU_BANDWIDTH_H_
