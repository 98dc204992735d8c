"""Any Hugging Face `tokenizer.json` as a glassllm tokenizer, through the `tokenizers` library.

The checkpoints of issue-21's classes ship their tokenizer as one `tokenizer.json`: a
byte-level BPE (Qwen2/Qwen3, Pythia, SmolLM2, OLMo-2, Phi: GPT-2's byte-to-character table,
with their own pre-tokenizer regex and special tokens) or a SentencePiece-style BPE (Gemma:
spaces as "▁", unknown bytes as the byte pieces "<0x00>".."<0xFF>", `byte_fallback`).
`HFTokenizer` encodes with the library itself (normalizer, pre-tokenizer and model exactly as
the file says, so ids equal `transformers.AutoTokenizer`'s without special tokens) and
decodes through a table id -> bytes built once from the vocabulary (for `decode_bytes` and
token-by-token streaming, which the library's text decoder cannot do mid-character).

The end-of-text and begin-of-sequence ids come from the checkpoint's config.json
(`eos_token_id`, `bos_token_id`) when given, else from the usual token names.

Not reproduced: a decoder's `Strip` of the space a `Prepend("▁")` normalizer added (Llama 2's
tokenizer.json): `decode` keeps that leading space (ids are unaffected). Gemma's files have no
such normalizer.
"""
from __future__ import annotations

import json
import re

import numpy as np

from ..formats.atomic import atomic_write
from .bpe import UNICODE_TO_BYTE

EOS_NAMES = ("<|endoftext|>", "<eos>", "</s>", "<|end_of_text|>", "<|im_end|>")
BOS_NAMES = ("<bos>", "<s>", "<|begin_of_text|>")
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


# GPT-2's printable stand-in of each byte, reversed: how a byte-level vocabulary spells bytes
_CHAR_TO_BYTE = UNICODE_TO_BYTE


class HFTokenizer:
    """A `tokenizers.Tokenizer` read from a tokenizer.json, with glassllm's tokenizer surface
    (`glassllm.tokenizers`): vocab_size, eot_id, bos_id, encode, decode, decode_bytes,
    to_json.

    Args:
        hf_tokenizer: the `tokenizers.Tokenizer`.
        eot_id: the end-of-text id (None: looked up by the names EOS_NAMES).
        bos_id: the begin-of-sequence id (None: looked up by the names BOS_NAMES; it may
            stay None).

    Raises:
        ValueError: no end-of-text token, or a vocabulary entry whose bytes cannot be known
            (neither byte-level characters nor SentencePiece text/byte pieces).
    """

    def __init__(self, hf_tokenizer, eot_id: int | None = None, bos_id: int | None = None):
        self._tok = hf_tokenizer
        self.vocab_size = int(hf_tokenizer.get_vocab_size(with_added_tokens=True))
        self.eot_id = self._special(eot_id, EOS_NAMES, "end-of-text")
        self.bos_id = self._special(bos_id, BOS_NAMES, None)
        self._id_dtype = np.uint16 if self.vocab_size <= 65536 else np.uint32
        self._id_bytes = self._byte_table()

    def __repr__(self) -> str:
        """`HFTokenizer(vocab_size=32000, model='BPE', eot_id=2, bos_id=1)`: `model` is the
        tokenizer.json's model type (BPE, Unigram, WordPiece, WordLevel)."""
        return (f"HFTokenizer(vocab_size={self.vocab_size}, "
                f"model={type(self._tok.model).__name__!r}, eot_id={self.eot_id}, "
                f"bos_id={self.bos_id})")

    def _special(self, given, names, what):
        if given is not None:
            given = int(given)
            if not 0 <= given < self.vocab_size:
                raise ValueError(f"tokenizer.json: special id {given} outside the vocabulary "
                                 f"of {self.vocab_size}")
            return given
        for name in names:
            found = self._tok.token_to_id(name)
            if found is not None:
                return int(found)
        if what is None:
            return None
        raise ValueError(f"tokenizer.json: no {what} token (none of {list(names)}) and no "
                         f"eos_token_id in config.json")

    def _byte_table(self) -> list[bytes]:
        """id -> the bytes it stands for: special tokens none; byte-level vocabularies through
        GPT-2's character table; SentencePiece ones with "▁" as a space and <0xNN> as a byte."""
        special = {t.content for t in self._tok.get_added_tokens_decoder().values()
                   if t.special}
        vocab = self._tok.get_vocab(with_added_tokens=True)
        byte_level = all(all(c in _CHAR_TO_BYTE for c in token)
                         for token in vocab if token not in special)
        table = [b""] * self.vocab_size
        for token, i in vocab.items():
            if token in special:
                continue
            if byte_level:
                table[i] = bytes(_CHAR_TO_BYTE[c] for c in token)
            elif _BYTE_PIECE.fullmatch(token):
                table[i] = bytes([int(token[3:5], 16)])
            else:
                table[i] = token.replace("\u2581", " ").encode("utf-8")
        return table

    # -- the tokenizer protocol --------------------------------------------------------------
    def encode(self, text: str) -> np.ndarray:
        """str -> 1-D ids, no special tokens added (special-token strings in the text are
        ordinary characters, as `BPETokenizer.encode`).

        Raises:
            ValueError: text not a str, or not valid Unicode.
        """
        if not isinstance(text, str):
            raise ValueError(f"HFTokenizer.encode: expected str, got {type(text).__name__}")
        self._tok.encode_special_tokens = True
        try:
            ids = self._tok.encode(text, add_special_tokens=False).ids
        except TypeError:  # lone surrogates
            raise ValueError("HFTokenizer.encode: text is not valid Unicode") from None
        return np.asarray(ids, dtype=self._id_dtype)

    def decode_bytes(self, ids) -> bytes:
        """Ids -> the exact bytes they stand for (special tokens give none).

        Raises:
            ValueError: an id outside [0, vocab_size).
        """
        ids = np.asarray(ids).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"HFTokenizer: ids must be in [0, {self.vocab_size})")
        table = self._id_bytes
        return b"".join([table[int(i)] for i in ids])

    def decode(self, ids) -> str:
        """Ids -> text; invalid UTF-8 becomes U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(int(token_id))

    # -- files -------------------------------------------------------------------------------
    def to_json(self) -> str:
        """{"type": "hf", "eot_id": ..., "bos_id": ..., "tokenizer": <the tokenizer.json>}."""
        return json.dumps({"type": "hf", "eot_id": self.eot_id, "bos_id": self.bos_id,
                           "tokenizer": json.loads(self._tok.to_str())}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str, eot_id: int | None = None,
                  bos_id: int | None = None) -> "HFTokenizer":
        """From `to_json()`, or from a plain tokenizer.json's text (with the ids given).

        Raises:
            ValueError: not JSON, or not a description the `tokenizers` library loads.
        """
        from tokenizers import Tokenizer
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"tokenizer JSON is not valid: {e}") from None
        if isinstance(spec, dict) and spec.get("type") == "hf":
            eot_id, bos_id, spec = spec.get("eot_id"), spec.get("bos_id"), spec.get("tokenizer")
        if not isinstance(spec, dict) or "model" not in spec:
            raise ValueError("tokenizer JSON has no tokenizer model")
        try:
            tok = Tokenizer.from_str(json.dumps(spec))
        except Exception as e:  # tokenizers raises plain Exception for a bad description
            if type(e) is not Exception:
                raise
            raise ValueError(f"tokenizer JSON cannot be loaded: {e}") from None
        return cls(tok, eot_id, bos_id)

    def save(self, path) -> None:
        with atomic_write(path, "w") as f:
            f.write(self.to_json())
