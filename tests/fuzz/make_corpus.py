#!/usr/bin/python3
"""Writes the committed seed corpora for the fuzzers (run from anywhere; rewrites the files):
corpus/safetensors/*  valid and invalid safetensors files (small),
corpus/model_config/* valid and invalid config.json texts,
corpus/tokenizer/*    inputs of tokenizer_fuzzer (the first byte picks the mode, see its header),
corpus/request/*      inputs of request_fuzzer (the first byte picks the mode, see its header),
corpus/chat_template/* inputs of chat_template_fuzzer (flags byte, template, NUL, messages),
corpus/openai_request/* inputs of openai_request_fuzzer (endpoint byte, then a JSON body).
Uses only json + struct (and protoc's text-to-binary encoder for the request seeds), so the seeds
do not depend on specd's writer. The two whole tokenizer.json seeds come from specd itself:
  make_corpus.py --specd build/tools/specd
runs `specd synth --shape tiny --vocab 300` and `specd convert llama2c` of
/work/shared/models/stories260K and rewrites corpus/tokenizer/json_*; without --specd they are
left as they are."""
import argparse
import json
import os
import struct
import subprocess
import tempfile

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

SHARED = os.environ.get("SPECD_SHARED_DIR", "/work/shared")
TOK_CONFIG = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>",
              "eos_token": "</s>", "unk_token": "<unk>", "clean_up_tokenization_spaces": False}


def llama2c_tokenizer(pieces, max_len=None):
    """tokenizer.bin: int32 max_token_length, then per token float32 score, int32 length, bytes."""
    out = struct.pack("<i", max_len if max_len is not None else max(len(p) for p, _ in pieces))
    for piece, score in pieces:
        out += struct.pack("<fi", score, len(piece)) + piece
    return out


def small_llama2c():
    pieces = [(b"<unk>", 0.0), (b"\n<s>\n", 0.0), (b"\n</s>\n", 0.0)]
    pieces += [(b"<0x%02X>" % b, 0.0) for b in range(256)]
    pieces += [(b" ", -1.0), (b"t", -2.0), (b"h", -3.0), (b"e", -4.0), (b" t", -5.0),
               (b"he", -6.0), (b" the", -7.0)]
    return pieces


def tokenizer_seeds():
    """Mode byte + payload (see tokenizer_fuzzer.cc)."""
    config = json.dumps(TOK_CONFIG).encode()
    # FuzzedDataProvider ends a random-length string at a backslash followed by another byte.
    seeds = {
        "configs_llama2": b"\x01" + config + b"\\\n" + b'{"bos_token_id":1,"eos_token_id":[2,1]}',
        "configs_bad": b"\x01" + b'{"add_bos_token":"yes"}' + b"\\\n" + b'{"eos_token_id":-4}',
        "encode_spm": b"\x02\x00" + " Hello  the cat \u00e9\n\u2581x".encode(),
        "encode_byte_level": b"\x02\x03" + "<|eot_id|> the h\u00e4llo [x]  \r\n".encode(),
        "encode_bad_utf8": b"\x02\x01" + b"ab\xc3\x28\xed\xa0\x80\xf8",
        "decode_spm": b"\x03\x00" + struct.pack("<8i", 1, 267, 3 + 0xC3, 3 + 0xA9, 269, 270, 2, 3),
        "decode_out_of_range": b"\x03\x01" + struct.pack("<3i", 5, 303, -1),
        "incremental": b"\x04" + bytes(range(1, 255, 3)),
        "llama2c_small": b"\x05" + struct.pack("<i", 266) + llama2c_tokenizer(small_llama2c()),
        "llama2c_truncated": b"\x05" + struct.pack("<i", 266) +
                             llama2c_tokenizer(small_llama2c())[:200],
        # A vocab_size of 536871424 over a few hundred bytes once reserved ~20 GB up front.
        "llama2c_huge_vocab": b"\x05" + struct.pack("<i", 0x20000200) +
                              llama2c_tokenizer(small_llama2c())[:300],
    }
    with open(os.path.join(SHARED, "models", "stories260K", "tok512.bin"), "rb") as f:
        seeds["llama2c_tok512"] = b"\x05" + struct.pack("<i", 512) + f.read()
    return seeds


