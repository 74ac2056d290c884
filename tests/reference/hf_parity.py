#!/usr/bin/env python3
"""Parity of specd's engine with Hugging Face transformers' LlamaForCausalLM.

Makes small synthetic Llama checkpoints (safetensors, written here with numpy: GQA, llama3 RoPE
scaling, tied and untied classifiers, in f32 and bf16), runs specd's engine on them
(tools/bench/engine/engine_logits, on the back end given) and transformers on the same weights,
and checks:
  * logits at every prompt position: per row, max|specd - hf| / max|hf| <= 1e-4 in f32 and
    <= 2e-2 in bf16 (transformers computing in bf16, as it serves a bf16 checkpoint); the bf16
    rows are also reported against transformers in f32 on the same bf16 weights;
  * greedy tokens identical for 64 tokens on 5 prompts in f32;
  * transformers' RoPE inverse frequencies equal the llama3-scaled ones computed here, so the
    scaling is really in play.
Writes hf_parity.json and prints a summary; exits 1 on a failed check.

usage: hf_parity.py --engine-logits PATH --work DIR [--backend cuda] [--device cuda]
       [--out FILE] [--skip-hf]
--skip-hf (where transformers is not installed, as on the CPU CI machine): compare specd's logits
with tests/reference/llama_ref.py (an independent numpy forward pass in float64) instead, at the
f32 tolerance, for every checkpoint.
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np

F32_TOL = 1e-4
BF16_TOL = 2e-2
GREEDY_TOKENS = 64

BASE = dict(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=2, head_dim=32,
            max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=500000.0,
            rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                              high_freq_factor=4.0, original_max_position_embeddings=128),
            bos_token_id=1, eos_token_id=2)


def bf16_bits(x):
    """float32 -> bfloat16 bits, round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, (dtype, array) in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)


def make_weights(cfg, tied, seed):
    """f32 weights in the synth recipe: the embedding dominates the residual stream."""
    rng = np.random.default_rng(seed)
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    n = lambda shape, std: (rng.standard_normal(shape) * std).astype(np.float32)
    w = {"model.embed_tokens.weight": n((cfg["vocab_size"], h), 1.0)}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = (1 + n((h,), 0.1)).astype(np.float32)
        w[p + "post_attention_layernorm.weight"] = (1 + n((h,), 0.1)).astype(np.float32)
        w[p + "self_attn.q_proj.weight"] = n((q, h), 1 / math.sqrt(h))
        w[p + "self_attn.k_proj.weight"] = n((kv, h), 1 / math.sqrt(h))
        w[p + "self_attn.v_proj.weight"] = n((kv, h), 1 / math.sqrt(h))
        w[p + "self_attn.o_proj.weight"] = n((h, q), 0.5 / math.sqrt(q))
        w[p + "mlp.gate_proj.weight"] = n((i, h), 1 / math.sqrt(h))
        w[p + "mlp.up_proj.weight"] = n((i, h), 1 / math.sqrt(h))
        w[p + "mlp.down_proj.weight"] = n((h, i), 0.5 / math.sqrt(i))
    w["model.norm.weight"] = (1 + n((h,), 0.1)).astype(np.float32)
    if not tied:
        # Spread the logits (std ~4) so greedy choices are far from ties.
        w["lm_head.weight"] = n((cfg["vocab_size"], h), 4 / math.sqrt(h))
    return w


def write_checkpoint(directory, cfg, weights, dtype, tied):
    os.makedirs(directory, exist_ok=True)
    config = dict(cfg, architectures=["LlamaForCausalLM"], model_type="llama",
                  hidden_act="silu", tie_word_embeddings=tied,
                  torch_dtype="bfloat16" if dtype == "bf16" else "float32")
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tensors = {}
    stored = {}
    for name, array in weights.items():
        if dtype == "bf16":  # every tensor, norms included, as a real bf16 checkpoint has
            bits = bf16_bits(array)
            tensors[name] = ("BF16", bits)
            stored[name] = bf16_to_f32(bits)
        else:
            tensors[name] = ("F32", array)
            stored[name] = array
    write_safetensors(os.path.join(directory, "model.safetensors"), tensors)
    return stored  # the values as stored, widened to f32


def llama3_inv_freq(cfg):
    d = cfg["head_dim"]
    inv = 1.0 / (cfg["rope_theta"] ** (np.arange(0, d, 2, dtype=np.float64) / d))
    s = cfg["rope_scaling"]
    low_wavelen = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wavelen = s["original_max_position_embeddings"] / s["high_freq_factor"]
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / s["factor"])
        else:
            smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / (
                s["high_freq_factor"] - s["low_freq_factor"])
            out.append((1 - smooth) * f / s["factor"] + smooth * f)
    return np.array(out)


def prompts(cfg):
    rng = np.random.default_rng(99)
    return [[1] + rng.integers(3, cfg["vocab_size"], size=n).tolist() for n in (6, 13, 22, 31, 40)]


def run_specd(engine_logits, backend, directory, prompt_list, greedy):
    spec = os.path.join(directory, "prompts.json")
    with open(spec, "w") as f:
        json.dump({"prompts": prompt_list}, f)
    out = os.path.join(directory, "specd_out")
    cmd = [engine_logits, "--model", directory, "--prompts", spec, "--out", out, "--backend",
           backend, "--greedy", str(greedy)]
    subprocess.run(cmd, check=True)
    logits = []
    for p, prompt in enumerate(prompt_list):
        raw = np.fromfile(os.path.join(out, f"logits_{p}.f32"), dtype=np.float32)
        logits.append(raw.reshape(len(prompt), -1))
    with open(os.path.join(out, "greedy.json")) as f:
        g = json.load(f)
    return logits, g["tokens"], g["backend"]


