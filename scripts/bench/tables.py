#!/usr/bin/python3
"""Turns the JSON of scripts/bench/sweep.sh into gnuplot tables and a summary.

usage: /usr/bin/python3 scripts/bench/tables.py OUT_DIR

Writes OUT_DIR/k_sweep.tsv (one gnuplot data block per alpha: K, measured, ideal and
engine-limited speed-up, efficiency, T_v(K)/T_t, overhead), OUT_DIR/concurrency.tsv (streams,
tokens/s of K=0 and K=4 fixed and adaptive, and their speed-ups) and prints a summary that names
the concurrency where K=4 stops beating K=0 (the crossover).
"""
import glob
import json
import math
import os
import re
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def num(v, fmt="%.4f"):
    return "NaN" if v is None else fmt % v


def k_sweep(out):
    rows = []
    for path in glob.glob(os.path.join(out, "k_sweep_alpha*.json")):
        target = float(re.search(r"alpha([0-9.]+)\.json$", path).group(1))
        j = load(path)
        arms = {a["label"]: a for a in j["arms"]}
        for c in j["compare"]:
            arm = arms[c["label"]]
            rows.append((target, c, arm))
    rows.sort(key=lambda r: (r[0], r[1]["k"]))
    lines = ["# alpha_target alpha K measured ideal engine_limited efficiency T_v/T_t overhead"]
    last = None
    for target, c, arm in rows:
        if last is not None and target != last:
            lines += ["", ""]  # a new gnuplot data block
        last = target
        lines.append("\t".join([
            "%.2f" % target, num(c["alpha"]), "%g" % c["k"], num(c["measured_speedup"]),
            num(c["ideal_speedup"]), num(c["engine_limited_speedup"]), num(c["efficiency"]),
            num(c["verify_to_target"]), num(arm["overhead_fraction"])]))
    with open(os.path.join(out, "k_sweep.tsv"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return rows


def concurrency(out):
    by_streams = {}
    for path in glob.glob(os.path.join(out, "concurrency_*_streams*.json")):
        m = re.search(r"concurrency_(fixed|adaptive)_streams(\d+)\.json$", path)
        j = load(path)
        by_streams.setdefault(int(m.group(2)), {})[m.group(1)] = j
    lines = ["# streams K0_tok/s K4_fixed_tok/s speedup_fixed K4_adaptive_tok/s speedup_adaptive"]
    table = []
    for s in sorted(by_streams):
        runs = by_streams[s]
        k0 = k4f = k4a = sf = sa = None
        if "fixed" in runs:
            k0 = runs["fixed"]["arms"][0]["output_tokens_per_s"]
            k4f = runs["fixed"]["arms"][1]["output_tokens_per_s"]
            sf = runs["fixed"]["compare"][0]["measured_speedup"]
        if "adaptive" in runs:
            k4a = runs["adaptive"]["arms"][1]["output_tokens_per_s"]
            sa = runs["adaptive"]["compare"][0]["measured_speedup"]
        table.append((s, k0, k4f, sf, k4a, sa))
        lines.append("\t".join([str(s), num(k0, "%.2f"), num(k4f, "%.2f"), num(sf),
                                num(k4a, "%.2f"), num(sa)]))
    with open(os.path.join(out, "concurrency.tsv"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return table


def crossover(table, column):
    """The concurrency where the speed-up in `column` first falls to 1, interpolated in log2."""
    prev = None
    for row in table:
        s, speedup = row[0], row[column]
        if speedup is None:
            continue
        if speedup < 1:
            if prev is None:
                return "below 1 already at %d stream(s)" % s
            (s0, v0) = prev
            t = (v0 - 1) / (v0 - speedup)
            at = 2 ** (math.log2(s0) + t * (math.log2(s) - math.log2(s0)))
            return "about %.1f streams (between %d and %d)" % (at, s0, s)
        prev = (s, speedup)
    return "none up to %d streams" % table[-1][0] if table else "no data"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    rows = k_sweep(out)
    table = concurrency(out)
    print("speed-up vs K (one stream):")
    print("  %-6s %6s %3s %9s %7s %7s %10s %8s %9s" % (
        "alpha~", "alpha", "K", "measured", "ideal", "engine", "efficiency", "Tv/Tt", "overhead"))
    for target, c, arm in rows:
        print("  %-6.2f %6s %3g %9s %7s %7s %10s %8s %9s" % (
            target, num(c["alpha"], "%.3f"), c["k"], num(c["measured_speedup"], "%.3f"),
            num(c["ideal_speedup"], "%.3f"), num(c["engine_limited_speedup"], "%.3f"),
            num(c["efficiency"], "%.3f"), num(c["verify_to_target"], "%.3f"),
            num(arm["overhead_fraction"], "%.3f")))
    if table:
        print("tokens/s vs concurrency (K=4 against K=0):")
        print("  %7s %9s %11s %8s %14s %8s" % (
            "streams", "K=0", "K=4 fixed", "ratio", "K=4 adaptive", "ratio"))
        for s, k0, k4f, sf, k4a, sa in table:
            print("  %7d %9s %11s %8s %14s %8s" % (
                s, num(k0, "%.1f"), num(k4f, "%.1f"), num(sf, "%.3f"), num(k4a, "%.1f"),
                num(sa, "%.3f")))
        print("crossover, K=4 fixed: " + crossover(table, 3))
        print("crossover, K=4 adaptive: " + crossover(table, 5))


if __name__ == "__main__":
    main()
