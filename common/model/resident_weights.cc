#include "common/model/resident_weights.h"

#include <sys/mman.h>

#include <cstring>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"

namespace specd {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kAlign = 64;  // a cache line: every matrix starts on one

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t BytesOf(const kernels::WeightView& w) {
  return static_cast<size_t>(w.rows * w.cols * kernels::DTypeSize(w.dtype));
}

}  // namespace

absl::StatusOr<std::unique_ptr<AnonymousMapping>> AnonymousMapping::Create(size_t bytes) {
  const size_t size = RoundUp(std::max<size_t>(bytes, 1), kHugePage);
  // One extra huge page lets the usable range start on a 2 MiB boundary.
  const size_t mapped = size + kHugePage;
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", size >> 20, " MiB for the model weights: ", strerror(errno)));
  }
  char* aligned = reinterpret_cast<char*>(RoundUp(reinterpret_cast<uintptr_t>(base), kHugePage));
  // Advisory: without transparent huge pages the weights still work, only slower.
  (void)madvise(aligned, size, MADV_HUGEPAGE);
  return absl::WrapUnique(new AnonymousMapping(base, mapped, aligned, size));
}

AnonymousMapping::~AnonymousMapping() { munmap(base_, mapped_); }

absl::Status MakeWeightsResident(ModelWeights* weights) {
  std::vector<kernels::WeightView*> views = {&weights->embed, &weights->lm_head};
  for (LayerWeights& l : weights->layers) {
    for (kernels::WeightView* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      views.push_back(v);
    }
  }
  // A tied classifier shares the embedding's memory: copy each source once.
  absl::flat_hash_map<const void*, size_t> offset_of;
  size_t total = 0;
  for (const kernels::WeightView* v : views) {
    if (offset_of.contains(v->data)) continue;
    offset_of[v->data] = total;
    total = RoundUp(total + BytesOf(*v), kAlign);
  }
  absl::StatusOr<std::unique_ptr<AnonymousMapping>> memory = AnonymousMapping::Create(total);
  if (!memory.ok()) return memory.status();
  for (const auto& [src, offset] : offset_of) {
    for (const kernels::WeightView* v : views) {
      if (v->data != src) continue;
      std::memcpy((*memory)->data() + offset, src, BytesOf(*v));
      break;
    }
  }
  for (kernels::WeightView* v : views) v->data = (*memory)->data() + offset_of[v->data];
  weights->resident = *std::move(memory);
  weights->checkpoint.reset();  // nothing points into the file mapping any more
  return absl::OkStatus();
}

}  // namespace specd
