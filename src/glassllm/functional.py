"""The ops of the transformer as their formulas read: each a forward and a backward over plain
NumPy arrays, side by side, and the autograd op the model calls.

    y, saved = op_forward(x, ...)       # plain arrays in, plain arrays out
    dx, ... = op_backward(dy, saved)    # gradients of the inputs
    op(x: Tensor, ...) -> Tensor        # the autograd op: one graph node

(the pattern of llm.c's `*_forward` / `*_backward` pairs). These are the REFERENCE forms: the
definitions, a few lines each, with the paper they come from. The engine registers fast forms
of most pairs (`glassllm.engine.ops`: sliced over threads, in place, attention in blocks of
queries); an op runs `kernels.pick(...)` of its forward and its backward, which is the
engine's pair unless GLASSLLM_KERNELS=reference (`glassllm.kernels`). Both halves are picked
when the forward runs, since `saved` is the pair's own format. `tests/test_kernels.py` holds
every fast form equal to its reference; `tests/test_functional.py` checks every op against
central finite differences in float64 and against torch autograd, in both modes.

Shapes in the comments: B batch, T time, C channels (d_model), H query heads, K key/value
heads, D head_dim, V vocabulary, N rows (B*T, or any leading axes flattened). Every matrix
product goes through `kernels.matmul` (BLAS, and autocast's rounding inside
`glassllm.amp.autocast`).

Every form takes its array functions from its input's namespace, `xp = namespace(x)` (the
Python array API standard: `numpy` itself on the CPU, CuPy on CUDA, `array_api_strict` in the
tests; `glassllm.devices`), so one formula runs on every device. The engine's forms are NumPy
code: on another device an op runs its reference (`kernels.pick(..., on=x)`).
"""
from __future__ import annotations

import math

import numpy as np

from . import devices, kernels
from .devices import namespace
from .tensor import Tensor


def _node(y, parents, backward, saved, *extra) -> Tensor:
    """One graph node: y, whose parents' gradients are backward(dy, saved, *extra). The
    backward runs in the autocast precision of this moment (`kernels.keep_context`)."""
    return Tensor.from_op(y, parents, kernels.keep_context(
        lambda dy: backward(dy, saved, *extra)), fresh_grads=True)


def _forms(forward, backward, x):
    """The forward and backward forms an op on array x runs now (`kernels.pick`): the
    engine's pair on the CPU in engine mode, else the reference pair."""
    return kernels.pick(forward, on=x), kernels.pick(backward, on=x)


def _sum_rows(a):
    """Sum over every axis but the last: [..., C] -> [C] (a gradient of a per-channel vector)."""
    xp = namespace(a)
    return xp.sum(xp.reshape(a, (-1, a.shape[-1])), axis=0)


def _like(array, like):
    """`array` (host ids, a table) on the device of the array `like`: NumPy's asarray on the
    CPU, else an explicit move (`glassllm.devices.to_device`)."""
    if isinstance(like, np.ndarray):
        return np.asarray(array)
    return devices.to_device(array, devices.device_of(like))


def _device(array):
    """The array's `device` attribute for `xp.arange(..., device=)`; None for NumPy's."""
    return None if isinstance(array, np.ndarray) else array.device


def _contiguous(x):
    """x in C order on NumPy (so later reshapes are views); other namespaces keep their own
    layouts (the standard has no order, and its reshape copies where it must)."""
    return np.ascontiguousarray(x) if isinstance(x, np.ndarray) else x


# --------------------------------------------------------------------------- linear
def linear_forward(x, weight, bias=None):
    """y = x @ W + b. x [..., C_in], W [C_in, C_out] (input-major, as GPT-2's Conv1D), b [C_out]
    or None -> y [..., C_out]. The leading axes are flattened into rows: one product."""
    xp = namespace(x)
    x2 = xp.reshape(x, (-1, x.shape[-1]))        # [N, C_in]
    y = kernels.matmul(x2, weight)               # [N, C_out]
    if bias is not None:
        y += bias
    return (xp.reshape(y, (*x.shape[:-1], weight.shape[1])),
            (x2, weight, x.shape, bias is not None))


