"""`prepare`: text files -> train.bin / val.bin (+ sidecars, + tokenizer.json), what
`glassllm prepare` runs.

Five named steps, each a function: read the sources (`read_sources`: which files, where each
splits), choose or train the tokenizer (`choose_tokenizer`), tokenize and split into token
files written to temporaries (`write_splits`), and publish every output together
(`publish_together`). Nothing is published before the last step, and that step renames all
or, on any failure or Ctrl-C, restores what was there: a `prepare` leaves out_dir as it was or
holds the complete new output, never a mix, and never a temporary.
"""
from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..formats.atomic import AtomicFile, remove_leftover_temporaries
from ..formats.paths import same_file
from ..formats.token_file import TokenWriter
from ..tokenizers import BPETokenizer, ByteTokenizer
from .lock import OutputLock, lock_outputs, signals_held
from .text import list_text_files, split_offset, text_chunks

CHUNK_BYTES = 1 << 20  # text read per step of `prepare`: the bound on its working memory


@dataclass
class Progress:
    """Reported by `prepare` after each chunk: `done` of `total` text bytes in `stage`
    ("tokenizer" while training a BPE, "tokenize" while writing ids)."""
    stage: str
    done: int
    total: int


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


def _remove_dirs(created: list[str]) -> None:
    """Remove the directories a failed prepare created, innermost first (`_missing_dirs`)."""
    for directory in created:
        try:
            os.rmdir(directory)
        except OSError:  # not empty (not ours alone) or gone: leave the rest
            break


BPE_MAX_VOCAB = 1 << 24  # ids fit uint32 token files many times over; far above any real BPE


def lock_folder(out_dir) -> OutputLock:
    """Lock every file a prepare writes in `out_dir` (PREPARE_OUTPUTS) until the returned lock
    is released, as `glassllm train` locks its outputs (`glassllm.training.lock`): two
    prepares into one folder would otherwise interleave their renames and publish a mixed set
    (one's train.bin with the other's val.bin), each reporting success. The temporaries of a
    prepare killed outright (SIGKILL), whose locks are taken over, are removed.

    Raises:
        glassllm.training.lock.OutputLocked: another process is writing one of them."""
    held = lock_outputs([os.path.join(out_dir, name) for name in PREPARE_OUTPUTS])
    try:
        for path in held.stale_paths:
            remove_leftover_temporaries(path)
    except BaseException:
        held.release()
        raise
    return held


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
    cannot change (`glassllm.training.text`), so memory is bounded by the chunk size whatever
    the corpus size.

    The steps: `read_sources`, `choose_tokenizer`, `write_splits` (every output to a
    temporary), `publish_together` (all renamed, or none).

    Args:
        tokenizer: "byte"; "bpe:N" to learn a byte-level BPE of N ids from the train parts
            (written to out_dir/tokenizer.json); or a tokenizer object (a loaded BPE is also
            written to out_dir/tokenizer.json).
        on_progress: called with a `Progress` after each chunk.

    Returns:
        `{"train": sidecar dict, "val": sidecar dict, "tokenizer": the tokenizer,
            "files": [paths]}`.

    Raises:
        FileNotFoundError: an input is missing.
        ValueError: val_fraction outside [0, 1), chunk_bytes < 1, a file that is not UTF-8,
            a bad tokenizer spec, an output that is one of the inputs.
        glassllm.training.lock.OutputLocked: another prepare (or run) is writing out_dir's
            files now (an OSError naming the file and its holder); nothing is written.
        OSError: an output cannot be written (a full disk), naming it.

    On any failure (Ctrl-C included) nothing of this call is left: no temporary, no output,
    and the files of an earlier `prepare` in out_dir as they were (restored when the failure
    comes while publishing); directories this call created are removed again. A signal that
    arrives while the outputs are renamed waits until all are in place (a few renames), then
    interrupts as usual.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    report = on_progress or (lambda p: None)
    sources = read_sources(inputs, out_dir, val_fraction)
    created = _missing_dirs(out_dir)  # removed again if this call fails
    os.makedirs(out_dir, exist_ok=True)
    try:
        with lock_folder(out_dir):
            tokenizer = choose_tokenizer(tokenizer, sources, chunk_bytes, report)
            metas, staged = write_splits(sources, tokenizer, out_dir, chunk_bytes, report)
            publish_together(staged, retire=_retired(out_dir, staged))
    except BaseException:  # Ctrl-C included: no directory of this call is left either
        _remove_dirs(created)
        raise
    return {"train": metas["train"], "val": metas["val"], "tokenizer": tokenizer,
            "files": sources.files}


