#!/usr/bin/env python3
"""Llama 2 reference for the tokenizer parity test, from the SentencePiece model alone.

1. Writes the Hugging Face `tokenizer.json` (+ `tokenizer_config.json`, `generation_config.json`)
   that transformers' LlamaConverter produces from a Llama 2 `tokenizer.model` (legacy mode):
   a BPE model with byte fallback, merges recovered from the piece scores the way
   SentencePieceExtractor/generate_merges does, the Prepend/Replace normalizer and the
   Replace/ByteFallback/Fuse/Strip decoder.
2. Writes `expected.json`: for every corpus string, SentencePiece's own `encode` ids (no BOS)
   and its `decode` of them.
The test then runs hf_reference.mjs (Hugging Face `tokenizers`) on the written directory for
what SentencePiece cannot answer: the Hugging Face decoding of arbitrary id sequences.

Runs with Debian's python3-sentencepiece only (no transformers, no protobuf):
  /usr/bin/python3 sp_to_hf_tokenizer.py --model tokenizer.model --corpus corpus.jsonl --out DIR
"""

import argparse
import json
import os
import sys

import sentencepiece as spm

SPACE = "\u2581"  # "▁", SentencePiece's visible space


def load_corpus(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def build_vocab(sp):
    vocab = {}
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if piece in vocab:
            sys.exit(f"duplicate piece {piece!r} at ids {vocab[piece]} and {i}")
        vocab[piece] = i
    return vocab


def build_merges(sp, vocab):
    """Every split of every piece into two vocabulary pieces, ordered by the merged piece's
    score (highest first), ties by longer left then longer right part; within one piece by the
    parts' ids. This is transformers' generate_merges(vocab, vocab_scores)."""
    merges = []
    for piece, piece_id in vocab.items():
        score = sp.get_score(piece_id)
        local = []
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                local.append((left, right, score))
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    # Python's sort is stable with reverse=True too, as generate_merges relies on.
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    for left, right, _ in merges:
        if " " in left or " " in right:
            sys.exit(f"merge part contains a space, cannot write 'a b' merges: {left!r} {right!r}")
    return [f"{left} {right}" for left, right, _ in merges]


def added_token(token_id, content):
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def build_tokenizer_json(sp):
    vocab = build_vocab(sp)
    unk, bos, eos = sp.unk_id(), sp.bos_id(), sp.eos_id()
    bos_piece = sp.id_to_piece(bos)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [added_token(i, sp.id_to_piece(i)) for i in sorted({unk, bos, eos})],
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": SPACE},
                {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
            ],
        },
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": bos_piece, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": bos_piece, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": bos_piece, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {bos_piece: {"id": bos_piece, "ids": [bos], "tokens": [bos_piece]}},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": sp.id_to_piece(unk),
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": build_merges(sp, vocab),
        },
    }


def build_expected(sp, corpus):
    cases = []
    for text in corpus:
        ids = sp.encode(text)
        cases.append({"ids": ids, "decoded": sp.decode(ids)})
    return {
        "reference": f"sentencepiece {spm.__version__}",
        "bos_id": sp.bos_id(),
        "eos_id": sp.eos_id(),
        "vocab_size": sp.get_piece_size(),
        "corpus": cases,
    }


def write_json(path, value):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False)
    os.replace(tmp, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="SentencePiece tokenizer.model")
    parser.add_argument("--corpus", required=True, help="corpus.jsonl")
    parser.add_argument("--out", required=True, help="output directory")
    args = parser.parse_args()

    sp = spm.SentencePieceProcessor(model_file=args.model)
    os.makedirs(args.out, exist_ok=True)
    corpus = load_corpus(args.corpus)
    write_json(os.path.join(args.out, "tokenizer.json"), build_tokenizer_json(sp))
    write_json(os.path.join(args.out, "tokenizer_config.json"), {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": sp.id_to_piece(sp.bos_id()),
        "eos_token": sp.id_to_piece(sp.eos_id()),
        "unk_token": sp.id_to_piece(sp.unk_id()),
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "tokenizer_class": "LlamaTokenizer",
    })
    write_json(os.path.join(args.out, "generation_config.json"), {
        "bos_token_id": sp.bos_id(),
        "eos_token_id": sp.eos_id(),
    })
    # Written last: its presence tells a caller the whole directory is complete.
    write_json(os.path.join(args.out, "expected.json"), build_expected(sp, corpus))


if __name__ == "__main__":
    main()
