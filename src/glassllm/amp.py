"""Mixed precision (autocast) state.

Only the hook that `glassllm.functional` consults lives here for now: `matmul_dtype()` is the
low-precision dtype matrix products are rounded to inside `autocast`, or None in float32.
"""
from __future__ import annotations

import contextlib

import numpy as np

_autocast_dtype = None


def matmul_dtype():
    """The NumPy dtype matmul inputs/outputs are rounded to, or None outside autocast."""
    return _autocast_dtype


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b in float32, or with tensor-core rounding inside `autocast` (see the module doc)."""
    low = _autocast_dtype
    if low is None:
        return a @ b
    out = a.astype(low).astype(np.float32) @ b.astype(low).astype(np.float32)
    return out.astype(low).astype(np.float32)


@contextlib.contextmanager
def autocast(dtype):
    global _autocast_dtype
    previous = _autocast_dtype
    _autocast_dtype = np.dtype(dtype)
    try:
        yield
    finally:
        _autocast_dtype = previous
