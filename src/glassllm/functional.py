"""Fused ops: each a forward and a hand-written backward over plain NumPy arrays, side by side.

A transformer built from elementwise `Tensor` ops would create dozens of graph nodes and
temporaries per layer; here each op below is one node. The pattern (from llm.c's
`*_forward` / `*_backward` pairs) is:

    y, saved = op_forward(x, ...)       # plain arrays in, plain arrays out
    dx, ... = op_backward(dy, saved)    # gradients of the inputs
    op(x: Tensor, ...) -> Tensor        # the autograd wrapper the model calls

Every op's backward is checked against central finite differences in float64 and against
torch autograd in `tests/test_functional.py`. Shapes use B batch, T time, C channels
(d_model), H heads, D head_dim, V vocabulary, N = B*T rows.

Matrix products run on all cores inside NumPy's BLAS; the elementwise passes of the ops are
written per slice of rows and run on all cores by `glassllm.engine.parallel.for_slices`.
"""
from __future__ import annotations

import math

import numpy as np

from . import amp
from .engine import parallel
from .tensor import Tensor

_mm = amp.matmul  # every matrix product goes through the autocast hook

# A product with fewer output rows than this per thread runs whole, on the calling thread.
MIN_ROWS_PER_THREAD = 16


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for 2-D a and b, through amp.matmul. In split mode (`glassllm.engine.parallel`) the
    output's rows are cut into one slice per thread of the pool, each a product of a's rows
    with the whole of b (same bits as one product: no row's sum is split)."""
    n_rows = a.shape[0]
    if not parallel.split_matmuls() or n_rows < MIN_ROWS_PER_THREAD * parallel.get_num_threads():
        return _mm(a, b)
    out = np.empty((n_rows, b.shape[1]), dtype=np.result_type(a, b))
    parallel.for_thread_slices(lambda rows: _mm(a[rows], b, out=out[rows]), n_rows)
    return out


# --------------------------------------------------------------------------- linear
def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y = x @ weight + bias.

    Shapes: x (..., C_in), weight (C_in, C_out) -- input-major, as GPT-2's Conv1D and the
    004 design; bias (C_out,) or None -> y (..., C_out). Leading axes are flattened into one
    matrix so each direction is a single GEMM.
    """
    lead, c_in = x.shape[:-1], x.shape[-1]
    x2 = x.data.reshape(-1, c_in)
    y = _matmul(x2, weight.data)
    if bias is not None:
        y += bias.data
    y = y.reshape(*lead, weight.shape[1])

    def backward(dy):
        dy2 = dy.reshape(-1, dy.shape[-1])
        dx = _matmul(dy2, weight.data.T).reshape(x.shape) if x.requires_grad else None
        dw = _matmul(x2.T, dy2) if weight.requires_grad else None
        db = dy2.sum(axis=0) if bias is not None and bias.requires_grad else None
        return dx, dw, db

    parents = (x, weight) if bias is None else (x, weight, bias)
    # keep_autocast: the backward runs in the precision this forward ran in (as torch.autocast)
    return Tensor.from_op(y, parents, amp.keep_autocast(backward), fresh_grads=True)


def unembed(x: Tensor, weight: Tensor) -> Tensor:
    """Logits against a tied embedding: y = x @ weight.T.

    Shapes: x (..., C), weight (V, C) -- the token embedding itself -> y (..., V).
    """
    lead, c = x.shape[:-1], x.shape[-1]
    x2 = x.data.reshape(-1, c)
    y = _matmul(x2, weight.data.T).reshape(*lead, weight.shape[0])

    def backward(dy):
        dy2 = dy.reshape(-1, weight.shape[0])
        dx = _matmul(dy2, weight.data).reshape(x.shape) if x.requires_grad else None
        dw = _matmul(dy2.T, x2) if weight.requires_grad else None
        return dx, dw

    return Tensor.from_op(y, (x, weight), amp.keep_autocast(backward), fresh_grads=True)


# --------------------------------------------------------------------------- embedding
def _scatter_add_rows(ids: np.ndarray, rows: np.ndarray, like: np.ndarray) -> np.ndarray:
    """out = zeros_like(like); out[ids[j]] += rows[j] for every j, repeated ids adding up.

    Sorting the ids and summing each run of equal ids with one `np.add.reduceat` is about 3x
    faster than `np.add.at` (element-by-element); the sums are the same, in the same order.
    """
    out = np.zeros_like(like)
    if ids.size == 0:
        return out
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
    out[sorted_ids[starts]] = np.add.reduceat(rows[order], starts, axis=0)
    return out


def embedding(ids: np.ndarray, weight: Tensor) -> Tensor:
    """Rows of `weight` picked by integer `ids`: (...,) ints, weight (V, C) -> (..., C).

    Backward scatters-adds the output gradient into the picked rows (a token that appears
    twice gets both contributions). Ids are not range-checked here: the model does that.
    """
    ids = np.asarray(ids)

    def backward(dy):
        return (_scatter_add_rows(ids.reshape(-1), dy.reshape(-1, weight.shape[1]),
                                  weight.data),)

    return Tensor.from_op(weight.data[ids], (weight,), backward, fresh_grads=True)


# --------------------------------------------------------------------------- norms
# The row statistics and the weight gradients of the norms are dot products; einsum computes
# them without materialising the elementwise product (2-3x faster than (a * b).sum()).
def _row_dot(a, b):
    """sum(a * b, axis=-1, keepdims=True): (..., C), (..., C) -> (..., 1)."""
    return np.einsum("...i,...i->...", a, b)[..., None]


def _column_dot(a, b):
    """sum(a * b) over every axis but the last: (..., C), (..., C) -> (C,)."""
    c = a.shape[-1]
    return np.einsum("ij,ij->j", a.reshape(-1, c), b.reshape(-1, c))


def _rows(a):
    """a as a 2-D (rows, last axis) array: a view for the contiguous arrays ops make."""
    return a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)


def rms_norm_forward(x, weight, eps):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last axis (Zhang & Sennrich 2019)."""
    x2 = _rows(x)
    C = x2.shape[1]
    xhat = np.empty_like(x2)
    rstd = np.empty((x2.shape[0], 1), dtype=x2.dtype)
    y = np.empty(x2.shape, dtype=np.result_type(x2, weight))

    def rows(r):
        np.divide(1.0, np.sqrt(_row_dot(x2[r], x2[r]) / C + eps), out=rstd[r])
        np.multiply(x2[r], rstd[r], out=xhat[r])
        np.multiply(xhat[r], weight, out=y[r])

    parallel.for_slices(rows, *x2.shape)
    return y.reshape(x.shape), (xhat, rstd, weight)


def rms_norm_backward(dy, saved):
    xhat, rstd, weight = saved
    dy2 = _rows(dy)
    C = xhat.shape[1]
    dw = _column_dot(dy2, xhat)
    dx = np.empty(xhat.shape, dtype=np.result_type(dy2, weight))

    def rows(r):
        d = np.multiply(dy2[r], weight, out=dx[r])  # dxhat, turned into dx in place:
        # d/dx of x*rstd: rstd * (dxhat - xhat * mean(dxhat * xhat))
        d -= xhat[r] * (_row_dot(d, xhat[r]) / C)
        d *= rstd[r]

    parallel.for_slices(rows, *xhat.shape)
    return dx.reshape(dy.shape), dw


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-5) -> Tensor:
    """RMSNorm (Llama): x (..., C), weight (C,) -> (..., C). Statistics in x's dtype."""
    y, saved = rms_norm_forward(x.data, weight.data, eps)
    return Tensor.from_op(y, (x, weight), lambda dy: rms_norm_backward(dy, saved),
                          fresh_grads=True)


