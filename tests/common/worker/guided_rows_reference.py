#!/usr/bin/python3
"""Independent numpy reference of a guided sequence's processed rows, for the worker's tests.

Row j is the processed distribution (tests/kernels/cpu/processed_reference.py) of the guided
logits u + s * (c - u) (tests/reference/cfg_ref.py: llama_ref on both texts, combined in float64)
of the token after COND + GEN[:j], with the penalties over the conditional text alone: COND is
the prompt, GEN[:j] the output. Nothing here comes from specd's C++.

With a last argument "raw", row j is instead the log-softmax of the penalised guided logits
(before temperature): the raw logprobs a guided Verify reports.

usage: guided_rows_reference.py MODEL_DIR OUT.f64 SCALE TEMPERATURE REPETITION PRESENCE FREQUENCY
           COND_IDS UNCOND_IDS GEN_IDS [raw]      (ids comma-separated; GEN_IDS may be "")
writes [len(GEN) + 1, vocab] float64 little endian.
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
    if len(sys.argv) not in (11, 12):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    model = llama_ref.Model(sys.argv[1])
    scale = float(sys.argv[3])
    params = processed_reference.params(
        temperature=float(sys.argv[4]),
        repetition_penalty=float(sys.argv[5]),
        presence_penalty=float(sys.argv[6]),
        frequency_penalty=float(sys.argv[7]),
    )
    cond, uncond = cfg_ref.parse_ids(sys.argv[8]), cfg_ref.parse_ids(sys.argv[9])
    gen = cfg_ref.parse_ids(sys.argv[10])
    raw = len(sys.argv) == 12 and sys.argv[11] == "raw"
    guided = cfg_ref.guided_logits(model, cond, uncond, gen, scale)
    rows = []
    for j in range(len(gen) + 1):
        if raw:
            w = processed_reference.penalized(
                guided[j].astype(np.float32),
                params,
                np.array(cond, dtype=np.int64),
                np.array(gen[:j], dtype=np.int64),
            ).astype(np.float64)
            rows.append(w - w.max() - np.log(np.exp(w - w.max()).sum()))
            continue
        probs, _, _ = processed_reference.processed(
            guided[j].astype(np.float32),
            params,
            np.array(cond, dtype=np.int64),
            np.array(gen[:j], dtype=np.int64),
        )
        rows.append(probs.astype(np.float64))
    np.array(rows).astype("<f8").tofile(sys.argv[2])


if __name__ == "__main__":
    main()