def linear_backward(dy, saved, needs=(True, True, True)):
    """dx = dy @ W^T, dW = x^T @ dy, db = dy summed over rows; None where `needs` (one flag per
    input) says the gradient is not wanted."""
    x2, weight, x_shape, has_bias = saved
    xp = namespace(dy)
    dy2 = xp.reshape(dy, (-1, dy.shape[-1]))     # [N, C_out]
    dx = xp.reshape(kernels.matmul(dy2, weight.T), x_shape) if needs[0] else None
    dw = kernels.matmul(x2.T, dy2) if needs[1] else None
    db = xp.sum(dy2, axis=0) if has_bias and needs[2] else None
    return dx, dw, db


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y = x @ weight + bias: x (..., C_in), weight (C_in, C_out), bias (C_out,) or None ->
    y (..., C_out). See `linear_forward`."""
    forward, backward = _forms(linear_forward, linear_backward, x.data)
    y, saved = forward(x.data, weight.data, None if bias is None else bias.data)
    needs = (x.requires_grad, weight.requires_grad, bias is not None and bias.requires_grad)
    parents = (x, weight) if bias is None else (x, weight, bias)
    return _node(y, parents, backward, saved, needs)


def unembed_forward(x, weight):
    """Logits against a tied embedding: y = x @ E^T. x [..., C], E [V, C] -> y [..., V]."""
    xp = namespace(x)
    x2 = xp.reshape(x, (-1, x.shape[-1]))        # [N, C]
    y = kernels.matmul(x2, weight.T)             # [N, V]
    return xp.reshape(y, (*x.shape[:-1], weight.shape[0])), (x2, weight, x.shape)


def unembed_backward(dy, saved, needs=(True, True)):
    """dx = dy @ E, dE = dy^T @ x; None where `needs` says the gradient is not wanted."""
    x2, weight, x_shape = saved
    xp = namespace(dy)
    dy2 = xp.reshape(dy, (-1, weight.shape[0]))  # [N, V]
    dx = xp.reshape(kernels.matmul(dy2, weight), x_shape) if needs[0] else None
    dw = kernels.matmul(dy2.T, x2) if needs[1] else None
    return dx, dw


def unembed(x: Tensor, weight: Tensor) -> Tensor:
    """Logits against the tied embedding: x (..., C), weight (V, C) -> (..., V)."""
    forward, backward = _forms(unembed_forward, unembed_backward, x.data)
    y, saved = forward(x.data, weight.data)
    return _node(y, (x, weight), backward, saved, (x.requires_grad, weight.requires_grad))


# --------------------------------------------------------------------------- embedding
def embedding_forward(ids, weight):
    """Rows of the table picked by id: ids [...] ints, W [V, C] -> y [..., C]."""
    xp = namespace(weight)
    rows = xp.take(weight, xp.reshape(ids, (-1,)), axis=0)              # [N, C]
    return xp.reshape(rows, (*ids.shape, weight.shape[1])), (ids, weight)


def embedding_backward(dy, saved):
    """dW[v] = the sum of dy over the positions whose id is v (a repeated id adds up)."""
    ids, weight = saved
    xp = namespace(weight)
    dw = xp.zeros_like(weight)                   # [V, C]
    devices.scatter_add(dw, xp.reshape(ids, (-1,)), xp.reshape(dy, (-1, weight.shape[1])))
    return (dw,)


def embedding(ids: np.ndarray, weight: Tensor) -> Tensor:
    """Rows of `weight` picked by integer `ids`: (...,) ints, weight (V, C) -> (..., C).
    Ids are not range-checked here: the model does that. Ids on the host are moved to
    weight's device."""
    forward, backward = _forms(embedding_forward, embedding_backward, weight.data)
    y, saved = forward(_like(ids, weight.data), weight.data)
    return _node(y, (weight,), backward, saved)


