#!/usr/bin/python3
"""Independent safetensors reader for specd's writer tests (numpy + json + struct only).

  st_read.py FILE   prints JSON: {"header_bytes", "order", "metadata",
                                  "tensors": {name: {"dtype", "shape", "data_offsets", "hex",
                                                     "values"}}}
It checks what the format and the reference writer guarantee and exits non-zero otherwise: the
header is UTF-8 JSON padded with spaces to a multiple of 8 bytes, tensors are contiguous and
cover the data section exactly, and each byte range matches its shape and dtype.
"""
import json
import struct
import sys

import numpy as np

SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4,
         "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def decode(dtype, raw):
    if dtype == "F32":
        return np.frombuffer(raw, "<f4").astype(np.float64).tolist()
    if dtype == "F16":
        return np.frombuffer(raw, "<f2").astype(np.float64).tolist()
    if dtype == "F64":
        return np.frombuffer(raw, "<f8").tolist()
    if dtype == "BF16":
        hi = np.frombuffer(raw, "<u2").astype("<u4")
        return (hi << 16).view("<f4").astype(np.float64).tolist()
    return None


def unique_keys(pairs):
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"duplicate keys in {keys}"
    return dict(pairs)


def main():
    data = open(sys.argv[1], "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    assert 8 + n <= len(data), "header runs past the end"
    text = data[8:8 + n].decode("utf-8")
    assert n % 8 == 0, f"header length {n} is not a multiple of 8"
    stripped = text.rstrip(" ")
    assert stripped.endswith("}"), "header padding is not spaces"
    assert len(text) - len(stripped) < 8, "more padding than needed"
    header = json.loads(text, object_pairs_hook=unique_keys)  # dicts keep the file's order
    metadata = header.pop("__metadata__", None)
    order = list(header)
    body = data[8 + n:]
    out = {}
    expected_begin = 0
    for name in sorted(header, key=lambda k: tuple(header[k]["data_offsets"])):
        t = header[name]
        begin, end = t["data_offsets"]
        assert begin == expected_begin, f"{name} is not contiguous"
        numel = int(np.prod(t["shape"], dtype=np.int64)) if t["shape"] else 1
        assert end - begin == numel * SIZES[t["dtype"]], f"{name} size mismatch"
        raw = body[begin:end]
        out[name] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [begin, end],
                     "hex": raw.hex(), "values": decode(t["dtype"], raw)}
        expected_begin = end
    assert expected_begin == len(body), "data section not covered exactly"
    json.dump({"header_bytes": n, "order": order,
               "metadata": metadata, "tensors": out}, sys.stdout)


if __name__ == "__main__":
    main()
