#!/usr/bin/python3
"""Closed-form joint distribution of the first three tokens of a guided request.

P(a, b, c) = p1(a) * p2(b | a) * p3(c | a, b), where each p is the processed distribution
(tests/kernels/cpu/processed_reference.py; penalties over the conditional prompt and the output)
of the guided logits u + s * (c - u) of an independent numpy forward pass of the conditional and
the unconditional prompt, each followed by the generated tokens (tests/reference/cfg_ref.py).
Nothing here comes from specd's C++.

MIX = probs gives the distribution of the classic mistake instead: the probabilities mixed,
norm(max(0, pu + s * (pc - pu))) with pc and pu the processed distributions of c and u.

usage: guided_joint_reference.py MODEL_DIR OUT.f64 TEMPERATURE TOP_K TOP_P REPETITION_PENALTY
           SCALE MIX UNCOND_IDS PROMPT_IDS      (ids comma-separated)
writes V^3 probabilities, float64 little endian, index a * V * V + b * V + c.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "reference"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "kernels", "cpu"))

import cfg_ref  # noqa: E402
import llama_ref  # noqa: E402
import processed_reference  # noqa: E402


def main():
    if len(sys.argv) != 11:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    model_dir, out = sys.argv[1], sys.argv[2]
    params = processed_reference.params(
        temperature=float(sys.argv[3]),
        top_k=int(sys.argv[4]),
        top_p=float(sys.argv[5]),
        repetition_penalty=float(sys.argv[6]),
    )
    scale = float(sys.argv[7])
    mix = sys.argv[8]
    assert mix in ("logits", "probs"), mix
    uncond = cfg_ref.parse_ids(sys.argv[9])
    prompt = cfg_ref.parse_ids(sys.argv[10])
    model = llama_ref.Model(model_dir)

    def process(logits, gen):
        probs, _, _ = processed_reference.processed(
            logits.astype(np.float32), params, np.array(prompt, dtype=np.int64),
            np.array(gen, dtype=np.int64)
        )
        return probs.astype(np.float64)

    def dist(gen):
        if mix == "logits":
            return process(cfg_ref.guided_logits(model, prompt, uncond, gen, scale)[-1], gen)
        pc = process(model.logits(prompt + gen)[-1], gen)
        pu = process(model.logits(uncond + gen)[-1], gen)
        mixed = np.maximum(pu + scale * (pc - pu), 0.0)
        return mixed / mixed.sum()

    p1 = dist([])
    v = p1.size
    joint = np.zeros((v, v, v))
    for a in np.flatnonzero(p1 > 0):
        p2 = dist([int(a)])
        for b in np.flatnonzero(p2 > 0):
            p3 = dist([int(a), int(b)])
            joint[a, b, :] = p1[a] * p2[b] * p3
    joint.astype("<f8").tofile(out)


if __name__ == "__main__":
    main()