# --------------------------------------------------------------------------- norms
def rms_norm_forward(x, weight, eps):
    """RMSNorm (Zhang & Sennrich 2019; Llama): y = x / sqrt(mean(x^2) + eps) * w.
    x [..., C], w [C] -> y [..., C]; the statistics in x's dtype."""
    xp = namespace(x)
    rstd = 1.0 / xp.sqrt(xp.mean(x * x, axis=-1, keepdims=True) + eps)   # [..., 1]
    xhat = x * rstd                                                       # [..., C]
    return xhat * weight, (xhat, rstd, weight)


def rms_norm_backward(dy, saved):
    """With g = dy * w: dx = rstd * (g - xhat * mean(g * xhat)); dw = sum of dy * xhat."""
    xhat, rstd, weight = saved
    xp = namespace(dy)
    g = dy * weight                                                       # d loss / d xhat
    dx = rstd * (g - xhat * xp.mean(g * xhat, axis=-1, keepdims=True))
    return dx, _sum_rows(dy * xhat)


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-5, offset: bool = False) -> Tensor:
    """RMSNorm: x (..., C), weight (C,) -> (..., C). See `rms_norm_forward`.

    offset=True: Gemma's form, y = x / sqrt(mean(x^2) + eps) * (1 + w) (Hugging Face's
    `GemmaRMSNorm`; w is stored as they store it, 0 for a unit gain). The scale 1 + w is
    rounded to w's dtype, as theirs; d(1 + w)/dw = 1, so the pair's gradients are w's as they
    stand."""
    forward, backward = _forms(rms_norm_forward, rms_norm_backward, x.data)
    scale = weight.data + 1.0 if offset else weight.data   # [C], in w's dtype
    y, saved = forward(x.data, scale, eps)
    return _node(y, (x, weight), backward, saved)


def layer_norm_forward(x, weight, bias, eps):
    """LayerNorm (Ba et al. 2016; GPT-2 uses eps 1e-5): y = (x - mean) / sqrt(var + eps) * w + b.
    x [..., C], w and b [C] -> y [..., C]."""
    xp = namespace(x)
    xc = x - xp.mean(x, axis=-1, keepdims=True)                          # [..., C]
    rstd = 1.0 / xp.sqrt(xp.mean(xc * xc, axis=-1, keepdims=True) + eps)  # [..., 1]
    xhat = xc * rstd
    return xhat * weight + bias, (xhat, rstd, weight)


def layer_norm_backward(dy, saved):
    """With g = dy * w: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dw = sum of
    dy * xhat; db = sum of dy."""
    xhat, rstd, weight = saved
    xp = namespace(dy)
    g = dy * weight
    dx = rstd * (g - xp.mean(g, axis=-1, keepdims=True)
                 - xhat * xp.mean(g * xhat, axis=-1, keepdims=True))
    return dx, _sum_rows(dy * xhat), _sum_rows(dy)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float = 1e-5) -> Tensor:
    """LayerNorm: x (..., C), weight (C,), bias (C,) or None -> (..., C). See
    `layer_norm_forward`; without a bias it is the same formula with b = 0 (and no db)."""
    forward, backward = _forms(layer_norm_forward, layer_norm_backward, x.data)
    if bias is None:
        y, saved = forward(x.data, weight.data, namespace(weight.data).zeros_like(weight.data),
                           eps)
        return _node(y, (x, weight), lambda dy, saved: backward(dy, saved)[:2], saved)
    y, saved = forward(x.data, weight.data, bias.data, eps)
    return _node(y, (x, weight, bias), backward, saved)


