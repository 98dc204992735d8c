"""Output buffers the compiled forms reuse from one step to the next, instead of fresh arrays.

Why: a fresh multi-megabyte NumPy array is memory the C library may just have returned to
the system (glibc trims the top of its heap once more than its threshold is free), so the
kernel that first writes it page-faults on every 4 KiB page: the SwiGLU forward at the M
config's shapes (two 8 MiB outputs) took 6.3 ms through fresh arrays and 0.6 ms on arrays
written before. A training step makes the same shapes every step, so a buffer freed by one
step's backward is the next step's forward output.

`empty(shape, dtype)` is `np.empty` for arrays under MIN_BYTES; for larger ones it returns a
pooled array of that shape and dtype that nothing else references any more (CPython's
reference count: every view, saved tensor or caller holding it counts, so a buffer is only
handed out again once the autograd and the caller have dropped it), else a new one, which it
keeps for later (at most MAX_PER_SHAPE per shape and MAX_BYTES in all; `clear()` lets them
go). The contents are arbitrary, as np.empty's.
"""
from __future__ import annotations

import math
import sys
import threading

import numpy as np

MIN_BYTES = 1 << 20       # smaller arrays come from malloc's free lists, already written
MAX_PER_SHAPE = 64        # a deep model's activations of one shape, alive at once
MAX_BYTES = 2 << 30       # what the pool may keep in all

_lock = threading.Lock()
_pool: dict[tuple, list[np.ndarray]] = {}
_pooled_bytes = 0
# references to a pooled array while `empty` checks it: the pool's list, the loop variable and
# getrefcount's own argument
_UNUSED = 3


def empty(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array of `shape` and `dtype`: a reused one where the pool
    holds one no one else references (arrays of MIN_BYTES and more), else a new one."""
    dtype = np.dtype(dtype)
    shape = tuple(int(n) for n in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < MIN_BYTES:
        return np.empty(shape, dtype)
    global _pooled_bytes
    key = (shape, dtype.str)
    with _lock:
        arrays = _pool.setdefault(key, [])
        for a in arrays:
            if sys.getrefcount(a) == _UNUSED:
                return a
        a = np.empty(shape, dtype)
        if len(arrays) < MAX_PER_SHAPE and _pooled_bytes + nbytes <= MAX_BYTES:
            arrays.append(a)
            _pooled_bytes += nbytes
        return a


def empty_like(a: np.ndarray) -> np.ndarray:
    """`empty(a.shape, a.dtype)`."""
    return empty(a.shape, a.dtype)


def pooled_bytes() -> int:
    """Bytes the pool keeps (in use or free)."""
    return _pooled_bytes


def clear() -> None:
    """Let every pooled buffer go (those still in use live on with their holders)."""
    global _pooled_bytes
    with _lock:
        _pool.clear()
        _pooled_bytes = 0
