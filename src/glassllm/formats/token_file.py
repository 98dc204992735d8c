"""Token files: the ids `glassllm prepare` writes and training reads, memory-mapped.

Format: raw little-endian uint16 ids (uint32 when vocab_size > 65536), no header, plus a JSON
sidecar `<file>.json`:

    {"format": "glassllm-tokens", "version": 1, "dtype": "uint16", "vocab_size": 257,
     "token_count": N, "text_bytes": B, "tokenizer": {...its to_json()...},
     "sources": ["a.txt", ...]}

`text_bytes` is the number of UTF-8 bytes of text the ids encode, so a loss in nats per token
converts to bits per byte: loss * token_count / text_bytes / ln 2.

`TokenFile` maps a file with mmap, so a batch reads only the pages its windows touch, never
the whole file; `TokenWriter` streams ids to a temporary and publishes the file and its sidecar
(`close`), or hands both over, written and unpublished, to a caller that publishes several
files together (`stage`: `glassllm.training.prepare`). `token_fingerprint` identifies a stream
of ids, whatever its dtype (a checkpoint records it: `glassllm.training.batches`).
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
from typing import Iterable

import numpy as np

from ..tokenizers import tokenizer_from_json
from ..train import get_batch  # the one batch sampler
from .atomic import AtomicFile, about, atomic_write

TOKEN_FILE_FORMAT = "glassllm-tokens"
TOKEN_FILE_VERSION = 1
FINGERPRINT_CHUNK = 1 << 22  # ids hashed per step: 16 MiB as uint32


def token_fingerprint(ids) -> str:
    """Hex SHA-256 identifying a 1-D stream of token ids, whatever its integer dtype.

    The ids are hashed as little-endian uint32 (int64 if some id is negative or >= 2**32),
    after a header with that dtype and the count, in chunks of FINGERPRINT_CHUNK ids, so a
    memory-mapped multi-GB file is hashed without being loaded: the same ids as uint16 in a
    token file, int64 in memory or uint8 from bytes give the same fingerprint. Cost: about
    2 s per GB of uint16 ids on this project's machine (each id is widened to 4 bytes and
    SHA-256 runs at ~1 GB/s).

    Raises:
        ValueError: ids not a 1-D integer array.
    """
    ids = ids if isinstance(ids, np.ndarray) else np.asarray(ids)
    if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
        raise ValueError(f"token_fingerprint: ids must be 1-D integers, got {ids.dtype} of "
                         f"shape {ids.shape}")
    wide = False
    if ids.size and (ids.dtype.kind == "i" or ids.dtype.itemsize > 4):
        # only a signed or 8-byte dtype can hold an id outside uint32 (token files never do)
        wide = int(ids.min()) < 0 or int(ids.max()) >= 2**32
    canon = np.dtype("<i8") if wide else np.dtype("<u4")
    h = hashlib.sha256(f"glassllm-tokens|{canon.str}|{len(ids)}|".encode())
    for start in range(0, len(ids), FINGERPRINT_CHUNK):
        piece = np.ascontiguousarray(ids[start:start + FINGERPRINT_CHUNK], dtype=canon)
        h.update(memoryview(piece).cast("B"))
    return h.hexdigest()


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65536), else uint32.

    Raises:
        ValueError: vocab_size < 1 or > 2**32.
    """
    if not 1 <= vocab_size <= 2**32:
        raise ValueError(f"vocab_size must be in [1, 2**32], got {vocab_size}")
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


def sidecar_path(path) -> str:
    """`<file>.json`, the metadata file next to a token file."""
    return os.fspath(path) + ".json"


