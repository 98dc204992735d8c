"""Byte-level BPE, GPT-2's (openai/gpt-2 src/encoder.py), on top of Hugging Face `tokenizers`.

`import tokenizers` / `from tokenizers import ...` here is the PyPI library: imports are
absolute (PEP 328), so this package's own name never shadows it.
"""
from __future__ import annotations

import json
import os

import numpy as np

from ..formats.atomic import atomic_write
from .common import check_text, ids_below, not_unicode

EOT_TOKEN = "<|endoftext|>"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from the 256 byte values to 256 printable characters.

    Byte-level BPE works on text where each byte is replaced by one visible character, so
    merges never see control bytes or spaces: printable Latin-1 bytes stand for themselves and
    the other 68 bytes map to U+0100.. in order. Source: openai/gpt-2 src/encoder.py
    `bytes_to_unicode` (the same table HF `tokenizers` ByteLevel uses).
    """
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


UNICODE_TO_BYTE = {c: b for b, c in bytes_to_unicode().items()}


class BPETokenizer:
    """Byte-level BPE (GPT-2 style) on top of Hugging Face `tokenizers`.

    Text is split by GPT-2's regex pre-tokenizer, each piece's UTF-8 bytes are mapped to
    printable characters (`bytes_to_unicode`) and merged by the learned merge list (Sennrich
    et al. 2016, "Neural Machine Translation of Rare Words with Subword Units"; byte-level
    variant: Radford et al. 2019, GPT-2). Any text encodes, no unknown tokens.

    `eot_id` is the id of the special token "<|endoftext|>". `encode(text)` treats that string
    in text as ordinary characters (like tiktoken's `encode_ordinary`, and like ByteTokenizer)
    unless `allowed_special="all"`. `decode_bytes` drops special tokens (end-of-text stands for
    no bytes, as in ByteTokenizer).

    `bos_id` is None: GPT-2's byte-level BPE has no begin-of-sequence token, so an
    unconditional sample starts from `eot_id` (see `start_id`).

    Build one with `BPETokenizer.train(...)`, `from_gpt2_files(vocab.json, merges.txt)`,
    `load(path)` or `from_json(text)`.
    """

    bos_id = None

    def __init__(self, hf_tokenizer, eot_token: str = EOT_TOKEN):
        """Wrap a `tokenizers.Tokenizer` whose model is byte-level BPE.

        Raises:
            ValueError: not a BPE model, the end-of-text token missing, or a vocabulary entry
                that is not made of byte-level characters (so its bytes would be unknown).
        """
        from tokenizers import models
        self._tok = hf_tokenizer
        self._json = None
        if not isinstance(hf_tokenizer.model, models.BPE):
            raise ValueError(f"BPETokenizer: expected a BPE model, got "
                             f"{type(hf_tokenizer.model).__name__}")
        eot = hf_tokenizer.token_to_id(eot_token)
        if eot is None:
            raise ValueError(f"BPETokenizer: the vocabulary has no {eot_token!r} token")
        self.eot_token = eot_token
        self.eot_id = int(eot)
        self.vocab_size = int(hf_tokenizer.get_vocab_size(with_added_tokens=True))
        self._id_dtype = np.uint16 if self.vocab_size <= 65536 else np.uint32
        # Table id -> raw bytes, built once: decode_bytes is then a join, and StreamDecoder
        # can push one id at a time without going through the Rust decoder.
        special = {t.content for t in hf_tokenizer.get_added_tokens_decoder().values()
                   if t.special}
        self._id_bytes: list[bytes] = [b""] * self.vocab_size
        for token, i in hf_tokenizer.get_vocab(with_added_tokens=True).items():
            if token in special:
                continue  # special tokens stand for no bytes
            try:
                self._id_bytes[i] = bytes(UNICODE_TO_BYTE[c] for c in token)
            except KeyError:
                raise ValueError(f"BPETokenizer: token {token!r} (id {i}) is not byte-level; "
                                 "only byte-level BPE tokenizers are supported") from None

    def __repr__(self) -> str:
        """`BPETokenizer(vocab_size=50257, merges=50000, eot_token='<|endoftext|>')`: merges
        counts the tokens of two or more bytes (in byte-level BPE, one per merge rule)."""
        merges = sum(len(b) > 1 for b in self._id_bytes)
        return (f"BPETokenizer(vocab_size={self.vocab_size}, merges={merges}, "
                f"eot_token={self.eot_token!r})")

    # -- building ----------------------------------------------------------------------------

    @staticmethod
    def _byte_level(hf_tokenizer):
        from tokenizers import decoders, pre_tokenizers
        hf_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf_tokenizer.decoder = decoders.ByteLevel()
        return hf_tokenizer

    @classmethod
    def train(cls, texts, vocab_size: int, min_frequency: int = 2) -> "BPETokenizer":
        """Learn a byte-level BPE of `vocab_size` ids from text.

        Args:
            texts: one str (the whole text), an iterable of str (text chunks of a corpus,
                streamed; split them at newlines so no word is cut), or a list of
                pathlib.Path files (read as UTF-8 by `tokenizers`). A plain str is always
                text, never a file name, and never iterated character by character.
            vocab_size: total ids, >= 257: id 0 is "<|endoftext|>", ids 1..256 the 256 bytes,
                the rest merges (fewer if the corpus runs out of pairs seen `min_frequency`
                times).

        Raises:
            ValueError: vocab_size < 257. FileNotFoundError: a Path that is not a file.
        """
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
        if vocab_size < 257:
            raise ValueError(f"BPETokenizer.train: vocab_size must be >= 257 (256 bytes + "
                             f"end-of-text), got {vocab_size}")
        tok = cls._byte_level(Tokenizer(models.BPE()))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      special_tokens=[EOT_TOKEN], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        if isinstance(texts, str):  # one text; iterating it would give single characters
            texts = [texts]
        if isinstance(texts, (list, tuple)) and texts and all(
                isinstance(t, os.PathLike) for t in texts):
            for t in texts:
                if not os.path.isfile(t):
                    raise FileNotFoundError(f"BPETokenizer.train: no such file {t}")
            tok.train([os.fspath(t) for t in texts], trainer)
        else:
            tok.train_from_iterator(texts, trainer)
        return cls(tok)

    @classmethod
    def from_gpt2_files(cls, vocab_json, merges_txt) -> "BPETokenizer":
        """GPT-2's tokenizer from its `vocab.json` (token -> id) and `merges.txt`; ids equal
        GPT-2's (OpenAI's `encoder.json`/`vocab.bpe` are the same files). vocab_size 50257,
        eot_id 50256.

        Raises:
            FileNotFoundError: a file is missing.
            ValueError: the files cannot be parsed as a BPE vocabulary and merge list.
        """
        from tokenizers import Tokenizer, models
        for path in (vocab_json, merges_txt):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"GPT-2 tokenizer file not found: {path}")
        try:
            model = models.BPE.from_file(os.fspath(vocab_json), os.fspath(merges_txt))
        except Exception as e:  # tokenizers raises plain Exception for a bad file
            if type(e) is not Exception:  # MemoryError, OSError...: not about the content
                raise
            raise ValueError(f"cannot read GPT-2 tokenizer files {vocab_json}, {merges_txt}: "
                             f"{e}") from None
        tok = cls._byte_level(Tokenizer(model))
        tok.add_special_tokens([EOT_TOKEN])
        return cls(tok)

    # -- the tokenizer protocol --------------------------------------------------------------

    def encode(self, text: str, allowed_special: str = "none") -> np.ndarray:
        """str -> 1-D ids (uint16 when vocab_size <= 65536, else uint32); no end-of-text added.

        allowed_special: "none" encodes "<|endoftext|>" in text as ordinary characters;
            "all" turns it into `eot_id`.

        Raises:
            ValueError: allowed_special not "none" or "all"; text not a str, or not valid
                Unicode (a lone surrogate such as "\\udcff", as ByteTokenizer.encode).
        """
        if allowed_special not in ("none", "all"):
            raise ValueError(f"allowed_special must be 'none' or 'all', got {allowed_special!r}")
        check_text(text, "BPETokenizer.encode")
        self._tok.encode_special_tokens = allowed_special == "none"
        try:
            ids = self._tok.encode(text, add_special_tokens=False).ids
        except TypeError:  # the Rust side cannot take a str with lone surrogates
            raise not_unicode("BPETokenizer.encode", text) from None
        return np.asarray(ids, dtype=self._id_dtype)

    def decode_bytes(self, ids) -> bytes:
        """Ids -> the exact bytes they stand for (special tokens give none).

        Raises:
            ValueError: an id outside [0, vocab_size).
        """
        ids = ids_below(ids, self.vocab_size, "BPETokenizer")
        table = self._id_bytes
        return b"".join([table[i] for i in ids.tolist()])

    def decode(self, ids) -> str:
        """Ids -> text; invalid UTF-8 (tokens can end mid-character) becomes U+FFFD.

        Raises:
            ValueError: an id outside [0, vocab_size).
        """
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of an id (byte-level characters, e.g. 'Ġthe'), or None."""
        return self._tok.id_to_token(int(token_id))

    # -- files -------------------------------------------------------------------------------

    def to_json(self) -> str:
        """{"type": "bpe", "eot_token": ..., "tokenizer": <the HF tokenizer.json object>}."""
        if self._json is None:  # cached: the tokenizer never changes, GPT-2's is 1.7 MB
            self._json = json.dumps({"type": "bpe", "eot_token": self.eot_token,
                                     "tokenizer": json.loads(self._tok.to_str())},
                                    ensure_ascii=False)
        return self._json

    @classmethod
    def from_json(cls, text: str) -> "BPETokenizer":
        """Rebuild from `to_json()`; also accepts a plain HF `tokenizer.json` of a byte-level
        BPE with an "<|endoftext|>" token.

        Raises:
            ValueError: not JSON, or not a byte-level BPE description.
        """
        from tokenizers import Tokenizer
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"BPE tokenizer JSON is not valid: {e}") from None
        if not isinstance(spec, dict):
            raise ValueError("BPE tokenizer JSON must be an object")
        inner, eot_token = spec, EOT_TOKEN
        if spec.get("type") == "bpe":
            inner, eot_token = spec.get("tokenizer"), spec.get("eot_token", EOT_TOKEN)
        if not isinstance(inner, dict) or "model" not in inner:
            raise ValueError("BPE tokenizer JSON has no tokenizer model")
        try:
            tok = Tokenizer.from_str(json.dumps(inner))
        except Exception as e:  # tokenizers raises plain Exception for a bad description
            if type(e) is not Exception:  # MemoryError...: not about the content
                raise
            raise ValueError(f"BPE tokenizer JSON cannot be loaded: {e}") from None
        return cls(tok, eot_token)

    def save(self, path) -> None:
        """Write `to_json()` to `path` atomically (temp file + os.replace)."""
        text = self.to_json()
        with atomic_write(path, "w") as f:
            f.write(text)

    @classmethod
    def load(cls, path) -> "BPETokenizer":
        """Read a file written by `save` (or a HF tokenizer.json).

        Raises:
            FileNotFoundError: no such file. ValueError: see `from_json`.
        """
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())
