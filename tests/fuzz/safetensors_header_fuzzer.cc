// libFuzzer target: ParseSafetensorsHeader must never crash, and whatever it accepts must satisfy
// the format's invariants (tensors contiguous, sizes matching shapes, data section covered).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/model/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using specd::fuzz::Check;

constexpr char kFile[] = "fuzz.safetensors";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<specd::SafetensorsHeader> header =
      specd::ParseSafetensorsHeader(bytes, kFile);
  if (!header.ok()) {
    // Every rejection names the file.
    Check(header.status().message().find(kFile) != absl::string_view::npos);
    return 0;
  }
  Check(header->data_start >= 8 && header->data_start <= size);
  uint64_t covered = 0;
  for (const specd::SafetensorsTensor& t : header->tensors) {
    Check(t.data_begin == covered);
    int64_t numel = 1;
    for (const int64_t d : t.shape) {
      Check(d >= 0);
      numel *= d;
    }
    Check(numel == t.numel);
    Check(t.data_end - t.data_begin ==
          static_cast<uint64_t>(numel) * specd::SafetensorsDTypeSize(t.dtype));
    Check(header->Find(t.name) == &t);
    const std::string_view tensor_bytes = header->TensorBytes(bytes, t);
    Check(tensor_bytes.size() == t.data_end - t.data_begin);
    if (!tensor_bytes.empty()) {
      // Touch both ends so ASan sees any out-of-bounds view.
      volatile char first = tensor_bytes.front();
      volatile char last = tensor_bytes.back();
      (void)first;
      (void)last;
    }
    covered = t.data_end;
  }
  Check(header->data_start + covered == size);
  return 0;
}
