"""The engine's compiled forms of the elementwise ops: `glassllm.functional`'s signatures, the
passes of each op fused into one numba loop (`glassllm.engine.numba_kernels`), run per slice
of rows on the pool's threads (`parallel.for_slices`).

Each form here falls back to the engine's NumPy form (`glassllm.engine.ops`) where numba
cannot load (`jit.kernels()` is None) or the arrays are not float32/float64 of one dtype; a
forward and its backward share the `saved` format of the NumPy pair, so either backward
reads either forward's values. These are the registered fast forms of their ops (the NumPy
forms are not registered apart: one fast form per op); GLASSLLM_KERNELS=reference runs
`glassllm.functional` as ever. Equal to the references to the bounds stated in
tests/test_numba_kernels.py. Their large outputs (activations, gradients) come from `buffers`
(the arrays of an earlier call, once the autograd and every caller have let them go) rather
than fresh memory.
"""
from __future__ import annotations

import math

import numpy as np

from .. import functional as F
from .. import optim
from . import buffers, jit, ops, optimizer, parallel

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _kernels(*arrays):
    """The kernels module when every array is float32 (or every one float64), else None."""
    k = jit.kernels()
    if k is None:
        return None
    dtype = arrays[0].dtype
    if dtype not in _FLOATS or any(a.dtype != dtype for a in arrays[1:]):
        return None
    return k


def _fits(*pairs) -> bool:
    """Each (array, shape) pair matches exactly. The loops index without bounds checks and
    without broadcasting: where shapes differ (a caller's mistake, or a broadcast the
    reference allows) the NumPy form runs instead and raises or broadcasts as the
    reference does."""
    return all(a.shape == tuple(shape) for a, shape in pairs)


def _rows(a):
    """a as C-contiguous (rows, last axis): a view when a is contiguous already."""
    if not a.ndim:
        return a.reshape(1, 1)
    # (not reshape(-1, C): with C = 0 the row count cannot be inferred)
    return np.ascontiguousarray(a.reshape(math.prod(a.shape[:-1]), a.shape[-1]))


# What an element of a pass bound by its arithmetic costs against one bound by memory, in
# `parallel.for_slices`' work_bytes. One thread, warm, per byte touched (bench/kernel_speed.py's
# kernels at 256-8192 rows, the project's 2-core EPYC): the cross-entropy backward 11 ps, GELU
# and SwiGLU backward 13, softmax backward 17, AdamW 19 (counted as memory); SwiGLU forward 33,
# the norms 40, GELU forward 48, RoPE 52, softmax and cross-entropy forward 61-64 (arithmetic:
# exp, tanh, the norms' division, RoPE's table reads and pair shuffles). 8 (the ratio rounded
# up) puts each pass's switch to the pool near the one-thread time where the pool starts to
# gain (`parallel.MIN_PARALLEL_BYTES`).
ARITHMETIC = 8


def _for_rows(kernel, arguments, n_rows, row_size, arrays, arithmetic=False, itemsize=4):
    """kernel(*arguments(rows)) over slices of rows on the pool's threads (the slice function
    named after the kernel, for profiles); `arrays` of the (n_rows, row_size) shape read or
    written (each counted once per read or write), the pass bound by its `arithmetic` or by
    memory: on the pool only where that work outweighs the hand-off."""
    def rows(r):
        kernel(*arguments(r))

    rows.__qualname__ = f"{kernel.__name__}.rows"
    work = arrays * itemsize * (ARITHMETIC if arithmetic else 1)
    parallel.for_slices(rows, n_rows, row_size, work_bytes=work)


def _each_slice(kernel, arrays, *scalars, arithmetic=False):
    """kernel(*(a[rows] for a in arrays), *scalars) over slices of the first array's rows, on
    the pool's threads (each array read or written once)."""
    n, c = arrays[0].shape

    _for_rows(kernel, lambda r: [a[r] for a in arrays] + list(scalars), n, c, len(arrays),
              arithmetic, arrays[0].itemsize)


# --------------------------------------------------------------------------- norms
def rms_norm_forward(x, weight, eps):
    k = _kernels(x, weight)
    if k is None or not _fits((weight, x.shape[-1:])):
        return ops.rms_norm_forward(x, weight, eps)
    x2 = _rows(x)
    y, xhat = buffers.empty_like(x2), buffers.empty_like(x2)
    rstd = np.empty((x2.shape[0], 1), dtype=x2.dtype)
    n, c = x2.shape
    eps = float(eps)
    _for_rows(k.rms_norm_forward, lambda r: (x2[r], weight, eps, y[r], xhat[r], rstd[r]), n, c,
              3, True, x2.itemsize)
    return y.reshape(x.shape), (xhat, rstd, weight)


