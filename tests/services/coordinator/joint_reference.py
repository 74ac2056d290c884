#!/usr/bin/python3
"""Closed-form joint distribution of the first three generated tokens, for the exactness test.

P(a, b, c) = p1(a) * p2(b | a) * p3(c | a, b), where each p is the target's processed distribution
(tests/kernels/cpu/processed_reference.py) of the logits of an independent numpy forward pass
(tests/reference/llama_ref.py). Nothing here comes from specd's C++.

usage: joint_reference.py MODEL_DIR OUT.f64 TEMPERATURE TOP_K TOP_P BIAS PROMPT_ID [PROMPT_ID ...]
BIAS is the logit bias as TOKEN:BIAS[,TOKEN:BIAS...] (ascending tokens), or - for none.
writes V^3 probabilities, float64 little endian, index a * V * V + b * V + c.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "reference"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "kernels", "cpu"))

import llama_ref  # noqa: E402
import processed_reference  # noqa: E402


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    params = processed_reference.params(
        temperature=float(sys.argv[3]), top_k=int(sys.argv[4]), top_p=float(sys.argv[5])
    )
    bias = []
    if sys.argv[6] != "-":
        for item in sys.argv[6].split(","):
            token, value = item.split(":")
            bias.append((int(token), float(value)))
    prompt = [int(t) for t in sys.argv[7:]]
    model = llama_ref.Model(model_dir)

    def dist(prefix):
        logits = model.logits(prefix)[-1].astype(np.float32)
        output = np.array(prefix[len(prompt):], dtype=np.int64)
        probs, _, _ = processed_reference.processed(
            logits, params, np.array(prompt, dtype=np.int64), output, bias
        )
        return probs.astype(np.float64)

    p1 = dist(prompt)
    v = p1.size
    joint = np.zeros((v, v, v))
    for a in np.flatnonzero(p1 > 0):
        p2 = dist(prompt + [int(a)])
        for b in np.flatnonzero(p2 > 0):
            p3 = dist(prompt + [int(a), int(b)])
            joint[a, b, :] = p1[a] * p2[b] * p3
    joint.astype("<f8").tofile(out)


if __name__ == "__main__":
    main()
