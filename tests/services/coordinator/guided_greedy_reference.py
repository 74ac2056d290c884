#!/usr/bin/python3
"""Greedy classifier-free guidance decoded by an independent numpy reference.

Each case is "SCALE COND_IDS UNCOND_IDS" (ids comma-separated), one per line of CASES. For each,
the next token is the argmax of the guided logits u + s * (c - u) (tests/reference/cfg_ref.py:
two llama_ref passes combined in float64) of the conditional and the unconditional text, each
followed by the tokens generated so far, with the lowest id on ties. Alongside each token it
writes the gap between the best and the second-best guided logit, relative to the row's largest
magnitude, so a caller can tell a decision that fp32 rounding could flip. Nothing here comes
from specd's C++.

usage: guided_greedy_reference.py MODEL_DIR CASES N OUT
writes one line per case: N tokens, then N relative gaps, space-separated.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "reference"))

import cfg_ref  # noqa: E402
import llama_ref  # noqa: E402


def main():
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    model = llama_ref.Model(sys.argv[1])
    n = int(sys.argv[3])
    lines = []
    with open(sys.argv[2]) as f:
        for line in f:
            if not line.strip():
                continue
            scale, cond, uncond = line.split()
            cond, uncond = cfg_ref.parse_ids(cond), cfg_ref.parse_ids(uncond)
            gen, gaps = [], []
            for _ in range(n):
                row = cfg_ref.guided_logits(model, cond, uncond, gen, float(scale))[-1]
                best = int(np.argmax(row))
                second = np.max(np.delete(row, best))
                gaps.append((row[best] - second) / np.max(np.abs(row)))
                gen.append(best)
            lines.append(" ".join([str(t) for t in gen] + [repr(float(g)) for g in gaps]))
    with open(sys.argv[4], "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