def layer_norm_forward(x, weight, bias, eps):
    """y = (x - mean) / sqrt(var + eps) * weight + bias (Ba et al. 2016; GPT-2 uses eps 1e-5)."""
    x2 = _rows(x)
    C = x2.shape[1]
    xhat = np.empty_like(x2)
    rstd = np.empty((x2.shape[0], 1), dtype=x2.dtype)
    y = np.empty(x2.shape, dtype=np.result_type(x2, weight, bias))

    def rows(r):
        xc = np.subtract(x2[r], x2[r].mean(axis=-1, keepdims=True), out=xhat[r])
        np.divide(1.0, np.sqrt(_row_dot(xc, xc) / C + eps), out=rstd[r])
        xc *= rstd[r]
        np.multiply(xc, weight, out=y[r])
        y[r] += bias

    parallel.for_slices(rows, *x2.shape)
    return y.reshape(x.shape), (xhat, rstd, weight)


def layer_norm_backward(dy, saved):
    xhat, rstd, weight = saved
    dy2 = _rows(dy)
    C = xhat.shape[1]
    dw = _column_dot(dy2, xhat)
    db = dy2.sum(axis=0)
    dx = np.empty(xhat.shape, dtype=np.result_type(dy2, weight))

    def rows(r):
        d = np.multiply(dy2[r], weight, out=dx[r])  # dxhat, turned into dx in place:
        # rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
        projection = xhat[r] * (_row_dot(d, xhat[r]) / C)
        d -= d.mean(axis=-1, keepdims=True)
        d -= projection
        d *= rstd[r]

    parallel.for_slices(rows, *xhat.shape)
    return dx.reshape(dy.shape), dw, db


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """LayerNorm: x (..., C), weight (C,), bias (C,) -> (..., C)."""
    y, saved = layer_norm_forward(x.data, weight.data, bias.data, eps)
    return Tensor.from_op(y, (x, weight, bias), lambda dy: layer_norm_backward(dy, saved),
                          fresh_grads=True)


