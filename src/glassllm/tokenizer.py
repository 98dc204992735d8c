"""Tokenizers: text <-> integer ids, and a streaming decoder for printing as tokens arrive.

Every tokenizer here has the same small surface, so the model file, the CLI and the generator
do not care which one they hold:

    vocab_size: int                     number of ids
    eot_id: int                         the end-of-text id
    encode(text: str) -> np.ndarray     1-D ids (uint16 when vocab_size <= 65536, else uint32)
    decode(ids) -> str                  never raises; invalid UTF-8 becomes U+FFFD
    decode_bytes(ids) -> bytes          the raw bytes the ids stand for
    to_json() -> str                    enough to rebuild it with `tokenizer_from_json`
"""
from __future__ import annotations

import codecs
import json

import numpy as np


class ByteTokenizer:
    """One id per UTF-8 byte (0-255) plus end-of-text (256): vocab_size 257.

    No training, no unknown tokens, any text round-trips. The price is length: a token per
    byte, so a model spends context spelling words (004 calls this its limit).
    """

    vocab_size = 257
    eot_id = 256

    def encode(self, text: str) -> np.ndarray:
        """str -> uint16 ids of its UTF-8 bytes (no end-of-text added)."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

    def decode_bytes(self, ids) -> bytes:
        """Ids -> bytes; the end-of-text id contributes nothing.

        Raises:
            ValueError: an id outside [0, 257).
        """
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"ByteTokenizer: ids must be in [0, {self.vocab_size}), got "
                             f"range [{ids.min()}, {ids.max()}]")
        return ids[ids != self.eot_id].astype(np.uint8).tobytes()

    def decode(self, ids) -> str:
        """Ids -> text. Never raises for ids in range: bytes that are not valid UTF-8 (a model
        can emit any byte sequence) become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def to_json(self) -> str:
        return json.dumps({"type": "byte"})


class StreamDecoder:
    """Turns ids into text one at a time, releasing only complete UTF-8 characters.

    A multi-byte character can be split across tokens (always, with ByteTokenizer); printing
    each token's bytes at once would show broken characters. `push(id)` returns the text
    completed so far (possibly ""), `flush()` the rest. ''.join of all chunks followed by
    flush() equals `tok.decode(all ids)`, because both use the same UTF-8 decoder with
    errors="replace", one incrementally.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self.tokenizer.decode_bytes([int(token_id)]))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


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
        return BPETokenizer.from_json(text)  # noqa: F821 -- defined below by the BPE section
    raise ValueError(f"unknown tokenizer type {kind!r}")
