"""`load_corpus`: what `glassllm train --data` reads (text files, directories, a `glassllm
prepare` directory, or by default the standard library's own .py files), in one call, as a
`Corpus`: training and validation `Batches`, their tokenizer and what to tell the user."""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import sysconfig

import numpy as np

from ..formats.paths import read_regular_file
from ..formats.token_file import TokenFile, sidecar_path
from ..tokenizers import ByteTokenizer
from .batches import ArrayBatches, data_identity
from .text import NoInputFiles, decode_utf8, list_text_files

STDLIB_CORPUS_BYTES = 4 << 20  # the default corpus: the first 4 MiB of the stdlib's .py files
VAL_FRACTION = 0.1             # load_corpus holds out the last 10% of a text token stream


class Corpus:
    """Training and validation `Batches`, their tokenizer and what to tell the user.

    Attributes:
        name: a short description ("a.txt", "3 files", "Python standard library source ...").
        sources: absolute paths the data came from (None for the standard library corpus).
        train, val: `Batches` (ArrayBatches of the bytes, or the TokenFiles of a prepare
            directory).
        tokenizer: ByteTokenizer, or the prepare directory's.
        val_text_bytes: UTF-8 bytes of text the validation tokens encode (None if unknown).
        notes: (path, remark) pairs for the user, e.g. files of a directory that were skipped.
    """

    def __init__(self, name, sources, train, val, tokenizer, val_text_bytes, notes=()):
        self.name, self.sources = name, sources
        self.train, self.val, self.tokenizer = train, val, tokenizer
        self.val_text_bytes = val_text_bytes
        self.notes = list(notes)
        self._identity = None

    def bits_per_byte(self, nats_per_token: float) -> float:
        """A loss in nats per token as bits per byte of the validation text:
        nats * tokens / bytes / ln 2 (tokens per byte 1 when the byte count is unknown)."""
        tokens_per_byte = (self.val.token_count() / self.val_text_bytes
                           if self.val_text_bytes else 1.0)
        return nats_per_token * tokens_per_byte / math.log(2)

    def identity(self) -> dict:
        """`data_identity(train, val)`, what a checkpoint records; computed once (hashing a
        memory-mapped file takes about 2 s per GB)."""
        if self._identity is None:
            self._identity = data_identity(self.train, self.val)
        return self._identity

    def fingerprint(self) -> str:
        """Hex SHA-256 of what the model sees: the tokenizer's JSON and the identity of the
        training and validation token streams."""
        h = hashlib.sha256(self.tokenizer.to_json().encode("utf-8"))
        h.update(json.dumps(self.identity(), sort_keys=True).encode())
        return h.hexdigest()

    def input_files(self) -> list[str]:
        """Every file this corpus was read from (text files, or token files and their
        sidecars): what no output of a run may be."""
        found = [s for s in self.sources or () if not os.path.isdir(s)]
        for split in (self.train, self.val):
            if isinstance(split, TokenFile):
                found += [split.path, sidecar_path(split.path)]
        return found

    def describe(self) -> dict:
        """JSON facts for a checkpoint's `extra`: sources (None: the stdlib corpus), token
        counts and the fingerprint."""
        return {"sources": self.sources, "train_tokens": int(self.train.token_count()),
                "val_tokens": int(self.val.token_count()), "sha256": self.fingerprint()}


