"""The engine's fast forms of `glassllm.functional`'s ops: the same signatures, the same
results (tests/test_kernels.py), computed for speed.

What makes them fast, and why it is kept apart from the references:
- the elementwise passes run per slice of rows on every core (`parallel.for_slices`): NumPy
  releases the GIL inside a ufunc, and a slice of ~256K elements stays in cache over its
  several passes;
- the passes run in place in preallocated outputs, with no temporaries (a GPT-2-sized
  vocabulary makes each N x V temporary 0.2 GB per 1024 positions);
- fewer transcendental calls: sigmoid and GELU through one exp (NumPy's exp is about twice as
  fast as its tanh), row statistics as einsum dot products (2-3x faster than (a * b).sum());
- in split mode (`glassllm.engine.parallel`) the matrix products are cut into row slices run
  by the pool (`_matmul`).

Where the operations and their order are those of the reference (linear, unembed, silu,
swiglu, rope, softmax), the results are the same bits; elsewhere they differ by rounding
(the tolerances are stated in tests/test_kernels.py). The causal attention is in
`glassllm.engine.attention`.
"""
from __future__ import annotations

import numpy as np

from .. import functional as F
from .. import kernels
from . import parallel

# A product with fewer output rows than this per thread runs whole, on the calling thread.
MIN_ROWS_PER_THREAD = 16


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for 2-D a and b, through kernels.matmul. In split mode (`glassllm.engine.parallel`)
    the output's rows are cut into one slice per thread of the pool, each a product of a's
    rows with the whole of b (same bits as one product on MKL: no row's sum is split)."""
    n_rows = a.shape[0]
    if not parallel.split_matmuls() or n_rows < MIN_ROWS_PER_THREAD * parallel.get_num_threads():
        return kernels.matmul(a, b)
    out = np.empty((n_rows, b.shape[1]), dtype=np.result_type(a, b))
    parallel.for_thread_slices(lambda rows: kernels.matmul(a[rows], b, out=out[rows]), n_rows)
    return out


def _rows(a):
    """a as a 2-D (rows, last axis) array: a view for the contiguous arrays ops make."""
    return a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)


def _row_dot(a, b):
    """sum(a * b, axis=-1, keepdims=True): (..., C), (..., C) -> (..., 1)."""
    return np.einsum("...i,...i->...", a, b)[..., None]


def _column_dot(a, b):
    """sum(a * b) over every axis but the last: (..., C), (..., C) -> (C,)."""
    c = a.shape[-1]
    return np.einsum("ij,ij->j", a.reshape(-1, c), b.reshape(-1, c))


# --------------------------------------------------------------------------- linear
def linear_forward(x, weight, bias=None):
    """`functional.linear_forward`, its product cut over the pool in split mode."""
    x2 = x.reshape(-1, x.shape[-1])
    y = _matmul(x2, weight)
    if bias is not None:
        y += bias
    return y.reshape(*x.shape[:-1], weight.shape[1]), (x2, weight, x.shape, bias is not None)


def linear_backward(dy, saved, needs=(True, True, True)):
    x2, weight, x_shape, has_bias = saved
    dy2 = dy.reshape(-1, dy.shape[-1])
    dx = _matmul(dy2, weight.T).reshape(x_shape) if needs[0] else None
    dw = _matmul(x2.T, dy2) if needs[1] else None
    db = dy2.sum(axis=0) if has_bias and needs[2] else None
    return dx, dw, db


def unembed_forward(x, weight):
    """`functional.unembed_forward`, its product cut over the pool in split mode."""
    x2 = x.reshape(-1, x.shape[-1])
    y = _matmul(x2, weight.T)
    return y.reshape(*x.shape[:-1], weight.shape[0]), (x2, weight, x.shape)


def unembed_backward(dy, saved, needs=(True, True)):
    x2, weight, x_shape = saved
    dy2 = dy.reshape(-1, weight.shape[0])
    dx = _matmul(dy2, weight).reshape(x_shape) if needs[0] else None
    dw = _matmul(dy2.T, x2) if needs[1] else None
    return dx, dw


