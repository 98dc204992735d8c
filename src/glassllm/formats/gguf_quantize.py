"""Q8_0 and Q4_0 quantization, as glass: the block layouts llama.cpp stores and how a block of
32 float32 weights becomes its bytes.

Source: ggml's `ggml-quants.c`, `quantize_row_q8_0_ref` and `quantize_row_q4_0_ref`; the
structs `block_q8_0` and `block_q4_0` in `ggml-common.h`. Names below are theirs: `QK8_0`,
`QK4_0` (weights per block), `d` (the block's scale, stored as float16), `qs` (the quants).

    block_q8_0 (34 bytes): d: float16 | qs: int8[32]             x[j] ~= d * qs[j]
    block_q4_0 (18 bytes): d: float16 | qs: uint8[16], two 4-bit quants a byte: the low
                           nibble of qs[j] is weight j, the high nibble weight j + 16;
                                                                 x[j] ~= d * (q[j] - 8)

A row of a weight matrix (its last axis, ggml's ne[0]) is cut into blocks in order, so its
length must be a multiple of 32; the blocks of all rows follow one another.

Each type has a reference form, one block as `ggml-quants.c` reads (`quantize_block_*`), and
a fast form over every block at once in NumPy (`quantize_q8_0`, `quantize_q4_0`). The tests
hold both equal to each other and to the `gguf` package's `gguf.quants.quantize`, byte for
byte. Both compute in float32, as the C code does: `x * id` with `id = 1 / d` in float32,
then round (Q8_0: C's `roundf`, halves away from zero) or truncate (Q4_0: the `(int8_t)`
cast of `x * id + 8.5`).
"""
from __future__ import annotations

import numpy as np

QK8_0 = 32  # weights per block_q8_0 (ggml-common.h)
QK4_0 = 32  # weights per block_q4_0
Q8_0_BYTES = 2 + QK8_0       # float16 d + int8 qs[32]
Q4_0_BYTES = 2 + QK4_0 // 2  # float16 d + uint8 qs[16]


def _roundf(x: np.ndarray) -> np.ndarray:
    """C's roundf: to the nearest integer, halves away from zero (NumPy's round is to even)."""
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


def quantize_block_q8_0(x: np.ndarray) -> bytes:
    """One block, as `quantize_row_q8_0_ref` (ggml-quants.c) does it.

    Args:
        x: float32 [QK8_0] weights.
    Returns:
        the 34 bytes of a block_q8_0: d (float16, little-endian), then qs (int8 [32]).
    """
    x = np.asarray(x, dtype=np.float32)
    amax = np.float32(np.max(np.abs(x)))  # the block's largest magnitude maps to +-127
    d = amax / np.float32(127)
    inv_d = np.float32(1) / d if d != 0 else np.float32(0)
    qs = _roundf(x * inv_d).astype(np.int8)
    return np.float16(d).tobytes() + qs.tobytes()


def quantize_block_q4_0(x: np.ndarray) -> bytes:
    """One block, as `quantize_row_q4_0_ref` (ggml-quants.c) does it.

    The weight of largest magnitude (the first, among equal ones) keeps its sign in d, so it
    lands exactly on q = 0 (d * -8): the 16 levels are not symmetric about zero.

    Args:
        x: float32 [QK4_0] weights.
    Returns:
        the 18 bytes of a block_q4_0: d (float16), then qs (uint8 [16]).
    """
    x = np.asarray(x, dtype=np.float32)
    i_max = int(np.argmax(np.abs(x)))  # C's loop keeps the first index of the largest |x|
    d = x[i_max] / np.float32(-8)
    inv_d = np.float32(1) / d if d != 0 else np.float32(0)
    half = QK4_0 // 2
    # x*id lies in [-8, 8]; + 8.5 then truncation is round-to-nearest onto 0..16, capped at 15
    q = np.minimum(15, np.trunc(x * inv_d + np.float32(8.5)).astype(np.int8)).astype(np.uint8)
    qs = q[:half] | (q[half:] << np.uint8(4))
    return np.float16(d).tobytes() + qs.tobytes()


def _blocks(weights: np.ndarray, qk: int) -> np.ndarray:
    """[..., n] float32 -> [n_blocks, qk]: each row cut into blocks of qk, in order.

    Raises:
        ValueError: the last axis is not a multiple of qk.
    """
    weights = np.ascontiguousarray(weights, dtype=np.float32)
    if weights.ndim == 0 or weights.shape[-1] % qk:
        raise ValueError(f"a row of {weights.shape[-1] if weights.ndim else 0} weights is not "
                         f"a whole number of {qk}-weight blocks")
    return weights.reshape(-1, qk)


def quantize_q8_0(weights: np.ndarray) -> np.ndarray:
    """Every block of `weights` at once, equal to `quantize_block_q8_0` on each.

    Args:
        weights: float32 [..., n], n a multiple of 32.
    Returns:
        uint8 [..., n // 32 * 34]: the blocks of each row (gguf's byte layout for GGUFWriter).
    Raises:
        ValueError: n is not a multiple of 32.
    """
    blocks = _blocks(weights, QK8_0)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv_d = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    qs = _roundf(blocks * inv_d).astype(np.int8)
    out = np.concatenate([d.astype(np.float16).view(np.uint8), qs.view(np.uint8)], axis=1)
    return out.reshape(*weights.shape[:-1], -1)


def quantize_q4_0(weights: np.ndarray) -> np.ndarray:
    """Every block of `weights` at once, equal to `quantize_block_q4_0` on each.

    Args:
        weights: float32 [..., n], n a multiple of 32.
    Returns:
        uint8 [..., n // 32 * 18].
    Raises:
        ValueError: n is not a multiple of 32.
    """
    blocks = _blocks(weights, QK4_0)
    i_max = np.abs(blocks).argmax(axis=1)[:, None]
    d = np.take_along_axis(blocks, i_max, axis=1) / np.float32(-8)
    with np.errstate(divide="ignore"):
        inv_d = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = np.minimum(15, np.trunc(blocks * inv_d + np.float32(8.5))).astype(np.uint8)
    half = QK4_0 // 2
    qs = q[:, :half] | (q[:, half:] << np.uint8(4))
    out = np.concatenate([d.astype(np.float16).view(np.uint8), qs], axis=1)
    return out.reshape(*weights.shape[:-1], -1)


QUANTIZERS = {"q8_0": quantize_q8_0, "q4_0": quantize_q4_0}
BLOCK_SIZE = {"q8_0": QK8_0, "q4_0": QK4_0}