class TokenFile:
    """A token file on disk, memory-mapped: batches read only the ids they use.

    Opening reads the sidecar and the file size, not the ids; `batch` gathers
    batch_size * (seq_len + 1) ids through the page cache, so a multi-GB corpus costs a few
    pages of memory per batch.

    Attributes:
        path: the token file.
        meta: the sidecar dict.
        vocab_size: ids are below it.
        dtype: of the stored ids.
        text_bytes: UTF-8 bytes of the text the ids encode (or None).
        tokens: a read-only 1-D array over the memory-mapped file.

    Raises:
        FileNotFoundError: the token file or its sidecar is missing.
        ValueError: sidecar not valid JSON or missing fields, unknown format or dtype, file
            size not a multiple of the dtype size or not matching the sidecar's token_count,
            vocab_size too large for the dtype; with check_ids=True, an id >= vocab_size.
    """

    def __init__(self, path, check_ids: bool = False):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"token file not found: {self.path}")
        side = sidecar_path(self.path)
        if not os.path.isfile(side):
            raise FileNotFoundError(f"token file {self.path} has no sidecar {side} (written by "
                                    "`glassllm prepare` / TokenWriter)")
        self.meta = _read_sidecar(side)
        self.dtype = np.dtype(self.meta["dtype"])
        self.vocab_size = int(self.meta["vocab_size"])
        self.text_bytes = self.meta.get("text_bytes")
        if self.vocab_size > np.iinfo(self.dtype).max + 1:
            raise ValueError(f"{side}: vocab_size {self.vocab_size} does not fit {self.dtype}")
        size = os.path.getsize(self.path)
        if size % self.dtype.itemsize:
            raise ValueError(f"{self.path}: size {size} bytes is not a multiple of "
                             f"{self.dtype.itemsize} ({self.dtype}); the file is truncated or "
                             "not a token file")
        n = size // self.dtype.itemsize
        if n != int(self.meta["token_count"]):
            raise ValueError(f"{self.path}: holds {n} tokens but its sidecar says "
                             f"{self.meta['token_count']}; the file is truncated or replaced")
        self.tokens = _map_tokens(self.path, self.dtype.newbyteorder("<"), n)
        if check_ids:
            self.check_ids()

    def token_count(self) -> int:
        return len(self.tokens)

    def batch(self, rng: np.random.Generator, batch_size: int,
              seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """int64 (batch_size, seq_len) x, y; errors as `get_batch`."""
        x, y = get_batch(self.tokens, batch_size, seq_len, rng)
        return x.astype(np.int64), y.astype(np.int64)

    def fingerprint(self) -> str:
        """`token_fingerprint` of the file's ids (streamed; computed once: the mapped file is
        read-only)."""
        if getattr(self, "_fingerprint", None) is None:
            self._fingerprint = token_fingerprint(self.tokens)
        return self._fingerprint

    def tokenizer(self):
        """The tokenizer the sidecar names (rebuilt with `tokenizer_from_json`).

        Raises:
            ValueError: naming the sidecar, when its tokenizer description is invalid.
        """
        try:
            return tokenizer_from_json(json.dumps(self.meta["tokenizer"]))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{sidecar_path(self.path)}: invalid tokenizer: {e}") from None

    def check_ids(self, chunk_tokens: int = 1 << 22) -> None:
        """Scan the whole file (in chunks, bounded memory) for ids >= vocab_size.

        Raises:
            ValueError: naming the first bad position and id.
        """
        for start in range(0, len(self.tokens), chunk_tokens):
            part = np.asarray(self.tokens[start:start + chunk_tokens])
            bad = np.flatnonzero(part >= self.vocab_size)
            if bad.size:
                i = start + int(bad[0])
                raise ValueError(f"{self.path}: token {i} is {int(self.tokens[i])}, outside "
                                 f"the vocabulary [0, {self.vocab_size})")

    def __repr__(self) -> str:
        return (f"TokenFile({self.path!r}, tokens={self.token_count()}, dtype={self.dtype}, "
                f"vocab_size={self.vocab_size})")


def _map_tokens(path: str, dtype: np.dtype, n: int) -> np.ndarray:
    """A read-only 1-D array over the file's bytes, memory-mapped (what np.memmap does, plus
    one call np.memmap does not make).

    madvise(MADV_RANDOM): batches read scattered windows. With the default advice the kernel
    reads ahead and maps ~64 KiB around every touched page, so 3,200 windows of 257 ids cost
    200 MB of RSS and seconds of I/O; with MADV_RANDOM they cost ~1-2 pages each. Pages a
    batch touched stay in RSS as reclaimable file cache, as with any memory map.
    """
    if n == 0:  # mmap refuses empty files; an empty split is still a valid (empty) source
        return np.zeros(0, dtype=dtype)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        mapped.madvise(mmap.MADV_RANDOM)
    return np.frombuffer(mapped, dtype=dtype, count=n)


def _read_sidecar(side: str) -> dict:
    try:
        with open(side, encoding="utf-8") as f:
            meta = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{side}: token file sidecar is not valid JSON: {e}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{side}: token file sidecar must be a JSON object")
    if meta.get("format") != TOKEN_FILE_FORMAT:
        raise ValueError(f"{side}: not a {TOKEN_FILE_FORMAT} sidecar "
                         f"(format={meta.get('format')!r})")
    missing = [k for k in ("dtype", "vocab_size", "token_count", "tokenizer") if k not in meta]
    if missing:
        raise ValueError(f"{side}: sidecar lacks {', '.join(missing)}")
    if meta["dtype"] not in ("uint16", "uint32"):
        raise ValueError(f"{side}: dtype must be uint16 or uint32, got {meta['dtype']!r}")
    for key in ("vocab_size", "token_count"):
        if not isinstance(meta[key], int) or meta[key] < 0:
            raise ValueError(f"{side}: {key} must be a non-negative integer, got {meta[key]!r}")
    return meta


class TokenWriter:
    """Appends ids to a new token file; `close()` publishes it with its sidecar.

    Ids go to a temporary file beside `path` as they arrive (bounded memory; see
    `glassllm.formats.atomic`); `close()` renames it to `path`
    (os.replace, atomic) and then writes the sidecar atomically, so a reader never sees a
    half-written file under its final name. Used as a context manager, an exception discards
    the temp file and leaves any previous file untouched.

    Raises (append):
        ValueError: ids not 1-D integers, or outside [0, vocab_size).
        OSError: the ids cannot be written (a full disk), naming `path`.
    """

    def __init__(self, path, tokenizer, sources: Iterable[str] = ()):
        self.path = os.fspath(path)
        self.tokenizer = tokenizer
        self.vocab_size = int(tokenizer.vocab_size)
        self.dtype = token_dtype(self.vocab_size)
        self.sources = [os.fspath(s) for s in sources]
        self.token_count = 0
        self.text_bytes = 0
        self._out = AtomicFile(self.path, "wb")  # ids stream to its temporary file
        self._file = self._out.file
        self.published: list[str] = []  # final paths close() has written, in order
        self._staged: list[AtomicFile] = []  # what stage() has written, unpublished

    def append(self, ids, text_bytes: int = 0) -> None:
        """Write ids (any integer dtype); text_bytes: the UTF-8 bytes of text they encode."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
            raise ValueError(f"TokenWriter: ids must be 1-D integers, got {ids.dtype} "
                             f"of shape {ids.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"TokenWriter: ids must be in [0, {self.vocab_size}), got range "
                             f"[{ids.min()}, {ids.max()}]")
        try:
            self._file.write(ids.astype(self.dtype.newbyteorder("<"), copy=False).tobytes())
        except OSError as e:  # a full disk: name the token file, not the temporary
            raise about(e, self.path, "cannot write the token file") from None
        self.token_count += int(ids.size)
        self.text_bytes += int(text_bytes)

    def close(self) -> dict:
        """Publish the file and its sidecar; returns the sidecar dict. Each path is added to
        `published` once it is in place (a failure in between leaves the file without its
        sidecar, and `published` says so)."""
        self._out.commit()
        self.published.append(self.path)
        meta = self._sidecar()
        _write_json_atomic(sidecar_path(self.path), meta)
        self.published.append(sidecar_path(self.path))
        return meta

    def stage(self) -> tuple[dict, list[AtomicFile]]:
        """Finish the file and its sidecar, each in its temporary, published by neither:
        (sidecar dict, [the ids' AtomicFile, the sidecar's]), flushed and fsync'ed, for a
        caller that renames several files together (each `AtomicFile.tmp` over its `.path`)
        or discards them all. After `stage`, `abort` discards both.

        Raises:
            OSError: naming the token file or its sidecar (a full disk); nothing is left.
        """
        meta = self._sidecar()
        self._staged = [self._out]
        try:
            side = AtomicFile(sidecar_path(self.path), "w", doing="cannot write the sidecar")
            self._staged.append(side)
            side.file.write(json.dumps(meta, ensure_ascii=False))
            for staged in self._staged:
                staged.file.flush()
                os.fsync(staged.file.fileno())
                staged.file.close()
        except BaseException as e:
            self.abort()
            if isinstance(e, OSError):
                raise about(e, self.path, "cannot write the token file") from None
            raise
        return meta, list(self._staged)

    def _sidecar(self) -> dict:
        return {"format": TOKEN_FILE_FORMAT, "version": TOKEN_FILE_VERSION,
                "dtype": self.dtype.name, "vocab_size": self.vocab_size,
                "token_count": self.token_count, "text_bytes": self.text_bytes,
                "tokenizer": json.loads(self.tokenizer.to_json()), "sources": self.sources}

    def abort(self) -> None:
        """Discard the temporaries (and those `stage` wrote); the final paths are not
        touched."""
        for staged in self._staged or [self._out]:
            staged.discard()

    def __enter__(self) -> "TokenWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _write_json_atomic(path: str, obj) -> None:
    text = json.dumps(obj, ensure_ascii=False)
    with atomic_write(path, "w") as f:
        f.write(text)