def _norm_backward(dy, xhat, rstd, weight, centred):
    """(dx, dw, db) of RMSNorm (db None) or LayerNorm (centred) in one pass over dy and xhat:
    each block of rows adds its column sums into float64 partials, added in block order. The
    blocks are cut by size alone (`for_slices(balanced=False)`), so dw and db are the same
    bits on any thread count."""
    k = _kernels(dy, xhat, weight)
    if k is None or dy.size != xhat.size or not _fits((weight, xhat.shape[-1:])):
        dy2 = ops._rows(dy)
        return (ops._norm_backward(dy, xhat, rstd, weight, centred),
                ops._column_dot(dy2, xhat), dy2.sum(axis=0) if centred else None)
    dy2 = _rows(dy)
    dx = buffers.empty_like(dy2)
    n, c = dy2.shape
    partial = {}

    def rows(r):
        dw, db = np.zeros(c), np.zeros(c if centred else 0)
        k.norm_backward(dy2[r], xhat[r], rstd[r], weight, centred, dx[r], dw, db)
        partial[r.start] = dw, db

    rows.__qualname__ = "norm_backward.rows"
    parallel.for_slices(rows, n, c, balanced=False,  # dy, xhat in; dx out
                        work_bytes=3 * ARITHMETIC * dy2.itemsize)
    blocks = [partial[start] for start in sorted(partial)]
    dw = sum((w for w, _ in blocks), np.zeros(c)).astype(dy2.dtype)
    db = sum((b for _, b in blocks), np.zeros(c)).astype(dy2.dtype) if centred else None
    return dx.reshape(dy.shape), dw, db


def rms_norm_backward(dy, saved):
    xhat, rstd, weight = saved
    return _norm_backward(dy, xhat, rstd, weight, False)[:2]


def layer_norm_forward(x, weight, bias, eps):
    k = _kernels(x, weight, bias)
    if k is None or not _fits((weight, x.shape[-1:]), (bias, x.shape[-1:])):
        return ops.layer_norm_forward(x, weight, bias, eps)
    x2 = _rows(x)
    y, xhat = buffers.empty_like(x2), buffers.empty_like(x2)
    rstd = np.empty((x2.shape[0], 1), dtype=x2.dtype)
    eps = float(eps)
    _for_rows(k.layer_norm_forward,
              lambda r: (x2[r], weight, bias, eps, y[r], xhat[r], rstd[r]), *x2.shape,
              3, True, x2.itemsize)
    return y.reshape(x.shape), (xhat, rstd, weight)


def layer_norm_backward(dy, saved):
    xhat, rstd, weight = saved
    return _norm_backward(dy, xhat, rstd, weight, True)


# --------------------------------------------------------------------------- activations
def swiglu_forward(gate, up):
    k = _kernels(gate, up)
    if k is None or not _fits((up, gate.shape)):
        return ops.swiglu_forward(gate, up)
    g, u = _rows(gate), _rows(up)
    s, y = buffers.empty_like(g), buffers.empty_like(g)
    _each_slice(k.swiglu_forward, (g, u, s, y), arithmetic=True)  # exp
    return y.reshape(gate.shape), (g, u, s)


def swiglu_backward(dy, saved):
    g, u, s = saved
    k = _kernels(dy, g, u)
    if k is None or dy.size != g.size:
        return ops.swiglu_backward(dy, saved)
    dy2 = _rows(dy)
    dgate, dup = buffers.empty_like(g), buffers.empty_like(g)
    _each_slice(k.swiglu_backward, (dy2, g, u, s, dgate, dup))
    return dgate.reshape(dy.shape), dup.reshape(dy.shape)


def gelu_forward(x):
    k = _kernels(x)
    if k is None:
        return ops.gelu_forward(x)
    x2 = _rows(x)
    s, y = buffers.empty_like(x2), buffers.empty_like(x2)
    n, c = x2.shape
    _for_rows(k.gelu_forward, lambda r: (x2[r], F.GELU_C, s[r], y[r]), n, c, 3, True,
              x2.itemsize)  # tanh
    return y.reshape(x.shape), (x2, s)


