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
  the documented order, deterministic on one machine; inf and NaN kept. The softmax's and
  cross-entropy's exp passes (`_jit_exp`) also allow FMA contraction and sum in the row's
  dtype per SUM_BLOCK elements (then float64): they are bound by exp's arithmetic;
- one row kernel per formula (`_rms_norm_row`, `_swiglu_row`, `_rope_row`, `_softmax_row`
  and its first half `_exp_row`), called by the (N, C) kernels of the training forms and by
  the decoding step alike.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from .jit import disk_cache  # False where numba has nowhere to write its cache (see jit)

_jit = njit(cache=disk_cache(), nogil=True, error_model="numpy")
_jit_sum = njit(cache=disk_cache(), nogil=True, error_model="numpy", fastmath={"reassoc"})
# the exp passes of softmax and cross-entropy: also FMA contraction (the exp polynomial's
# multiply-adds fused: fewer roundings, 1.4x faster there)
_jit_exp = njit(cache=disk_cache(), nogil=True, error_model="numpy",
                fastmath={"reassoc", "contract"})


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


def _max_f32(x):
    """max of a float32 row as the max of order-preserving int32 keys: the float's bits,
    the magnitude bits flipped for negative values (an involution). An integer max reduction
    vectorizes without fast-math flags; a float one (`max(m, x)`) keeps NaN semantics and runs
    one element per compare's latency (the softmax's and cross-entropy's bottleneck). A NaN
    comes out as NaN or as a finite max; either way the row's exp pass turns it into NaN."""
    bits = x.view(np.int32)
    key = np.int32(-2147483648)
    flip = np.int32(0x7FFFFFFF)
    for j in range(x.shape[0]):
        b = bits[j]
        key = max(key, b ^ ((b >> np.int32(31)) & flip))
    return np.int32(key ^ ((key >> np.int32(31)) & flip)).view(np.float32)


def _max_any(x):
    m = x[0]
    for j in range(1, x.shape[0]):
        m = max(m, x[j])
    return m


def _row_max(x):
    """max of a non-empty 1-D row: `_max_f32` for float32, a plain loop otherwise."""
    return np.max(x)


@overload(_row_max)  # a call (LLVM inlines it), not numba IR inlining: that warns on loops
def _row_max_typed(x):
    if x.dtype == types.float32:
        return _max_f32
    return _max_any


# Elements per block of the online normalizer: 8 KiB of float32, in L1 between the block's
# max and its exps. (Each block a slice handed to a function: loops over a range(start, stop)
# of the row compiled 1.7x slower here.)
ONLINE_BLOCK = 2048


SUM_BLOCK = 512  # elements summed in the row's dtype before the float64 total


@_jit_exp
def _exp_sum(x, m, y):
    """y = exp(x - m) (y not x: see `_exp_sum_inplace`); returns sum(y) in x's dtype (in
    vector lanes: at most SUM_BLOCK / lanes values per partial sum)."""
    total = x.dtype.type(0.0)
    for j in range(x.shape[0]):
        e = _exp(x[j] - m)
        y[j] = e
        total += e
    return total


@_jit_exp
def _exp_sum_inplace(x, m):
    """x = exp(x - m) in x's buffer; returns its sum. Apart from `_exp_sum`: an output equal
    to an input fails LLVM's overlap check and runs the scalar loop."""
    total = x.dtype.type(0.0)
    for j in range(x.shape[0]):
        e = _exp(x[j] - m)
        x[j] = e
        total += e
    return total


@_jit
def _exp_block(x, m, y):
    """y = exp(x - m) (y may be x); returns sum(y) in float64, summed SUM_BLOCK at a time."""
    total = 0.0
    inplace = x.ctypes.data == y.ctypes.data
    for start in range(0, x.shape[0], SUM_BLOCK):
        if inplace:
            total += _exp_sum_inplace(x[start:start + SUM_BLOCK], m)
        else:
            total += _exp_sum(x[start:start + SUM_BLOCK], m, y[start:start + SUM_BLOCK])
    return total


@njit(cache=disk_cache(), nogil=True, error_model="numpy", inline="always")
def _exp_row(x, y):
    """y = exp(x - max(x)) of a non-empty row of at most SUM_BLOCK elements (y may be x);
    returns (max, sum of y in float64)."""
    m = x.dtype.type(_row_max(x))
    if x.ctypes.data == y.ctypes.data:
        return m, np.float64(_exp_sum_inplace(x, m))
    return m, np.float64(_exp_sum(x, m, y))


