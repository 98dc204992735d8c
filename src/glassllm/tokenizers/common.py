"""What every tokenizer of the package shares: the id an unconditional sample starts from
(`start_id`), the streaming decoder (`StreamDecoder`), and the checks of text and ids the
tokenizers raise the same errors with.

The surface every glassllm tokenizer has (byte, BPE, SentencePiece, tokenizer.json), so the
model file, the CLI and the generator do not care which one they hold:

    vocab_size: int                     number of ids
    eot_id: int                         the end-of-text id
    bos_id: int | None                  the begin-of-sequence id (SentencePiece/Llama: 1), or
                                        None when the tokenizer has none (GPT-2, byte)
    encode(text: str) -> np.ndarray     1-D ids (uint16 when vocab_size <= 65536, else uint32);
                                        ValueError for text that is not valid Unicode
    decode(ids) -> str                  never raises; invalid UTF-8 becomes U+FFFD
    decode_bytes(ids) -> bytes          the raw bytes the ids stand for
    to_json() -> str                    enough to rebuild it with `tokenizer_from_json`
    stop_ids (optional)                 the ids that end a generation; default (eot_id,)
"""
from __future__ import annotations

import codecs

import numpy as np


def start_id(tokenizer) -> int:
    """The id an unconditional sample starts from (an empty prompt): the tokenizer's
    begin-of-sequence id (`bos_id`; SentencePiece/Llama: BOS, as llama2.c starts), or its
    end-of-text id when it has none (`bos_id` None: GPT-2 and the byte tokenizer, as nanoGPT's
    and transformers' GPT-2 `generate` start from <|endoftext|>). Tokenizers without a
    `bos_id` attribute count as having none."""
    bos = getattr(tokenizer, "bos_id", None)
    return int(tokenizer.eot_id if bos is None else bos)


def check_text(text, who: str) -> None:
    """ValueError "<who>: expected str, got <type>" for anything but a str."""
    if not isinstance(text, str):
        raise ValueError(f"{who}: expected str, got {type(text).__name__}")


def not_unicode(who: str, text: str, e: UnicodeEncodeError | None = None) -> ValueError:
    """The ValueError for a str that has no UTF-8 encoding (a lone surrogate)."""
    if e is None:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as found:
            e = found
    where = f" {text[e.start]!r} at character {e.start}" if e is not None else ""
    return ValueError(f"{who}: text is not valid Unicode: lone surrogate{where} (undecodable "
                      f"bytes read with errors='surrogateescape'?); decode the input as UTF-8, "
                      f"e.g. with errors='replace'")


class StreamDecoder:
    """Turns ids into text one at a time, releasing only complete UTF-8 characters.

    A multi-byte character can be split across tokens (always, with ByteTokenizer); printing
    each token's bytes at once would show broken characters. `push(id)` returns the text
    completed so far (possibly ""), `flush()` the rest. ''.join of all chunks followed by
    flush() equals `tok.decode(all ids)`, because both use the same UTF-8 decoder with
    errors="replace", one incrementally.

    Some tokenizers print a token differently after some others: SentencePiece drops the
    leading space of the piece after BOS (`SentencePieceTokenizer.piece_bytes`). For those the
    decoder remembers the previous id; `prev_id` is the id before the first pushed one (the
    last prompt token, or BOS for an unconditional sample), None for the start of a sequence.
    """

    def __init__(self, tokenizer, prev_id: int | None = None):
        self.tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._piece_bytes = getattr(tokenizer, "piece_bytes", None)
        self._prev = None if prev_id is None else int(prev_id)

    def push(self, token_id: int) -> str:
        token_id = int(token_id)
        if self._piece_bytes is not None:
            data = self._piece_bytes(token_id, self._prev)
        else:
            data = self.tokenizer.decode_bytes([token_id])
        self._prev = token_id
        return self._utf8.decode(data)

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def ids_below(ids, vocab_size: int, who: str) -> np.ndarray:
    """ids as a flat int64 array, checked to lie in [0, vocab_size).

    Raises:
        ValueError: "<who>: ids must be in [0, V), got range [lo, hi]".
    """
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{who}: ids must be in [0, {vocab_size}), got range "
                         f"[{ids.min()}, {ids.max()}]")
    return ids