# --------------------------------------------------------------------------- embedding
def embedding_backward(dy, saved):
    """out[ids[j]] += dy[j] for every j, as `functional.embedding_backward`'s np.add.at.

    Sorting the ids and summing each run of equal ids with one `np.add.reduceat` is about 3x
    faster than `np.add.at` (element by element); the sums are the same, in the same order.
    """
    ids, weight = saved
    ids, rows = ids.reshape(-1), dy.reshape(-1, weight.shape[1])
    out = np.zeros_like(weight)
    if ids.size == 0:
        return (out,)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
    out[sorted_ids[starts]] = np.add.reduceat(rows[order], starts, axis=0)
    return (out,)


# --------------------------------------------------------------------------- norms
def rms_norm_forward(x, weight, eps):
    """`functional.rms_norm_forward` per slice of rows, in place."""
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


def _norm_backward(dy, xhat, rstd, weight, centred: bool):
    """dx of y = xhat * weight, xhat = (x [- mean(x)]) * rstd, per slice of rows, in place:
    rstd * (dxhat [- mean(dxhat)] - xhat * mean(dxhat * xhat)), dxhat = dy * weight; the
    bracketed terms for LayerNorm (centred) only."""
    dy2 = _rows(dy)
    C = xhat.shape[1]
    dx = np.empty(xhat.shape, dtype=np.result_type(dy2, weight))

    def rows(r):
        d = np.multiply(dy2[r], weight, out=dx[r])  # dxhat, turned into dx in place
        projection = xhat[r] * (_row_dot(d, xhat[r]) / C)
        if centred:
            d -= d.mean(axis=-1, keepdims=True)
        d -= projection
        d *= rstd[r]

    parallel.for_slices(rows, *xhat.shape)
    return dx.reshape(dy.shape)


def rms_norm_backward(dy, saved):
    """`functional.rms_norm_backward` per slice of rows, in place."""
    xhat, rstd, weight = saved
    return _norm_backward(dy, xhat, rstd, weight, centred=False), _column_dot(_rows(dy), xhat)


def layer_norm_forward(x, weight, bias, eps):
    """`functional.layer_norm_forward` per slice of rows, in place."""
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
    """`functional.layer_norm_backward` per slice of rows, in place."""
    xhat, rstd, weight = saved
    dy2 = _rows(dy)
    return (_norm_backward(dy, xhat, rstd, weight, centred=True), _column_dot(dy2, xhat),
            dy2.sum(axis=0))


# --------------------------------------------------------------------------- activations
def _sigmoid(x, out):
    """out = 1 / (1 + exp(-x)) in place (out may be x itself), as `functional.sigmoid`.
    Returns out."""
    np.negative(x, out=out)
    with np.errstate(over="ignore"):
        np.exp(out, out=out)
    out += 1.0
    return np.reciprocal(out, out=out)


def _silu_grad(x, s, dy, out):
    """out = s (1 + x (1 - s)) dy, with s = sigmoid(x), in place (`functional.silu_backward`)."""
    d = np.subtract(1.0, s, out=out)
    d *= x
    d += 1.0
    d *= s
    d *= dy
    return d


def silu_forward(x):
    x2 = _rows(x)
    s, y = np.empty_like(x2), np.empty_like(x2)

    def rows(r):
        _sigmoid(x2[r], out=s[r])
        np.multiply(x2[r], s[r], out=y[r])

    parallel.for_slices(rows, *x2.shape)
    return y.reshape(x.shape), (x2, s)


def silu_backward(dy, saved):
    x2, s = saved
    dy2, dx = _rows(dy), np.empty(x2.shape, dtype=np.result_type(x2, dy))
    parallel.for_slices(lambda r: _silu_grad(x2[r], s[r], dy2[r], out=dx[r]), *x2.shape)
    return (dx.reshape(dy.shape),)