def gelu_backward(dy, saved):
    x2, s = saved
    k = _kernels(dy, x2)
    if k is None or dy.size != x2.size:
        return ops.gelu_backward(dy, saved)
    dy2 = _rows(dy)
    dx = buffers.empty_like(x2)
    _for_rows(k.gelu_backward, lambda r: (dy2[r], x2[r], s[r], F.GELU_C, dx[r]), *x2.shape,
              4, False, x2.itemsize)
    return (dx.reshape(dy.shape),)


# --------------------------------------------------------------------------- rotary embedding
def _rope(x, cos, sin, sign):
    """x (B, T, H, D), cos/sin (T, D) -> the rotation of every head (sign -1: back), in one
    pass over x's own layout."""
    B, T, H, D = x.shape
    k = _kernels(x, cos, sin)
    x3 = np.ascontiguousarray(x).reshape(B * T, H, D)
    y3 = buffers.empty_like(x3)
    cos, sin = np.ascontiguousarray(cos), np.ascontiguousarray(sin)
    _for_rows(k.rope, lambda r: (x3[r], cos, sin, r.start, sign, y3[r]), B * T, H * D, 2,
              True, x3.itemsize)
    return y3.reshape(B, T, H, D)


def _rope_fits(x, cos, sin) -> bool:
    """x (B, T, H, D) with D even, cos and sin (T, D): what the loop reads."""
    return x.ndim == 4 and x.shape[-1] % 2 == 0 and _fits((cos, (x.shape[1], x.shape[3])),
                                                          (sin, (x.shape[1], x.shape[3])))


def rope_forward(x, cos, sin):
    if _kernels(x, cos, sin) is None or not _rope_fits(x, cos, sin):
        return ops.rope_forward(x, cos, sin)
    return _rope(x, cos, sin, 1.0), (cos[:, None, :], sin[:, None, :])


def rope_backward(dy, saved):
    c, s = saved
    if (_kernels(dy, c, s) is None or c.ndim != 3
            or not _rope_fits(dy, c[:, 0, :], s[:, 0, :])):
        return ops.rope_backward(dy, saved)
    return (_rope(dy, c[:, 0, :], s[:, 0, :], -1.0),)


# --------------------------------------------------------------------------- softmax
def softmax_rows_inplace(x):
    """`ops.softmax_rows_inplace` (x C-contiguous, changed in place; returns x)."""
    k = _kernels(x)
    if k is None:
        return ops.softmax_rows_inplace(x)
    x2 = ops._rows(x)
    _for_rows(k.softmax_rows_inplace, lambda r: (x2[r],), *x2.shape, 2, True, x2.itemsize)
    return x


def softmax_backward_inplace(dp, p):
    """`ops.softmax_backward_inplace`: dp <- p (dp - rowsum(dp p)) in dp's buffer."""
    k = _kernels(dp, p)
    if k is None or not _fits((p, dp.shape)):
        return ops.softmax_backward_inplace(dp, p)
    d2, p2 = ops._rows(dp), ops._rows(p)
    _for_rows(k.softmax_backward_inplace, lambda r: (d2[r], p2[r]), *d2.shape, 3, False,
              d2.itemsize)
    return dp


softmax_forward, softmax_backward = ops.softmax_pair(softmax_rows_inplace,
                                                    softmax_backward_inplace, buffers.empty)


# --------------------------------------------------------------------------- loss
def cross_entropy_forward(logits, targets, overwrite_logits: bool = False):
    """`ops.cross_entropy_forward`, saving (exps, targets, row_scale) for the backward:
    exps * row_scale[:, None] are the probabilities (exps in logits' own buffer with
    overwrite_logits; see the kernel for why the rows are left unnormalized)."""
    k = _kernels(logits)
    if k is None or not logits.flags.c_contiguous:
        return ops.cross_entropy_forward(logits, targets, overwrite_logits)
    exps = logits if overwrite_logits else buffers.empty_like(logits)
    N, V = logits.shape
    if 0 < N * V <= SERIAL_LOSS_ELEMENTS:
        t = np.ascontiguousarray(targets, dtype=np.int64)
        stats = np.empty((3, N))
        if t.shape == (N,):
            total, ok = k.cross_entropy_forward_total(logits, t, exps, stats)
            if ok:
                return np.asarray(-total / N, dtype=logits.dtype), (exps, t, stats[2])
    t = _checked_targets(targets, N, V)  # raises, or counts negative targets from the end
    # each row's shifted target logit, sum of exps and scale, in one array (one allocation:
    # see `numba_kernels.cross_entropy_total` on what each small NumPy call costs)
    stats = np.ones((3, N))  # (rows of V = 0 are skipped by the kernel)
    shifted, row_sum, row_scale = stats
    _for_rows(k.cross_entropy_forward,
              lambda r: (logits[r], t[r], exps[r], shifted[r], row_sum[r], row_scale[r]),
              *logits.shape, 2, True, logits.itemsize)  # exp-bound
    loss = -k.cross_entropy_total(stats) / N if N else np.nan  # (the mean of no rows)
    return np.asarray(loss, dtype=logits.dtype), (exps, t, row_scale)