@dataclass
class Sources:
    """The text files of a `prepare` and where each splits: `splits` holds (path, cut, size),
    bytes [0, cut) of the file for training, [cut, size) for validation."""
    files: list[str]
    splits: list[tuple[str, int, int]]

    @property
    def train_bytes(self) -> int:
        return sum(cut for _, cut, _ in self.splits)

    @property
    def total_bytes(self) -> int:
        return sum(size for _, _, size in self.splits)

    def ranges(self, split: str) -> list[tuple[str, int, int]]:
        """(path, start, end) of the files' parts in `split` ("train" or "val"), the empty
        ones left out."""
        parts = [(p, 0, c) if split == "train" else (p, c, s) for p, c, s in self.splits]
        return [r for r in parts if r[2] > r[1]]


def read_sources(inputs, out_dir, val_fraction: float) -> Sources:
    """Step 1: the files `inputs` names (`list_text_files`) and each one's split offset.

    Raises:
        FileNotFoundError, ValueError: as `list_text_files`; ValueError when an output of
            this prepare in out_dir is one of the inputs.
    """
    files = list_text_files(inputs)
    _check_not_an_input(out_dir, files)
    return Sources(files, [(path, split_offset(path, val_fraction), os.path.getsize(path))
                           for path in files])


def choose_tokenizer(spec, sources: Sources, chunk_bytes: int, report):
    """Step 2: the tokenizer `spec` names ("byte", "bpe:N" trained on the training parts of
    `sources`), or `spec` itself when it is a tokenizer object.

    Raises:
        ValueError: an unknown spec, a bad bpe:N, a training part that is not UTF-8.
    """
    if not isinstance(spec, str):
        return spec
    if spec == "byte":
        return ByteTokenizer()
    if not spec.startswith("bpe:"):
        raise ValueError(f"unknown tokenizer {spec!r}: use byte, bpe:N or a path")
    vocab_size = bpe_vocab_size(spec)
    step = _progress(report, "tokenizer", sources.train_bytes)
    texts = (text for path, start, end in sources.ranges("train")
             for text in _counted(text_chunks(path, start, end, chunk_bytes), step))
    return BPETokenizer.train(texts, vocab_size)


def write_splits(sources: Sources, tokenizer, out_dir,
                 chunk_bytes: int, report) -> tuple[dict, list[AtomicFile]]:
    """Steps 3 and 4: tokenize each split into its token file, every output (train.bin,
    val.bin, their sidecars, tokenizer.json for a BPE) written to a temporary beside it in
    out_dir and published by none. Returns ({"train": sidecar, "val": sidecar}, the
    `AtomicFile`s, for `publish_together`). On any failure every temporary is removed.
    """
    step = _progress(report, "tokenize", sources.total_bytes)
    writers, staged, metas = [], [], {}
    try:
        for split in ("train", "val"):
            ranges = sources.ranges(split)
            writer = TokenWriter(os.path.join(out_dir, f"{split}.bin"), tokenizer,
                                 sources=[path for path, _, _ in ranges])
            writers.append(writer)
            _tokenize_into(writer, tokenizer, ranges, chunk_bytes, step)
        for split, writer in zip(("train", "val"), writers):
            metas[split], files = writer.stage()
            staged += files
        if isinstance(tokenizer, BPETokenizer):
            staged.append(_staged_text(os.path.join(out_dir, "tokenizer.json"),
                                       tokenizer.to_json()))
    except BaseException:  # Ctrl-C included: leave no temporary
        for writer in writers:
            writer.abort()
        for file in staged:
            file.discard()
        raise
    return metas, staged


def _tokenize_into(writer: TokenWriter, tokenizer, ranges, chunk_bytes: int, step) -> None:
    """Encode the byte ranges into `writer`, an end-of-text id between two files."""
    eot = np.array([tokenizer.eot_id])
    for k, (path, start, end) in enumerate(ranges):
        if k:
            writer.append(eot)
        for text, n in text_chunks(path, start, end, chunk_bytes):
            writer.append(tokenizer.encode(text), text_bytes=n)
            step(n)


