"""GGUF's tensor types as glass: each quantization's block, and the arithmetic that turns it back
into float32, written out.

A quantized tensor is a row of fixed-size blocks; each block holds `block_size` weights as small
integers with one or a few float16 scales. The block layouts are `ggml-common.h`'s structs
(`block_q4_0`, `block_q4_K`, ...), given here as NumPy structured dtypes whose field names are
theirs (d, dmin, m, scales, qs, qh, ql, bsums), and each dequantizer is the loop of
`ggml-quants.c`'s `dequantize_row_<type>` with the per-block loop turned into NumPy operations
over all blocks at once (the loops inside a block are kept, so each line reads as the C line it
mirrors). Every product is taken in float32 in the C order (d * sc first, then * q, then - m),
so the results are those of llama.cpp's reference C and of the `gguf` package's NumPy
dequantizers, bit for bit (tests/test_gguf_quants.py).

Sources: llama.cpp ggml/src/ggml-common.h (block structs, QK4_0 = 32, QK_K = 256,
K_SCALE_SIZE = 12) and ggml/src/ggml-quants.c (dequantize_row_q4_0 ... dequantize_row_q8_K,
get_scale_min_k4).

Formats, what one block of weights w holds (n: block_size):
    Q8_0  n=32   d (f16), qs int8:                 w = d * q
    Q4_0  n=32   d, qs 4-bit:                      w = d * (q - 8)
    Q4_1  n=32   d, m, qs 4-bit:                   w = d * q + m
    Q5_0  n=32   d, qh (the 5th bits), qs 4-bit:   w = d * (q - 16)
    Q5_1  n=32   d, m, qh, qs:                     w = d * q + m
    Q4_K  n=256  d, dmin, 8 pairs of 6-bit (scale, min) packed in 12 bytes, qs 4-bit:
                 w = (d * sc_j) * q - dmin * m_j   over 8 sub-blocks j of 32
    Q5_K  n=256  as Q4_K with a 5th bit per weight in qh
    Q6_K  n=256  ql (low 4 bits), qh (high 2 bits), 16 int8 scales, d:
                 w = (d * sc_j) * (q - 32)          over 16 sub-blocks of 16
    Q8_K  n=256  d (f32), qs int8, bsums (sums of 16, for dot products): w = d * q
"""
from __future__ import annotations

import gguf
import numpy as np

QK4_0 = QK4_1 = QK5_0 = QK5_1 = QK8_0 = 32
QK_K = 256
K_SCALE_SIZE = 12
_QT = gguf.GGMLQuantizationType

