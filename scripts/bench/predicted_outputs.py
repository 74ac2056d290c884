#!/usr/bin/env python3
"""Predicted outputs (OpenAI's "prediction") against plain decoding and prompt lookup, side by side.

One `specd serve --draft-method ngram` (no draft model) gets, for each prompt, greedy requests of
--max-tokens new tokens over POST /v1/completions in four arms, alternating their order each
repeat: plain decoding (K = 0); prompt lookup (K = --k) with no prediction; a prediction that is
the plain output itself; and an edited prediction (every --edit-every'th word replaced, as an
edit rewrites a file). Every arm must return the plain text (the script fails otherwise). Prints
each arm's median latency, its speed-up over plain decoding, and the accepted and rejected
prediction tokens from usage.

usage: /usr/bin/python3 scripts/bench/predicted_outputs.py [--model DIR] [--max-tokens 200]
       [--k 8] [--repeats 5] [--edit-every 12] [--threads 1]
(without --model: the real stories260K from $SPECD_SHARED_DIR (default ../shared), converted once
under bench-out/predicted_outputs)
"""
import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPECD = pathlib.Path(os.environ.get("SPECD", ROOT / "build" / "tools" / "specd"))
SHARED = pathlib.Path(os.environ.get("SPECD_SHARED_DIR", ROOT.parent / "shared"))
PROMPTS = ["Once upon a time", "The little cat was", "Lily and Tom went to the park",
           "One day, a big dog"]

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from server import Server  # noqa: E402


def log(msg):
    print(f"predicted_outputs: {msg}", file=sys.stderr, flush=True)


def complete(address, prompt, max_tokens, k, prediction=None):
    """(seconds, text, usage) of one greedy completion."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "num_speculative_tokens": k, "k_policy": "fixed"}
    if prediction is not None:
        body["prediction"] = {"type": "content", "content": prediction}
    start = time.time()
    reply = urllib.request.urlopen(urllib.request.Request(
        f"http://{address}/v1/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json"}))
    out = json.loads(reply.read())
    return time.time() - start, out["choices"][0]["text"], out["usage"]


def edited(text, every):
    """`text` with every `every`'th word replaced by another: a prediction an edit made stale."""
    words = text.split(" ")
    for i in range(every - 1, len(words), every):
        words[i] = "banana" if words[i] != "banana" else "apple"
    return " ".join(words)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model directory (default: stories260K, converted)")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--edit-every", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    out = ROOT / "bench-out" / "predicted_outputs"
    out.mkdir(parents=True, exist_ok=True)
    model = pathlib.Path(args.model) if args.model else out / "stories260K"
    if not (model / "config.json").exists():
        src = SHARED / "models" / "stories260K"
        if not src.exists():
            sys.exit(f"predicted_outputs: {src} is missing; set SPECD_SHARED_DIR or pass --model")
        subprocess.run([str(SPECD), "convert", "llama2c", "--checkpoint", str(src / "stories260K.bin"),
                        "--tokenizer", str(src / "tok512.bin"), "--out", str(model)], check=True)
    server = Server("predicted_outputs: specd serve",
                    [SPECD, "serve", "--target", model, "--draft-method", "ngram", "--threads",
                     str(args.threads), "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"],
                    "listening on ", lambda o: re.search(r"^http on (\S+)", o, re.M).group(1),
                    out / "serve.log")
    arms = ["plain", "prompt lookup", "prediction", "edited prediction"]
    times = {a: [] for a in arms}
    counts = {a: [0, 0] for a in arms}  # accepted, rejected prediction tokens
    try:
        addr = server.port
        plain_text = {p: complete(addr, p, args.max_tokens, 0)[1] for p in PROMPTS}
        for r in range(args.repeats):
            order = arms if r % 2 == 0 else arms[::-1]
            for p in PROMPTS:
                for arm in order:
                    k = 0 if arm == "plain" else args.k
                    prediction = {"prediction": plain_text[p],
                                  "edited prediction": edited(plain_text[p], args.edit_every)
                                  }.get(arm)
                    seconds, text, usage = complete(addr, p, args.max_tokens, k, prediction)
                    if text != plain_text[p]:
                        sys.exit(f"predicted_outputs: {arm} changed the output of {p!r}")
                    times[arm].append(seconds)
                    details = usage.get("completion_tokens_details")
                    if details:
                        counts[arm][0] += details["accepted_prediction_tokens"]
                        counts[arm][1] += details["rejected_prediction_tokens"]
            log(f"repeat {r + 1}/{args.repeats} done")
    finally:
        server.close()
    med = {a: statistics.median(t) for a, t in times.items()}
    print(f"{len(PROMPTS)} prompts x {args.max_tokens} greedy tokens, K = {args.k}, median of "
          f"{args.repeats} repeats; every arm returned the plain text")
    for a in arms:
        acc, rej = counts[a]
        extra = f"   prediction tokens accepted {acc}, rejected {rej}" if acc + rej else ""
        print(f"{a:18} {med[a] * 1000:7.1f} ms   plain / this {med['plain'] / med[a]:5.2f}x{extra}")


if __name__ == "__main__":
    main()
