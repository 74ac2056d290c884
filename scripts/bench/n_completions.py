#!/usr/bin/env python3
"""n completions over the OpenAI API, with in-batch prefix sharing on and off, side by side.

Two `specd serve` processes of one model (--prefix-sharing on and off, prefix caching on in both)
get the same requests, alternating which goes first: POST /v1/completions with a new prompt of
--prompt-tokens random token ids each time (so no cache holds it), temperature 0.8 with a seed,
--max-tokens new tokens, once with n = 1 and once with n = --n. Prints each server's median
latency for both and the ratio of its n-completion latency to its single completion's: with
sharing the prompt is computed once for all n, without it once per completion.

usage: /usr/bin/python3 scripts/bench/n_completions.py [--model DIR] [--n 4]
       [--prompt-tokens 800] [--max-tokens 8] [--repeats 3] [--threads 2]
(without --model: a synthetic stories110M target, made once under bench-out/n_completions, with
its 2-layer early exit as the draft)
"""
import argparse
import json
import os
import pathlib
import random
import re
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPECD = pathlib.Path(os.environ.get("SPECD", ROOT / "build" / "tools" / "specd"))
MODEL_ID = "bench"

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from server import Server  # noqa: E402


def log(msg):
    print(f"n_completions: {msg}", file=sys.stderr, flush=True)


def start(model, sharing, threads, log_path):
    """A `specd serve` with its HTTP API on a free port (.port: its address)."""
    cmd = [SPECD, "serve", "--target", model, "--draft-exit-layer", "2", "--threads", threads,
           "--kv-tokens", "32768", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
           "--prefix-sharing", sharing, "--served-model-name", MODEL_ID]
    return Server(f"n_completions: specd serve --prefix-sharing {sharing}", cmd, "listening on ",
                  lambda out: re.search(r"^http on (\S+)", out, re.M).group(1), log_path)


def complete(address, prompt, n, max_tokens):
    """Seconds for one non-streamed completion request with n choices."""
    body = json.dumps({"model": MODEL_ID, "prompt": prompt, "max_tokens": max_tokens, "n": n,
                       "temperature": 0.8, "seed": 1, "ignore_eos": True}).encode()
    start = time.time()
    reply = urllib.request.urlopen(urllib.request.Request(
        f"http://{address}/v1/completions", body, {"Content-Type": "application/json"}))
    choices = json.loads(reply.read())["choices"]
    elapsed = time.time() - start
    if len(choices) != n:
        sys.exit(f"n_completions: asked for {n} choices, got {len(choices)}")
    return elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model directory (default: a synthetic stories110M)")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=800)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    out = ROOT / "bench-out" / "n_completions"
    out.mkdir(parents=True, exist_ok=True)
    model = pathlib.Path(args.model) if args.model else out / "stories110M"
    if not (model / "config.json").exists():
        subprocess.run([str(SPECD), "synth", "--shape", "stories110M", "--residual-scale", "0.1",
                        "--seed", "1", "--out", str(model)], check=True)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    servers = {s: start(model, s, args.threads, out / f"serve_{s}.log") for s in ("on", "off")}
    times = {s: {1: [], args.n: []} for s in servers}
    rng = random.Random(5)
    try:
        for r in range(args.repeats):
            for n in (1, args.n):
                prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_tokens)]
                for s in (("on", "off") if r % 2 == 0 else ("off", "on")):
                    times[s][n].append(complete(servers[s].port, prompt, n, args.max_tokens))
            log(f"repeat {r + 1}/{args.repeats} done")
    finally:
        for server in servers.values():
            server.close()
    med = {s: {n: statistics.median(v) for n, v in t.items()} for s, t in times.items()}
    print(f"{args.prompt_tokens}-token prompts, {args.max_tokens} new tokens, "
          f"median of {args.repeats}")
    for s in ("on", "off"):
        print(f"prefix sharing {s:3}: n=1 {med[s][1] * 1000:7.0f} ms   n={args.n} "
              f"{med[s][args.n] * 1000:7.0f} ms   n={args.n} / n=1 "
              f"{med[s][args.n] / med[s][1]:.2f}")
    print(f"n={args.n} latency, sharing on / off: {med['on'][args.n] / med['off'][args.n]:.3f}")


if __name__ == "__main__":
    main()
