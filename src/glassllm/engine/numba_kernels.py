"""Compiled loops for the elementwise passes of `glassllm.functional`, one per op, each the
loop that op's formula reads as (llm.c's `*_forward` / `*_backward` style, in numba).

Imported only by `glassllm.engine.jit.kernels()`, on the first op that wants one: importing
numba costs ~0.3 s and compiling is paid once per machine (`cache=True` keeps the machine code
on disk, next to this file or in numba's user cache directory).

Conventions shared by every kernel here:
- arguments are 2-D C-contiguous row blocks (N, C) already cut by the caller into the rows one
  thread works on (`glassllm.engine.parallel.for_slices`), outputs preallocated by the caller;
- `nogil=True`: the pool's threads run them at the same time. No `prange`: the engine already
  has one pool of threads (`parallel`); numba's default threading layer (workqueue) is not
  safe to enter from several threads at once, which the attention's per-thread batch slices do;
- no `fastmath`: every sum is the plain left-to-right loop written here, accumulated in
  float64 (row statistics) so that the result is closer to the exact one than the
  reference's float32 pairwise sum; results differ from the NumPy reference by rounding only
  (bounds in tests/test_numba_kernels.py);
- exp of float32 is `_expf` below, a branch-free polynomial that LLVM vectorizes (libm's
  expf is a call per element, 15x slower, and NumPy's own SIMD exp is not reachable from a
  loop); float64 uses libm's exp.
- sums: `fastmath={"reassoc"}` only, on the kernels that sum a row, lets LLVM add the row in
  vector lanes (8 float32 partial sums on AVX2, 16 on AVX-512) combined at the end: that is
  the documented order, deterministic on one machine; nothing else of fastmath (no FMA
  contraction, inf and NaN kept).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from .jit import disk_cache  # False where numba has nowhere to write its cache (see jit)

_jit = njit(cache=disk_cache(), nogil=True, error_model="numpy")
_jit_sum = njit(cache=disk_cache(), nogil=True, error_model="numpy", fastmath={"reassoc"})


def _expf(x):
    """exp(x) of float32 x, vectorizable, within 3 ulp of the exact value (Cody & Waite
    range reduction, Cephes' expf scheme): x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its
    degree-6 Taylor polynomial, 2^n written into the float's exponent bits. exp(x) = 0 for
    x < -87.6 (no subnormals: as the probabilities of masked keys, exactly 0 for -inf);
    +inf from x > 88.37 (the true overflow is at 88.72); NaN stays NaN."""
    x = min(max(x, np.float32(-88.0)), np.float32(88.7))
    n = np.floor(x * np.float32(1.4426950408889634) + np.float32(0.5))
    r = x - n * np.float32(0.693145751953125) - n * np.float32(1.428606765330187e-06)
    p = np.float32(1.0 / 720)
    p = p * r + np.float32(1.0 / 120)
    p = p * r + np.float32(1.0 / 24)
    p = p * r + np.float32(1.0 / 6)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    return p * np.int32((np.int32(n) + np.int32(127)) << np.int32(23)).view(np.float32)


def _exp(x):
    """exp(x): `_expf` for float32, libm's exp otherwise (the typed form is chosen below)."""
    return np.exp(x)


@overload(_exp, inline="always")
def _exp_typed(x):
    if x == types.float32:
        return _expf
    return lambda x: np.exp(x)


# --------------------------------------------------------------------------- norms
@_jit_sum
def rms_norm_forward(x, weight, eps, y, xhat, rstd):
    """rstd = 1 / sqrt(mean(x^2) + eps); xhat = x * rstd; y = xhat * weight. x (N, C)."""
    N, C = x.shape
    for i in range(N):
        ss = 0.0
        for j in range(C):
            ss += np.float64(x[i, j]) * x[i, j]
        # the mean square in x's dtype, as the reference holds it: past float32's range it is
        # inf there, rstd 0 (torch's and HF's RMSNorm too), never a finite 1e-30 here
        r = x.dtype.type(1.0 / math.sqrt(x.dtype.type(ss / C) + eps))
        rstd[i, 0] = r
        for j in range(C):
            xh = x[i, j] * r
            xhat[i, j] = xh
            y[i, j] = xh * weight[j]


@_jit_sum
def layer_norm_forward(x, weight, bias, eps, y, xhat, rstd):
    """mean, rstd = 1 / sqrt(var + eps); xhat = (x - mean) * rstd; y = xhat * w + b."""
    N, C = x.shape
    for i in range(N):
        s = 0.0
        for j in range(C):
            s += x[i, j]
        mean = x.dtype.type(s / C)
        ss = 0.0
        for j in range(C):
            d = x[i, j] - mean
            ss += np.float64(d) * d
        r = x.dtype.type(1.0 / math.sqrt(x.dtype.type(ss / C) + eps))  # as RMSNorm's
        rstd[i, 0] = r
        for j in range(C):
            xh = (x[i, j] - mean) * r
            xhat[i, j] = xh
            y[i, j] = xh * weight[j] + bias[j]


@_jit_sum
def norm_backward(dy, xhat, rstd, weight, centred, dx):
    """g = dy * w; dx = rstd * (g [- mean(g)] - xhat * mean(g * xhat)); the bracket for
    LayerNorm (centred) only. dw and db (column sums) are the caller's."""
    N, C = dy.shape
    for i in range(N):
        sg = 0.0
        sgx = 0.0
        for j in range(C):
            g = dy[i, j] * weight[j]
            sg += g
            sgx += np.float64(g) * xhat[i, j]
        mean_g = dx.dtype.type(sg / C) if centred else dx.dtype.type(0.0)
        mean_gx = dx.dtype.type(sgx / C)
        r = rstd[i, 0]
        for j in range(C):
            g = dy[i, j] * weight[j]
            dx[i, j] = r * (g - mean_g - xhat[i, j] * mean_gx)


# --------------------------------------------------------------------------- activations
@_jit
def swiglu_forward(gate, up, s, y):
    """s = sigmoid(gate) = 1 / (1 + exp(-gate)); y = gate * s * up."""
    N, C = gate.shape
    one = s.dtype.type(1.0)
    for i in range(N):
        for j in range(C):
            g = gate[i, j]
            sg = one / (one + _exp(-g))
            s[i, j] = sg
            y[i, j] = g * sg * up[i, j]


@_jit
def swiglu_backward(dy, gate, up, s, dgate, dup):
    """dgate = s (1 + g (1 - s)) dy up; dup = g s dy."""
    N, C = gate.shape
    one = s.dtype.type(1.0)
    for i in range(N):
        for j in range(C):
            g, sg, d = gate[i, j], s[i, j], dy[i, j]
            dgate[i, j] = sg * (one + g * (one - sg)) * d * up[i, j]
            dup[i, j] = g * sg * d


@_jit
def gelu_forward(x, c, s, y):
    """GELU's tanh form as x * sigmoid(2u), u = c (x + 0.044715 x^3), c = sqrt(2/pi):
    0.5 (1 + tanh u) = sigmoid(2u). Saves s = sigmoid(2u)."""
    N, C = x.shape
    one = s.dtype.type(1.0)
    two_c = s.dtype.type(2.0 * c)
    k = s.dtype.type(0.044715)
    for i in range(N):
        for j in range(C):
            xv = x[i, j]
            sv = one / (one + _exp(-(two_c * (xv + k * xv * xv * xv))))
            s[i, j] = sv
            y[i, j] = xv * sv


@_jit
def gelu_backward(dy, x, s, c, dx):
    """d/dx x s(2u) = s + 2 x s (1 - s) u', u' = c (1 + 3 * 0.044715 x^2)."""
    N, C = x.shape
    one = s.dtype.type(1.0)
    two_c = s.dtype.type(2.0 * c)
    k3 = s.dtype.type(3 * 0.044715)
    for i in range(N):
        for j in range(C):
            xv, sv = x[i, j], s[i, j]
            du = two_c * (one + k3 * xv * xv)
            dx[i, j] = (sv + xv * sv * (one - sv) * du) * dy[i, j]


# --------------------------------------------------------------------------- rotary embedding
@_jit
def rope(x, cos, sin, first_row, sign, y):
    """Rotate each half-split pair of every head. x, y (rows, H, D): rows first_row.. of the
    (B*T) positions of a (B, T, H, D) array, row n at time n % T; cos, sin (T, D).
    y[.., i] = x[i] cos[i] - sign x[i + D/2] sin[i], y[.., i + D/2] = x[i + D/2] cos[i + D/2]
    + sign x[i] sin[i + D/2] (sign +1 forward, -1 the backward's rotation back)."""
    N, H, D = x.shape
    T = cos.shape[0]
    half = D // 2
    for n in range(N):
        t = (first_row + n) % T
        for h in range(H):
            for i in range(half):
                a, b = x[n, h, i], x[n, h, i + half]
                y[n, h, i] = a * cos[t, i] - sign * (b * sin[t, i])
                y[n, h, i + half] = b * cos[t, i + half] + sign * (a * sin[t, i + half])


# --------------------------------------------------------------------------- softmax
@_jit_sum
def softmax_rows_inplace(x):
    """Each row -> exp(x - max) / sum(exp(x - max)), in place; -inf entries become 0."""
    N, C = x.shape
    for i in range(N if C else 0):
        m = x[i, 0]  # the row's max, in x's dtype (a float64 -inf start would make it float64)
        for j in range(1, C):
            m = max(m, x[i, j])
        total = 0.0
        for j in range(C):
            e = _exp(x[i, j] - m)
            x[i, j] = e
            total += e
        inv = x.dtype.type(1.0 / total)
        for j in range(C):
            x[i, j] = x[i, j] * inv


@_jit_sum
def softmax_backward_inplace(dp, p):
    """dp <- p (dp - sum(dp p)) per row, in dp's buffer."""
    N, C = dp.shape
    for i in range(N):
        acc = 0.0
        for j in range(C):
            acc += np.float64(dp[i, j]) * p[i, j]
        dot = dp.dtype.type(acc)
        for j in range(C):
            dp[i, j] = p[i, j] * (dp[i, j] - dot)


# --------------------------------------------------------------------------- loss
@_jit_sum
def cross_entropy_forward(z, targets, probs, logprob_target):
    """probs = softmax(z) per row (may be z's own buffer); logprob_target[i] =
    log softmax(z)[i, targets[i]] = (z[t] - max) - log(sum(exp(z - max)))."""
    N, V = z.shape
    for i in range(N if V else 0):
        m = z[i, 0]
        for j in range(1, V):
            m = max(m, z[i, j])
        shifted_target = z[i, targets[i]] - m
        total = 0.0
        for j in range(V):
            e = _exp(z[i, j] - m)
            probs[i, j] = e
            total += e
        logprob_target[i] = shifted_target - math.log(total)
        inv = probs.dtype.type(1.0 / total)
        for j in range(V):
            probs[i, j] = probs[i, j] * inv


@_jit
def cross_entropy_backward(probs, targets, scale):
    """probs <- (probs - onehot(targets)) * scale, in place: the logits' gradient."""
    N, V = probs.shape
    sc = probs.dtype.type(scale)
    for i in range(N):
        t = targets[i]
        for j in range(V):
            p = probs[i, j]
            if j == t:
                p -= 1.0
            probs[i, j] = p * sc


# --------------------------------------------------------------------------- optimizer
@_jit
def adamw_update(p, g, m, v, lr, beta1, beta2, eps, weight_decay, c1, c2):
    """AdamW (Loshchilov & Hutter 2019) over flat buffers, one pass, in place:
    p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
    p -= lr * (m / c1) / (sqrt(v / c2) + eps), c1 = 1 - b1^t, c2 = 1 - b2^t.
    The arithmetic of each element is in p's dtype and in the reference's order, every
    constant rounded once from float64 as NumPy does with a Python float: the same bits."""
    ty = p.dtype.type
    c1, c2 = ty(c1), ty(c2)  # 1 - beta^t, computed by the caller with Python's pow
    decay = ty(1.0 - lr * weight_decay)
    b1, b2, one_b1, one_b2 = ty(beta1), ty(beta2), ty(1.0 - beta1), ty(1.0 - beta2)
    lr_, eps_ = ty(lr), ty(eps)
    for i in range(p.size):
        gi = g[i]
        mi = b1 * m[i] + one_b1 * gi
        vi = b2 * v[i] + one_b2 * (gi * gi)
        m[i] = mi
        v[i] = vi
        pi = p[i] * decay if weight_decay != 0.0 else p[i]
        p[i] = pi - lr_ * (mi / c1) / (np.sqrt(vi / c2) + eps_)


@_jit_sum
def sum_of_squares(g):
    """sum(g^2) in float64, left to right."""
    total = 0.0
    for i in range(g.size):
        x = np.float64(g[i])
        total += x * x
    return total


# --------------------------------------------------------------------------- decoding
@_jit_sum
def _matvec(out, x, w):
    """out = x @ w, x (n_in,), w (n_in, n_out) row-major: out accumulated one input at a time,
    each pass a vector loop over the outputs (llama2.c's matmul, over w's contiguous rows)."""
    for j in range(out.shape[0]):
        out[j] = 0.0
    for i in range(x.shape[0]):
        xi = x[i]
        for j in range(out.shape[0]):
            out[j] += xi * w[i, j]


@_jit_sum
def _matvec_rows(out, x, w_t):
    """out = x @ w_t.T, w_t (n_out, n_in) row-major: one dot product per output (run.c's
    matmul itself, for weights stored (out, in) as llama2.c's)."""
    for j in range(out.shape[0]):
        s = out.dtype.type(0.0)
        for i in range(x.shape[0]):
            s += w_t[j, i] * x[i]
        out[j] = s


@_jit
def _mv(out, x, w, rows):
    """`_matvec_rows` when the weights are given (out, in) (`rows`), else `_matvec`."""
    if rows:
        _matvec_rows(out, x, w)
    else:
        _matvec(out, x, w)


@_jit_sum
def _rms_norm_vec(out, x, weight, eps):
    ss = 0.0
    for j in range(x.shape[0]):
        ss += np.float64(x[j]) * x[j]
    r = x.dtype.type(1.0 / math.sqrt(x.dtype.type(ss / x.shape[0]) + eps))  # as above
    for j in range(x.shape[0]):
        out[j] = (x[j] * r) * weight[j]


@_jit
def _rope_vec(v, n_heads, cos, sin):
    """v (n_heads * D,) rotated in place, rotate-half pairs, cos/sin (D,) of this position."""
    D = cos.shape[0]
    half = D // 2
    for h in range(n_heads):
        o = h * D
        for i in range(half):
            a, b = v[o + i], v[o + i + half]
            v[o + i] = a * cos[i] - b * sin[i]
            v[o + i + half] = b * cos[i + half] + a * sin[i + half]


@_jit_sum
def decode_step(token, pos, emb, head, tied, rows, final_norm, attention_norms, wq, wk, wv,
                wo, mlp_norms, w_gate, w_up, w_down, cos, sin, k_cache, v_cache, eps, n_heads,
                logits):
    """One token of a llama-family model, llama2.c's `forward()`: logits (V,) of `token` at
    `pos`, k and v written to k_cache/v_cache (L, max_len, Hkv, D) at `pos`. The weights are
    tuples of one array per layer, (in, out) as `glassllm.nn.Linear`'s, or with `rows` their
    transposes (out, in), as llama2.c stores them; `head` is lm_head's (C, V) (its (V, C)
    transpose with `rows`) or, `tied`, the embedding (V, C)."""
    C = emb.shape[1]
    D = cos.shape[1]
    n_kv = k_cache.shape[2]
    G = n_heads // n_kv
    f32 = emb.dtype.type
    scale = f32(1.0 / math.sqrt(D))
    x = emb[token].copy()
    h = np.empty(C, emb.dtype)
    q = np.empty(n_heads * D, emb.dtype)
    kv = np.empty(n_kv * D, emb.dtype)
    y = np.empty(n_heads * D, emb.dtype)
    out = np.empty(C, emb.dtype)
    att = np.empty(pos + 1, emb.dtype)
    F = w_gate[0].shape[0] if rows else w_gate[0].shape[1]
    gate = np.empty(F, emb.dtype)
    up = np.empty(F, emb.dtype)
    for layer in range(len(wq)):
        # attention: q, k, v of this position, k and v into the cache
        _rms_norm_vec(h, x, attention_norms[layer], eps)
        _mv(q, h, wq[layer], rows)
        _rope_vec(q, n_heads, cos[pos], sin[pos])
        _mv(kv, h, wk[layer], rows)
        _rope_vec(kv, n_kv, cos[pos], sin[pos])
        for i in range(n_kv * D):
            k_cache[layer, pos, i // D, i % D] = kv[i]
        _mv(kv, h, wv[layer], rows)
        for i in range(n_kv * D):
            v_cache[layer, pos, i // D, i % D] = kv[i]
        for head_i in range(n_heads):  # softmax(q k^T / sqrt(D)) v, head by head
            kvh = head_i // G
            o = head_i * D
            m = -np.inf
            for t in range(pos + 1):
                s = f32(0.0)
                for d in range(D):
                    s += (q[o + d] * scale) * k_cache[layer, t, kvh, d]
                att[t] = s
                m = max(m, s)
            total = 0.0
            for t in range(pos + 1):
                e = _exp(att[t] - f32(m))
                att[t] = e
                total += e
            inv = f32(1.0 / total)
            for d in range(D):
                y[o + d] = 0.0
            for t in range(pos + 1):
                p = att[t] * inv
                for d in range(D):
                    y[o + d] += p * v_cache[layer, t, kvh, d]
        _mv(out, y, wo[layer], rows)
        for j in range(C):
            x[j] += out[j]
        # SwiGLU MLP: down(silu(gate) * up)
        _rms_norm_vec(h, x, mlp_norms[layer], eps)
        _mv(gate, h, w_gate[layer], rows)
        _mv(up, h, w_up[layer], rows)
        one = f32(1.0)
        for j in range(F):
            g = gate[j]
            gate[j] = g * (one / (one + _exp(-g))) * up[j]
        _mv(out, gate, w_down[layer], rows)
        for j in range(C):
            x[j] += out[j]
    _rms_norm_vec(h, x, final_norm, eps)
    if tied:
        for v in range(emb.shape[0]):
            s = f32(0.0)
            for j in range(C):
                s += emb[v, j] * h[j]
            logits[v] = s
    else:
        _mv(logits, h, head, rows)
