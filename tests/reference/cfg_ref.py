#!/usr/bin/env python3
"""Independent numpy reference of classifier-free guidance, for testing specd's guided requests.

Guidance (Sanchez et al. 2023, "Stay on topic with Classifier-Free Guidance") replaces the
logits c of the conditional text by u + s * (c - u), where u are the logits of the unconditional
text followed by the same generated tokens. Here c and u come from two forward passes of
llama_ref.py (written from transformers, not from specd's C++) and are combined in float64.

usage: cfg_ref.py MODEL_DIR OUT.f64 SCALE COND_IDS UNCOND_IDS [GEN_IDS]
  ids are comma-separated; GEN_IDS may be omitted or empty.
writes [len(GEN) + 1, vocab] float64 little endian: row j holds the guided logits of the token
that follows COND + GEN[:j] (and UNCOND + GEN[:j]).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import llama_ref  # noqa: E402


def guided_logits(model, cond, uncond, gen, scale):
    """Rows j = 0..len(gen): the guided logits after cond + gen[:j], float64."""
    c = model.logits(list(cond) + list(gen))[len(cond) - 1 :]
    u = model.logits(list(uncond) + list(gen))[len(uncond) - 1 :]
    return u + scale * (c - u)


def parse_ids(text):
    return [int(t) for t in text.split(",") if t != ""]


def main():
    if len(sys.argv) not in (6, 7):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    model = llama_ref.Model(sys.argv[1])
    scale = float(sys.argv[3])
    cond, uncond = parse_ids(sys.argv[4]), parse_ids(sys.argv[5])
    gen = parse_ids(sys.argv[6]) if len(sys.argv) == 7 else []
    guided_logits(model, cond, uncond, gen, scale).astype("<f8").tofile(sys.argv[2])


if __name__ == "__main__":
    main()
