"""Training data: where batches come from, and token files on disk.

A training loop only needs to draw batches, so data is a small protocol, `Batches`
(a multi-gigabyte token file on disk fills it, and so does a 600-token array in memory):

    token_count() -> int
    batch(rng, batch_size, seq_len) -> (x, y)   int64 (batch_size, seq_len), y the next tokens
    fingerprint() -> str                        SHA-256 of the token stream (`token_fingerprint`)

The fingerprint is the data's identity: a checkpoint records `data_identity(train, val)` and a
resume on other data is refused (`check_same_data`). `load_corpus` is what `glassllm train
--data` reads (text files, directories, a `glassllm prepare` directory, or by default the
standard library's own .py files), in one call.

`ArrayBatches` holds ids in memory; `TokenFile` maps a `.bin` file of ids with `np.memmap`,
so a batch reads only the pages its windows touch, never the whole file. `prepare` turns text
files into such files, streaming: memory stays bounded by the chunk size, not the corpus.

Token file format: raw little-endian uint16 ids (uint32 when vocab_size > 65536), no header,
plus a JSON sidecar `<file>.json`:

    {"format": "glassllm-tokens", "version": 1, "dtype": "uint16", "vocab_size": 257,
     "token_count": N, "text_bytes": B, "tokenizer": {...its to_json()...},
     "sources": ["a.txt", ...]}

`text_bytes` is the number of UTF-8 bytes of text the ids encode, so a loss in nats per token
converts to bits per byte: loss * token_count / text_bytes / ln 2.
"""
from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import sys
import sysconfig
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Protocol, runtime_checkable

import numpy as np

from ..formats.atomic import AtomicFile, about, atomic_write
from ..formats.tokenizer import ByteTokenizer, tokenizer_from_json
from ..train import get_batch  # the one batch sampler

TOKEN_FILE_FORMAT = "glassllm-tokens"
TOKEN_FILE_VERSION = 1
CHUNK_BYTES = 1 << 20  # text read per step of `prepare`: the bound on its working memory




