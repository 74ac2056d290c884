#!/usr/bin/env python3
"""Independent numpy reference of the Llama forward pass, for testing specd's engine.

Written from the Hugging Face transformers LlamaForCausalLM definition (not from specd's C++):
it reads a Hugging Face checkpoint directory (config.json + model.safetensors or a sharded index)
with its own safetensors reader and computes the logits of every position in float64.

usage: llama_ref.py MODEL_DIR OUT.f32 TOKEN [TOKEN ...]
writes logits [len(tokens), vocab] as little-endian float32, row-major.
"""
import json
import math
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[base + begin : base + end]
        shape = info["shape"]
        dtype = info["dtype"]
        if dtype == "F32":
            arr = np.frombuffer(raw, dtype="<f4").astype(np.float64)
        elif dtype == "F16":
            arr = np.frombuffer(raw, dtype="<f2").astype(np.float64)
        elif dtype == "BF16":
            u16 = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u16.view(np.float32).astype(np.float64)
        else:
            raise ValueError(f"unsupported dtype {dtype} for {name}")
        out[name] = arr.reshape(shape)
    return out


def load_tensors(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(read_safetensors(os.path.join(model_dir, shard)))
        return tensors
    return read_safetensors(os.path.join(model_dir, "model.safetensors"))


def rope_inv_freq(cfg, head_dim):
    base = cfg.get("rope_theta", 10000.0)
    # transformers computes the default frequencies in float32.
    exps = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (np.float32(1.0) / (np.float32(base) ** exps)).astype(np.float32)
    scaling = cfg.get("rope_scaling")
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        assert kind == "llama3", kind
        factor = scaling["factor"]
        low = scaling["low_freq_factor"]
        high = scaling["high_freq_factor"]
        old_ctx = scaling["original_max_position_embeddings"]
        low_wavelen = old_ctx / low
        high_wavelen = old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = np.where(is_medium, smoothed, scaled).astype(np.float32)
    return inv_freq.astype(np.float64)


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def forward(model_dir, tokens):
    return Model(model_dir).logits(tokens)


class Model:
    """A checkpoint loaded once, for many forward passes."""

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        self.w = load_tensors(model_dir)

    def logits(self, tokens):
        return _forward(self.cfg, self.w, tokens)


def _forward(cfg, w, tokens):
    dim = cfg["hidden_size"]
    n_heads = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_heads)
    head_dim = cfg.get("head_dim") or dim // n_heads
    eps = cfg.get("rms_norm_eps", 1e-6)
    n_layers = cfg["num_hidden_layers"]
    T = len(tokens)

    x = w["model.embed_tokens.weight"][np.array(tokens)]
    inv_freq = rope_inv_freq(cfg, head_dim)
    positions = np.arange(T, dtype=np.float64)
    # transformers forms the angles in float32 as well.
    angles = (positions.astype(np.float32)[:, None] * inv_freq.astype(np.float32)[None, :]).astype(
        np.float64
    )
    emb = np.concatenate([angles, angles], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    mask = np.triu(np.full((T, T), -np.inf), k=1)

    for l in range(n_layers):
        p = f"model.layers.{l}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, n_heads, head_dim)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, n_kv, head_dim)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, n_kv, head_dim)
        q = q * cos[:, None, :] + rotate_half(q) * sin[:, None, :]
        k = k * cos[:, None, :] + rotate_half(k) * sin[:, None, :]
        group = n_heads // n_kv
        k = np.repeat(k, group, axis=1)
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / math.sqrt(head_dim) + mask[None]
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        att = np.einsum("hts,shd->thd", probs, v).reshape(T, n_heads * head_dim)
        x = x + att @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T

    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight")
    if head is None or cfg.get("tie_word_embeddings", False):
        head = w["model.embed_tokens.weight"]
    return x @ head.T


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    logits = forward(sys.argv[1], [int(t) for t in sys.argv[3:]])
    logits.astype("<f4").tofile(sys.argv[2])


if __name__ == "__main__":
    main()