# --------------------------------------------------------------------------- activations
def sigmoid(x):
    """1 / (1 + exp(-x)), any shape. exp(-x) overflows to inf for x < -88 (float32), where
    1 / (1 + inf) = 0 is the right value, hence the silenced warning."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + namespace(x).exp(-x))


def silu_forward(x):
    """SiLU / swish (Elfwing et al. 2017): y = x * sigmoid(x), any shape."""
    s = sigmoid(x)
    return x * s, (x, s)


def silu_backward(dy, saved):
    """d/dx x s(x) = s + x s (1 - s) = s (1 + x (1 - s))."""
    x, s = saved
    return (s * (1.0 + x * (1.0 - s)) * dy,)


def silu(x: Tensor) -> Tensor:
    """SiLU: x * sigmoid(x). Any shape."""
    forward, backward = _forms(silu_forward, silu_backward, x.data)
    y, saved = forward(x.data)
    return _node(y, (x,), backward, saved)


def swiglu_forward(gate, up):
    """SwiGLU's gating (Shazeer 2020, as Llama's MLP): y = silu(gate) * up, same shapes."""
    s = sigmoid(gate)
    return gate * s * up, (gate, up, s)


def swiglu_backward(dy, saved):
    """d gate = silu'(gate) * up * dy (silu' as in `silu_backward`); d up = silu(gate) * dy."""
    gate, up, s = saved
    return s * (1.0 + gate * (1.0 - s)) * dy * up, gate * s * dy


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up: gate, up (..., F) -> (..., F)."""
    forward, backward = _forms(swiglu_forward, swiglu_backward, gate.data)
    y, saved = forward(gate.data, up.data)
    return _node(y, (gate, up), backward, saved)


GELU_C = math.sqrt(2.0 / math.pi)


def gelu_forward(x):
    """GELU, tanh approximation (Hendrycks & Gimpel 2016), GPT-2's `gelu_new`, any shape:
    y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)."""
    t = namespace(x).tanh(GELU_C * (x + 0.044715 * x ** 3))
    return 0.5 * x * (1.0 + t), (x, t)


def gelu_backward(dy, saved):
    """dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u', u' = sqrt(2/pi) (1 + 3 0.044715 x^2)."""
    x, t = saved
    du = GELU_C * (1.0 + 3 * 0.044715 * x * x)
    return ((0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du) * dy,)


def gelu(x: Tensor) -> Tensor:
    """GELU (tanh form, as GPT-2). Any shape."""
    forward, backward = _forms(gelu_forward, gelu_backward, x.data)
    y, saved = forward(x.data)
    return _node(y, (x,), backward, saved)


def geglu_forward(gate, up):
    """GeGLU's gating (Shazeer 2020, "GLU Variants Improve Transformer"; Gemma's MLP with the
    tanh GELU): y = gelu_tanh(gate) * up, same shapes."""
    g, (_, t) = gelu_forward(gate)
    return g * up, (gate, up, g, t)


def geglu_backward(dy, saved):
    """d gate = gelu'(gate) * up * dy (gelu' as in `gelu_backward`); d up = gelu(gate) * dy."""
    gate, up, g, t = saved
    (dgate,) = gelu_backward(dy * up, (gate, t))
    return dgate, g * dy


def geglu(gate: Tensor, up: Tensor) -> Tensor:
    """gelu_tanh(gate) * up: gate, up (..., F) -> (..., F). See `geglu_forward`."""
    forward, backward = _forms(geglu_forward, geglu_backward, gate.data)
    y, saved = forward(gate.data, up.data)
    return _node(y, (gate, up), backward, saved)




def gelu_exact_forward(x):
    """GELU as defined (Hendrycks & Gimpel 2016), PyTorch's `gelu` / Hugging Face's "gelu"
    (GPT-NeoX): y = x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2, any shape. Phi is computed
    in float64 and rounded to x's dtype."""
    xp = namespace(x)
    phi = xp.astype(0.5 * (1.0 + devices.erf(xp.astype(x, xp.float64) / math.sqrt(2.0))),
                    x.dtype)
    return x * phi, (x, phi)


def gelu_exact_backward(dy, saved):
    """dy/dx = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi) the normal density."""
    x, phi = saved
    density = namespace(x).exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)   # in x's dtype
    return ((phi + x * density) * dy,)


def gelu_exact(x: Tensor) -> Tensor:
    """GELU, exact (erf) form. Any shape. See `gelu_exact_forward`."""
    forward, backward = _forms(gelu_exact_forward, gelu_exact_backward, x.data)
    y, saved = forward(x.data)
    return _node(y, (x,), backward, saved)