@runtime_checkable
class Batches(Protocol):
    """A source of training batches (in memory or a memory-mapped token file)."""

    def token_count(self) -> int:
        """Number of tokens in the source."""
        ...

    def batch(self, rng: np.random.Generator, batch_size: int,
              seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """x, y: int64 (batch_size, seq_len), y[:, t] the token after x[:, t]."""
        ...

    def fingerprint(self) -> str:
        """Hex SHA-256 of the token stream (`token_fingerprint`): equal iff same ids in the
        same order. Needed by a `Trainer` that writes or resumes checkpoints."""
        ...


class ArrayBatches:
    """Batches from a 1-D array of ids in memory (e.g. a 600-token test corpus).

    `batch` draws exactly the windows `glassllm.train.train` draws from the same array and
    rng, because both go through `get_batch`.

    Raises:
        ValueError: ids not 1-D or not integers.
    """

    def __init__(self, ids):
        ids = np.asarray(ids)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"ArrayBatches: ids must be a 1-D integer array, got "
                             f"{ids.dtype} of shape {ids.shape}")
        self.ids = ids

    def token_count(self) -> int:
        return len(self.ids)

    def batch(self, rng: np.random.Generator, batch_size: int,
              seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        """int64 (batch_size, seq_len) x, y; errors as `get_batch`."""
        x, y = get_batch(self.ids, batch_size, seq_len, rng)
        return x.astype(np.int64, copy=False), y.astype(np.int64, copy=False)

    def fingerprint(self) -> str:
        """`token_fingerprint(ids)`, computed on each call (the array may be changed in
        place between runs)."""
        return token_fingerprint(self.ids)


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


def data_identity(train, val) -> dict:
    """What a checkpoint records of its data: {"train": {"tokens": int, "sha256": hex},
    "val": {...}}, from each source's `token_count()` and `fingerprint()`.

    Raises:
        ValueError: a source without a `fingerprint()` method (it cannot be identified).
    """
    identity = {}
    for name, source in (("train", train), ("val", val)):
        fingerprint = getattr(source, "fingerprint", None)
        if not callable(fingerprint):
            raise ValueError(f"the {_SPLIT_WORDS[name]} data ({type(source).__name__}) has no "
                             f"fingerprint() method; a run that writes or resumes checkpoints "
                             f"records its data's identity (see glassllm.training.data.Batches)")
        identity[name] = {"tokens": int(source.token_count()), "sha256": str(fingerprint())}
    return identity


_SPLIT_WORDS = {"train": "training", "val": "validation"}




def check_same_data(saved: dict | None, train, val, where: str = "resume") -> None:
    """Refuse to continue a run on other data than it was trained on.

    Args:
        saved: the checkpoint's `data_identity` (None: the checkpoint recorded none).
        train, val: the sources of the run that resumes.

    Raises:
        ValueError: "<where>: ..." saying which split differs (token count or content), or
            that the checkpoint cannot prove its data (written before data identities).
    """
    if saved is None:
        raise ValueError(f"{where}: the checkpoint records no data identity (written by a "
                         f"glassllm before checkpoint version 2), so resuming it cannot be "
                         f"checked to use the same data; start a new run")
    now = data_identity(train, val)
    for name in ("train", "val"):
        a, b = saved[name], now[name]
        if a["tokens"] != b["tokens"]:
            raise ValueError(f"{where}: the {_SPLIT_WORDS[name]} data differs from the "
                             f"checkpoint's ({b['tokens']} tokens vs {a['tokens']}); resume "
                             f"with the same data")
        if a["sha256"] != b["sha256"]:
            raise ValueError(f"{where}: the {_SPLIT_WORDS[name]} data differs from the "
                             f"checkpoint's (same length, other content: SHA-256 "
                             f"{b['sha256'][:12]}... vs {a['sha256'][:12]}...); resume with "
                             f"the same data")





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
        path, meta (the sidecar dict), vocab_size, dtype, text_bytes (or None),
        tokens (a read-only 1-D array over the memory-mapped file).

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
        meta = {"format": TOKEN_FILE_FORMAT, "version": TOKEN_FILE_VERSION,
                "dtype": self.dtype.name, "vocab_size": self.vocab_size,
                "token_count": self.token_count, "text_bytes": self.text_bytes,
                "tokenizer": json.loads(self.tokenizer.to_json()), "sources": self.sources}
        _write_json_atomic(sidecar_path(self.path), meta)
        self.published.append(sidecar_path(self.path))
        return meta

    def abort(self) -> None:
        """Discard the temp file; the final path is not touched."""
        self._out.discard()

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


# --- prepare: text files -> train.bin / val.bin ------------------------------------------------

@dataclass
class Progress:
    """Reported by `prepare` after each chunk: `done` of `total` text bytes in `stage`
    ("tokenizer" while training a BPE, "tokenize" while writing ids)."""
    stage: str
    done: int
    total: int


def list_text_files(inputs: Iterable) -> list[str]:
    """Files named by `inputs`, in order; a directory contributes every regular file below
    it whose name does not start with ".", in sorted path order.

    Raises:
        FileNotFoundError: an input does not exist. ValueError: no files at all.
    """
    files = []
    for item in inputs:
        item = os.fspath(item)
        if os.path.isfile(item):
            files.append(item)
        elif os.path.isdir(item):
            found = []
            for root, dirs, names in os.walk(item):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                found += [os.path.join(root, n) for n in names if not n.startswith(".")]
            files += sorted(found)
        else:
            raise FileNotFoundError(f"input not found: {item}")
    if not files:
        raise ValueError("no input text files")
    return files


def _char_before(buf: bytes, i: int) -> str:
    """The character ending at byte i of buf ("" if none or incomplete)."""
    return buf[max(0, i - 4):i].decode("utf-8", errors="ignore")[-1:]


def _char_after(buf: bytes, i: int) -> str:
    """The character starting at byte i of buf ("" if none or cut off by the end)."""
    return buf[i:i + 4].decode("utf-8", errors="ignore")[:1]


def _cut(buf: bytes) -> int:
    """A safe place to end a chunk inside `buf`, or 0 if there is none ("read more").

    Safe means that encoding the chunks one by one gives the ids of encoding the whole text.
    GPT-2's pre-tokenizer (regex `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+|
    ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`) has no look-behind, so a cut is safe where a
    pre-token starts in the whole text and the pre-token before it ends there even when the
    text stops. Two such places, searched from the end:
      - just after a lone "\\n" between two non-space characters (the newline is its own
        pre-token; a longer whitespace run is not safe: at the end of a chunk "\\n\\n\\n" is
        one pre-token, inside the text it is "\\n\\n" + "\\n");
      - just before a lone " " between two non-space characters (the space starts the next
        pre-token, " word").
    Either place also lies between two whole UTF-8 characters.
    """
    i = len(buf)
    while True:
        i = buf.rfind(b"\n", 0, i)
        if i < 0:
            break
        before, after = _char_before(buf, i), _char_after(buf, i + 1)
        if before and after and not before.isspace() and not after.isspace():
            return i + 1
    i = len(buf)
    while True:
        i = buf.rfind(b" ", 0, i)
        if i <= 0:
            return 0
        before, after = _char_before(buf, i), _char_after(buf, i + 1)
        if before and after and not before.isspace() and not after.isspace():
            return i


def _char_boundary(buf: bytes) -> int:
    """The last position in buf that does not split a UTF-8 character (last resort for text
    with no safe cut over many chunks: tokens may differ from whole-text encoding there)."""
    i = len(buf)
    while i > 0 and 0x80 <= buf[i - 1] < 0xC0:  # back over continuation bytes
        i -= 1
    return i - 1 if i > 0 and buf[i - 1] >= 0xC0 else i


def _text_chunks(path: str, start: int, end: int,
                 chunk_bytes: int) -> Iterator[tuple[str, int]]:
    """(text, n_bytes) pieces of bytes [start, end) of a UTF-8 file, about chunk_bytes each,
    cut by `_cut`. Holds at most about 4 * chunk_bytes of text: a stretch that long with no
    safe cut is split at a character boundary (`_char_boundary`) instead.

    Raises:
        ValueError: the bytes are not valid UTF-8 (naming the file and offset).
    """
    with open(path, "rb") as f:
        f.seek(start)
        pos, carry = start, b""
        while pos < end:
            block = f.read(min(chunk_bytes, end - pos))
            if not block:  # the file shrank while we read it
                break
            pos += len(block)
            buf = carry + block
            if pos >= end:
                cut = len(buf)
            else:
                cut = _cut(buf) or (_char_boundary(buf) if len(buf) >= 4 * chunk_bytes else 0)
            if cut == 0:
                carry = buf
                continue
            carry = buf[cut:]
            yield _decode(path, buf[:cut], pos - len(buf)), cut
        if carry:
            yield _decode(path, carry, pos - len(carry)), len(carry)


def _decode(path: str, piece: bytes, offset: int) -> str:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (invalid byte at offset "
                         f"{offset + e.start})") from None


def _split_offset(path: str, val_fraction: float) -> int:
    """Byte offset where a file's validation tail starts: the first line start at or after
    (1 - val_fraction) of its size (or the end, if there is none). Reads only from there on."""
    size = os.path.getsize(path)
    if val_fraction <= 0:
        return size
    target = int(size * (1.0 - val_fraction))
    if target == 0:
        return 0
    with open(path, "rb") as f:
        f.seek(target - 1)
        pos = target - 1
        while True:
            block = f.read(1 << 16)
            if not block:
                return size
            i = block.find(b"\n")
            if i >= 0:
                return pos + i + 1
            pos += len(block)


def _missing_dirs(path) -> list[str]:
    """The directories `os.makedirs(path)` would create, innermost first."""
    missing = []
    path = os.path.abspath(path)
    while not os.path.exists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


BPE_MAX_VOCAB = 1 << 24  # ids fit uint32 token files many times over; far above any real BPE


def bpe_vocab_size(spec: str) -> int:
    """N of a "bpe:N" tokenizer spec, an integer in [257, BPE_MAX_VOCAB] (256 bytes and the
    end-of-text id at least).

    Raises:
        ValueError: not "bpe:N" with such an N.
    """
    text = spec[4:] if spec.startswith("bpe:") else ""
    if not text.strip().isdigit():
        raise ValueError(f"tokenizer {spec!r}: expected bpe:N with N an integer")
    if len(text) > 12 or not 257 <= int(text) <= BPE_MAX_VOCAB:
        shown = text if len(text) <= 12 else f"{text[:12]}... ({len(text)} digits)"
        raise ValueError(f"tokenizer bpe:{shown}: N must be in [257, {BPE_MAX_VOCAB}] (256 "
                         f"bytes + end-of-text at least)")
    return int(text)


def prepare(inputs, out_dir, tokenizer="byte", val_fraction: float = 0.1,
            chunk_bytes: int = CHUNK_BYTES,
            on_progress: Callable[[Progress], None] | None = None) -> dict:
    """Tokenize text files into `out_dir/train.bin` and `out_dir/val.bin` (+ sidecars).

    Split (deterministic, per file): each file's last `val_fraction` of bytes, starting at a
    line start, goes to val, the rest to train; files are read in the order of
    `list_text_files(inputs)`. Within a split, an end-of-text id separates files.

    Streaming: text is read and encoded in chunks of about `chunk_bytes`, cut where the ids
    cannot change (`_cut`), so memory is bounded by the chunk size whatever the corpus size.

    Args:
        tokenizer: "byte"; "bpe:N" to learn a byte-level BPE of N ids from the train parts
            (written to out_dir/tokenizer.json); or a tokenizer object (a loaded BPE is also
            written to out_dir/tokenizer.json).
        on_progress: called with a `Progress` after each chunk.

    Returns:
        {"train": sidecar dict, "val": sidecar dict, "tokenizer": the tokenizer,
         "files": [paths]}.

    Raises:
        FileNotFoundError: an input is missing. ValueError: val_fraction outside [0, 1),
            a file that is not UTF-8, a bad tokenizer spec. On any failure (Ctrl-C included),
            no output file of this call is left -- neither temporaries nor the files it had
            already published (train.bin, val.bin, their sidecars, tokenizer.json) -- and
            directories this call created are removed again. Files of an earlier `prepare`
            in out_dir stay as they were when the failure comes before publishing (reading,
            training the tokenizer, encoding: nearly all of the work); publishing replaces
            them one file at a time, so a failure there (a full disk while writing a sidecar)
            leaves only those the new output had not yet replaced.
    """
    from ..formats.tokenizer import BPETokenizer
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    files = list_text_files(inputs)
    splits = [(path, _split_offset(path, val_fraction), os.path.getsize(path))
              for path in files]
    train_total = sum(cut for _, cut, _ in splits)
    total = sum(size for _, _, size in splits)
    report = on_progress or (lambda p: None)

    if isinstance(tokenizer, str):
        if tokenizer == "byte":
            tokenizer = ByteTokenizer()
        elif tokenizer.startswith("bpe:"):
            vocab_size = bpe_vocab_size(tokenizer)
            done = 0

            def train_texts():
                nonlocal done
                for path, cut, _ in splits:
                    for text, n in _text_chunks(path, 0, cut, chunk_bytes):
                        done += n
                        report(Progress("tokenizer", done, train_total))
                        yield text
            tokenizer = BPETokenizer.train(train_texts(), vocab_size)
        else:
            raise ValueError(f"unknown tokenizer {tokenizer!r}: use byte, bpe:N or a path")

    created = _missing_dirs(out_dir)  # removed again if this call fails
    os.makedirs(out_dir, exist_ok=True)
    eot = np.array([tokenizer.eot_id])
    done = 0
    writers, published = [], []
    try:  # both splits go to temp files; nothing is published unless both succeed
        for name, ranges in (("train", [(p, 0, c) for p, c, _ in splits]),
                             ("val", [(p, c, s) for p, c, s in splits])):
            used = [r for r in ranges if r[2] > r[1]]
            writer = TokenWriter(os.path.join(out_dir, f"{name}.bin"), tokenizer,
                                 sources=[p for p, _, _ in used])
            writers.append(writer)
            for k, (path, start, end) in enumerate(used):
                if k:
                    writer.append(eot)
                for text, n in _text_chunks(path, start, end, chunk_bytes):
                    writer.append(tokenizer.encode(text), text_bytes=n)
                    done += n
                    report(Progress("tokenize", done, total))
        metas = {}
        for name, writer in zip(("train", "val"), writers):  # publish
            try:
                metas[name] = writer.close()
            finally:
                published += writer.published
        if isinstance(tokenizer, BPETokenizer):
            tokenizer.save(os.path.join(out_dir, "tokenizer.json"))
            published.append(os.path.join(out_dir, "tokenizer.json"))
    except BaseException:  # Ctrl-C included: leave no temp file and nothing of this call
        for writer in writers:
            writer.abort()
        for path in published:
            try:
                os.remove(path)
            except OSError:  # already gone: nothing of ours is left there
                pass
        for directory in created:  # and no empty directory this call made
            try:
                os.rmdir(directory)
            except OSError:
                break
        raise
    return {"train": metas["train"], "val": metas["val"], "tokenizer": tokenizer,
            "files": files}


# --- load_corpus: what `glassllm train --data` reads --------------------------------------------

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
        train = TokenFile(os.path.join(sources[0], "train.bin"))
        val = TokenFile(os.path.join(sources[0], "val.bin"))
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
        except ValueError:  # an empty directory: nothing to take from it
            found = []
        for path in found:
            data = _read_bytes(path)
            if named:
                _decode(path, data, 0)  # ValueError "PATH: not UTF-8 text (... offset N)"
            else:
                try:
                    _decode(path, data, 0)
                    if b"\0" in data:
                        raise ValueError("holds NUL bytes")
                except ValueError:
                    skipped.append(path)
                    continue
            files.append(path)
            chunks.append(data)
    notes = []
    if skipped:
        shown = ", ".join(skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3
                                          else "")
        notes.append((" ".join(map(str, sources)), f"skipped {len(skipped)} file(s) that are not UTF-8 text: "
                                f"{shown}"))
    if not files:
        raise ValueError(f"{' '.join(map(str, sources))}: no UTF-8 text files")
    return files, chunks, notes


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


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
        except OSError:
            continue  # an unreadable file is skipped: the corpus is a sample anyway
        files.append(path)
        chunks.append(data)
        size += len(data)
    if not chunks:
        raise FileNotFoundError(f"no .py files under {root} (Python {sys.version.split()[0]} "
                                f"installed without its sources?); give text files instead")
    return files, b"".join(chunks)
