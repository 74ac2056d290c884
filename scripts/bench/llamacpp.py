#!/usr/bin/env python3
"""specd against llama.cpp on the same CPU, the same weights and the same threads.

llama.cpp is the peer a CPU user would otherwise run. Both engines get one synthetic checkpoint
(`specd synth`, untied classifier), llama.cpp through scripts/bench/to_gguf.py (same dtype, tensor
for tensor), and are measured side by side, alternating, in one run:

  parity   greedy text of both from one prompt (f32 only): equal text means the GGUF holds the
           same model, so the figures below compare engines, not models;
  decode   batch-1 decode tokens/s: llama-bench's tgN (N tokens from an empty context, best of 3
           samples) against decode_bench (forwards of one token at context N/2, the tgN average,
           best of 3 batches of N), per dtype and thread count;
  spec     speculative decoding of one stream from the prompt with the target's first
           --draft-layers layers as the draft (a separate GGUF for llama.cpp): llama.cpp's
           llama-speculative-simple (greedy, --draft-max K, drafts never cut short) against
           spec_bench --speedup (the coordinator's round logic in process). Both count
           accepted/drafted; on one prompt and one model they should agree closely.

Each figure is the median over --repeats, with the ratio specd / llama.cpp. Run with Debian's
python3 (numpy, for the conversion), after building specd (scripts/setup.sh) and llama.cpp's CPU
back end:

  git clone https://github.com/ggml-org/llama.cpp && cd llama.cpp
  cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF
  cmake --build build -j --target llama-bench llama-simple llama-speculative-simple

usage: /usr/bin/python3 scripts/bench/llamacpp.py --llama-cpp DIR [--dtypes f32,bf16]
       [--threads 1,2] [--shape stories110M] [--ks 2,4] [--repeats 3] [--json OUT]
"""
import argparse
import json
import pathlib
import re
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMPT = "Once upon a time"


def log(msg):
    print(f"llamacpp: {msg}", file=sys.stderr, flush=True)


def run(cmd, timeout=1800):
    # Bytes, then text: llama-simple prints a byte-fallback piece as the raw byte.
    done = subprocess.run([str(c) for c in cmd], capture_output=True, timeout=timeout,
                          check=False)
    stdout = done.stdout.decode(errors="replace")
    stderr = done.stderr.decode(errors="replace")
    if done.returncode != 0:
        sys.exit(f"llamacpp: {' '.join(map(str, cmd))} failed ({done.returncode}):\n"
                 f"{stderr[-2000:]}")
    return stdout, stderr


