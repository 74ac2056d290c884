#!/usr/bin/python3
"""Writes the committed seed corpora for the fuzzers (run from anywhere; rewrites the files):
corpus/safetensors/*  valid and invalid safetensors files (small),
corpus/model_config/* valid and invalid config.json texts.
Uses only json + struct, so the seeds do not depend on specd's writer."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def st(header, data=b"", pad=True, length=None):
    text = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    n = len(text) if length is None else length
    return struct.pack("<Q", n) + text + data


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


SAFETENSORS = {
    "valid_empty": st({}),
    "valid_one_f32": st({"w": t("F32", [2, 2], 0, 16)}, bytes(range(16))),
    "valid_mixed": st({"__metadata__": {"format": "pt"}, "a": t("F64", [1], 0, 8),
                       "b": t("BF16", [3], 8, 14), "c": t("U8", [2], 14, 16),
                       "d": t("BOOL", [], 16, 17), "e": t("F8_E4M3", [0, 4], 17, 17)},
                      bytes(17)),
    "valid_llama_names": st({"model.embed_tokens.weight": t("F16", [4, 2], 0, 16),
                             "model.norm.weight": t("F32", [2], 16, 24)}, bytes(24)),
    "valid_unpadded": st({"x": t("I32", [1], 0, 4)}, bytes(4), pad=False),
    "bad_truncated_data": st({"w": t("F32", [4], 0, 16)}, bytes(10)),
    "bad_header_length": st({"w": t("F32", [1], 0, 4)}, bytes(4), length=1 << 40),
    "bad_overlap": st({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 4, 12)}, bytes(12)),
    "bad_gap": st({"a": t("F32", [1], 0, 4), "b": t("F32", [1], 8, 12)}, bytes(12)),
    "bad_dtype": st({"w": t("F128", [1], 0, 16)}, bytes(16)),
    "bad_shape_overflow": st({"w": t("F64", [4294967296, 4294967296], 0, 8)}, bytes(8)),
    "bad_duplicate": st(b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                        b'"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', bytes(2)),
    "bad_not_json": st(b"{not json", b""),
    "bad_short": b"\x08\x00\x00",
}

LLAMA_32_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
    "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
}
STORIES = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 172,
    "num_hidden_layers": 5, "num_attention_heads": 8, "num_key_value_heads": 4,
    "vocab_size": 512, "max_position_embeddings": 512, "rms_norm_eps": 1e-05,
    "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": True, "torch_dtype": "float32",
}
V5 = dict(LLAMA_32_1B, rope_parameters=dict(LLAMA_32_1B["rope_scaling"], rope_theta=500000.0),
          dtype="bfloat16")
del V5["rope_scaling"], V5["rope_theta"], V5["torch_dtype"]

CONFIGS = {
    "llama32_1b.json": LLAMA_32_1B,
    "stories260k.json": STORIES,
    "transformers5.json": V5,
    "bad_heads.json": dict(STORIES, num_attention_heads=7),
    "bad_yarn.json": dict(LLAMA_32_1B, rope_scaling={"rope_type": "yarn", "factor": 4.0}),
    "bad_huge.json": dict(STORIES, vocab_size=2000000000, hidden_size=16000000),
}


def main():
    for name, data in SAFETENSORS.items():
        with open(os.path.join(HERE, "corpus", "safetensors", name), "wb") as f:
            f.write(data)
    for name, cfg in CONFIGS.items():
        with open(os.path.join(HERE, "corpus", "model_config", name), "w") as f:
            json.dump(cfg, f, indent=2)


if __name__ == "__main__":
    main()
