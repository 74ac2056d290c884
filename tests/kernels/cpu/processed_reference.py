#!/usr/bin/python3
"""Independent numpy reference for specd's processed distribution.

Written from DESIGN.md ("The processed distribution") and the precision list at the top of
kernels/cpu/processed.h, with whole-array numpy operations (full sorts, masks) instead of the
C++ selection algorithms. It generates the test cases itself and writes, into OUT_DIR:

  cases.json    one entry per case: name, vocab, params, prompt, output, bias ([token, bias]
                pairs, ascending tokens), offset (into the binary files, in elements),
                greedy_token, redraws
  logits.f32    the input rows, float32 little endian, concatenated
  expected.f32  the reference processed rows, same layout
  kept.u8       1 where the token survives every filter (top-k, top-p, min-p), else 0

Usage: /usr/bin/python3 processed_reference.py OUT_DIR

Where the C++ and numpy results may legitimately differ (the C++ uses its own fp32 exp
polynomial, numpy its own exp, neither correctly rounded; and the fp64 sums run in different
orders), probabilities agree to a relative tolerance only: each to about 2.4e-7 relative (one
fp32 ulp of exp plus two roundings), so a cumulative top-p sum to about 2.4e-7 absolute. Filter
decisions must agree exactly, so a random case whose top-p sum lies within FRAGILE_CUM of top_p,
or whose min-p or top-p boundary token lies within FRAGILE_REL (relative) of the decision, is
redrawn; the number of redraws is recorded. Both margins are several times those error bounds.
Everything before exp (penalties, temperature, top-k, the exp flush at -87) is IEEE-exact on
both sides, so those decisions are compared without any margin.
"""

import json
import math
import os
import sys

import numpy as np

F32 = np.float32
F64 = np.float64
FRAGILE_REL = 4e-6
FRAGILE_CUM = 1e-6


class NoDistribution(Exception):
    pass


def penalized(logits, p, prompt, output, bias=()):
    """Step 0's logit bias (one float32 add per listed token), then step 1: repetition over
    prompt + output, then frequency and presence over output."""
    w = logits.astype(F32).copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for token, b in bias:
            w[token] = F32(w[token] + F32(b))
        r = F32(p["repetition_penalty"])
        if r != F32(1):
            ids = np.unique(np.concatenate([prompt, output]).astype(np.int64))
            vals = w[ids]
            w[ids] = np.where(vals > F32(0), vals / r, vals * r).astype(F32)
        ids, counts = np.unique(output.astype(np.int64), return_counts=True)
        freq = F32(p["frequency_penalty"])
        pres = F32(p["presence_penalty"])
        if ids.size and freq != F32(0):
            w[ids] = w[ids] - (freq * counts.astype(F32))
        if ids.size and pres != F32(0):
            w[ids] = w[ids] - pres
    assert w.dtype == F32
    return w


def order_desc(values, ids):
    """ids sorted by (value desc, id asc)."""
    return ids[np.lexsort((ids, -values[ids]))]


def processed(logits, p, prompt, output, bias=()):
    """Returns (probs float32[V], kept bool[V], info dict for the fragility check)."""
    v = logits.size
    ids_all = np.arange(v, dtype=np.int64)
    w = penalized(logits, p, prompt, output, bias)
    info = {"w": w}
    if F32(p["temperature"]) == F32(0):
        probs = np.zeros(v, dtype=F32)
        probs[int(np.argmax(w))] = 1
        return probs, probs > 0, info

    with np.errstate(over="ignore"):
        w = (w / F32(p["temperature"])).astype(F32)
    info["w"] = w

    kept = np.ones(v, dtype=bool)
    k = int(p["top_k"])
    if 0 < k < v:
        kept[:] = False
        kept[order_desc(w, ids_all)[:k]] = True

    m = np.max(w[kept])
    if m == -np.inf:
        raise NoDistribution()
    e = np.zeros(v, dtype=F32)
    if m == np.inf:
        e[kept & (w == np.inf)] = 1
    else:
        d = (w[kept] - m).astype(F32)
        with np.errstate(under="ignore"):
            # Below -87 the C++ flushes to 0 (processed.h, kExpFlushBelow).
            e[kept] = np.where(d < F32(-87), F32(0), np.exp(d)).astype(F32)
    s = math.fsum(e.astype(F64).tolist())
    probs = (e.astype(F64) / s).astype(F32)
    info["probs_softmax"] = probs.copy()

    top_p = F32(p["top_p"])
    if top_p < F32(1):
        cand = ids_all[probs > 0]
        order = order_desc(probs, cand)
        cum = np.cumsum(probs[order].astype(F64))
        reached = np.flatnonzero(cum >= F64(top_p))
        n_keep = int(reached[0]) + 1 if reached.size else order.size
        kept[order[n_keep:]] = False
        info["top_p"] = (order, cum, n_keep, F64(top_p))

    min_p = F32(p["min_p"])
    if min_p > F32(0):
        p_max = probs.max()
        threshold = F32(min_p * p_max)
        kept &= probs >= threshold
        info["min_p"] = (threshold, int(np.argmax(probs)))

    kept &= probs > 0
    if top_p >= F32(1) and min_p <= F32(0):
        return probs, kept, info
    probs = np.where(kept, probs, F32(0)).astype(F32)
    s2 = math.fsum(probs.astype(F64).tolist())
    out = (probs.astype(F64) / s2).astype(F32)
    return out, kept, info


