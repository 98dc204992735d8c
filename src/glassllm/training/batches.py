"""Where training batches come from: the `Batches` protocol, ids in memory, and the data's
identity a checkpoint records.

A training loop only needs to draw batches, so data is a small protocol, `Batches`
(a multi-gigabyte token file on disk fills it, `glassllm.formats.token_file.TokenFile`, and so
does a 600-token array in memory, `ArrayBatches`):

    token_count() -> int
    batch(rng, batch_size, seq_len) -> (x, y)   int64 (batch_size, seq_len), y the next tokens
    fingerprint() -> str                        SHA-256 of the token stream (`token_fingerprint`)

The fingerprint is the data's identity: a checkpoint records `data_identity(train, val)` and a
resume on other data is refused (`check_same_data`).
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from ..formats.token_file import token_fingerprint
from ..train import get_batch  # the one batch sampler


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
                             f"records its data's identity (see glassllm.training.batches.Batches)")
        identity[name] = {"tokens": int(source.token_count()), "sha256": str(fingerprint())}
    return identity


_SPLIT_WORDS = {"train": "training", "val": "validation"}




def check_same_data(saved: dict | None, train, val, where: str = "resume") -> None:
    """Refuse to continue a run on other data than it was trained on.

    Args:
        saved: the checkpoint's `data_identity` (None: the checkpoint recorded none).
        train: the training source of the run that resumes.
        val: its validation source.

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
