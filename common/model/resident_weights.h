// Moves a model's weight matrices from the file mapping into one anonymous mapping aligned to
// 2 MiB with transparent huge pages requested. Decode streams every weight once per token, and on
// 4 KiB file pages the TLB misses cost a large share of the memory bandwidth (measured here:
// about 19 GB/s from file pages against about 33 GB/s from huge pages).
#ifndef SPECD_COMMON_MODEL_RESIDENT_WEIGHTS_H_
#define SPECD_COMMON_MODEL_RESIDENT_WEIGHTS_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "common/model/weights.h"

namespace specd {

// An anonymous private mapping, unmapped on destruction.
class AnonymousMapping {
 public:
  // RESOURCE_EXHAUSTED when the memory cannot be had.
  static absl::StatusOr<std::unique_ptr<AnonymousMapping>> Create(size_t bytes);
  ~AnonymousMapping();
  AnonymousMapping(const AnonymousMapping&) = delete;
  AnonymousMapping& operator=(const AnonymousMapping&) = delete;

  char* data() const { return aligned_; }
  size_t size() const { return size_; }

 private:
  AnonymousMapping(void* base, size_t mapped, char* aligned, size_t size)
      : base_(base), mapped_(mapped), aligned_(aligned), size_(size) {}
  void* base_;
  size_t mapped_;
  char* aligned_;
  size_t size_;
};

// Copies every matrix of `weights` into a fresh AnonymousMapping (a tied classifier is copied
// once), re-points the views, and releases the checkpoint's file mapping.
absl::Status MakeWeightsResident(ModelWeights* weights);

}  // namespace specd

#endif  // SPECD_COMMON_MODEL_RESIDENT_WEIGHTS_H_