def fragile(info):
    """True if a float32-exp-level difference could flip a top-p or min-p decision."""
    w = info["w"]
    if "top_p" in info:
        order, cum, n_keep, target = info["top_p"]
        if abs(cum[n_keep - 1] - target) < FRAGILE_CUM:
            return True
        if n_keep >= 2 and target - cum[n_keep - 2] < FRAGILE_CUM:
            return True
        if n_keep < order.size:
            probs = info["probs_softmax"]
            a, b = order[n_keep - 1], order[n_keep]
            if w[a] != w[b] and probs[a] - probs[b] <= FRAGILE_REL * probs[a]:
                return True
    if "min_p" in info:
        threshold, arg = info["min_p"]
        probs = info["probs_softmax"]
        near = np.abs(probs.astype(F64) - F64(threshold)) <= FRAGILE_REL * F64(threshold)
        near &= w != w[arg]
        if np.any(near):
            return True
    return False


def params(**overrides):
    p = {
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
    }
    for key, value in overrides.items():
        assert key in p, key
        p[key] = value
    return p


RANDOM_PARAMS = [
    ("plain", params()),
    ("temperature_0.7", params(temperature=0.7)),
    ("temperature_1.9", params(temperature=1.9)),
    ("greedy", params(temperature=0.0, repetition_penalty=1.2, presence_penalty=0.5)),
    ("top_k_1", params(top_k=1)),
    ("top_k_5", params(top_k=5)),
    ("top_k_vocab_minus_1", params(top_k=-1)),  # -1: resolved to V - 1 below
    ("top_k_vocab", params(top_k=-2)),  # -2: V
    ("top_k_over_vocab", params(top_k=-3)),  # -3: V + 17
    ("top_p_0.9", params(top_p=0.9)),
    ("top_p_0.5", params(top_p=0.5)),
    ("top_p_0.001", params(top_p=0.001)),
    ("top_p_1", params(top_p=1.0)),
    ("min_p_0.05", params(min_p=0.05)),
    ("min_p_0.5", params(min_p=0.5)),
    ("min_p_1", params(min_p=1.0)),
    ("repetition_1.3", params(repetition_penalty=1.3)),
    ("repetition_0.8", params(repetition_penalty=0.8)),
    ("presence_0.6", params(presence_penalty=0.6)),
    ("presence_-1.5", params(presence_penalty=-1.5)),
    ("frequency_0.7", params(frequency_penalty=0.7)),
    ("frequency_-0.4", params(frequency_penalty=-0.4)),
    ("penalties_all", params(repetition_penalty=1.15, presence_penalty=0.4,
                             frequency_penalty=0.3)),
    ("combined", params(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02,
                        repetition_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.1)),
    ("combined_no_top_k", params(temperature=1.2, top_p=0.95, min_p=0.01,
                                 repetition_penalty=1.3, frequency_penalty=-0.2)),
    ("combined_min_p_first_binds", params(temperature=0.6, top_p=0.99, min_p=0.2)),
]


def resolve_top_k(p, v):
    p = dict(p)
    if p["top_k"] == -1:
        p["top_k"] = max(v - 1, 1)
    elif p["top_k"] == -2:
        p["top_k"] = v
    elif p["top_k"] == -3:
        p["top_k"] = v + 17
    return p