class Bench:

    def __init__(self, args):
        self.args = args
        build = pathlib.Path(args.specd_build)
        self.specd_bin = build / "tools/specd"
        self.decode_bench_bin = build / "tools/bench/engine/decode_bench"
        self.spec_bench_bin = build / "tools/bench/engine/spec_bench"
        lbin = pathlib.Path(args.llama_cpp) / "build/bin"
        self.llama_bench_bin = lbin / "llama-bench"
        self.llama_simple_bin = lbin / "llama-simple"
        self.llama_spec_bin = lbin / "llama-speculative-simple"
        for b in (self.specd_bin, self.decode_bench_bin, self.spec_bench_bin,
                  self.llama_bench_bin, self.llama_simple_bin, self.llama_spec_bin):
            if not b.exists():
                sys.exit(f"llamacpp: {b} is missing (build specd, and llama.cpp's targets above)")
        self.work = pathlib.Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)

    def models(self, dtype):
        """(target dir, target GGUF, draft GGUF), written once under --work."""
        a = self.args
        # decode_bench --model-dir finds the target under the name it would give it.
        target = self.work / f"{a.shape}-untied-{dtype}"
        draft = self.work / f"{a.shape}-untied-{dtype}-draft{a.draft_layers}"
        if not (target / "config.json").exists():
            log(f"writing the {a.shape}-shaped {dtype} target")
            run([self.specd_bin, "synth", "--shape", a.shape, "--dtype", dtype, "--residual-scale",
                 a.residual_scale, "--out", target])
        if not (draft / "config.json").exists():
            run([self.specd_bin, "synth", "--early-exit-of", target, "--layers", a.draft_layers,
                 "--out", draft])
        ggufs = []
        for d in (target, draft):
            gguf = d.with_suffix(".gguf")
            if not gguf.exists():
                log(f"converting {d.name} to GGUF")
                run([sys.executable, ROOT / "scripts/bench/to_gguf.py", d, gguf, "--gguf-py",
                     pathlib.Path(a.llama_cpp) / "gguf-py"])
            ggufs.append(gguf)
        return target, ggufs[0], ggufs[1]

    def parity(self, target, gguf):
        n = str(self.args.tokens)
        ours, _ = run([self.specd_bin, "generate", "--model", target, "--prompt", PROMPT,
                       "--max-tokens", n])
        theirs, _ = run([self.llama_simple_bin, "-m", gguf, "-n", n, PROMPT])
        # llama-simple prints the prompt with its BOS piece; specd generate, the prompt as given.
        ours = ours.strip()
        theirs = theirs.strip().removeprefix("<s>").strip()
        same = ours == theirs
        at = next((i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y),
                  min(len(ours), len(theirs)))
        return {"identical": same, "first_difference_at_char": None if same else at,
                "chars": len(ours)}

    def llama_decode(self, gguf, threads):
        out, _ = run([self.llama_bench_bin, "-m", gguf, "-t", threads, "-p", "0", "-n",
                      self.args.tokens, "-r", "3", "-o", "json"])
        return max(json.loads(out)[0]["samples_ts"])

    def specd_decode(self, dtype, threads):
        out, _ = run([self.decode_bench_bin, "--untied", "--shape", self.args.shape,
                      "--dtypes", dtype, "--threads", threads, "--steps", self.args.tokens,
                      "--context", self.args.tokens // 2, "--model-dir", self.work])
        row = next(l for l in out.splitlines() if l.startswith(dtype + " "))
        return float(row.split()[4])  # dtype, "threads N", read GB/s, tok/s

    def prompt_ids(self, target):
        out, _ = run([self.specd_bin, "tokenize", "--model", target, "--text", PROMPT])
        return ",".join(out.split())

    def llama_spec(self, target_gguf, draft_gguf, k, threads):
        _, err = run([self.llama_spec_bin, "-m", target_gguf, "-md", draft_gguf, "-p", PROMPT, "-n",
                      self.args.tokens, "--draft-max", k, "--draft-min", "0", "--draft-p-min", "0",
                      "--temp", "0", "-t", threads, "-td", threads, "-c", "4096"])
        speed = float(re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+)",
                                err).group(1))
        drafted = int(re.search(r"n_drafted\s*=\s*(\d+)", err).group(1))
        accepted = int(re.search(r"n_accept\s*=\s*(\d+)", err).group(1))
        return speed, accepted, drafted

    def specd_spec(self, target, ids, k, threads):
        out, _ = run([self.spec_bench_bin, "--speedup", "--target", target, "--draft-layers",
                      self.args.draft_layers, "--ks", k, "--new-tokens", self.args.tokens,
                      "--threads", threads, "--prompt-ids", ids])
        row = next(l.split() for l in out.splitlines() if l.split()[:1] == [str(k)])
        accepted, drafted = (int(x) for x in row[4].split("/"))
        return float(row[1]), accepted, drafted


def median(xs):
    return statistics.median(xs)


def drafts(samples):
    """accepted/drafted of the first repeat (greedy: every repeat runs the same rounds)."""
    return f"{samples[0]['accepted']}/{samples[0]['drafted']}"


