"""A tokenizer from its JSON description or from disk, whatever kind it is."""
from __future__ import annotations

import json
import os

from .bpe import BPETokenizer
from .byte import ByteTokenizer
from .hf import from_hf_json
from .sentencepiece import SentencePieceTokenizer
from .tokenizer_json import HFTokenizer


def tokenizer_from_json(text: str):
    """Rebuild a tokenizer from its `to_json()` string.

    Raises:
        ValueError: not JSON, or an unknown tokenizer type.
    """
    try:
        spec = json.loads(text)
        kind = spec["type"]
    except (json.JSONDecodeError, TypeError, KeyError) as e:
        raise ValueError(f"tokenizer description is not valid: {e}") from None
    if kind == "byte":
        return ByteTokenizer()
    if kind == "bpe":
        return BPETokenizer.from_json(text)
    if kind == "sentencepiece":
        return SentencePieceTokenizer.from_json(text)
    if kind == "hf":  # any other tokenizer.json (Gemma's SentencePiece-style BPE, ...)
        return HFTokenizer.from_json(text)
    raise ValueError(f"unknown tokenizer type {kind!r}")


def load_tokenizer(path):
    """A tokenizer from disk: a JSON file written by any tokenizer's `to_json()` / `save`
    (byte or bpe), a HF `tokenizer.json` (a byte-level BPE, or the byte or SentencePiece
    layouts `glassllm.formats.hf.to_hf` writes: `glassllm.tokenizers.hf`), or a
    directory holding GPT-2's `vocab.json` + `merges.txt` (or a `tokenizer.json`).

    Raises:
        FileNotFoundError: path missing, or a directory without those files.
        ValueError: the file is not a tokenizer description.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        vocab, merges = os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt")
        if os.path.isfile(vocab) and os.path.isfile(merges):
            return BPETokenizer.from_gpt2_files(vocab, merges)
        if os.path.isfile(os.path.join(path, "tokenizer.json")):
            return load_tokenizer(os.path.join(path, "tokenizer.json"))
        raise FileNotFoundError(f"{path}: no vocab.json + merges.txt or tokenizer.json in it")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such tokenizer file or directory: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a tokenizer JSON file (not UTF-8 text)") from None
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a tokenizer JSON file: {e}") from None
    if isinstance(spec, dict) and "type" in spec:
        return tokenizer_from_json(text)
    try:
        return from_hf_json(text) or BPETokenizer.from_json(text)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
