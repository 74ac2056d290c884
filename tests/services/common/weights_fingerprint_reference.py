#!/usr/bin/env python3
"""Independent reference for services/common/weights_fingerprint.h, from its documented rule.

usage: weights_fingerprint_reference.py MODEL_DIR  -> prints the lowercase hex SHA-256.

Reads model.safetensors, or model.safetensors.index.json and its shards, with the standard
library only (the safetensors header is 8 bytes of little-endian length, then JSON).
"""
import hashlib
import json
import os
import struct
import sys

WHOLE_TENSOR_BYTES = 64 << 10
WINDOWS = 16
WINDOW_BYTES = 4 << 10


def tensors(model_dir):
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        files = [single]
    else:
        with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
            files = sorted({os.path.join(model_dir, s) for s in json.load(f)["weight_map"].values()})
    out = {}
    for path in files:
        with open(path, "rb") as f:
            blob = f.read()
        (header_len,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8:8 + header_len])
        data = blob[8 + header_len:]
        for name, t in header.items():
            if name == "__metadata__":
                continue
            begin, end = t["data_offsets"]
            out[name] = (t["dtype"], t["shape"], data[begin:end])
    return out


def main():
    h = hashlib.sha256()

    def field(b):
        h.update(str(len(b)).encode() + b":")
        h.update(b)

    all_tensors = tensors(sys.argv[1])
    for name in sorted(all_tensors, key=lambda n: n.encode()):
        dtype, shape, data = all_tensors[name]
        field(name.encode())
        field(("%s[%s]" % (dtype, ",".join(str(d) for d in shape))).encode())
        if len(data) <= WHOLE_TENSOR_BYTES:
            field(data)
            continue
        last_start = len(data) - WINDOW_BYTES
        for i in range(WINDOWS):
            start = last_start * i // (WINDOWS - 1)
            field(data[start:start + WINDOW_BYTES])
    print(h.hexdigest())


if __name__ == "__main__":
    main()