def _staged_text(path: str, text: str) -> AtomicFile:
    """`text` in a temporary beside `path`, flushed, fsync'ed and closed, not yet renamed."""
    staged = AtomicFile(path, "w")
    try:
        staged.file.write(text)
        staged.file.flush()
        os.fsync(staged.file.fileno())
        staged.file.close()
    except BaseException:
        staged.discard()
        raise
    return staged


def _retired(out_dir, staged: list[AtomicFile]) -> list[str]:
    """The earlier prepare's files in out_dir that this one does not write: a BPE prepare's
    tokenizer.json when this one is byte-level (or SentencePiece), which would describe
    tokens train.bin no longer holds (a later `--tokenizer OUT/tokenizer.json` would read
    the old one silently)."""
    written = {os.path.abspath(file.path) for file in staged}
    return [path for path in (os.path.join(out_dir, name) for name in PREPARE_OUTPUTS)
            if os.path.abspath(path) not in written and os.path.lexists(path)]


def publish_together(staged: list[AtomicFile], retire=()) -> list[str]:
    """Step 5: rename every staged temporary over its path and remove the `retire` paths
    (an earlier prepare's files this one does not replace), all or none.

    Each rename is atomic (os.replace) but a set of them is not, so an earlier file at each
    path is kept (a hard link beside it, under a temporary's name) until all are in place; on
    a failure or Ctrl-C between two renames the ones done are undone (the earlier file put
    back, or the new one removed) and every temporary is removed. SIGINT, SIGTERM and SIGHUP
    are held while the renames (or their undoing) run, when this is the main thread: a
    second Ctrl-C cannot leave half of the set. Returns the published paths, in order (the
    retired ones not among them).

    Raises:
        OSError: a rename failed (naming its file); nothing was published.
    """
    backups, done = [], []
    with signals_held():
        try:
            for file in staged:
                backups.append(_keep_earlier(file.path))
                os.replace(file.tmp, file.path)
                done.append(file.path)
            for path in retire:  # undone as a rename is: the backup put back
                backups.append(_keep_earlier(path))
                os.remove(path)
                done.append(path)
        except BaseException:
            for path, backup in reversed(list(zip(done, backups))):
                _put_back(path, backup)
            for backup in backups[len(done):]:
                _remove_quietly(backup)
            for file in staged:
                file.discard()
            raise
        for backup in backups:
            _remove_quietly(backup)
    return done[:len(staged)]


def _keep_earlier(path: str) -> str | None:
    """A second name for the file at `path` (a hard link under a temporary's name, so
    `glassllm.formats.atomic.leftover_temporaries` knows it), or None when there is none."""
    if not os.path.lexists(path):
        return None
    folder, name = os.path.split(os.path.abspath(path))
    backup = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
    try:
        os.link(path, backup)
    except OSError:  # a filesystem without hard links: a copy keeps it as well
        shutil.copy2(path, backup)
    return backup


def _put_back(path: str, backup: str | None) -> None:
    """Undo one rename of `publish_together`: the earlier file back, or the new one gone."""
    if backup is None:
        _remove_quietly(path)
    else:
        os.replace(backup, path)


def _remove_quietly(path: str | None) -> None:
    if path is None:
        return
    try:
        os.remove(path)
    except OSError:  # already gone: nothing of ours is left there
        pass


def _progress(report, stage: str, total: int):
    """A function of the bytes just done that reports `Progress(stage, done so far, total)`."""
    done = 0

    def step(n: int) -> None:
        nonlocal done
        done += n
        report(Progress(stage, done, total))
    return step


def _counted(chunks, step):
    """The texts of (text, n_bytes) `chunks`, calling `step(n_bytes)` before each."""
    for text, n in chunks:
        step(n)
        yield text


PREPARE_OUTPUTS = ("train.bin", "val.bin", "train.bin.json", "val.bin.json", "tokenizer.json")


def _check_not_an_input(out_dir, files: list[str]) -> None:
    """ValueError when a file `prepare` writes in out_dir is one of its inputs (by identity:
    `prepare p/train.bin --out p` would replace its own input)."""
    for name in PREPARE_OUTPUTS:
        out = os.path.join(os.fspath(out_dir), name)
        for path in files:
            if same_file(out, path):
                raise ValueError(f"{path} is an input and {out} an output of this prepare: "
                                 f"it would replace its own input; give --out another "
                                 f"directory")