# Losses of at most this many logits run as one call on the calling thread
# (`numba_kernels.cross_entropy_forward_total`): at 2048 x 256 with the logits read from memory
# one thread took 0.23 ms and the pool's two 0.29 ms; at 2048 x 2048 the pool gained 1.6x.
SERIAL_LOSS_ELEMENTS = 1 << 20


def _checked_targets(targets, N, V):
    """targets as N int64 in [0, V): NumPy's indexing rules, which the reference follows (a
    negative target counts from the end; one outside [-V, V) is an IndexError), checked
    here because the compiled loops index without bounds checks (`functional.cross_entropy`
    checks its callers' ids; these forms are also called directly). One pass for the range
    (NumPy's min and max: two, and 10 us of the forward's 265 at 2048 rows)."""
    t = np.ascontiguousarray(targets, dtype=np.int64)
    if t.shape != (N,):
        raise ValueError(f"cross_entropy: targets of shape {t.shape} for {N} rows of logits")
    if not t.size:
        return t
    lo, hi = jit.kernels().targets_range(t)
    if lo < -V or hi >= V:
        bad = t[(t < -V) | (t >= V)][0]
        raise IndexError(f"cross_entropy: target {bad} is out of bounds for {V} classes")
    return np.where(t < 0, t + V, t) if lo < 0 else t


def cross_entropy_backward(dloss, saved):
    """dz = (probabilities - onehot(targets)) * dloss / N in the saved buffer, from this
    module's forward (exps, checked targets, row_scale) or `ops`' (probabilities, targets)."""
    k = _kernels(saved[0])
    if len(saved) == 3:  # this module's forward
        dz, t, row_scale = saved
        if k is None:  # (numba switched off in between) the probabilities, then NumPy's form
            dz *= row_scale.astype(dz.dtype)[:, None]
            return ops.cross_entropy_backward(dloss, (dz, t))
    else:
        dz, targets = saved
        if k is None:
            return ops.cross_entropy_backward(dloss, saved)
        t, row_scale = _checked_targets(targets, *dz.shape), np.ones(len(dz))
    scale = float(dloss) / len(t)
    _for_rows(k.cross_entropy_backward, lambda r: (dz[r], t[r], row_scale[r], scale),
              *dz.shape, 2, False, dz.itemsize)
    return (dz,)


# --------------------------------------------------------------------------- optimizer
def adamw_update(p, g, m, v, *, lr, beta1, beta2, eps, weight_decay, step) -> None:
    """`optim.adamw_update` in one pass per slice: the same bits as the reference."""
    k = _kernels(p, g, m, v)
    if (k is None or not all(a.flags.c_contiguous for a in (p, g, m, v))
            or not _fits((g, p.shape), (m, p.shape), (v, p.shape))):
        return optimizer.adamw_update(p, g, m, v, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                                      weight_decay=weight_decay, step=step)
    pf, gf, mf, vf = p.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1)
    lr, beta1, beta2, eps, decay = map(float, (lr, beta1, beta2, eps, weight_decay))
    c1, c2 = 1.0 - beta1 ** step, 1.0 - beta2 ** step  # as the reference computes them
    _for_rows(k.adamw_update, lambda r: (pf[r], gf[r], mf[r], vf[r], lr, beta1, beta2, eps,
                                         decay, c1, c2), p.size, 1, 7, False, p.itemsize)


FAST_FORMS = [
    *ops.op_pairs(globals(), ("rms_norm", "layer_norm", "swiglu", "gelu", "rope", "softmax",
                              "cross_entropy")),
    (optim.adamw_update, adamw_update),
]
