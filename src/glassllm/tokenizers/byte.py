"""The byte tokenizer: one id per UTF-8 byte, plus end-of-text."""
from __future__ import annotations

import json

import numpy as np

from .common import check_text, not_unicode


class ByteTokenizer:
    """One id per UTF-8 byte (0-255) plus end-of-text (256): vocab_size 257.

    No training, no unknown tokens, any text round-trips. The price is length: a token per
    byte, so a model spends context spelling words (the reason GPT-2 uses byte-level BPE
    instead: Radford et al. 2019, "Language Models are Unsupervised Multitask Learners",
    section 2.2).
    """

    vocab_size = 257
    eot_id = 256
    bos_id = None  # no begin-of-sequence token: unconditional samples start from eot_id

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size={self.vocab_size})"

    def encode(self, text: str) -> np.ndarray:
        """str -> uint16 ids of its UTF-8 bytes (no end-of-text added).

        Raises:
            ValueError: text is not a str, or is not valid Unicode (a lone surrogate such as
                "\\udcff", which is what `errors="surrogateescape"` makes of undecodable
                bytes: it has no UTF-8 encoding). The message gives its position.
        """
        check_text(text, "ByteTokenizer.encode")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise not_unicode("ByteTokenizer.encode", text, e) from None
        return np.frombuffer(data, dtype=np.uint8).astype(np.uint16)

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