def request_seeds():
    """Mode byte + a serialized specd.v1.GenerateRequest, written by protoc from text format."""
    texts = {
        "text_prompt": 'text: "Once upon a time" sampling { temperature: 0.7 top_p: 0.9 seed: 7 } '
                       'stopping { max_new_tokens: 16 stop: "the" stop_token_ids: 2 } '
                       'speculation { num_speculative_tokens: 4 '
                       'draft_sampling: DRAFT_SAMPLING_GREEDY }',
        "token_ids": 'token_ids { ids: [1, 267, 269] } request_id: "abc" '
                     'sampling { top_k: 5 min_p: 0.1 repetition_penalty: 1.1 presence_penalty: -2 '
                     'frequency_penalty: 2 }',
        "bad_nan": 'token_ids { ids: [1] } sampling { temperature: nan top_p: inf }',
        "bad_ids": 'token_ids { ids: [-1, 272, 2147483647] } '
                   'stopping { max_new_tokens: 4294967295 }',
        "bad_utf8": 'text: "ab\\xc3\\x28" stopping { stop: "\\xff" stop: "" }',
        "bad_k": 'text: "x" speculation { num_speculative_tokens: 4294967295 }',
        "prediction": 'text: "Once" speculation { num_speculative_tokens: 4 '
                      'prediction { text: "upon a time" } }',
        "prediction_bad": 'token_ids { ids: [1] } speculation { draft_method: DRAFT_METHOD_MODEL '
                          'prediction { token_ids { ids: [5, 6, -1] } } }',
    }
    proto_dir = os.path.join(HERE, "..", "..", "proto")
    seeds = {}
    for name, text in texts.items():
        encoded = subprocess.run(
            ["protoc", "--proto_path=" + proto_dir, "--encode=specd.v1.GenerateRequest",
             "specd/v1/generation.proto"], input=text.encode(), capture_output=True, check=True)
        seeds[name] = b"\x00" + encoded.stdout
    # Bit 3: a chat template that takes any conversation.
    chat = ('chat { messages { role: "user" content: "Weather?" } '
            'messages { role: "assistant" tool_calls { id: "c1" name: "get_weather" '
            'arguments: "{\\"city\\": \\"Oslo\\"}" } } '
            'messages { role: "tool" content: "-3 C" tool_call_id: "c1" } '
            'tools { name: "get_weather" description: "Weather of a city." parameters { '
            'fields { key: "type" value { string_value: "object" } } '
            'fields { key: "properties" value { struct_value { fields { key: "city" value { '
            'struct_value { fields { key: "type" value { string_value: "string" } } } } } } } } } } '
            'tool_choice: TOOL_CHOICE_AUTO parallel_tool_calls: false '
            'chat_template_kwargs { fields { key: "date_string" value { string_value: "x" } } } }')
    encoded = subprocess.run(
        ["protoc", "--proto_path=" + proto_dir, "--encode=specd.v1.GenerateRequest",
         "specd/v1/generation.proto"], input=chat.encode(), capture_output=True, check=True)
    seeds["chat_tools"] = b"\x08" + encoded.stdout
    seeds["structured"] = b"\x01" + bytes(range(256))
    seeds["structured_no_tokenizer"] = b"\x03" + bytes(range(255, -1, -2))
    return seeds


def specd_tokenizer_seeds(specd):
    """Whole tokenizer.json files as specd writes them, compacted, behind mode byte 0."""
    seeds = {}
    with tempfile.TemporaryDirectory() as tmp:
        synth = os.path.join(tmp, "synth")
        conv = os.path.join(tmp, "conv")
        subprocess.run([specd, "synth", "--shape", "tiny", "--vocab", "300", "--out", synth],
                       check=True, capture_output=True)
        stories = os.path.join(SHARED, "models", "stories260K")
        subprocess.run([specd, "convert", "llama2c", "--checkpoint",
                        os.path.join(stories, "stories260K.bin"), "--tokenizer",
                        os.path.join(stories, "tok512.bin"), "--out", conv],
                       check=True, capture_output=True)
        for name, d in (("json_synth_tiny", synth), ("json_stories260k", conv)):
            with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
                doc = json.load(f)
            seeds[name] = b"\x00" + json.dumps(doc, separators=(",", ":"),
                                                ensure_ascii=False).encode()
    return seeds


