#!/usr/bin/python3
"""numpy float32 reference for RoPE inverse frequencies, written from Hugging Face transformers'
`_compute_default_rope_parameters` and `_compute_llama3_parameters`
(transformers/modeling_rope_utils.py) and independent of specd's C++.

  rope_reference.py CASES.json   CASES: [{"head_dim", "rope_theta", "rope_scaling": null or
                                          {"factor", "low_freq_factor", "high_freq_factor",
                                           "original_max_position_embeddings"}}]
prints [[float32 bit patterns of inv_freq] per case].

torch evaluates these in float32 tensors, where a Python scalar is rounded to float32 when it meets
a tensor and `scalar / tensor` is Tensor.__rtruediv__, i.e. `tensor.reciprocal() * scalar`.
The comments give the transformers line each step reproduces.

`base ** exponent` is the one step that is not a basic IEEE operation. numpy's float32 power is
not correctly rounded (on this machine it differs from the exactly rounded float32 result in
about 1 of 6 entries, torch's SIMD pow may differ too), so the reference takes the correctly
rounded float32 power: the float64 power of the float32 operands, rounded once to float32.
Every other step is a float32 +, -, *, / or comparison, reproducible to the last bit.
"""
import json
import math
import sys

import numpy as np

f32 = np.float32


def rdiv(scalar, tensor):
    """torch's `scalar / tensor`."""
    return np.reciprocal(tensor) * f32(scalar)


def inv_freq_default(head_dim, base):
    # inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(f32) / f32(head_dim)
    power = np.power(np.float64(f32(base)), exponent.astype(np.float64)).astype(f32)
    return rdiv(1.0, power)


def inv_freq_llama3(inv_freq, s):
    factor = s["factor"]
    low_freq_factor = s["low_freq_factor"]
    high_freq_factor = s["high_freq_factor"]
    old_context_len = s["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor    # Python floats
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = rdiv(2 * math.pi, inv_freq)
    # inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    inv_freq_llama = np.where(wavelen > f32(low_freq_wavelen), inv_freq / f32(factor), inv_freq)
    # smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smooth_factor = (rdiv(old_context_len, wavelen) - f32(low_freq_factor)) / f32(
        high_freq_factor - low_freq_factor)
    # smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    smoothed = (f32(1) - smooth_factor) * inv_freq_llama / f32(factor) + smooth_factor * inv_freq_llama
    # is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    is_medium = ~(wavelen < f32(high_freq_wavelen)) & ~(wavelen > f32(low_freq_wavelen))
    return np.where(is_medium, smoothed, inv_freq_llama).astype(f32)


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    out = []
    for case in cases:
        inv = inv_freq_default(case["head_dim"], case["rope_theta"]).astype(f32)
        if case.get("rope_scaling"):
            inv = inv_freq_llama3(inv, case["rope_scaling"])
        assert inv.dtype == f32
        out.append(inv.view(np.uint32).tolist())
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