# inlined into its callers by numba (not left to LLVM, which kept it a call: its long-row
# path makes it big): 20% of the cross-entropy forward's time at rows of 256 was that call
@njit(cache=disk_cache(), nogil=True, error_model="numpy", inline="always")
def _softmax_row(x, y, block_max):
    """y = softmax(x) of a non-empty row (y may be x); returns (max, sum of exp(x - max)).

    The online normalizer (Milakov & Gimelshein 2018, "Online normalizer calculation for
    softmax"): one read of x, block by block, keeping the running max m and the sum d of
    exp(x - m), rescaled by exp(m_old - m_new) when a block raises the max; each block's exps
    are stored against the max at that block (block_max, one slot per block) and a second
    pass over y, in cache, scales each block by exp(m_block - m) / d. One exp per element."""
    C = x.shape[0]
    if C <= SUM_BLOCK:  # one block (the attention's rows): no slices, no rescaling
        m, d = _exp_row(x, y)
        s = y.dtype.type(1.0 / d)
        for j in range(C):
            y[j] = y[j] * s
        return m, d
    m = x[0]
    d = 0.0
    n_blocks = 0
    for start in range(0, C, ONLINE_BLOCK):
        block = x[start:start + ONLINE_BLOCK]
        new_m = max(m, x.dtype.type(_row_max(block)))
        if new_m != m:
            d *= math.exp(np.float64(m) - np.float64(new_m))
            m = new_m
        d += _exp_block(block, m, y[start:start + ONLINE_BLOCK])
        block_max[n_blocks] = m
        n_blocks += 1
    inv = 1.0 / d
    for b in range(n_blocks):
        scale = inv
        if block_max[b] != m:
            scale *= math.exp(np.float64(block_max[b]) - np.float64(m))
        block = y[b * ONLINE_BLOCK:(b + 1) * ONLINE_BLOCK]
        s = y.dtype.type(scale)
        for j in range(block.shape[0]):
            block[j] = block[j] * s
    return m, d