def load_corpus(sources=None, seq_len: int = 64, val_fraction: float = VAL_FRACTION,
                stdlib_bytes: int = STDLIB_CORPUS_BYTES, tokenizer=None) -> Corpus:
    """Read training data the way `glassllm train --data` does, in one call.

    sources:
        - None or empty: the standard library's own .py files (`stdlib_corpus`), every Python
          installation has them, so this needs no download;
        - one directory written by `glassllm prepare` (train.bin / val.bin), alone: its
          tokens, split and tokenizer;
        - text files and directories: their bytes concatenated in order (byte tokenizer). A
          file named in `sources` must be UTF-8 (the check of `prepare`); a directory
          contributes the files below it that are UTF-8 and hold no NUL byte (text never
          does; token .bin files, safetensors, images do); the others are skipped and listed
          in `Corpus.notes`.
    For text, the last `val_fraction` of the token stream is the validation split.
    tokenizer: None (bytes, `ByteTokenizer`), or the tokenizer of a model being fine-tuned
    (`glassllm train --init-from`): text is then encoded with it, the last `val_fraction` of
    the text's bytes (cut at a character boundary) being the validation split; a prepare
    directory must have been written with the same tokenizer.

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: a named file is not UTF-8 text (path and byte offset in the message), a
            prepare directory mixed with other data, no text, too little of it for seq_len
            (each split needs more than seq_len tokens), val_fraction outside (0, 1).
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"load_corpus: val_fraction must be in (0, 1), got {val_fraction}")
    sources = [os.fspath(s) for s in sources or ()]
    prepared = [s for s in sources if is_prepared_dir(s)]
    if prepared and len(sources) > 1:
        raise ValueError(f"{prepared[0]} is a `glassllm prepare` directory (its own tokens and "
                         f"split); give it alone, not with other data")
    if prepared:
        # every id checked now, naming the file: one id >= vocab_size would otherwise fail
        # mid-run without a name, or, drawn rarely, never
        train = TokenFile(os.path.join(sources[0], "train.bin"), check_ids=True)
        val = TokenFile(os.path.join(sources[0], "val.bin"), check_ids=True)
        if tokenizer is not None and train.tokenizer().to_json() != tokenizer.to_json():
            raise ValueError(f"{sources[0]}: prepared with another tokenizer than the model's; "
                             f"give text files, or prepare them with the model's tokenizer")
        _check_long_enough(train.token_count(), val.token_count(), seq_len, sources[0])
        return Corpus(sources[0], [os.path.abspath(sources[0])], train, val, train.tokenizer(),
                      val.text_bytes)
    notes = []
    if sources:
        files, chunks, notes = _read_text_files(sources)
        text = b"".join(chunks)
        name = files[0] if len(files) == 1 else f"{len(files)} files"
    else:
        files, text = stdlib_corpus(stdlib_bytes)
        name = f"Python standard library source ({len(files)} .py files, {len(text):,} bytes)"
    paths = [os.path.abspath(f) for f in files] if sources else None
    if tokenizer is not None and tokenizer.to_json() != ByteTokenizer().to_json():
        return _encoded_corpus(name, paths, text, tokenizer, val_fraction, seq_len, notes)
    ids = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
    n_val = int(len(ids) * val_fraction)
    _check_long_enough(len(ids) - n_val, n_val, seq_len, name)
    return Corpus(name, paths, ArrayBatches(ids[:len(ids) - n_val]),
                  ArrayBatches(ids[len(ids) - n_val:]), ByteTokenizer(), n_val, notes)


def _encoded_corpus(name, paths, text: bytes, tokenizer, val_fraction: float, seq_len: int,
                    notes) -> Corpus:
    """UTF-8 `text` split at the character boundary nearest the last `val_fraction` of its
    bytes, each part encoded with `tokenizer` (so no token straddles the split)."""
    cut = len(text) - int(len(text) * val_fraction)
    while 0 < cut < len(text) and (text[cut] & 0xC0) == 0x80:  # a continuation byte
        cut += 1
    train = np.asarray(tokenizer.encode(text[:cut].decode("utf-8")))
    val = np.asarray(tokenizer.encode(text[cut:].decode("utf-8")))
    _check_long_enough(len(train), len(val), seq_len, name)
    return Corpus(name, paths, ArrayBatches(train), ArrayBatches(val), tokenizer,
                  len(text) - cut, notes)


def is_prepared_dir(path) -> bool:
    """True for a directory holding a `glassllm prepare` train.bin."""
    return os.path.isdir(path) and os.path.exists(os.path.join(path, "train.bin"))


def _read_text_files(sources) -> tuple[list[str], list[bytes], list[tuple[str, str]]]:
    """(files, their bytes, notes) for text files and directories; see load_corpus."""
    files, chunks, skipped = [], [], []
    for source in sources:
        named = os.path.isfile(source)
        try:
            found = list_text_files([source])
        except NoInputFiles:  # an empty directory: nothing to take from it
            found = []
        for path in found:
            data = _read_bytes(path)
            if named:
                decode_utf8(path, data, 0)  # ValueError "PATH: not UTF-8 text (... offset N)"
            elif not _is_text(path, data):
                skipped.append(path)
                continue
            files.append(path)
            chunks.append(data)
    notes = []
    if skipped:
        shown = ", ".join(skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3
                                          else "")
        notes.append((" ".join(map(str, sources)),
                      f"skipped {len(skipped)} file(s) that are not UTF-8 text: {shown}"))
    if not files:
        raise ValueError(f"{' '.join(map(str, sources))}: no UTF-8 text files")
    return files, chunks, notes


def _is_text(path: str, data: bytes) -> bool:
    """A file of a directory counts as text when it is UTF-8 and holds no NUL byte (text never
    does; token .bin files, safetensors, images do)."""
    try:
        decode_utf8(path, data, 0)
    except ValueError:
        return False
    return b"\0" not in data


def _read_bytes(path: str) -> bytes:
    return read_regular_file(path, "data file")  # a FIFO or device: ValueError, no hang


def _check_long_enough(n_train: int, n_val: int, seq_len: int, name: str) -> None:
    if min(n_train, n_val) <= seq_len:
        raise ValueError(f"{name}: too little text for seq_len {seq_len} ({n_train} training "
                         f"and {n_val} validation tokens; each needs more than {seq_len})")


def stdlib_corpus(cap_bytes: int = STDLIB_CORPUS_BYTES) -> tuple[list[str], bytes]:
    """The default corpus: the standard library's own .py files (from
    `sysconfig.get_paths()["stdlib"]`), in sorted path order, concatenated and cut at
    `cap_bytes`. Installed packages (site-/dist-packages) and caches are left out. Real code,
    on every machine, with no download. Returns (files used, their bytes).

    Raises:
        FileNotFoundError: no .py file found (a Python installed without its sources).
    """
    root = sysconfig.get_paths()["stdlib"]
    paths = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages",
                                                      "__pycache__") and not d.startswith("."))
        paths += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".py")]
    paths.sort(key=lambda p: os.path.relpath(p, root))
    files, chunks, size = [], [], 0
    for path in paths:
        if size >= cap_bytes:
            break
        try:
            data = _read_bytes(path)[:cap_bytes - size]
        except (OSError, ValueError):
            continue  # an unreadable file is skipped: the corpus is a sample anyway
        files.append(path)
        chunks.append(data)
        size += len(data)
    if not chunks:
        raise FileNotFoundError(f"no .py files under {root} (Python {sys.version.split()[0]} "
                                f"installed without its sources?); give text files instead")
    return files, b"".join(chunks)
