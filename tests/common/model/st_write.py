#!/usr/bin/python3
"""Independent safetensors writer for specd's model-loading tests (numpy + json + struct only).

It follows the format description at https://github.com/huggingface/safetensors and never uses
specd code, so files it writes are a reference for specd's reader.

  st_write.py files SPEC.json OUT_DIR
      SPEC: {"files": {"name.safetensors": [{"name", "dtype", "shape"}...]},
             "metadata": {...} (optional), "index": {tensor: file} (optional)}
      Tensors are laid out in the order listed (the test controls alignment).
  st_write.py llama OUT_DIR [--shards N] [--dtype D] [--set NAME=DTYPE] [--omit NAME]
                            [--shape NAME=d0,d1] [--lm-head]
      Writes a Llama checkpoint for OUT_DIR/config.json (already there) with Hugging Face
      tensor names and shapes, as transformers' LlamaForCausalLM defines them.

Both write OUT_DIR/manifest.json: {name: {"dtype", "shape", "file", "hex", "values"}} where
"hex" is the tensor's little-endian bytes and "values" (float dtypes) the numbers they encode.
"""
import json
import struct
import sys

import numpy as np

NUMPY_DTYPES = {
    "BOOL": "|b1", "U8": "|u1", "I8": "|i1", "I16": "<i2", "U16": "<u2", "F16": "<f2",
    "BF16": "<u2", "I32": "<i4", "U32": "<u4", "F32": "<f4", "F64": "<f8", "I64": "<i8",
    "U64": "<u8", "F8_E4M3": "|u1", "F8_E5M2": "|u1",
}


def make_tensor(rng, dtype, shape):
    """Random data of `dtype`; returns (raw bytes, decoded float values or None)."""
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if dtype in ("F32", "F16", "F64"):
        a = rng.standard_normal(n).astype(NUMPY_DTYPES[dtype])
        return a.tobytes(), a.astype(np.float64).tolist()
    if dtype == "BF16":
        # bfloat16 is the upper half of a float32.
        f = rng.standard_normal(n).astype("<f4")
        hi = (f.view("<u4") >> 16).astype("<u2")
        values = (hi.astype("<u4") << 16).view("<f4").astype(np.float64).tolist()
        return hi.tobytes(), values
    if dtype == "BOOL":
        return rng.integers(0, 2, n).astype("|b1").tobytes(), None
    info = np.iinfo(np.dtype(NUMPY_DTYPES[dtype]))
    a = rng.integers(info.min, info.max, n, dtype=np.dtype(NUMPY_DTYPES[dtype]), endpoint=True)
    return a.tobytes(), None


def write_file(path, tensors, metadata):
    """tensors: list of (name, dtype, shape, raw bytes), written in this order."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, raw in tensors:
            f.write(raw)


def write_all(out_dir, files, metadata, index, seed=1234):
    rng = np.random.default_rng(seed)
    manifest = {}
    for file_name, specs in files.items():
        tensors = []
        for spec in specs:
            raw, values = make_tensor(rng, spec["dtype"], spec["shape"])
            tensors.append((spec["name"], spec["dtype"], spec["shape"], raw))
            manifest[spec["name"]] = {"dtype": spec["dtype"], "shape": spec["shape"],
                                      "file": file_name, "hex": raw.hex(), "values": values}
        write_file(f"{out_dir}/{file_name}", tensors, metadata)
    if index is not None:
        with open(f"{out_dir}/model.safetensors.index.json", "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": index}, f, indent=2)
    with open(f"{out_dir}/manifest.json", "w") as f:
        json.dump(manifest, f)


def llama_tensors(cfg, with_lm_head):
    """(name, shape) of LlamaForCausalLM's parameters, as transformers names them."""
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    inter = cfg["intermediate_size"]
    vocab = cfg["vocab_size"]
    out = [("model.embed_tokens.weight", [vocab, hidden])]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", [heads * head_dim, hidden]),
            (p + "self_attn.k_proj.weight", [kv_heads * head_dim, hidden]),
            (p + "self_attn.v_proj.weight", [kv_heads * head_dim, hidden]),
            (p + "self_attn.o_proj.weight", [hidden, heads * head_dim]),
            (p + "mlp.gate_proj.weight", [inter, hidden]),
            (p + "mlp.up_proj.weight", [inter, hidden]),
            (p + "mlp.down_proj.weight", [hidden, inter]),
            (p + "input_layernorm.weight", [hidden]),
            (p + "post_attention_layernorm.weight", [hidden]),
        ]
    out.append(("model.norm.weight", [hidden]))
    if with_lm_head or not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", [vocab, hidden]))
    return out


def llama(out_dir, args):
    shards, dtype, overrides, omit, shapes, lm_head = 1, "F32", {}, set(), {}, False
    i = 0
    while i < len(args):
        flag = args[i]
        if flag == "--lm-head":
            lm_head = True
            i += 1
            continue
        value = args[i + 1]
        i += 2
        if flag == "--shards":
            shards = int(value)
        elif flag == "--dtype":
            dtype = value
        elif flag == "--set":
            name, d = value.split("=")
            overrides[name] = d
        elif flag == "--omit":
            omit.add(value)
        elif flag == "--shape":
            name, dims = value.split("=")
            shapes[name] = [int(d) for d in dims.split(",")]
        else:
            sys.exit(f"unknown flag {flag}")
    with open(f"{out_dir}/config.json") as f:
        cfg = json.load(f)
    specs = [{"name": n, "shape": shapes.get(n, s), "dtype": overrides.get(n, dtype)}
             for n, s in llama_tensors(cfg, lm_head) if n not in omit]
    # Wider dtypes first keeps every tensor aligned, as the reference writer arranges.
    width = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4}
    specs.sort(key=lambda s: -width.get(s["dtype"], 2 if s["dtype"] in ("F16", "BF16") else 1))
    if shards == 1:
        write_all(out_dir, {"model.safetensors": specs}, {"format": "pt"}, None)
        return
    files = {}
    index = {}
    for k in range(shards):
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        files[name] = specs[k::shards]
        for s in files[name]:
            index[s["name"]] = name
    write_all(out_dir, files, {"format": "pt"}, index)


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "files":
        with open(sys.argv[2]) as f:
            spec = json.load(f)
        write_all(sys.argv[3], spec["files"], spec.get("metadata"), spec.get("index"))
    elif len(sys.argv) >= 3 and sys.argv[1] == "llama":
        llama(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
