#!/usr/bin/env python3
"""Writes a specd/Hugging Face Llama checkpoint as a GGUF file for llama.cpp, tensor for tensor.

For the peer benchmark (scripts/bench/llamacpp.sh): llama.cpp must run the very weights specd
runs, in the same dtype (f32, bf16 or f16; norms are f32 in GGUF), so that tokens/s compare the two
engines and nothing else. llama.cpp's own convert_hf_to_gguf.py needs PyTorch and transformers;
this needs only numpy and llama.cpp's gguf-py package (pass its folder with --gguf-py).

What changes on the way, as convert_hf_to_gguf.py does it for LlamaForCausalLM:
  * q_proj/k_proj rows go from Hugging Face's rotate-half order back to the interleaved pairs
    llama.cpp's rope expects;
  * llama3 rope scaling becomes the rope_freqs.weight factors;
  * the tokenizer.json vocabulary (Llama 2 style: byte fallback, "▁" for spaces) becomes an SPM
    vocabulary whose scores are the BPE merge ranks, so that llama.cpp merges in the same order.
"""

import argparse
import json
import math
import pathlib
import struct
import sys

import numpy as np

SAFETENSORS_DTYPES = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16}


def read_safetensors(model_dir):
    """{name: (dtype string, numpy array over the file's bytes)} of every shard in model_dir."""
    tensors = {}
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        sys.exit(f"to_gguf: no .safetensors files in {model_dir}")
    for path in files:
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = info["dtype"]
            if dtype not in SAFETENSORS_DTYPES:
                sys.exit(f"to_gguf: {path.name}: {name} has dtype {dtype}; "
                         "only F32, BF16 and F16 convert")
            begin, end = info["data_offsets"]
            array = data[begin:end].view(SAFETENSORS_DTYPES[dtype]).reshape(info["shape"])
            tensors[name] = (dtype, array)
    return tensors


def to_f32(dtype, array):
    if dtype == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)


def unrotate_half(rows, n_head):
    """Hugging Face's rotate-half row order of a q/k projection back to interleaved pairs."""
    return (rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:])
            .swapaxes(1, 2).reshape(rows.shape))


def llama3_rope_factors(config, head_dim):
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        return None
    base = config.get("rope_theta", 10000.0)
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / low, old_context / high
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi / (1.0 / base ** (i / head_dim))
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def add_vocab(writer, gguf, model_dir, config):
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    model = tok["model"]
    if model.get("type") != "BPE" or not model.get("byte_fallback"):
        sys.exit("to_gguf: only Llama 2 style tokenizers (BPE with byte fallback) convert")
    vocab = dict(model["vocab"])
    special = set()
    for added in tok.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
        if added.get("special"):
            special.add(added["id"])
    n_vocab = config["vocab_size"]
    merged_rank = {}
    for rank, merge in enumerate(model.get("merges", [])):
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        merged_rank.setdefault(left + right, rank)
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    scores = [0.0] * n_vocab
    types = [gguf.TokenType.UNUSED] * n_vocab
    for piece, i in vocab.items():
        if i >= n_vocab:
            continue
        tokens[i] = piece
        if piece == model.get("unk_token"):
            types[i] = gguf.TokenType.UNKNOWN
        elif i in special:
            types[i] = gguf.TokenType.CONTROL
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            types[i] = gguf.TokenType.BYTE
        else:
            types[i] = gguf.TokenType.NORMAL
            scores[i] = -float(merged_rank.get(piece, 0))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    if "bos_token_id" in config:
        writer.add_bos_token_id(config["bos_token_id"])
    eos = config.get("eos_token_id")
    if isinstance(eos, int):
        writer.add_eos_token_id(eos)
    if model.get("unk_token") in vocab:
        writer.add_unk_token_id(vocab[model["unk_token"]])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=pathlib.Path)
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--gguf-py", type=pathlib.Path, required=True,
                        help="llama.cpp's gguf-py folder")
    args = parser.parse_args()
    sys.path.insert(0, str(args.gguf_py))
    import gguf  # pylint: disable=import-outside-toplevel

    config = json.loads((args.model_dir / "config.json").read_text())
    if config.get("model_type") != "llama":
        sys.exit(f"to_gguf: model_type {config.get('model_type')!r} is not llama")
    tensors = read_safetensors(args.model_dir)
    n_head, n_kv = config["num_attention_heads"], config.get("num_key_value_heads",
                                                               config["num_attention_heads"])
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // n_head
    matrix_dtypes = {d for name, (d, a) in tensors.items() if a.ndim == 2}
    if len(matrix_dtypes) != 1:
        sys.exit(f"to_gguf: matrices of several dtypes {sorted(matrix_dtypes)}")
    (dtype,) = matrix_dtypes
    file_type = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                 "BF16": gguf.LlamaFileType.MOSTLY_BF16}[dtype]

    writer = gguf.GGUFWriter(args.out, "llama")
    writer.add_name(args.model_dir.name)
    writer.add_context_length(config.get("max_position_embeddings", 2048))
    writer.add_embedding_length(hidden)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-5))
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(file_type)
    add_vocab(writer, gguf, args.model_dir, config)

    def add(gguf_name, hf_name, permute_heads=None):
        d, array = tensors.pop(hf_name)
        if array.ndim == 1:  # norms: GGUF keeps them f32 whatever the matrices' dtype
            writer.add_tensor(gguf_name, to_f32(d, array))
            return
        if permute_heads is not None:
            array = unrotate_half(array, permute_heads)
        if d == "BF16":
            writer.add_tensor(gguf_name, np.ascontiguousarray(array).view(np.uint8),
                              raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(gguf_name, np.ascontiguousarray(array))

    factors = llama3_rope_factors(config, head_dim)
    if factors is not None:
        writer.add_tensor("rope_freqs.weight", factors)
    add("token_embd.weight", "model.embed_tokens.weight")
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        add(f"blk.{i}.attn_norm.weight", p + "input_layernorm.weight")
        add(f"blk.{i}.attn_q.weight", p + "self_attn.q_proj.weight", n_head)
        add(f"blk.{i}.attn_k.weight", p + "self_attn.k_proj.weight", n_kv)
        add(f"blk.{i}.attn_v.weight", p + "self_attn.v_proj.weight")
        add(f"blk.{i}.attn_output.weight", p + "self_attn.o_proj.weight")
        add(f"blk.{i}.ffn_norm.weight", p + "post_attention_layernorm.weight")
        add(f"blk.{i}.ffn_gate.weight", p + "mlp.gate_proj.weight")
        add(f"blk.{i}.ffn_up.weight", p + "mlp.up_proj.weight")
        add(f"blk.{i}.ffn_down.weight", p + "mlp.down_proj.weight")
    add("output_norm.weight", "model.norm.weight")
    if "lm_head.weight" in tensors and not config.get("tie_word_embeddings", False):
        add("output.weight", "lm_head.weight")
    tensors.pop("lm_head.weight", None)
    if tensors:
        sys.exit(f"to_gguf: tensors left unconverted: {sorted(tensors)[:5]}")

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