# --------------------------------------------------------------------------- activations
def _sigmoid(x, out):
    """out = 1 / (1 + exp(-x)); out may be x itself. Returns out.

    One exp per element: NumPy's exp is about twice as fast as its tanh, and the passes run
    in place, with no temporaries. exp(-x) overflows to inf for x < -88 (float32), where
    1 / (1 + inf) = 0 is the right value, hence the silenced warning. Unlike
    0.5 * (1 + tanh(x / 2)), this keeps full relative precision for very negative x.
    """
    np.negative(x, out=out)
    with np.errstate(over="ignore"):
        np.exp(out, out=out)
    out += 1.0
    return np.reciprocal(out, out=out)


def _silu_grad(x, s, dy, out):
    """out = dy * d/dx[x * sigmoid(x)] = dy * s * (1 + x * (1 - s)), with s = sigmoid(x)."""
    d = np.subtract(1.0, s, out=out)
    d *= x
    d += 1.0
    d *= s
    d *= dy
    return d


def silu(x: Tensor) -> Tensor:
    """SiLU / swish: x * sigmoid(x) (Elfwing et al. 2017). Any shape."""
    x2 = _rows(x.data)
    s, y = np.empty_like(x2), np.empty_like(x2)

    def forward(r):
        _sigmoid(x2[r], out=s[r])
        np.multiply(x2[r], s[r], out=y[r])

    def backward(dy):
        dy2, dx = _rows(dy), np.empty(x2.shape, dtype=np.result_type(x2, dy))
        parallel.for_slices(lambda r: _silu_grad(x2[r], s[r], dy2[r], out=dx[r]), *x2.shape)
        return (dx.reshape(x.shape),)

    parallel.for_slices(forward, *x2.shape)
    return Tensor.from_op(y.reshape(x.shape), (x,), backward, fresh_grads=True)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """SwiGLU's gating: silu(gate) * up (Shazeer 2020, as in Llama's MLP). Same shapes in/out.

    Saves only sigmoid(gate) for the backward pass; silu(gate) = gate * sigmoid(gate) is one
    multiply to recompute there, cheaper than keeping another (N, d_ff) array alive.
    """
    g, u = _rows(gate.data), _rows(up.data)
    dtype = np.result_type(g, u)
    s, y = np.empty_like(g), np.empty(g.shape, dtype=dtype)

    def forward(r):
        _sigmoid(g[r], out=s[r])
        np.multiply(g[r], s[r], out=y[r])
        y[r] *= u[r]

    def backward(dy):
        dy2 = _rows(dy)
        dgate = np.empty(g.shape, dtype=np.result_type(dtype, dy2))
        dup = np.empty_like(dgate)

        def rows(r):
            _silu_grad(g[r], s[r], dy2[r], out=dgate[r])
            dgate[r] *= u[r]
            np.multiply(g[r], s[r], out=dup[r])
            dup[r] *= dy2[r]

        parallel.for_slices(rows, *g.shape)
        return dgate.reshape(gate.shape), dup.reshape(up.shape)

    parallel.for_slices(forward, *g.shape)
    return Tensor.from_op(y.reshape(gate.shape), (gate, up), backward, fresh_grads=True)