def arg_parser(doc):
    """The options Bench and both llama.cpp benchmarks use; each script adds its own."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--llama-cpp", required=True, help="a llama.cpp checkout, built (see above)")
    p.add_argument("--specd-build", default=str(ROOT / "build"))
    p.add_argument("--work", default="/tmp/specd-llamacpp-bench")
    p.add_argument("--shape", default="stories110M")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--draft-layers", type=int, default=2)
    p.add_argument("--residual-scale", default="0.1")
    p.add_argument("--json", help="write every measurement here")
    return p


def main():
    p = arg_parser(__doc__)
    p.add_argument("--dtypes", default="f32,bf16")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--ks", default="2,4")
    args = p.parse_args()
    bench = Bench(args)
    dtypes = args.dtypes.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    ks = [int(k) for k in args.ks.split(",")]
    report = {"shape": args.shape, "tokens": args.tokens, "repeats": args.repeats,
              "parity": None, "decode": [], "spec": []}

    models = {d: bench.models(d) for d in dtypes}
    if "f32" in models:
        log("greedy parity (f32)")
        report["parity"] = bench.parity(models["f32"][0], models["f32"][1])

    for d in dtypes:
        for t in threads:
            ours, theirs = [], []
            for r in range(args.repeats):
                log(f"decode {d}, {t} threads, repeat {r + 1}/{args.repeats}")
                theirs.append(bench.llama_decode(models[d][1], t))
                ours.append(bench.specd_decode(d, t))
            report["decode"].append({"dtype": d, "threads": t, "specd_tok_s": ours,
                                     "llamacpp_tok_s": theirs})

    t = max(threads)
    for d in dtypes:
        target, target_gguf, draft_gguf = models[d]
        ids = bench.prompt_ids(target)
        for k in ks:
            ours, theirs = [], []
            for r in range(args.repeats):
                log(f"speculative {d}, K = {k}, {t} threads, repeat {r + 1}/{args.repeats}")
                theirs.append(bench.llama_spec(target_gguf, draft_gguf, k, t))
                ours.append(bench.specd_spec(target, ids, k, t))
            report["spec"].append({"dtype": d, "k": k, "threads": t,
                                   "specd": [dict(zip(("tok_s", "accepted", "drafted"), x))
                                             for x in ours],
                                   "llamacpp": [dict(zip(("tok_s", "accepted", "drafted"), x))
                                                for x in theirs]})

    print(f"specd against llama.cpp: {args.shape}-shaped synthetic model (untied), "
          f"{args.tokens} tokens, median of {args.repeats}")
    par = report["parity"]
    if par is not None:
        print("greedy parity (f32, one prompt): " +
              (f"identical text ({par['chars']} characters)" if par["identical"] else
               f"DIFFERENT from character {par['first_difference_at_char']}"))
    print(f"{'dtype':6} {'threads':>7} {'specd tok/s':>12} {'llama.cpp tok/s':>16} {'ratio':>7}")
    for row in report["decode"]:
        ours, theirs = median(row["specd_tok_s"]), median(row["llamacpp_tok_s"])
        row["ratio"] = ours / theirs
        print(f"{row['dtype']:6} {row['threads']:>7} {ours:12.1f} {theirs:16.1f} "
              f"{row['ratio']:7.3f}")
    print(f"speculative, {t} threads, draft = first {args.draft_layers} layers "
          "(accepted/drafted over the run)")
    print(f"{'dtype':6} {'K':>3} {'specd tok/s':>12} {'accepted':>10} {'llama.cpp tok/s':>16} "
          f"{'accepted':>10} {'ratio':>7}")
    for row in report["spec"]:
        ours = median(x["tok_s"] for x in row["specd"])
        theirs = median(x["tok_s"] for x in row["llamacpp"])
        row["ratio"] = ours / theirs
        print(f"{row['dtype']:6} {row['k']:>3} {ours:12.1f} {drafts(row['specd']):>10} "
              f"{theirs:16.1f} {drafts(row['llamacpp']):>10} {row['ratio']:7.3f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if par is not None and not par["identical"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
