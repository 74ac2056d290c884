// A fingerprint of a checkpoint's tensors, so that a coordinator notices a target worker that
// restarted on other weights under the same directory name and config.json (a fine-tune copied
// over the old one): sequences it held would replay onto numbers another model began.
#ifndef SPECD_SERVICES_COMMON_WEIGHTS_FINGERPRINT_H_
#define SPECD_SERVICES_COMMON_WEIGHTS_FINGERPRINT_H_

#include <string>

#include "common/model/checkpoint.h"

namespace specd {

// SHA-256 (lowercase hex) over every tensor, in name order: its name, dtype and shape, and its
// bytes, all of them for a tensor of up to 64 KiB and 16 evenly spaced windows of 4 KiB for a
// larger one. Sampling keeps it to milliseconds on a checkpoint of gigabytes, whose pages the
// load has just read; it tells apart any two checkpoints that differ throughout a tensor
// (retrained, fine-tuned, merged, requantised), not an edit of a few weights. Independent of how
// the tensors are split into shard files.
std::string WeightsFingerprint(const Checkpoint& checkpoint);

}  // namespace specd

#endif  // SPECD_SERVICES_COMMON_WEIGHTS_FINGERPRINT_H_