_GELU_C = math.sqrt(2.0 / math.pi)


def gelu(x: Tensor) -> Tensor:
    """GELU, tanh approximation, as GPT-2's `gelu_new` (Hendrycks & Gimpel 2016). Any shape.

    0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3) is computed as the identical
    x * sigmoid(2u): one exp instead of NumPy's slower tanh, and no cancellation in 1 + tanh
    for negative x. Only s = sigmoid(2u) is saved for the backward pass.
    """
    x2 = _rows(x.data)
    s, y = np.empty_like(x2), np.empty_like(x2)

    def forward(r):
        xr, sr = x2[r], s[r]
        np.multiply(xr, xr, out=sr)  # becomes u, then sigmoid(2u), in place
        sr *= 0.044715
        sr += 1.0
        sr *= xr
        sr *= 2.0 * _GELU_C
        _sigmoid(sr, out=sr)
        np.multiply(xr, sr, out=y[r])

    def backward(dy):
        dy2 = _rows(dy)
        dx = np.empty(x2.shape, dtype=np.result_type(x2, dy2))

        def rows(r):
            # d/dx x s = s + 2 x s (1 - s) u',  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
            xr, sr = x2[r], s[r]
            d = np.multiply(xr, xr, out=dx[r])
            d *= 3 * 0.044715
            d += 1.0
            d *= 2.0 * _GELU_C
            d *= xr
            d *= 1.0 - sr
            d += 1.0
            d *= sr
            d *= dy2[r]

        parallel.for_slices(rows, *x2.shape)
        return (dx.reshape(x.shape),)

    parallel.for_slices(forward, *x2.shape)
    return Tensor.from_op(y.reshape(x.shape), (x,), backward, fresh_grads=True)