# Chat templates in the shapes real models ship (ChatML, Llama 3, Mistral's alternation check
# with a namespace), one that uses many builtins, and ones that ask for unbounded work: nested
# loops, a string that doubles, a recursive macro, a huge repetition, a list that holds itself
# twice per level, huge widths and separators. Loading and rendering must refuse the last kind
# with an error, within the fuzzer's time and memory limits.
CHAT_TEMPLATES = {
    "chatml": "{{ bos_token }}{% for message in messages %}{{ '<|im_start|>' + message['role'] + "
              "'\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
              "{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "llama3": "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + "
              "message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
              "'<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}"
              "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}",
    "mistral": "{%- set ns = namespace(system='') %}{%- for m in messages %}"
               "{%- if m.role == 'system' %}{%- set ns.system = m.content %}"
               "{%- elif (m.role == 'user') != (loop.index0 % 2 == 0) %}"
               "{{- raise_exception('Conversation roles must alternate user/assistant') }}"
               "{%- elif m.role == 'user' %}{{- '[INST] ' + ns.system + m.content + ' [/INST]' }}"
               "{%- else %}{{- m.content + eos_token }}{%- endif %}{%- endfor %}",
    "builtins": "{% macro f(x, y=2) %}{{ x * y }}{% endmacro %}{{ f(3) }}{{ messages | tojson }}"
                "{{ messages | length }}{{ 'abc' | upper }}{% for k, v in {'a': 1}.items() %}"
                "{{ k }}{{ v }}{% endfor %}{{ range(3) | list }}{{ strftime_now('%d %b %Y') }}"
                "{{ messages[0].content[1:3] }}{{ 'a,b'.split(',') | join('-') }}"
                "{% if messages is defined and not none %}{{ loop }}{% endif %}",
    "nested_loops": "{% for i in range(1000000) %}{% for j in range(1000000) %}{{ '' }}"
                    "{% endfor %}{% endfor %}",
    "doubling": "{% set ns = namespace(s='x') %}{% for i in range(80) %}"
                "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}",
    "recursion": "{% macro r(n) %}{{ r(n + 1) }}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}",
    "repeat": "{{ 'x' * 100000000000 }}{{ [1] * 100000000000 }}",
    "self_sharing": "{% set ns = namespace(x=[1]) %}{% for i in range(40) %}"
                    "{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x | tojson }}{{ ns.x ~ '' }}",
    "widths": "{{ 'a\\nb' | indent(100000000000) }}{{ [[1]] | tojson(indent=100000000000) }}"
              "{{ range(9) | join(range(100000) | join('y')) }}{{ 'ab' | replace('', 'c' * 1) }}",
}
CHAT_MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]},
    {"role": "assistant", "content": "Hi!", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
]


def chat_template_seeds():
    out = {}
    for name, source in CHAT_TEMPLATES.items():
        out[name] = b"\x03" + source.encode() + b"\x00" + json.dumps(CHAT_MESSAGES).encode()
    out["no_messages"] = b"\x01" + CHAT_TEMPLATES["chatml"].encode()
    return out


