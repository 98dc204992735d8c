"""The engine's causal attention: `functional.causal_attention_forward/backward` computed in
blocks of queries, with the query heads of a group stacked, never holding the T x T square.

- Queries are processed in blocks of ATTENTION_BLOCK positions. A block's queries see only the
  keys up to its last position, so the scores above the diagonal blocks -- almost half of the
  T x T square in training -- are never computed, exponentiated, stored or differentiated.
- Instead of copying K/V per query head (`functional.repeat_kv`), the G = H/K query heads of
  a group are stacked into one (Tq*G)-row matrix (row t*G + g), so each KV head is one batched
  GEMM, and a block of query positions is a slab of rows.
- q is scaled by 1/sqrt(D) before the product (T*D values are cheaper to scale than T*T
  scores): the scores differ from the reference's q k^T / sqrt(D) by rounding.
- Each slice of batch rows goes through the whole op before the next: in split mode the slices
  run in parallel, one per thread of the pool, and a block's scores are still in cache for
  their softmax.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .. import functional as F
from .. import kernels
from . import parallel
from .compiled import softmax_backward_inplace, softmax_rows_inplace  # numba, else NumPy

ATTENTION_BLOCK = 64


@functools.lru_cache(maxsize=64)
def _causal_bias(n: int, G: int, dtype) -> np.ndarray:
    """Additive mask of a diagonal block: (n*G, n), row t*G+g (time t, group head g) has
    -inf on the keys after t, 0 elsewhere. Made once per shape and kept (read-only): every
    layer, block and batch slice of a step adds the same one, and building it (a full, a
    triu, a repeat) cost a few percent of a small attention's forward."""
    upper = np.triu(np.full((n, n), -np.inf, dtype=dtype), 1)
    bias = np.repeat(upper, G, axis=0)
    bias.flags.writeable = False
    return bias


def _query_blocks(Tq: int, q_start: int):
    """(first, end, keys) per block: query positions [first, end) see keys [0, keys)."""
    return [(i, min(i + ATTENTION_BLOCK, Tq), q_start + min(i + ATTENTION_BLOCK, Tq))
            for i in range(0, Tq, ATTENTION_BLOCK)]


def _over_batch(fn, B: int) -> None:
    """fn(rows) over batch rows: in split mode one slice per thread of the pool (each slice's
    products then run on one BLAS thread), else all rows at once on the calling thread."""
    if parallel.split_matmuls():
        parallel.for_thread_slices(fn, B)
    else:
        fn(slice(0, B))


def causal_attention_forward(q, k, v, q_start: int = 0):
    """`functional.causal_attention_forward` in query blocks (module doc).

    q (B, Tq, Hq, D); k, v (B, Tk, Hkv, D) -> (B, Tq, Hq, D). The saved probabilities are one
    (B, Hkv, rows*G, keys) array per query block.
    """
    B, Tq, Hq, D = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    scale = 1.0 / math.sqrt(D)
    dtype = np.result_type(q, k, v)
    q5 = q.reshape(B, Tq, Hkv, G, D)
    qg = np.empty((B, Hkv, Tq * G, D), dtype=q.dtype)  # q * scale, groups stacked
    qg5 = qg.reshape(B, Hkv, Tq, G, D)
    # K and V are used in place: (B, Hkv, Tk, D) views whose rows are D contiguous values
    # Hkv*D apart, a layout BLAS reads directly (no copy; in decoding, none of the cache).
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    blocks = _query_blocks(Tq, q_start)
    probs = [np.empty((B, Hkv, (end - first) * G, keys), dtype=dtype)
             for first, end, keys in blocks]  # kept for the backward pass
    out = np.empty((B, Hkv, Tq * G, D), dtype=dtype)
    y = np.empty((B, Tq, Hkv, G, D), dtype=dtype)

    def batch_rows(b):
        np.multiply(q5[b].transpose(0, 2, 1, 3, 4), scale, out=qg5[b])
        for (first, end, keys), p in zip(blocks, probs):
            rows = slice(first * G, end * G)
            kernels.matmul(qg[b, :, rows], kh[b, :, :keys].swapaxes(-1, -2), out=p[b])
            diagonal = q_start + first  # keys from here on are in the future for some rows
            if diagonal + 1 < keys:
                p[b, ..., diagonal:] += _causal_bias(end - first, G, np.dtype(dtype))
            softmax_rows_inplace(p[b])
            kernels.matmul(p[b], vh[b, :, :keys], out=out[b, :, rows])
        y[b] = out[b].reshape(-1, Hkv, Tq, G, D).transpose(0, 2, 1, 3, 4)

    _over_batch(batch_rows, B)
    return y.reshape(B, Tq, Hq, D), (qg, kh, vh, probs, scale, q_start)


def causal_attention_backward(dy, saved):
    qg, kh, vh, probs, scale, q_start = saved
    B, Hkv, rows_total, D = qg.shape
    Tq = dy.shape[1]
    G = rows_total // Tq
    dy5 = dy.reshape(B, Tq, Hkv, G, D)
    dtype = np.result_type(qg, dy)
    dout = np.empty((B, Hkv, rows_total, D), dtype=dtype)
    dqg = np.empty((B, Hkv, rows_total, D), dtype=dtype)
    # dk, dv are made in the (B, Tk, Hkv, D) layout they are returned in; the loop adds into
    # their (B, Hkv, Tk, D) views
    dk = np.zeros((B, kh.shape[2], Hkv, D), dtype=dtype)
    dv = np.zeros_like(dk)
    dkh, dvh = dk.transpose(0, 2, 1, 3), dv.transpose(0, 2, 1, 3)
    dq = np.empty((B, Tq, Hkv, G, D), dtype=qg.dtype)

    def batch_rows(b):
        dout[b].reshape(-1, Hkv, Tq, G, D)[...] = dy5[b].transpose(0, 2, 1, 3, 4)
        for (first, end, keys), p in zip(_query_blocks(Tq, q_start), probs):
            rows = slice(first * G, end * G)
            do = dout[b, :, rows]
            dvh[b, :, :keys] += kernels.matmul(p[b].swapaxes(-1, -2), do)  # sums a group's heads
            dscores = kernels.matmul(do, vh[b, :, :keys].swapaxes(-1, -2))
            softmax_backward_inplace(dscores, p[b])
            kernels.matmul(dscores, kh[b, :, :keys], out=dqg[b, :, rows])
            dkh[b, :, :keys] += kernels.matmul(dscores.swapaxes(-1, -2), qg[b, :, rows])
        # back to (B, Tq, Hq, D), with the chain rule's 1/sqrt(D) in the same pass
        np.multiply(dqg[b].reshape(-1, Hkv, Tq, G, D).transpose(0, 2, 1, 3, 4), scale,
                    out=dq[b])

    _over_batch(batch_rows, B)
    return dq.reshape(B, Tq, Hkv * G, D), dk, dv


FAST_FORMS = [
    ((F.causal_attention_forward, F.causal_attention_backward),
     (causal_attention_forward, causal_attention_backward)),
]