# --------------------------------------------------------------------------- rotary embedding
def rope_tables(max_len: int, head_dim: int, theta: float = 10000.0, dtype=np.float32):
    """cos, sin tables of shape (max_len, head_dim) for rotary embedding (Su et al. 2021).

    Frequencies theta^(-2i/D) for i < D/2, each duplicated across the two halves: the
    rotate-half convention of Hugging Face's Llama (not the interleaved pairs of Meta's code).
    Angles are computed in float64 and rounded once.
    """
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.outer(np.arange(max_len, dtype=np.float64), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _rotate_half_transposed(x):  # the adjoint of _rotate_half: (a, b) -> (b, -a)
    half = x.shape[-1] // 2
    return np.concatenate([x[..., half:], -x[..., :half]], axis=-1)


def rope(x: Tensor, cos: np.ndarray, sin: np.ndarray) -> Tensor:
    """Rotary position embedding: x * cos + rotate_half(x) * sin.

    Shapes: x (B, T, H, D); cos, sin (T, D) -- rows for the positions of x's T steps.
    """
    c, s = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    xd = x.data
    B, T = xd.shape[:2]
    y = np.empty(xd.shape, dtype=np.result_type(xd, c))

    def forward(t):  # a slice of time steps, all batch rows; products land in y directly
        rotated = _rotate_half(xd[:, t])
        rotated *= s[t]
        np.add(np.multiply(xd[:, t], c[t], out=y[:, t]), rotated, out=y[:, t])

    def backward(dy):
        dx = np.empty(dy.shape, dtype=np.result_type(dy, c))

        def rows(t):
            rotated = _rotate_half_transposed(dy[:, t] * s[t])
            np.add(np.multiply(dy[:, t], c[t], out=dx[:, t]), rotated, out=dx[:, t])

        parallel.for_slices(rows, T, xd.size // max(1, T))
        return (dx,)

    parallel.for_slices(forward, T, xd.size // max(1, T))
    return Tensor.from_op(y, (x,), backward, fresh_grads=True)


# --------------------------------------------------------------------------- attention
# Queries are processed in blocks of this many positions. A block's queries see only the keys up
# to its last position, so the scores above the diagonal blocks -- almost half of the T x T
# square in training -- are never computed, exponentiated, stored or differentiated.
ATTENTION_BLOCK = 64


def _causal_bias(n: int, G: int, dtype) -> np.ndarray:
    """Additive mask of a diagonal block: (n*G, n), row t*G+g (time t, group head g) has
    -inf on the keys after t, 0 elsewhere."""
    upper = np.triu(np.full((n, n), -np.inf, dtype=dtype), 1)
    return np.repeat(upper, G, axis=0)


def _softmax_inplace(scores):
    """Row softmax over the last axis, in scores' buffer, with the max shift; returns it."""
    s2 = _rows(scores)

    def rows(r):
        block = s2[r]
        block -= block.max(axis=-1, keepdims=True)
        np.exp(block, out=block)
        block /= block.sum(axis=-1, keepdims=True)

    parallel.for_slices(rows, *s2.shape)
    return scores


def _softmax_backward_inplace(dprobs, probs):
    """dprobs <- dscores = P * (dP - rowsum(dP * P)); masked entries have P = 0."""
    d2, p2 = _rows(dprobs), _rows(probs)

    def rows(r):
        d = d2[r]
        d -= _row_dot(d, p2[r])
        d *= p2[r]

    parallel.for_slices(rows, *d2.shape)


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
    """softmax(q k^T / sqrt(D) + causal mask) v, with grouped-query heads.

    q (B, Tq, Hq, D); k, v (B, Tk, Hkv, D) with Hq a multiple of Hkv and Tk = q_start + Tq
    -> (B, Tq, Hq, D). Query i sits at absolute position q_start + i and sees keys
    0..q_start+i (q_start > 0 is decoding against a KV cache). Query head h reads KV head
    h // (Hq/Hkv), as Hugging Face's `repeat_kv`; instead of copying K/V per query head, the
    G = Hq/Hkv query heads of a group are stacked into one (Tq*G)-row matrix (row t*G + g),
    so each KV head is one batched GEMM, and a block of query positions is a slab of rows.
    Each slice of batch rows goes through the whole op (layout, every query block's scores,
    mask, softmax and values, layout back) before the next: in split mode the slices run in
    parallel, one per thread, and a block's scores are still in cache for their softmax.
    """
    B, Tq, Hq, D = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    scale = 1.0 / math.sqrt(D)
    dtype = np.result_type(q, k, v)
    # q as (B, Hkv, Tq*G, D), scaled by 1/sqrt(D) in the same pass (T*D values are cheaper
    # to scale than T*T scores).
    q5 = q.reshape(B, Tq, Hkv, G, D)
    qg = np.empty((B, Hkv, Tq * G, D), dtype=q.dtype)
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
            _mm(qg[b, :, rows], kh[b, :, :keys].swapaxes(-1, -2), out=p[b])
            diagonal = q_start + first  # keys from here on are in the future for some rows
            if diagonal + 1 < keys:
                p[b, ..., diagonal:] += _causal_bias(end - first, G, dtype)
            _softmax_inplace(p[b])
            _mm(p[b], vh[b, :, :keys], out=out[b, :, rows])
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
            dvh[b, :, :keys] += _mm(p[b].swapaxes(-1, -2), do)  # sums over a group's G heads
            dscores = _mm(do, vh[b, :, :keys].swapaxes(-1, -2))
            _softmax_backward_inplace(dscores, p[b])
            _mm(dscores, kh[b, :, :keys], out=dqg[b, :, rows])
            dkh[b, :, :keys] += _mm(dscores.swapaxes(-1, -2), qg[b, :, rows])  # qg: q*scale
        # back to (B, Tq, Hq, D), with the chain rule's 1/sqrt(D) in the same pass
        np.multiply(dqg[b].reshape(-1, Hkv, Tq, G, D).transpose(0, 2, 1, 3, 4), scale,
                    out=dq[b])

    _over_batch(batch_rows, B)
    return dq.reshape(B, Tq, Hkv * G, D), dk, dv


def causal_attention(q: Tensor, k: Tensor, v: Tensor, q_start: int = 0) -> Tensor:
    """Causal scaled dot-product attention with GQA; see `causal_attention_forward`.

    Shapes: q (B, Tq, Hq, D), k and v (B, Tk, Hkv, D) -> (B, Tq, Hq, D).
    Source: Vaswani et al. 2017 (attention), Ainslie et al. 2023 (grouped-query attention).
    """
    y, saved = causal_attention_forward(q.data, k.data, v.data, q_start)
    return Tensor.from_op(y, (q, k, v),
                          amp.keep_autocast(lambda dy: causal_attention_backward(dy, saved)),
                          fresh_grads=True)


# --------------------------------------------------------------------------- loss
def _softmax_and_target_logprob(z: np.ndarray, targets: np.ndarray, out=None):
    """softmax(z) (N, V) and log_softmax(z)[row, target] (N,), with the log-sum-exp shift.

    Works through slices of rows that fit in cache: each slice's shift, exp, row sum and
    normalisation happen in the output buffer, so the logits are read once and no N x V
    temporaries are made (the direct form makes two, `shifted` and `exp`: 0.2 GB each for a
    GPT-2-sized vocabulary and 1024 positions). `out` may be z itself.
    """
    probs = np.empty_like(z) if out is None else out
    logprob_target = np.empty(z.shape[0], dtype=z.dtype)

    def rows(r):
        ps = np.subtract(z[r], z[r].max(axis=-1, keepdims=True), out=probs[r])
        shifted_target = ps[np.arange(len(ps)), targets[r]]
        np.exp(ps, out=ps)
        sumexp = ps.sum(axis=-1, keepdims=True)
        logprob_target[r] = shifted_target - np.log(sumexp[:, 0])
        ps /= sumexp

    parallel.for_slices(rows, *z.shape)
    return probs, logprob_target


def cross_entropy(logits: Tensor, targets: np.ndarray, overwrite_logits: bool = False) -> Tensor:
    """Mean cross-entropy in nats: -mean(log softmax(logits)[target]).

    Shapes: logits (..., V) float, targets (...) ints in [0, V) -> scalar Tensor.
    log-softmax uses the log-sum-exp shift (subtract the row max) so no exp overflows.
    Backward: (softmax - onehot) / N, from the probabilities the forward pass keeps.
    overwrite_logits=True keeps those probabilities (and then the gradient) in logits.data
    instead of a new (N, V) array -- for a caller that owns the logits and never reads them
    again, as `GlassLM.loss`: with GPT-2's vocabulary that is 0.2 GB less memory and
    allocation per 1024 positions.

    Raises:
        ValueError: if the shapes disagree, targets are not integers or a target is outside
            [0, V).
    """
    targets = np.asarray(targets)
    V = logits.shape[-1]
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"cross_entropy: logits {logits.shape} and targets {targets.shape} "
                         "disagree (want logits = targets.shape + (V,))")
    if not np.issubdtype(targets.dtype, np.integer):
        raise ValueError(f"cross_entropy: targets must be integer ids, got dtype {targets.dtype}")
    flat_t = targets.reshape(-1)
    if flat_t.size and (flat_t.min() < 0 or flat_t.max() >= V):
        raise ValueError(f"cross_entropy: target ids must be in [0, {V}), "
                         f"got range [{flat_t.min()}, {flat_t.max()}]")
    z = logits.data.reshape(-1, V)
    N = z.shape[0]
    probs, logprob_target = _softmax_and_target_logprob(z, flat_t,
                                                        out=z if overwrite_logits else None)
    loss = -logprob_target.mean()

    def backward(dloss):
        dz = probs  # reuse the buffer (backward runs once)
        dz[np.arange(N), flat_t] -= 1.0
        dz *= dloss / N
        return (dz.reshape(logits.shape),)

    return Tensor.from_op(np.asarray(loss, dtype=z.dtype), (logits,), backward,
                          fresh_grads=True)