def softcap_forward(x, cap):
    """Soft-capping (Gemma 2; Bello et al. 2016): y = c tanh(x / c), any shape: about x for
    |x| << c, never past +-c (so -inf becomes -c: attention caps its scores before masking)."""
    t = namespace(x).tanh(x / float(cap))   # a Python float: rounded to x's dtype
    return t * float(cap), t


def softcap_backward(dy, t):
    """dy/dx = 1 - tanh^2(x / c)."""
    return ((1.0 - t * t) * dy,)


def softcap(x: Tensor, cap: float) -> Tensor:
    """c tanh(x / c): any shape, same shape. See `softcap_forward`."""
    forward, backward = _forms(softcap_forward, softcap_backward, x.data)
    y, saved = forward(x.data, cap)
    return _node(y, (x,), backward, saved)


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


def rotate_half(x):
    """(a, b) -> (-b, a) over the two halves of the last axis: each pair (a_i, b_i) turned by
    90 degrees. Its transpose is the turn back, -rotate_half."""
    half = x.shape[-1] // 2
    return namespace(x).concat([-x[..., half:], x[..., :half]], axis=-1)


def rope_forward(x, cos, sin):
    """Rotary position embedding (Su et al. 2021): y = x cos + rotate_half(x) sin.
    x [B, T, H, D]; cos, sin [T, R] (rows for the positions of x's T steps) -> y [B, T, H, D].
    R < D is partial rotary (GPT-NeoX's rotary_pct, Phi's partial_rotary_factor): the first R
    channels turn, rotate-half over those R; the other D - R pass through."""
    c, s = cos[:, None, :], sin[:, None, :]      # [T, 1, R]: every head turns alike
    R = c.shape[-1]
    if R == x.shape[-1]:
        return x * c + rotate_half(x) * s, (c, s)
    y = namespace(x).asarray(x, copy=True)
    y[..., :R] = x[..., :R] * c + rotate_half(x[..., :R]) * s
    return y, (c, s)


def rope_backward(dy, saved):
    """A rotation's gradient is the rotation back: dx = dy cos - rotate_half(dy sin) over the
    turned channels; the others' gradient passes through."""
    c, s = saved
    R = c.shape[-1]
    if R == dy.shape[-1]:
        return (dy * c - rotate_half(dy * s),)
    dx = namespace(dy).asarray(dy, copy=True)
    dx[..., :R] = dy[..., :R] * c - rotate_half(dy[..., :R] * s)
    return (dx,)


def rope(x: Tensor, cos: np.ndarray, sin: np.ndarray) -> Tensor:
    """Rotary position embedding: x (B, T, H, D), cos and sin (T, R), R <= D even ->
    (B, T, H, D). Partial rotary (R < D) runs the reference form (the engine's turns all D)."""
    if cos.shape[-1] == x.shape[-1]:
        forward, backward = _forms(rope_forward, rope_backward, x.data)
    else:
        forward, backward = rope_forward, rope_backward
    y, saved = forward(x.data, cos, sin)
    return _node(y, (x,), backward, saved)


# --------------------------------------------------------------------------- softmax
def softmax_rows(x):
    """The softmax of the library, over the last axis: exp(x - max) / sum(exp(x - max)).
    Any shape, same shape out. Subtracting the row's max changes nothing mathematically and
    keeps exp from overflowing; -inf entries get probability 0."""
    xp = namespace(x)
    e = xp.exp(x - xp.max(x, axis=-1, keepdims=True))
    return e / xp.sum(e, axis=-1, keepdims=True)


def log_softmax_rows(x):
    """log(softmax_rows(x)) without its rounding to 0: (x - max) - log(sum(exp(x - max)))."""
    xp = namespace(x)
    shifted = x - xp.max(x, axis=-1, keepdims=True)
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=-1, keepdims=True))