def hf_model(cfg, stored, tied, torch_dtype, device):
    import torch
    # f32 means f32: no TF32 in the reference's matrix products.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    from transformers import LlamaConfig, LlamaForCausalLM
    import inspect
    kw = {k: v for k, v in cfg.items() if k not in ("rope_scaling", "rope_theta")}
    kw["tie_word_embeddings"] = tied
    kw["hidden_act"] = "silu"
    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:
        kw["rope_parameters"] = dict(cfg["rope_scaling"], rope_theta=cfg["rope_theta"])
    else:
        kw["rope_scaling"] = cfg["rope_scaling"]
        kw["rope_theta"] = cfg["rope_theta"]
    config = LlamaConfig(**kw)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config)
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in stored.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all(m == "lm_head.weight" for m in missing) and (tied or not missing), missing
    if tied:
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model = model.to(device=device, dtype=torch_dtype).eval()
    return model


def hf_logits(model, prompt, device):
    import torch
    with torch.no_grad():
        ids = torch.tensor([prompt], device=device)
        return model(input_ids=ids).logits[0].float().cpu().numpy()


def hf_greedy(model, prompt, n, device):
    import torch
    with torch.no_grad():
        ids = torch.tensor([prompt], device=device)
        out = model(input_ids=ids, use_cache=True)
        past, tokens = out.past_key_values, []
        nxt = int(out.logits[0, -1].float().argmax())
        for _ in range(n):
            tokens.append(nxt)
            out = model(input_ids=torch.tensor([[nxt]], device=device), past_key_values=past,
                        use_cache=True)
            past = out.past_key_values
            nxt = int(out.logits[0, -1].float().argmax())
    return tokens


def row_errors(a, b):
    return [float(np.max(np.abs(a[r] - b[r])) / np.max(np.abs(b[r]))) for r in range(len(b))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine-logits", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="")
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args()
    report, ok = {"cases": []}, True
    for tied in (False, True):
        weights = make_weights(BASE, tied, seed=5 if tied else 6)
        for dtype in ("f32", "bf16"):
            name = f"{'tied' if tied else 'untied'}-{dtype}"
            directory = os.path.join(args.work, name)
            stored = write_checkpoint(directory, BASE, weights, dtype, tied)
            plist = prompts(BASE)
            greedy_n = GREEDY_TOKENS if dtype == "f32" else 0
            logits, greedy, backend = run_specd(args.engine_logits, args.backend, directory, plist,
                                                greedy_n)
            case = {"name": name, "specd_backend": backend}
            if args.skip_hf:
                sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
                import llama_ref
                errs = []
                for p, prompt in enumerate(plist):
                    errs += row_errors(logits[p], llama_ref.forward(directory, prompt))
                case["max_row_rel_err_vs_numpy"] = max(errs)
                case["passed_logits"] = max(errs) <= F32_TOL
                ok = ok and case["passed_logits"]
                report["cases"].append(case)
                print(json.dumps(case), flush=True)
                continue
            import torch
            ref_f32 = hf_model(BASE, stored, tied, torch.float32, args.device)
            # The RoPE module moved between transformers versions (per layer, then the model's).
            inv = next(b for n, b in ref_f32.named_buffers()
                       if n.endswith("inv_freq")).float().cpu().numpy()
            want_inv = llama3_inv_freq(BASE)
            case["inv_freq_max_rel_diff"] = float(np.max(np.abs(inv - want_inv) / want_inv))
            if case["inv_freq_max_rel_diff"] > 1e-6:
                ok = False
                case["inv_freq_failed"] = True
            errs_f32 = []
            for p, prompt in enumerate(plist):
                errs_f32 += row_errors(logits[p], hf_logits(ref_f32, prompt, args.device))
            if dtype == "f32":
                case["max_row_rel_err"] = max(errs_f32)
                case["tolerance"] = F32_TOL
                case["passed_logits"] = max(errs_f32) <= F32_TOL
                mismatches = []
                for p, prompt in enumerate(plist):
                    want = hf_greedy(ref_f32, prompt, GREEDY_TOKENS, args.device)
                    if want != greedy[p]:
                        first = next(i for i, (x, y) in enumerate(zip(want, greedy[p])) if x != y)
                        mismatches.append({"prompt": p, "first_difference": first})
                case["greedy_identical"] = not mismatches
                case["greedy_mismatches"] = mismatches
                ok = ok and case["passed_logits"] and not mismatches
            else:
                ref_bf16 = hf_model(BASE, stored, tied, torch.bfloat16, args.device)
                errs = []
                for p, prompt in enumerate(plist):
                    errs += row_errors(logits[p], hf_logits(ref_bf16, prompt, args.device))
                case["max_row_rel_err"] = max(errs)
                case["tolerance"] = BF16_TOL
                case["max_row_rel_err_vs_hf_f32_same_weights"] = max(errs_f32)
                case["passed_logits"] = max(errs) <= BF16_TOL
                ok = ok and case["passed_logits"]
            report["cases"].append(case)
            print(json.dumps(case), flush=True)
    report["passed"] = ok
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    print(("PASS" if ok else "FAIL") + ": hf parity", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