# HTTP bodies of each endpoint (byte 0: completions, 1: chat, 2: /tokenize, 3: /detokenize),
# valid ones using most fields and invalid ones of each kind.
OPENAI_BODIES = {
    "completion_prediction": (0, {"prompt": "x", "max_tokens": 4, "num_speculative_tokens": 3,
                                  "prediction": {"type": "content", "content": [
                                      {"type": "text", "text": "a b"}, {"type": "text",
                                                                        "text": "c"}]}}),
    "completion_text": (0, {"model": "m", "prompt": "hello", "max_tokens": 8, "temperature": 0.7,
                            "top_p": 0.9, "top_k": 20, "min_p": 0.05, "n": 2, "seed": 7,
                            "stop": ["\n", "."], "logprobs": 3, "echo": True,
                            "logit_bias": {"5": -100, "6": 2.5}, "presence_penalty": 0.5,
                            "frequency_penalty": 0.5, "repetition_penalty": 1.1,
                            "stream": True, "stream_options": {"include_usage": True},
                            "ignore_eos": True, "stop_token_ids": [2],
                            "num_speculative_tokens": 4, "return_token_ids": True}),
    "completion_prompts": (0, {"prompt": ["a", "b"], "max_tokens": 4}),
    "completion_ids": (0, {"prompt": [[1, 5, 9], [3]], "max_tokens": 4, "draft_method": "ngram"}),
    "completion_bad_types": (0, {"prompt": {"x": 1}, "max_tokens": "8", "temperature": [1],
                                 "n": 1e30, "stop": [1, 2], "logit_bias": {"x": "y"}}),
    "completion_bad_json": (0, '{"prompt": "hi", "max_tokens": '),
    "chat": (1, {"messages": [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                              {"role": "assistant", "content": "Hello"}],
                 "max_completion_tokens": 8, "logprobs": True, "top_logprobs": 2,
                 "continue_final_message": True, "add_generation_prompt": False,
                 "chat_template_kwargs": {"date_string": "29 Nov 2026"},
                 "speculation_tree": {"branching": [2, 2]}, "egag": True,
                 "guidance": {"scale": 1.5, "unconditional_prompt": "x"}}),
    "chat_bad_messages": (1, {"messages": [{"role": 5}, {"content": None}, "x"]}),
    "chat_tools": (1, {"messages": [{"role": "user", "content": "x"}], "tools": [],
                       "response_format": {"type": "json_object"}}),
    "tokenize": (2, {"prompt": "hello world", "add_special_tokens": False,
                     "return_token_strs": True}),
    "tokenize_chat": (2, {"messages": [{"role": "user", "content": "hi"}],
                          "add_generation_prompt": True}),
    "detokenize": (3, {"tokens": [1, 5, 9, 300000, -1]}),
    "chat_tool_call": (1, {"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"}],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "d", "strict": True,
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": "auto", "parallel_tool_calls": False}),
    "chat_tool_choice": (1, {"messages": [{"role": "user", "content": "x"}],
                             "tools": [{"type": "function", "function": {"name": "f"}}],
                             "tool_choice": {"type": "function", "function": {"name": "f"}}}),
    "tokenize_tools": (2, {"messages": [{"role": "user", "content": "hi"}],
                           "tools": [{"type": "function", "function": {"name": "f"}}]}),
    # Bit 2 of the first byte: a model's reply, parsed for tool calls.
    "reply_llama3": (4, '{"name": "get_weather", "parameters": {"city": "Oslo"}}'),
    "reply_llama3_many": (4, '<|python_tag|>{"name": "calculate", "arguments": "{}"}; '
                             '{"name": "get_weather"}'),
    "reply_hermes": (4, 'Sure. <tool_call>\n{"name": "calculate", "arguments": {"expr": "{"}}'
                        '\n</tool_call>\n<tool_call>{"name": "get_weather"}</tool_call>'),
    "reply_text": (4, 'No tools needed <tool but {braces} and "quotes\\"'),
    "reply_mistral": (4, '[TOOL_CALLS] [{"name": "calculate", "arguments": {"expr": "]"}}, '
                         '{"name": "get_weather", "arguments": {}}]'),
    "reply_granite": (4, '<|tool_call|>[{"arguments": {"city": "Oslo"}, "name": "get_weather"}]'),
}


def openai_seeds():
    return {name: bytes([endpoint]) + (body if isinstance(body, str) else json.dumps(body)).encode()
            for name, (endpoint, body) in OPENAI_BODIES.items()}


def write(corpus, name, data):
    os.makedirs(os.path.join(HERE, "corpus", corpus), exist_ok=True)
    with open(os.path.join(HERE, "corpus", corpus, name), "wb") as f:
        f.write(data)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--specd", help="specd binary, to rewrite the tokenizer.json seeds")
    args = parser.parse_args()
    for name, data in tokenizer_seeds().items():
        write("tokenizer", name, data)
    if args.specd:
        for name, data in specd_tokenizer_seeds(args.specd).items():
            write("tokenizer", name, data)
    for name, data in request_seeds().items():
        write("request", name, data)
    for name, data in chat_template_seeds().items():
        write("chat_template", name, data)
    for name, data in openai_seeds().items():
        write("openai_request", name, data)
    for name, data in SAFETENSORS.items():
        with open(os.path.join(HERE, "corpus", "safetensors", name), "wb") as f:
            f.write(data)
    for name, cfg in CONFIGS.items():
        with open(os.path.join(HERE, "corpus", "model_config", name), "w") as f:
            json.dump(cfg, f, indent=2)


if __name__ == "__main__":
    main()
