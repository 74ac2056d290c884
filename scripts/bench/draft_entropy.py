#!/usr/bin/python3
"""What EGAG sees on a synthetic pair: the early-exit draft's normalized entropy per position.

usage: draft_entropy.py MODEL_DIR EXIT_LAYER [TOKENS]   (run from the repository root)

Runs the engine's own forward pass (build/tools/bench/engine/engine_logits) for the target and
for its first EXIT_LAYER layers (the early-exit draft, through a copy of config.json), over a
story opening followed by the target's TOKENS greedy tokens (default 96), and prints, over the
greedy positions, the quantiles of H = H(softmax(draft logits)) / log V, the fraction where the
draft's argmax is the target's, and that agreement per quartile of H: whether H can tell EGAG
where the draft is unsure.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ENGINE_LOGITS = "build/tools/bench/engine/engine_logits"
TEXT = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the "
        "park with her friends.")


def logits(model, prompts, out):
    with open(os.path.join(out, "p.json"), "w") as f:
        json.dump({"prompts": [prompts]}, f)
    subprocess.check_call([ENGINE_LOGITS, "--model", model, "--prompts",
                           os.path.join(out, "p.json"), "--out", out, "--greedy", "0"])
    return np.fromfile(os.path.join(out, "logits_0.f32"), dtype=np.float32)


def main():
    model, exit_layer = sys.argv[1], int(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 96
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    vocab = config["vocab_size"]
    prompt = [int(t) for t in subprocess.check_output(
        ["build/tools/specd", "tokenize", "--model", model, "--text", TEXT]).split()]
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "p.json"), "w") as f:
            json.dump({"prompts": [prompt]}, f)
        subprocess.check_call([ENGINE_LOGITS, "--model", model, "--prompts",
                               os.path.join(tmp, "p.json"), "--out", tmp, "--greedy", str(n)])
        with open(os.path.join(tmp, "greedy.json")) as f:
            text = prompt + json.load(f)["tokens"][0]
        draft_dir = os.path.join(tmp, "draft")
        os.mkdir(draft_dir)
        for name in os.listdir(model):
            if name != "config.json":
                os.symlink(os.path.abspath(os.path.join(model, name)),
                           os.path.join(draft_dir, name))
        with open(os.path.join(draft_dir, "config.json"), "w") as f:
            json.dump(dict(config, num_hidden_layers=exit_layer), f)
        target = logits(model, text, tmp).reshape(-1, vocab).astype(np.float64)
        draft = logits(draft_dir, text, tmp).reshape(-1, vocab).astype(np.float64)
    h, agree = [], []
    for t in range(len(prompt) - 1, len(text) - 1):  # the rows that chose a greedy token
        z = draft[t] - draft[t].max()
        q = np.exp(z) / np.exp(z).sum()
        h.append(-(q * np.log(np.maximum(q, 1e-300))).sum() / np.log(vocab))
        agree.append(draft[t].argmax() == target[t].argmax())
    h, agree = np.array(h), np.array(agree, dtype=float)
    print(f"{model}, draft = first {exit_layer} layers, {len(h)} greedy positions")
    print("H quantiles (0, 10, 25, 50, 75, 90, 100%):",
          " ".join(f"{x:.4f}" for x in np.quantile(h, [0, .1, .25, .5, .75, .9, 1])))
    print(f"draft argmax = target argmax at {agree.mean():.3f} of positions; "
          f"corr(H, agreement) = {np.corrcoef(h, agree)[0, 1]:.3f}")
    edges = np.quantile(h, [0, .25, .5, .75, 1])
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (h >= lo) & (h <= hi)
        print(f"  H in [{lo:.4f}, {hi:.4f}]: {sel.sum()} positions, "
              f"agreement {agree[sel].mean():.2f}")


if __name__ == "__main__":
    main()
