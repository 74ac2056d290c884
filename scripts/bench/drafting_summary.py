#!/usr/bin/python3
"""Tables of scripts/bench/drafting.sh's runs (the figures docs/benchmarks.md quotes).

usage: drafting_summary.py [OUT_DIR]   (default bench-out/drafting)

Every figure comes from one `specd bench --compare` JSON, whose arms alternated on one server:
speed-ups are each arm's median output tokens/s over the K = 0 arm's of the same run.
"""
import json
import os
import re
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def verified(label):
    """Draft tokens the target verifies per round: K for a chain, the node count for a tree."""
    k = int(re.search(r"K=(\d+)", label).group(1))
    tree = re.search(r"tree (\d+)x(\d+)", label)
    if not tree:
        return k
    b, d = int(tree.group(1)), int(tree.group(2))
    nodes, width = 0, 1
    for level in range(1, k + 1):
        if level <= d:
            width *= b
        nodes += width
    return nodes


def fmt(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def rows(run):
    """(arm, compare row or None) for every arm, K = 0 first."""
    by_label = {c["label"]: c for c in run.get("compare", [])}
    return [(a, by_label.get(a["label"])) for a in run["arms"]]


def trees(out):
    for alpha in ("05", "07"):
        path = os.path.join(out, f"trees_alpha{alpha}.json")
        if not os.path.exists(path):
            continue
        run = load(path)
        print(f"\n### Trees against chains, alpha ~ 0.{alpha[1]} ({path})\n")
        print("| arm | verified/round | alpha | tokens/round | tok/s | speed-up |")
        print("| --- | --- | --- | --- | --- | --- |")
        for a, c in rows(run):
            v = verified(a["label"]) if a["k"] > 0 else 0
            print(f"| {a['label']} | {v} | {fmt(a['alpha'])} | {fmt(a['mean_accepted_length'])} "
                  f"| {fmt(a['output_tokens_per_s'], 1)} | {fmt(c and c['measured_speedup'])} |")


def egag(out):
    for alpha in ("05", "07"):
        path = os.path.join(out, f"egag_alpha{alpha}.json")
        if not os.path.exists(path):
            continue
        run = load(path)
        print(f"\n### EGAG on and off, alpha ~ 0.{alpha[1]} ({path})\n")
        print("| arm | rounds | drafted | wasted drafts | wasted / output token | mean K "
              "| alpha | tok/s | speed-up |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for a, c in rows(run):
            u = a["usage"]
            wasted = u["draft_tokens"] - u["accepted_tokens"]
            mean_k = u["draft_tokens"] / u["drafting_rounds"] if u["drafting_rounds"] else None
            print(f"| {a['label']} | {u['rounds']} | {u['draft_tokens']} | {wasted} "
                  f"| {fmt(wasted / a['output_tokens'])} | {fmt(mean_k, 2)} | {fmt(a['alpha'])} "
                  f"| {fmt(a['output_tokens_per_s'], 1)} | {fmt(c and c['measured_speedup'])} |")


def frspec(out):
    paths = sorted(p for p in os.listdir(out) if p.startswith("frspec_") and p.endswith(".json"))
    if not paths:
        return
    print("\n### FR-Spec: full draft head against a reduced one\n")
    print("| run | arm | T_d (ms) | T_t (ms) | T_d/T_t | alpha | acceptance | tokens/round "
          "| speed-up |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for p in paths:
        for a, c in rows(load(os.path.join(out, p))):
            if c is None:
                continue
            print(f"| {p[:-5]} | {a['label']} | {fmt(c['draft_step_ms'], 2)} "
                  f"| {fmt(c['target_step_ms'], 2)} | {fmt(c['draft_to_target'])} "
                  f"| {fmt(a['alpha'])} | {fmt(a['acceptance_rate'])} "
                  f"| {fmt(a['mean_accepted_length'])} | {fmt(c['measured_speedup'])} |")


def ngram(out):
    path = os.path.join(out, "ngram_stories260K.json")
    if not os.path.exists(path):
        return
    print(f"\n### Prompt lookup on a copy-heavy workload ({path})\n")
    print("| arm | drafting rounds / rounds | alpha | acceptance | tokens/round | tok/s "
          "| speed-up |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for a, c in rows(load(path)):
        u = a["usage"]
        share = u["drafting_rounds"] / u["rounds"] if u["rounds"] else 0.0
        print(f"| {a['label']} | {fmt(share)} | {fmt(a['alpha'])} | {fmt(a['acceptance_rate'])} "
              f"| {fmt(a['mean_accepted_length'])} | {fmt(a['output_tokens_per_s'], 1)} "
              f"| {fmt(c and c['measured_speedup'])} |")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "bench-out/drafting"
    trees(out)
    egag(out)
    frspec(out)
    ngram(out)


if __name__ == "__main__":
    main()