def softmax_forward(x):
    """p = softmax_rows(x), any shape [..., N]; saves p."""
    p = softmax_rows(x)
    return p, p


def softmax_backward(dp, p):
    """dx = p (dp - sum(dp p)) over the row: the softmax's Jacobian diag(p) - p p^T, applied."""
    return (p * (dp - namespace(p).sum(dp * p, axis=-1, keepdims=True)),)


def softmax(x: Tensor) -> Tensor:
    """Softmax over the last axis as an autograd op: (..., N) -> (..., N)."""
    forward, backward = _forms(softmax_forward, softmax_backward, x.data)
    p, saved = forward(x.data)
    return _node(p, (x,), backward, saved)


# --------------------------------------------------------------------------- attention
# Causal scaled dot-product attention (Vaswani et al. 2017) with grouped-query heads (Ainslie
# et al. 2023) in three pieces: scores = q k^T / sqrt(D) with the causal mask, pattern =
# softmax(scores), y = pattern @ v. Query head h reads key/value head h // (H/K), as Hugging
# Face's `repeat_kv`. Query i sits at absolute position q_start + i and sees keys 0..q_start+i
# (q_start > 0: decoding against a KV cache). Three options, as Hugging Face's models:
# - scale: the scores' factor instead of 1/sqrt(D) (Gemma 2's query_pre_attn_scalar**-0.5,
#   GPT-Neo's 1.0);
# - softcap: scores -> c tanh(scores / c) before the mask (Gemma 2);
# - window: sliding-window (local) attention, query i sees keys i - window < j <= i only
#   (Mistral, GPT-Neo's local layers, Gemma 2/3; Beltagy et al. 2020, Longformer).
def repeat_kv(x, n_heads: int):
    """Each key/value head repeated for the H/K query heads that read it: [B, T, K, D] ->
    [B, T, H, D], head h = x's head h // (H/K)."""
    return namespace(x).repeat(x, n_heads // x.shape[2], axis=2)


def sum_kv_groups(dx, n_kv_heads: int):
    """The transpose of `repeat_kv`: [B, T, H, D] -> [B, T, K, D], summing each group of H/K."""
    B, T, H, D = dx.shape
    xp = namespace(dx)
    return xp.sum(xp.reshape(dx, (B, T, n_kv_heads, H // n_kv_heads, D)), axis=3)


def causal_mask(Tq: int, Tk: int, q_start: int = 0, window: int | None = None,
                like=None) -> np.ndarray:
    """[Tq, Tk] bool: True where key j is hidden from query i: in its future (j > q_start + i),
    or, with a window W, W or more positions back (j <= q_start + i - W). On the device of
    the array `like` (None: a NumPy array)."""
    xp = np if like is None else namespace(like)
    device = None if xp is np else like.device
    query = (q_start + xp.arange(Tq, device=device))[:, None]
    key = xp.arange(Tk, device=device)[None, :]
    hidden = key > query
    if window is not None:
        hidden |= key <= query - window
    return hidden


def attention_scores_forward(q, k, q_start: int = 0, scale=None, softcap=None, window=None):
    """scores = q k^T / sqrt(D) (or * scale), soft-capped if softcap, -inf on hidden keys
    (`causal_mask`). q [B, Tq, H, D], k [B, Tk, K, D] with H a multiple of K and
    Tk = q_start + Tq -> scores [B, H, Tq, Tk]."""
    D, H = q.shape[3], q.shape[2]
    xp = namespace(q)
    qh = xp.permute_dims(q, (0, 2, 1, 3))                        # [B, H, Tq, D]
    kh = xp.permute_dims(repeat_kv(k, H), (0, 2, 1, 3))          # [B, H, Tk, D]
    scores = kernels.matmul(qh, xp.matrix_transpose(kh))         # [B, H, Tq, Tk]
    if scale is None:
        scores /= math.sqrt(D)
    else:
        scores *= float(scale)   # a Python float: rounded to the scores' dtype
    capped = None
    if softcap is not None:
        scores, capped = softcap_forward(scores, softcap)        # capped: tanh(scores / c)
    hidden = causal_mask(q.shape[1], k.shape[1], q_start, window, like=q)
    scores = xp.where(hidden, -xp.inf, scores)
    return scores, (qh, kh, hidden, k.shape[2], scale, capped)


def attention_scores_backward(dscores, saved):
    """The masked scores are constants; elsewhere, through the cap (1 - tanh^2) and the
    scale s: dq = ds k s, dk = ds^T q s, dk summed over the query heads of its group."""
    qh, kh, hidden, K, scale, capped = saved
    xp = namespace(dscores)
    ds = xp.where(hidden, 0.0, dscores)                             # [B, H, Tq, Tk]
    if capped is not None:
        (ds,) = softcap_backward(ds, capped)
    ds = ds / math.sqrt(qh.shape[3]) if scale is None else ds * float(scale)
    dq = kernels.matmul(ds, kh)                                    # [B, H, Tq, D]
    dkh = kernels.matmul(xp.matrix_transpose(ds), qh)              # [B, H, Tk, D]
    return (xp.permute_dims(dq, (0, 2, 1, 3)),
            sum_kv_groups(xp.permute_dims(dkh, (0, 2, 1, 3)), K))


def attention_scores(q: Tensor, k: Tensor, q_start: int = 0, scale=None, softcap=None,
                     window=None) -> Tensor:
    """Masked attention scores as an autograd op: q (B, Tq, H, D), k (B, Tk, K, D) ->
    (B, H, Tq, Tk). See `attention_scores_forward`."""
    scores, saved = attention_scores_forward(q.data, k.data, q_start, scale, softcap, window)
    return _node(scores, (q, k), attention_scores_backward, saved)


def attention_mix_forward(pattern, v):
    """y = pattern @ v per head: pattern [B, H, Tq, Tk], v [B, Tk, K, D] -> y [B, Tq, H, D]."""
    xp = namespace(v)
    vh = xp.permute_dims(repeat_kv(v, pattern.shape[1]), (0, 2, 1, 3))  # [B, H, Tk, D]
    y = kernels.matmul(pattern, vh)                               # [B, H, Tq, D]
    return _contiguous(xp.permute_dims(y, (0, 2, 1, 3))), (pattern, vh, v.shape[2])


def attention_mix_backward(dy, saved):
    """dpattern = dy v^T, dv = pattern^T dy (summed over the query heads of its group)."""
    pattern, vh, K = saved
    xp = namespace(dy)
    dyh = xp.permute_dims(dy, (0, 2, 1, 3))                       # [B, H, Tq, D]
    dpattern = kernels.matmul(dyh, xp.matrix_transpose(vh))       # [B, H, Tq, Tk]
    dvh = kernels.matmul(xp.matrix_transpose(pattern), dyh)       # [B, H, Tk, D]
    return dpattern, sum_kv_groups(xp.permute_dims(dvh, (0, 2, 1, 3)), K)


def attention_mix(pattern: Tensor, v: Tensor) -> Tensor:
    """pattern (B, H, Tq, Tk) @ v (B, Tk, K, D) per head, as an autograd op -> (B, Tq, H, D)."""
    y, saved = attention_mix_forward(pattern.data, v.data)
    return _node(y, (pattern, v), attention_mix_backward, saved)


def causal_attention_forward(q, k, v, q_start: int = 0, scale=None, softcap=None, window=None):
    """softmax(masked scores) v: the three pieces above, one after the other.
    q [B, Tq, H, D]; k, v [B, Tk, K, D] -> y [B, Tq, H, D]."""
    scores, scores_saved = attention_scores_forward(q, k, q_start, scale, softcap, window)
    pattern, pattern_saved = softmax_forward(scores)
    y, mix_saved = attention_mix_forward(pattern, v)
    return y, (scores_saved, pattern_saved, mix_saved)


def causal_attention_backward(dy, saved):
    """The chain rule through the three pieces, last to first."""
    scores_saved, pattern_saved, mix_saved = saved
    dpattern, dv = attention_mix_backward(dy, mix_saved)
    (dscores,) = softmax_backward(dpattern, pattern_saved)
    dq, dk = attention_scores_backward(dscores, scores_saved)
    return dq, dk, dv


def causal_attention(q: Tensor, k: Tensor, v: Tensor, q_start: int = 0, scale=None,
                     softcap=None, window=None) -> Tensor:
    """Causal scaled dot-product attention with grouped-query heads, one graph node.

    Shapes: q (B, Tq, Hq, D), k and v (B, Tk, Hkv, D), Hq a multiple of Hkv, Tk = q_start + Tq
    -> (B, Tq, Hq, D). scale (None: 1/sqrt(D)), softcap (None: none) and window (None: every
    earlier key) as the section's comment says. Source: Vaswani et al. 2017 (attention),
    Ainslie et al. 2023 (grouped-query attention). The engine's form never holds the
    Tq x Tk square; it computes the plain case, and any option runs the reference form.
    """
    if scale is None and softcap is None and window is None:
        forward, backward = _forms(causal_attention_forward, causal_attention_backward, q.data)
        y, saved = forward(q.data, k.data, v.data, q_start)
    else:
        forward, backward = causal_attention_forward, causal_attention_backward
        y, saved = forward(q.data, k.data, v.data, q_start, scale, softcap, window)
    return _node(y, (q, k, v), backward, saved)


# --------------------------------------------------------------------------- loss
def cross_entropy_forward(logits, targets, overwrite_logits: bool = False):
    """loss = -mean over rows of log softmax(z)[target]. logits [N, V], targets [N] ints in
    [0, V) -> loss (a 0-d array of logits' dtype), saved. `overwrite_logits` lets a form keep
    its buffers in logits (the engine's memory trick); this one never writes there."""
    xp = namespace(logits)
    logp = log_softmax_rows(logits)                                  # [N, V]
    loss = -xp.mean(xp.take_along_axis(logp, targets[:, None], axis=1)[:, 0])
    # a negative id counts from the end there, as NumPy's indexing: the same for the one-hot
    targets = xp.where(targets < 0, targets + logits.shape[1], targets)
    return xp.asarray(loss, dtype=logits.dtype), (logp, targets)


def cross_entropy_backward(dloss, saved):
    """dz = (softmax(z) - onehot(target)) / N, times d loss."""
    logp, targets = saved
    xp = namespace(logp)
    onehot = targets[:, None] == xp.arange(logp.shape[1], device=_device(logp))    # [N, V]
    dz = xp.exp(logp) - xp.astype(onehot, logp.dtype)                # softmax(z) - onehot
    return (dz * (dloss / targets.shape[0]),)


def cross_entropy(logits: Tensor, targets: np.ndarray, overwrite_logits: bool = False) -> Tensor:
    """Mean cross-entropy in nats: -mean(log softmax(logits)[target]).

    Shapes: logits (..., V) float, targets (...) ints in [0, V) -> scalar Tensor.
    log-softmax uses the log-sum-exp shift (subtract the row max) so no exp overflows.
    Backward: (softmax - onehot) / N. overwrite_logits=True allows the op to keep its
    probabilities (and then the gradient) in logits.data instead of a new (N, V) array -- for a
    caller that owns the logits and never reads them again, as `GlassLM.loss`; the engine's
    form does (0.2 GB less per 1024 positions with GPT-2's vocabulary).

    Raises:
        ValueError: if the shapes disagree, targets are not integers or a target is outside
            [0, V).
    """
    targets = devices.to_host(targets)  # checked on the host, then moved to the logits'
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
    forward, backward = _forms(cross_entropy_forward, cross_entropy_backward, logits.data)
    xp = namespace(logits.data)
    loss, saved = forward(xp.reshape(logits.data, (-1, V)), _like(flat_t, logits.data),
                          overwrite_logits)
    return Tensor.from_op(loss, (logits,), lambda dloss: (
        xp.reshape(backward(dloss, saved)[0], logits.shape),), fresh_grads=True)