# Cases whose rows also carry a random logit bias: listed tokens, some banned (-100), some pushed
# to the top (+100), the rest moderate; with and without penalties and filters.
BIAS_PARAMS = [
    ("bias_plain", params()),
    ("bias_greedy", params(temperature=0.0)),
    ("bias_penalties", params(repetition_penalty=1.3, presence_penalty=0.5,
                              frequency_penalty=0.3)),
    ("bias_combined", params(temperature=0.8, top_k=20, top_p=0.9, min_p=0.02,
                             repetition_penalty=1.1)),
]


def random_bias(rng, v):
    n = int(min(v, 12))
    tokens = np.sort(rng.choice(v, size=n, replace=False))
    values = rng.uniform(-10.0, 10.0, size=n).astype(F32)
    values[0] = F32(-100)
    values[n // 2] = F32(100) if v > 7 else values[n // 2]
    return [(int(t), float(b)) for t, b in zip(tokens, values)]


def random_history(rng, v):
    prompt = rng.integers(0, v, size=min(2 * v, 300))
    # Outputs drawn from a small pool so counts above 1 occur.
    pool = rng.integers(0, v, size=max(2, min(v // 2, 25)))
    output = rng.choice(pool, size=min(3 * v, 60))
    return prompt.astype(np.int32), output.astype(np.int32)


def edge_cases():
    """Hand-built rows: exact ties, signed zeros, infinities, negative logits under penalties."""
    ninf, inf = -np.inf, np.inf
    empty = np.zeros(0, dtype=np.int32)
    i32 = lambda xs: np.array(xs, dtype=np.int32)
    ties = [1.0, 2.0, 2.0, 2.0, 0.0, 2.0, -1.0]
    yield "ties_top_k_2", ties, params(top_k=2), empty, empty
    yield "ties_top_k_4", ties, params(top_k=4), empty, empty
    # Four tokens share the top probability; top-p cuts inside the tie, lowest ids first.
    yield "ties_top_p_inside_tie", [0.0, 3.0, 3.0, -2.0, 3.0, 3.0, 1.0], params(top_p=0.5), \
        empty, empty
    yield "ties_min_p_1", [0.0, 3.0, 2.9, 3.0, -5.0, 3.0, 1.0], params(min_p=1.0), empty, empty
    yield "ties_greedy_lowest_id", [0.5, 4.0, 4.0, 4.0, 0.0, 0.0, 0.0], params(temperature=0.0), \
        empty, empty
    yield "signed_zero_ties_top_k", [-0.0, 0.0, -0.0, -1.0, -2.0, 0.0, -3.0], params(top_k=2), \
        empty, empty
    # Negative, zero and positive logits in the history: x > 0 -> x / r, else x * r.
    neg = [-1.5, -0.25, 0.0, 0.75, 2.0, -3.0, 1.0]
    yield "repetition_negative_logits", neg, params(repetition_penalty=1.7), \
        i32([0, 1, 2]), i32([3, 5, 5])
    yield "repetition_below_one_negative_logits", neg, params(repetition_penalty=0.6), \
        i32([0, 5]), i32([4, 1, 1, 1])
    yield "frequency_counts", neg, params(frequency_penalty=0.9, presence_penalty=-0.3), \
        i32([6, 6]), i32([4, 4, 4, 6, 0, 4])
    yield "banned_tokens", [ninf, 1.0, ninf, 0.5, -0.5, ninf, 2.0], params(top_p=0.8), \
        empty, empty
    yield "banned_all_but_one", [ninf, ninf, ninf, -7.0, ninf, ninf, ninf], params(), empty, empty
    yield "top_k_over_banned", [ninf, 1.0, ninf, ninf, ninf, ninf, ninf], params(top_k=3), \
        empty, empty
    yield "plus_inf_share_mass", [1.0, inf, 3.0, inf, ninf, 0.0, 2.0], params(), empty, empty
    yield "plus_inf_with_penalty", [1.0, inf, 3.0, inf, ninf, 0.0, 2.0], \
        params(repetition_penalty=2.0, presence_penalty=2.0), i32([1]), i32([3, 3])
    # Temperature so low that w / T overflows: the overflowing tokens share the mass.
    yield "tiny_temperature_overflow", [5.0, 4.9, -1.0, 0.0, 4.95, 1.0, -0.5], \
        params(temperature=1e-38), empty, empty
    yield "huge_temperature_near_uniform", [5.0, 4.9, -1.0, 0.0, 4.95, 1.0, -0.5], \
        params(temperature=1e30), empty, empty
    yield "min_p_just_below_one", [0.0, 3.0, 2.9995, 3.0, -5.0, 2.99, 2.5], params(min_p=0.999), \
        empty, empty
    yield "top_p_one_top_k_over_vocab_min_p_zero", [0.3, -0.2, 1.1, 0.0, 2.2, -1.0, 0.9], \
        params(top_p=1.0, top_k=7, min_p=0.0), empty, empty
    yield "all_filters_keep_one", [0.3, -0.2, 1.1, 0.0, 2.2, -1.0, 0.9], \
        params(top_k=3, top_p=0.01, min_p=0.9), empty, empty


def main():
    out_dir = sys.argv[1]
    rng = np.random.default_rng(20240917)
    cases = []
    logits_blob, expected_blob, kept_blob = [], [], []
    offset = 0

    def add(name, logits, p, prompt, output, redraws, bias=()):
        nonlocal offset
        probs, kept, _ = processed(logits, p, prompt, output, bias)
        greedy = int(np.argmax(penalized(logits, p, prompt, output, bias)))
        cases.append({
            "name": name,
            "vocab": int(logits.size),
            "params": p,
            "prompt": prompt.tolist(),
            "output": output.tolist(),
            "bias": [[t, b] for t, b in bias],
            "offset": offset,
            "greedy_token": greedy,
            "redraws": redraws,
        })
        logits_blob.append(logits.astype("<f4"))
        expected_blob.append(probs.astype("<f4"))
        kept_blob.append(kept.astype(np.uint8))
        offset += logits.size

    for v in (7, 64, 1000, 32000):
        for name, base in RANDOM_PARAMS:
            p = resolve_top_k(base, v)
            for redraws in range(100):
                sigma = 2.5 if v >= 1000 else 1.5
                logits = rng.normal(0.0, sigma, size=v).astype(F32)
                prompt, output = random_history(rng, v)
                _, _, info = processed(logits, p, prompt, output)
                if not fragile(info):
                    break
            else:
                raise RuntimeError(f"no robust draw for {name} V={v}")
            add(f"{name}_V{v}", logits, p, prompt, output, redraws)

    for v in (7, 1000, 32000):
        for name, p in BIAS_PARAMS:
            for redraws in range(100):
                logits = rng.normal(0.0, 2.5, size=v).astype(F32)
                prompt, output = random_history(rng, v)
                bias = random_bias(rng, v)
                _, _, info = processed(logits, p, prompt, output, bias)
                if not fragile(info):
                    break
            else:
                raise RuntimeError(f"no robust draw for {name} V={v}")
            add(f"{name}_V{v}", logits, p, prompt, output, redraws, bias)

    # A bias cannot lift a banned (-inf) token nor sink a +inf one; it breaks ties; it applies
    # before the penalties, so repetition divides a biased positive logit.
    empty = np.zeros(0, dtype=np.int32)
    for name, logits, p, prompt, bias in [
        ("bias_on_infinities", [np.inf, -np.inf, 1.0, 0.5, -0.0, 2.0, 0.0], params(),
         empty, [(0, -100.0), (1, 100.0), (4, 0.0)]),
        ("bias_breaks_greedy_tie", [1.0, 3.0, 3.0, 3.0, 0.0, -1.0, 2.0], params(temperature=0.0),
         empty, [(1, -0.5), (3, 0.25)]),
        ("bias_before_repetition", [1.0, -2.0, 0.5, 3.0, 0.0, -1.0, 2.0],
         params(repetition_penalty=2.0), np.array([0, 1, 3], dtype=np.int32),
         [(0, 4.0), (1, 3.0), (3, -5.0)]),
    ]:
        logits = np.array(logits, dtype=F32)
        _, _, info = processed(logits, p, prompt, empty, bias)
        if fragile(info):
            raise RuntimeError(f"edge case {name} is too close to a boundary")
        add(name, logits, p, prompt, empty, 0, bias)

    for name, logits, p, prompt, output in edge_cases():
        logits = np.array(logits, dtype=F32)
        _, _, info = processed(logits, p, prompt, output)
        if fragile(info):
            raise RuntimeError(f"edge case {name} is too close to a boundary")
        add(name, logits, p, prompt, output, 0)

    with open(os.path.join(out_dir, "cases.json"), "w") as f:
        json.dump({"cases": cases}, f)
    np.concatenate(logits_blob).tofile(os.path.join(out_dir, "logits.f32"))
    np.concatenate(expected_blob).tofile(os.path.join(out_dir, "expected.f32"))
    np.concatenate(kept_blob).tofile(os.path.join(out_dir, "kept.u8"))


if __name__ == "__main__":
    main()
