#!/usr/bin/env python3
"""Hugging Face transformers' decoding speed on specd's synthetic checkpoint, for the comparison
with specd in scripts/gpu/device_check.sh: plain greedy generate() and assisted generate() with
the target's first --draft-layers layers as the assistant (the same early-exit draft specd's
spec_bench uses). Batch 1, bf16, on the GPU; prints tokens/s of both and writes --out.

usage: hf_generate_bench.py --target DIR --draft-layers L [--new-tokens N] [--out FILE]
"""
import argparse
import json
import time

import torch
import transformers
from transformers import LlamaForCausalLM

# transformers 4.56 renamed from_pretrained's torch_dtype to dtype (the old name warns, and goes).
_VERSION = tuple(int(p) for p in transformers.__version__.split(".")[:2])
DTYPE = {"dtype" if _VERSION >= (4, 56) else "torch_dtype": torch.bfloat16}


def timed_generate(model, ids, n, **kw):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)
    torch.cuda.synchronize()
    return out[0, ids.shape[1]:].tolist(), time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft-layers", type=int, required=True)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    target = LlamaForCausalLM.from_pretrained(args.target, **DTYPE).cuda().eval()
    draft = LlamaForCausalLM.from_pretrained(args.target, num_hidden_layers=args.draft_layers,
                                             **DTYPE).cuda().eval()
    ids = torch.tensor([[1] + [3 + (7919 * j) % 1000 for j in range(24)]], device="cuda")
    timed_generate(target, ids, 16)  # warm-up
    timed_generate(target, ids, 16, assistant_model=draft)
    plain_tokens, plain_s = timed_generate(target, ids, args.new_tokens)
    assisted_tokens, assisted_s = timed_generate(target, ids, args.new_tokens, assistant_model=draft)
    report = {
        "new_tokens": args.new_tokens,
        "plain_tokens_per_s": args.new_tokens / plain_s,
        "assisted_tokens_per_s": args.new_tokens / assisted_s,
        "assisted_equals_plain": plain_tokens == assisted_tokens,
    }
    print(json.dumps(report))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    print(f"transformers plain {report['plain_tokens_per_s']:.1f} tok/s, assisted "
          f"{report['assisted_tokens_per_s']:.1f} tok/s")


if __name__ == "__main__":
    main()