def swiglu_forward(gate, up):
    """Saves sigmoid(gate) only: silu(gate) = gate * sigmoid(gate) is one multiply to redo in
    the backward pass, cheaper than keeping another (N, d_ff) array alive."""
    g, u = _rows(gate), _rows(up)
    s, y = np.empty_like(g), np.empty(g.shape, dtype=np.result_type(g, u))

    def rows(r):
        _sigmoid(g[r], out=s[r])
        np.multiply(g[r], s[r], out=y[r])
        y[r] *= u[r]

    parallel.for_slices(rows, *g.shape)
    return y.reshape(gate.shape), (g, u, s)


def swiglu_backward(dy, saved):
    g, u, s = saved
    dy2 = _rows(dy)
    dgate = np.empty(g.shape, dtype=np.result_type(g, u, dy2))
    dup = np.empty_like(dgate)

    def rows(r):
        _silu_grad(g[r], s[r], dy2[r], out=dgate[r])
        dgate[r] *= u[r]
        np.multiply(g[r], s[r], out=dup[r])
        dup[r] *= dy2[r]

    parallel.for_slices(rows, *g.shape)
    return dgate.reshape(dy.shape), dup.reshape(dy.shape)


def gelu_forward(x):
    """0.5 x (1 + tanh(u)) computed as the identical x * sigmoid(2u): one exp instead of
    NumPy's slower tanh, and no cancellation in 1 + tanh for negative x. Saves sigmoid(2u)."""
    x2 = _rows(x)
    s, y = np.empty_like(x2), np.empty_like(x2)

    def rows(r):
        xr, sr = x2[r], s[r]
        np.multiply(xr, xr, out=sr)  # becomes u, then sigmoid(2u), in place
        sr *= 0.044715
        sr += 1.0
        sr *= xr
        sr *= 2.0 * F.GELU_C
        _sigmoid(sr, out=sr)
        np.multiply(xr, sr, out=y[r])

    parallel.for_slices(rows, *x2.shape)
    return y.reshape(x.shape), (x2, s)


def gelu_backward(dy, saved):
    x2, s = saved
    dy2 = _rows(dy)
    dx = np.empty(x2.shape, dtype=np.result_type(x2, dy2))

    def rows(r):
        # d/dx x s = s + 2 x s (1 - s) u',  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
        xr, sr = x2[r], s[r]
        d = np.multiply(xr, xr, out=dx[r])
        d *= 3 * 0.044715
        d += 1.0
        d *= 2.0 * F.GELU_C
        d *= xr
        d *= 1.0 - sr
        d += 1.0
        d *= sr
        d *= dy2[r]

    parallel.for_slices(rows, *x2.shape)
    return (dx.reshape(dy.shape),)


# --------------------------------------------------------------------------- rotary embedding
def _rotate_half_transposed(x):  # the adjoint of rotate_half: (a, b) -> (b, -a)
    half = x.shape[-1] // 2
    return np.concatenate([x[..., half:], -x[..., :half]], axis=-1)