@_jit
def _block_slots(C):
    """Scratch for `_softmax_row`'s per-block maxima of rows of C elements."""
    return np.empty(max(1, (C + ONLINE_BLOCK - 1) // ONLINE_BLOCK), np.float64)


# --------------------------------------------------------------------------- norms
@_jit_sum
def _rms_norm_row(x, weight, eps, y, xhat):
    """One row: rstd = 1 / sqrt(mean(x^2) + eps); xhat = x * rstd; y = xhat * weight.
    Returns rstd. xhat may be y (the decoding step keeps no xhat)."""
    C = x.shape[0]
    ss = 0.0
    for j in range(C):
        ss += np.float64(x[j]) * x[j]
    # the mean square in x's dtype, as the reference holds it: past float32's range it is
    # inf there, rstd 0 (torch's and HF's RMSNorm too), never a finite 1e-30 here
    r = x.dtype.type(1.0 / math.sqrt(x.dtype.type(ss / C) + eps))
    for j in range(C):
        xh = x[j] * r
        xhat[j] = xh
        y[j] = xh * weight[j]
    return r


@_jit
def rms_norm_forward(x, weight, eps, y, xhat, rstd):
    """`_rms_norm_row` of each row of x (N, C); rstd (N, 1)."""
    for i in range(x.shape[0]):
        rstd[i, 0] = _rms_norm_row(x[i], weight, eps, y[i], xhat[i])


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
def norm_backward(dy, xhat, rstd, weight, centred, dx, dw, db):
    """g = dy * w; dx = rstd * (g [- mean(g)] - xhat * mean(g * xhat)); the bracket for
    LayerNorm (centred) only. Also adds this block's column sums into dw += sum(dy * xhat) and,
    centred, db += sum(dy) (float64, (C,)): in the pass that writes dx, so dy and xhat are read
    once for the three (the caller adds the blocks' sums in a fixed order)."""
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
            d, xh = dy[i, j], xhat[i, j]
            dx[i, j] = r * (d * weight[j] - mean_g - xh * mean_gx)
            dw[j] += np.float64(d) * xh
        if centred:
            for j in range(C):
                db[j] += dy[i, j]


# --------------------------------------------------------------------------- activations
@_jit
def _swiglu_row(gate, up, s, y):
    """One row: s = sigmoid(gate) = 1 / (1 + exp(-gate)); y = gate * s * up. y may be gate,
    s may be y (the decoding step keeps no s)."""
    one = y.dtype.type(1.0)
    for j in range(gate.shape[0]):
        g = gate[j]
        sg = one / (one + _exp(-g))
        s[j] = sg
        y[j] = g * sg * up[j]


@_jit
def swiglu_forward(gate, up, s, y):
    """`_swiglu_row` of each row of gate, up (N, C)."""
    for i in range(gate.shape[0]):
        _swiglu_row(gate[i], up[i], s[i], y[i])


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
def _rope_row(x, cos, sin, sign, y):
    """One position: rotate each half-split pair of every head of x, y (H, D) by cos, sin (D,).
    y[h, i] = x[i] cos[i] - sign x[i + D/2] sin[i], y[h, i + D/2] = x[i + D/2] cos[i + D/2]
    + sign x[i] sin[i + D/2] (sign +1 forward, -1 the backward's rotation back); y may be x."""
    H, D = x.shape
    half = D // 2
    for h in range(H):
        for i in range(half):
            a, b = x[h, i], x[h, i + half]
            y[h, i] = a * cos[i] - sign * (b * sin[i])
            y[h, i + half] = b * cos[i + half] + sign * (a * sin[i + half])


@_jit
def rope(x, cos, sin, first_row, sign, y):
    """`_rope_row` of each position. x, y (rows, H, D): rows first_row.. of the (B*T)
    positions of a (B, T, H, D) array, row n at time n % T; cos, sin (T, D)."""
    T = cos.shape[0]
    for n in range(x.shape[0]):
        t = (first_row + n) % T
        _rope_row(x[n], cos[t], sin[t], sign, y[n])


# --------------------------------------------------------------------------- softmax
@_jit
def softmax_rows_inplace(x):
    """Each row -> exp(x - max) / sum(exp(x - max)), in place (`_softmax_row`); -inf entries
    become 0."""
    N, C = x.shape
    slots = _block_slots(C)
    for i in range(N if C else 0):
        _softmax_row(x[i], x[i], slots)


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
@_jit
def cross_entropy_forward(z, targets, exps, shifted_target, row_sum, row_scale):
    """exps[i] * row_scale[i] = softmax(z[i]) (exps may be z's own buffer): rows of at most
    SUM_BLOCK classes keep exp(z - max), row_scale = 1 / sum -- the normalizing pass is left
    to the backward, which scales every element anyway (one pass over the row less, as llm.c's
    fused classifier writes the gradient in the forward); longer rows come out normalized
    (`_softmax_row`: one read of the logits), row_scale = 1. shifted_target[i] = z[i,
    targets[i]] - max, row_sum[i] = sum(exp(z - max)) (float64): the caller takes log
    softmax(z)[i, t] = shifted_target - log(row_sum) with NumPy's vector log (libm's, per
    row, cost 15% here)."""
    N, V = z.shape
    slots = _block_slots(V)
    for i in range(N if V else 0):
        target_logit = z[i, targets[i]]  # read before exps (maybe z) is written
        if V <= SUM_BLOCK:
            m, d = _exp_row(z[i], exps[i])
            row_scale[i] = 1.0 / d
        else:
            m, d = _softmax_row(z[i], exps[i], slots)
            row_scale[i] = 1.0
        shifted_target[i] = target_logit - m
        row_sum[i] = d


@_jit
def cross_entropy_backward(exps, targets, row_scale, scale):
    """exps <- (exps * row_scale - onehot(targets)) * scale per row, in place: the logits'
    gradient (row_scale 1: exps are the probabilities already)."""
    N, V = exps.shape
    one = exps.dtype.type(1.0)
    for i in range(N):
        row = exps[i]
        t = targets[i]
        p_t = row[t] * exps.dtype.type(row_scale[i])  # the target's probability
        sc = exps.dtype.type(scale * row_scale[i])
        for j in range(V):  # no branch in the loop: it vectorizes
            row[j] = row[j] * sc
        row[t] = (p_t - one) * exps.dtype.type(scale)


@_jit
def cross_entropy_total(stats):
    """sum over rows of log softmax(z)[i, target] = shifted_target - log(row_sum), in float64,
    in row order (stats: `cross_entropy_forward`'s (3, N) float64 rows). One call for what
    took five NumPy calls: after a pass over memory evicts the interpreter's and NumPy's code
    and data from the caches, each small NumPy call cost 30-50 us (bench/kernel_speed.py's
    setting, where the loss's log and mean were 80 us of the forward's 0.39 ms)."""
    total = 0.0
    for i in range(stats.shape[1]):
        total += stats[0, i] - math.log(stats[1, i])
    return total


@_jit
def cross_entropy_forward_total(z, targets, exps, stats):
    """`cross_entropy_forward` of every row, then `cross_entropy_total`, in one call from
    Python, once every target is checked to be in [0, V). Returns (total, ok); ok False: a
    target is outside [0, V) and nothing was written (the caller's general path raises, or
    counts a negative target from the end). For losses too small to gain from the pool: after a
    pass over memory each call from Python costs 20-30 us (`cross_entropy_total`), and at 2048
    rows of 256 the kernel on one thread took 0.23 ms where the pool's two took 0.29 ms."""
    N, V = z.shape
    for i in range(N):
        if targets[i] < 0 or targets[i] >= V:
            return 0.0, False
    cross_entropy_forward(z, targets, exps, stats[0], stats[1], stats[2])
    return cross_entropy_total(stats), True


@_jit
def targets_range(t):
    """(min, max) of a non-empty int64 vector, in one pass."""
    lo = hi = t[0]
    for j in range(1, t.shape[0]):
        lo = min(lo, t[j])
        hi = max(hi, t[j])
    return lo, hi


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
    # the row kernels' second outputs (xhat, sigmoid, the rotation), kept apart from their
    # inputs: an output that overlaps an input fails LLVM's overlap check (the scalar loop)
    h_hat = np.empty(C, emb.dtype)
    act = np.empty(F, emb.dtype)
    sig = np.empty(F, emb.dtype)
    rotated = np.empty(n_heads * D, emb.dtype)  # n_heads >= n_kv
    slots = _block_slots(pos + 1)
    for layer in range(len(wq)):
        # attention: q, k, v of this position, k and v into the cache
        _rms_norm_row(x, attention_norms[layer], eps, h, h_hat)
        _mv(rotated, h, wq[layer], rows)  # q before its rotation (into q)
        _rope_row(rotated.reshape((n_heads, D)), cos[pos], sin[pos], f32(1.0),
                  q.reshape((n_heads, D)))
        _mv(kv, h, wk[layer], rows)
        _rope_row(kv.reshape((n_kv, D)), cos[pos], sin[pos], f32(1.0),
                  rotated[:n_kv * D].reshape((n_kv, D)))
        for i in range(n_kv * D):
            k_cache[layer, pos, i // D, i % D] = rotated[i]
        _mv(kv, h, wv[layer], rows)
        for i in range(n_kv * D):
            v_cache[layer, pos, i // D, i % D] = kv[i]
        for head_i in range(n_heads):  # softmax(q k^T / sqrt(D)) v, head by head
            kvh = head_i // G
            o = head_i * D
            for t in range(pos + 1):
                s = f32(0.0)
                for d in range(D):
                    s += (q[o + d] * scale) * k_cache[layer, t, kvh, d]
                att[t] = s
            _softmax_row(att, att, slots)
            for d in range(D):
                y[o + d] = 0.0
            for t in range(pos + 1):
                p = att[t]
                for d in range(D):
                    y[o + d] += p * v_cache[layer, t, kvh, d]
        _mv(out, y, wo[layer], rows)
        for j in range(C):
            x[j] += out[j]
        # SwiGLU MLP: down(silu(gate) * up)
        _rms_norm_row(x, mlp_norms[layer], eps, h, h_hat)
        _mv(gate, h, w_gate[layer], rows)
        _mv(up, h, w_up[layer], rows)
        _swiglu_row(gate, up, sig, act)
        _mv(out, act, w_down[layer], rows)
        for j in range(C):
            x[j] += out[j]
    _rms_norm_row(x, final_norm, eps, h, h_hat)
    if tied:
        for v in range(emb.shape[0]):
            s = f32(0.0)
            for j in range(C):
                s += emb[v, j] * h[j]
            logits[v] = s
    else:
        _mv(logits, h, head, rows)