# ggml-common.h's block structs (little-endian, packed: no padding between fields)
BLOCKS = {
    _QT.Q4_0: np.dtype([("d", "<f2"), ("qs", "u1", QK4_0 // 2)]),
    _QT.Q4_1: np.dtype([("d", "<f2"), ("m", "<f2"), ("qs", "u1", QK4_1 // 2)]),
    _QT.Q5_0: np.dtype([("d", "<f2"), ("qh", "<u4"), ("qs", "u1", QK5_0 // 2)]),
    _QT.Q5_1: np.dtype([("d", "<f2"), ("m", "<f2"), ("qh", "<u4"), ("qs", "u1", QK5_1 // 2)]),
    _QT.Q8_0: np.dtype([("d", "<f2"), ("qs", "i1", QK8_0)]),
    _QT.Q4_K: np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", K_SCALE_SIZE),
                        ("qs", "u1", QK_K // 2)]),
    _QT.Q5_K: np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", K_SCALE_SIZE),
                        ("qh", "u1", QK_K // 8), ("qs", "u1", QK_K // 2)]),
    _QT.Q6_K: np.dtype([("ql", "u1", QK_K // 2), ("qh", "u1", QK_K // 4),
                        ("scales", "i1", QK_K // 16), ("d", "<f2")]),
    _QT.Q8_K: np.dtype([("d", "<f4"), ("qs", "i1", QK_K), ("bsums", "<i2", QK_K // 16)]),
}


def _f32(x) -> np.ndarray:
    """A field as float32, one column per block ((n_blocks, 1): broadcast over its weights)."""
    return np.asarray(x, dtype=np.float32).reshape(len(x), -1)


# --------------------------------------------------------------------------- 32-weight blocks
def dequantize_q8_0(b: np.ndarray) -> np.ndarray:
    """block_q8_0 (n_blocks,) -> (n_blocks, 32) float32: y = qs * d (dequantize_row_q8_0)."""
    return b["qs"].astype(np.float32) * _f32(b["d"])


def dequantize_q4_0(b: np.ndarray) -> np.ndarray:
    """block_q4_0 -> (n_blocks, 32): the low nibbles of qs are weights 0..15, the high ones
    16..31, each (nibble - 8) * d (dequantize_row_q4_0)."""
    x0 = (b["qs"] & 0x0F).astype(np.int16) - 8
    x1 = (b["qs"] >> 4).astype(np.int16) - 8
    return np.concatenate([x0, x1], axis=1).astype(np.float32) * _f32(b["d"])


def dequantize_q4_1(b: np.ndarray) -> np.ndarray:
    """block_q4_1 -> (n_blocks, 32): nibble * d + m (dequantize_row_q4_1)."""
    x = np.concatenate([b["qs"] & 0x0F, b["qs"] >> 4], axis=1).astype(np.float32)
    return x * _f32(b["d"]) + _f32(b["m"])


def _fifth_bits(qh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """qh (n_blocks,) uint32 -> the 5th bit (as 0 or 0x10) of weights 0..15 and of 16..31:
    xh_0 = ((qh >> j) << 4) & 0x10, xh_1 = (qh >> (j + 12)) & 0x10 (dequantize_row_q5_0)."""
    j = np.arange(QK5_0 // 2, dtype=np.uint32)
    qh = qh.astype(np.uint32)[:, None]
    return ((qh >> j) << 4) & 0x10, (qh >> (j + 12)) & 0x10


def dequantize_q5_0(b: np.ndarray) -> np.ndarray:
    """block_q5_0 -> (n_blocks, 32): (nibble | 5th bit << 4) - 16, times d."""
    xh_0, xh_1 = _fifth_bits(b["qh"])
    x0 = ((b["qs"] & 0x0F) | xh_0).astype(np.int16) - 16
    x1 = ((b["qs"] >> 4) | xh_1).astype(np.int16) - 16
    return np.concatenate([x0, x1], axis=1).astype(np.float32) * _f32(b["d"])


def dequantize_q5_1(b: np.ndarray) -> np.ndarray:
    """block_q5_1 -> (n_blocks, 32): (nibble | 5th bit << 4) * d + m."""
    xh_0, xh_1 = _fifth_bits(b["qh"])
    x = np.concatenate([(b["qs"] & 0x0F) | xh_0, (b["qs"] >> 4) | xh_1], axis=1)
    return x.astype(np.float32) * _f32(b["d"]) + _f32(b["m"])


# --------------------------------------------------------------------------- k-quants
def get_scale_min_k4(j: int, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sub-block j's 6-bit (scale, min) out of the 12 `scales` bytes (n_blocks, 12): j < 4 in
    the low 6 bits of bytes j and j + 4; j >= 4 in the nibbles of byte j + 4 with their top
    2 bits in the spare bits of bytes j - 4 and j (ggml-quants.c get_scale_min_k4)."""
    if j < 4:
        return q[:, j] & 63, q[:, j + 4] & 63
    return ((q[:, j + 4] & 0xF) | ((q[:, j - 4] >> 6) << 4),
            (q[:, j + 4] >> 4) | ((q[:, j] >> 6) << 4))


def _k_scales(b: np.ndarray, j: int) -> tuple[np.ndarray, np.ndarray]:
    """(d * sc, dmin * m) of sub-block j, float32 columns."""
    sc, m = get_scale_min_k4(j, b["scales"])
    return _f32(b["d"]) * _f32(sc), _f32(b["dmin"]) * _f32(m)


def dequantize_q4_k(b: np.ndarray) -> np.ndarray:
    """block_q4_K -> (n_blocks, 256): 4 chunks of 64 weights, each 32 low nibbles (sub-block
    2i) then 32 high nibbles (sub-block 2i + 1) of the same 32 bytes: d1 * q - m1
    (dequantize_row_q4_K)."""
    y = []
    for i in range(QK_K // 64):
        q = b["qs"][:, 32 * i:32 * i + 32]
        (d1, m1), (d2, m2) = _k_scales(b, 2 * i), _k_scales(b, 2 * i + 1)
        y += [d1 * (q & 0xF).astype(np.float32) - m1, d2 * (q >> 4).astype(np.float32) - m2]
    return np.concatenate(y, axis=1)


def dequantize_q5_k(b: np.ndarray) -> np.ndarray:
    """block_q5_K -> (n_blocks, 256): Q4_K's layout with a 5th bit per weight, qh bit 2i for
    the low nibbles and 2i + 1 for the high ones of chunk i (u1, u2 in dequantize_row_q5_K)."""
    y = []
    for i in range(QK_K // 64):
        ql, qh = b["qs"][:, 32 * i:32 * i + 32], b["qh"]
        u1, u2 = 1 << (2 * i), 2 << (2 * i)
        (d1, m1), (d2, m2) = _k_scales(b, 2 * i), _k_scales(b, 2 * i + 1)
        low = (ql & 0xF) + np.where(qh & u1, 16, 0)
        high = (ql >> 4) + np.where(qh & u2, 16, 0)
        y += [d1 * low.astype(np.float32) - m1, d2 * high.astype(np.float32) - m2]
    return np.concatenate(y, axis=1)


def dequantize_q6_k(b: np.ndarray) -> np.ndarray:
    """block_q6_K -> (n_blocks, 256): two halves of 128; in each, weight l (< 32) of the four
    groups takes its low 4 bits from ql[l] / ql[l + 32] (low, then high nibbles) and its top 2
    bits from qh[l] (bits 0-1, 2-3, 4-5, 6-7); w = d * sc[is] * (q - 32) with one int8 scale
    per 16 weights (dequantize_row_q6_K)."""
    d = _f32(b["d"])
    y = []
    for n in range(2):
        ql, qh = b["ql"][:, 64 * n:64 * n + 64], b["qh"][:, 32 * n:32 * n + 32]
        sc = b["scales"][:, 8 * n:8 * n + 8].astype(np.float32)
        q = [(ql[:, :32] & 0xF) | ((qh >> 0) & 3) << 4, (ql[:, 32:] & 0xF) | ((qh >> 2) & 3) << 4,
             (ql[:, :32] >> 4) | ((qh >> 4) & 3) << 4, (ql[:, 32:] >> 4) | ((qh >> 6) & 3) << 4]
        for g in range(4):  # group g of 32 weights: scales sc[2g] (l < 16), sc[2g + 1]
            scale = np.repeat(sc[:, 2 * g:2 * g + 2], 16, axis=1)
            y.append(d * scale * (q[g].astype(np.int16) - 32).astype(np.float32))
    return np.concatenate(y, axis=1)


def dequantize_q8_k(b: np.ndarray) -> np.ndarray:
    """block_q8_K -> (n_blocks, 256): d * qs, d float32 (dequantize_row_q8_K; bsums are
    only read by dot products)."""
    return _f32(b["d"]) * b["qs"].astype(np.float32)


DEQUANTIZERS = {
    _QT.Q8_0: dequantize_q8_0, _QT.Q4_0: dequantize_q4_0, _QT.Q4_1: dequantize_q4_1,
    _QT.Q5_0: dequantize_q5_0, _QT.Q5_1: dequantize_q5_1, _QT.Q4_K: dequantize_q4_k,
    _QT.Q5_K: dequantize_q5_k, _QT.Q6_K: dequantize_q6_k, _QT.Q8_K: dequantize_q8_k,
}
FLOATS = (_QT.F32, _QT.F16, _QT.BF16)
SUPPORTED = FLOATS + tuple(DEQUANTIZERS)


def block_size(qtype) -> int:
    """Weights per block (1 for the float types)."""
    return 1 if qtype in FLOATS else int(gguf.GGML_QUANT_SIZES[qtype][0])


def dequantize(raw: np.ndarray, qtype, shape: tuple[int, ...]) -> np.ndarray:
    """A GGUF tensor's bytes -> float32 of NumPy `shape` (the reverse of ggml's ne; the last
    axis is the one blocks run along).

    F32 as stored; F16 widened (exact); BF16 the 16 stored bits as the top half of a float32
    (exact); a quantized type through its block dequantizer.

    Raises:
        ValueError: a type not in `SUPPORTED` (naming it), or a byte count other than the
            shape and type imply.
    """
    qtype = _QT(int(qtype))
    raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    n = int(np.prod(shape, dtype=np.int64))
    if qtype == _QT.F32:
        values = raw.view("<f4")
    elif qtype == _QT.F16:
        values = raw.view("<f2").astype(np.float32)
    elif qtype == _QT.BF16:
        values = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    elif qtype in DEQUANTIZERS:
        if raw.size % BLOCKS[qtype].itemsize:
            raise ValueError(f"{qtype.name}: {raw.size} bytes is not a whole number of "
                             f"{BLOCKS[qtype].itemsize}-byte blocks")
        values = DEQUANTIZERS[qtype](raw.view(BLOCKS[qtype])).reshape(-1)
    else:
        raise ValueError(f"tensor type {qtype.name} is not supported by glassllm (supported: "
                         f"{', '.join(t.name for t in SUPPORTED)})")
    if values.size != n:
        raise ValueError(f"{qtype.name}: {raw.size} bytes hold {values.size} values, the shape "
                         f"{tuple(shape)} needs {n}")
    return values.astype(np.float32, copy=False).reshape(shape)