def rope_forward(x, cos, sin):
    """`functional.rope_forward` over slices of time steps, products landing in y directly."""
    c, s = cos[:, None, :], sin[:, None, :]
    T = x.shape[1]
    y = np.empty(x.shape, dtype=np.result_type(x, c))

    def rows(t):  # a slice of time steps, all batch rows
        rotated = F.rotate_half(x[:, t])
        rotated *= s[t]
        np.add(np.multiply(x[:, t], c[t], out=y[:, t]), rotated, out=y[:, t])

    parallel.for_slices(rows, T, x.size // max(1, T))
    return y, (c, s)


def rope_backward(dy, saved):
    c, s = saved
    T = dy.shape[1]
    dx = np.empty(dy.shape, dtype=np.result_type(dy, c))

    def rows(t):
        rotated = _rotate_half_transposed(dy[:, t] * s[t])
        np.add(np.multiply(dy[:, t], c[t], out=dx[:, t]), rotated, out=dx[:, t])

    parallel.for_slices(rows, T, dy.size // max(1, T))
    return (dx,)


# --------------------------------------------------------------------------- softmax
def softmax_rows_inplace(x):
    """`functional.softmax_rows` in x's own buffer (C-contiguous), per slice of rows;
    returns x. The same operations in the same order: the same bits."""
    x2 = _rows(x)

    def rows(r):
        block = x2[r]
        block -= block.max(axis=-1, keepdims=True)
        np.exp(block, out=block)
        block /= block.sum(axis=-1, keepdims=True)

    parallel.for_slices(rows, *x2.shape)
    return x


def softmax_backward_inplace(dp, p):
    """dp <- p * (dp - rowsum(dp * p)), in dp's buffer (`functional.softmax_backward`)."""
    d2, p2 = _rows(dp), _rows(p)

    def rows(r):
        d = d2[r]
        d -= _row_dot(d, p2[r])
        d *= p2[r]

    parallel.for_slices(rows, *d2.shape)
    return dp


def softmax_pair(rows_inplace, backward_inplace, empty=np.empty):
    """The (forward, backward) pair of `functional.softmax` on two in-place row passes (this
    module's, or the compiled ones): forward x -> (p, saved p), on a copy of x in
    empty(shape, dtype) (np.empty's contract); backward dp -> (dx,)."""
    def softmax_forward(x):
        x = np.asarray(x)
        p = empty(x.shape, x.dtype)
        np.copyto(p, x)
        p = rows_inplace(p)
        return p, p

    def softmax_backward(dp, p):
        return (backward_inplace(np.array(dp, dtype=np.result_type(dp, p), order="C"), p),)

    return softmax_forward, softmax_backward


softmax_forward, softmax_backward = softmax_pair(softmax_rows_inplace, softmax_backward_inplace)


# --------------------------------------------------------------------------- loss
def _softmax_and_target_logprob(z: np.ndarray, targets: np.ndarray, out=None):
    """softmax(z) (N, V) and log_softmax(z)[row, target] (N,), with the log-sum-exp shift.

    Works through slices of rows that fit in cache: each slice's shift, exp, row sum and
    normalisation happen in the output buffer, so the logits are read once and no N x V
    temporaries are made. `out` may be z itself.
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


def cross_entropy_forward(logits, targets, overwrite_logits: bool = False):
    """`functional.cross_entropy_forward` in one pass over slices of rows, keeping the
    probabilities for the backward pass -- in logits' own buffer with overwrite_logits."""
    probs, logprob_target = _softmax_and_target_logprob(
        logits, targets, out=logits if overwrite_logits else None)
    return np.asarray(-logprob_target.mean(), dtype=logits.dtype), (probs, targets)


def cross_entropy_backward(dloss, saved):
    dz, targets = saved  # the probabilities' buffer, reused (the backward runs once)
    dz[np.arange(len(targets)), targets] -= 1.0
    dz *= dloss / len(targets)
    return (dz,)


def op_pairs(namespace: dict, ops: tuple[str, ...]) -> list:
    """[((reference forward, backward), (fast forward, backward))] of each op: functional's
    `<op>_forward`/`<op>_backward` and the same names in `namespace` (a module's globals)."""
    return [((getattr(F, f"{op}_forward"), getattr(F, f"{op}_backward")),
             (namespace[f"{op}_forward"], namespace[f"{op}_backward"])) for op in ops]


# reference pair -> fast pair, registered by `glassllm.engine`: the ops with no compiled form.
# The other elementwise forms here are the NumPy halves of `engine.compiled`'s registered
# forms (what they run where numba does not load), not registered themselves: one fast form
# per op. Causal attention: engine.attention.
FAST_FORMS = [
    ((F.embedding_forward, F.embedding_backward), (F.embedding_forward, embedding_backward)),
    *op_pairs(globals(), ("linear", "unembed", "silu")),
]
