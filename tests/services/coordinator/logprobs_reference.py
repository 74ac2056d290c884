#!/usr/bin/python3
"""Independent numpy reference of the logprobs specd reports (issue 15), for the logprobs tests.

For a prompt and the tokens a request generated, and each generated token t_j:
  raw:       log_softmax(penalized logits) of the target at its position, in float64 (vLLM's
             default logprobs: after the penalties, before temperature and truncation);
  processed: log(p_j(t_j)) of the target's processed distribution, -inf where it is 0.
The logits come from tests/reference/llama_ref.py (a float64 numpy forward pass written from
transformers' definition) and the penalties and the processed distribution from
tests/kernels/cpu/processed_reference.py. Nothing here comes from specd's C++, and the draft
model plays no part: the reference is the target alone.

usage: logprobs_reference.py MODEL_DIR REQUEST.json OUT.json
REQUEST: {"prompt": [ids], "output": [ids], "params": {temperature, top_k, top_p, min_p,
          repetition_penalty, presence_penalty, frequency_penalty}}
OUT: {"raw": [[V floats] per output token], "processed": [[V floats] per output token]}
     (-inf written as null)
"""
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "reference"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "kernels", "cpu"))

import llama_ref  # noqa: E402
import processed_reference  # noqa: E402


def log_softmax(w):
    w = w.astype(np.float64)
    m = np.max(w)
    return (w - m) - math.log(math.fsum(np.exp(w - m).tolist()))


def as_json(row):
    return [None if not np.isfinite(x) else float(x) for x in row]


def main():
    model_dir, request_path, out_path = sys.argv[1:4]
    with open(request_path) as f:
        request = json.load(f)
    prompt = [int(t) for t in request["prompt"]]
    output = [int(t) for t in request["output"]]
    params = processed_reference.params(**request["params"])
    logits = llama_ref.Model(model_dir).logits(prompt + output).astype(np.float32)
    raw, processed = [], []
    prompt_arr = np.array(prompt, dtype=np.int64)
    for j in range(len(output)):
        row = logits[len(prompt) - 1 + j]
        history = np.array(output[:j], dtype=np.int64)
        w = processed_reference.penalized(row, params, prompt_arr, history)
        raw.append(as_json(log_softmax(w)))
        probs, _, _ = processed_reference.processed(row, params, prompt_arr, history)
        with np.errstate(divide="ignore"):
            processed.append(as_json(np.log(probs.astype(np.float64))))
    with open(out_path, "w") as f:
        json.dump({"raw": raw, "processed": processed}, f)


if __name__ == "__main__":
    main()
