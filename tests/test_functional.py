"""The ops of glassllm.functional: float64 central differences, torch autograd, properties.

Every test runs twice, once in each mode of glassllm.kernels: "reference" checks the forms
written as the formulas read, "engine" the fast forms the engine registers (the same tests on
both; tests/test_kernels.py compares the two forms directly).

The torch side uses torch's own ops (F.rms_norm, F.layer_norm, F.gelu(approximate="tanh"),
F.scaled_dot_product_attention with repeat_interleave'd K/V, F.cross_entropy), never
glassllm's formulas.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from glassllm import Tensor, kernels
from glassllm import functional as F

rng = np.random.default_rng(1)


@pytest.fixture(autouse=True, params=kernels.MODES)
def mode(request):
    """Each test of this file in each mode (engine forms, then the references)."""
    with kernels.use(request.param):
        yield request.param


def r(*shape, scale=1.0):
    return scale * rng.standard_normal(shape)


IDS = np.array([[3, 0, 3], [1, 3, 4]])  # repeated ids: their gradients must add up
TARGETS = np.array([[2, 0, 4], [4, 4, 1]])
ROPE_COS, ROPE_SIN = F.rope_tables(4, 6, theta=100.0, dtype=np.float64)
EPS = 1e-5


def tf():
    import torch.nn.functional as tfn
    return tfn


def torch_rope(x, cos, sin):
    import torch
    cos, sin = torch.tensor(cos)[:, None, :], torch.tensor(sin)[:, None, :]  # (T, 1, D)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def torch_rope_partial(x, cos, sin):
    """GPT-NeoX / Phi: rotate the first R channels, pass the rest."""
    import torch
    R = cos.shape[-1]
    return torch.cat([torch_rope(x[..., :R], cos, sin), x[..., R:]], dim=-1)


def torch_attention(q, k, v, q_start=0):
    """Reference: (B, T, H, D) -> torch's (B, H, T, D), K/V heads repeated per group."""
    import torch
    Tq, Tk = q.shape[1], k.shape[1]
    rep = q.shape[2] // k.shape[2]
    qh = q.transpose(1, 2)
    kh = k.transpose(1, 2).repeat_interleave(rep, dim=1)
    vh = v.transpose(1, 2).repeat_interleave(rep, dim=1)
    allowed = torch.arange(Tk)[None, :] <= (q_start + torch.arange(Tq))[:, None]
    out = tf().scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed)
    return out.transpose(1, 2)


def torch_pattern(q, k, q_start=0):
    """softmax of the masked scores, (B, T, H, D) in, torch's (B, H, Tq, Tk) out."""
    import torch
    Tq, Tk, D = q.shape[1], k.shape[1], q.shape[3]
    kh = k.transpose(1, 2).repeat_interleave(q.shape[2] // k.shape[2], dim=1)
    scores = q.transpose(1, 2) @ kh.transpose(-1, -2) / math.sqrt(D)
    future = torch.arange(Tk)[None, :] > (q_start + torch.arange(Tq))[:, None]
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)


def torch_mix(pattern, v):
    """pattern (B, H, Tq, Tk) @ v (B, Tk, K, D) repeated per group -> (B, Tq, H, D)."""
    vh = v.transpose(1, 2).repeat_interleave(pattern.shape[1] // v.shape[2], dim=1)
    return (pattern @ vh).transpose(1, 2)


def torch_attention_options(q, k, v, q_start=0, scale=None, softcap=None, window=None):
    """Explicit scores as Hugging Face's eager attention (Gemma 2, Mistral, GPT-Neo): scores
    * scale, c tanh(scores / c), then the causal/sliding mask, softmax, @ v."""
    import torch
    Tq, Tk, D = q.shape[1], k.shape[1], q.shape[3]
    rep = q.shape[2] // k.shape[2]
    qh = q.transpose(1, 2)
    kh = k.transpose(1, 2).repeat_interleave(rep, dim=1)
    vh = v.transpose(1, 2).repeat_interleave(rep, dim=1)
    scores = qh @ kh.transpose(-1, -2) * (D ** -0.5 if scale is None else scale)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    query = (q_start + torch.arange(Tq))[:, None]
    key = torch.arange(Tk)[None, :]
    hidden = key > query
    if window is not None:
        hidden |= key <= query - window
    return (scores.masked_fill(hidden, float("-inf")).softmax(-1) @ vh).transpose(1, 2)


def torch_cross_entropy(logits, targets):
    import torch
    return tf().cross_entropy(logits.reshape(-1, logits.shape[-1]),
                              torch.tensor(targets).reshape(-1))


# name -> (glassllm fn, torch fn, inputs)
CASES = {
    "linear_bias": (lambda x, w, b: F.linear(x, w, b), lambda x, w, b: x @ w + b,
                    [r(2, 3, 4), r(4, 5), r(5)]),
    "linear_no_bias": (lambda x, w: F.linear(x, w), lambda x, w: x @ w, [r(3, 4), r(4, 2)]),
    "unembed": (F.unembed, lambda x, e: x @ e.T, [r(2, 3, 4), r(7, 4)]),
    "embedding": (lambda w: F.embedding(IDS, w), lambda w: tf().embedding(_long(IDS), w),
                  [r(5, 3)]),
    "rms_norm": (lambda x, w: F.rms_norm(x, w, EPS),
                 lambda x, w: tf().rms_norm(x, (x.shape[-1],), w, EPS), [r(2, 3, 5), r(5)]),
    "rms_norm_tiny_values": (lambda x, w: F.rms_norm(x, w, EPS),
                             lambda x, w: tf().rms_norm(x, (x.shape[-1],), w, EPS),
                             [r(2, 4, scale=1e-3), r(4)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, w, b, EPS),
                   lambda x, w, b: tf().layer_norm(x, (x.shape[-1],), w, b, EPS),
                   [r(2, 3, 5), r(5), r(5)]),
    "layer_norm_no_bias": (lambda x, w: F.layer_norm(x, w, None, EPS),
                           lambda x, w: tf().layer_norm(x, (x.shape[-1],), w, None, EPS),
                           [r(2, 3, 5), r(5)]),
    "rms_norm_offset": (lambda x, w: F.rms_norm(x, w, EPS, offset=True),
                        lambda x, w: tf().rms_norm(x, (x.shape[-1],), 1.0 + w, EPS),
                        [r(2, 3, 5), r(5)]),
    "silu": (F.silu, lambda x: tf().silu(x), [r(2, 5, scale=3.0)]),
    "swiglu": (F.swiglu, lambda g, u: tf().silu(g) * u, [r(2, 5, scale=3.0), r(2, 5)]),
    "gelu": (F.gelu, lambda x: tf().gelu(x, approximate="tanh"), [r(2, 5, scale=3.0)]),
    "gelu_exact": (F.gelu_exact, lambda x: tf().gelu(x), [r(2, 5, scale=3.0)]),
    "geglu": (F.geglu, lambda g, u: tf().gelu(g, approximate="tanh") * u,
              [r(2, 5, scale=3.0), r(2, 5)]),
    "softcap": (lambda x: F.softcap(x, 2.0), lambda x: (x / 2.0).tanh() * 2.0,
                [r(2, 5, scale=3.0)]),
    "rope_partial": (lambda x: F.rope(x, ROPE_COS[:, :2], ROPE_SIN[:, :2]),
                     lambda x: torch_rope_partial(x, ROPE_COS[:, :2], ROPE_SIN[:, :2]),
                     [r(2, 4, 3, 6)]),
    "attention_scale": (lambda q, k, v: F.causal_attention(q, k, v, scale=1.0),
                        lambda q, k, v: torch_attention_options(q, k, v, scale=1.0),
                        [r(2, 4, 2, 3), r(2, 4, 1, 3), r(2, 4, 1, 3)]),
    "attention_softcap": (lambda q, k, v: F.causal_attention(q, k, v, softcap=0.7),
                          lambda q, k, v: torch_attention_options(q, k, v, softcap=0.7),
                          [r(2, 4, 2, 3), r(2, 4, 1, 3), r(2, 4, 1, 3)]),
    "attention_window": (lambda q, k, v: F.causal_attention(q, k, v, window=2),
                         lambda q, k, v: torch_attention_options(q, k, v, window=2),
                         [r(1, 6, 2, 3), r(1, 6, 2, 3), r(1, 6, 2, 3)]),
    "attention_window_q_start": (
        lambda q, k, v: F.causal_attention(q, k, v, q_start=3, window=3, softcap=1.0,
                                           scale=0.5),
        lambda q, k, v: torch_attention_options(q, k, v, q_start=3, window=3, softcap=1.0,
                                                scale=0.5),
        [r(1, 2, 4, 2), r(1, 5, 2, 2), r(1, 5, 2, 2)]),
    "rope": (lambda x: F.rope(x, ROPE_COS, ROPE_SIN),
             lambda x: torch_rope(x, ROPE_COS, ROPE_SIN), [r(2, 4, 3, 6)]),
    "attention_mha": (F.causal_attention, torch_attention,
                      [r(2, 4, 2, 3), r(2, 4, 2, 3), r(2, 4, 2, 3)]),
    "attention_gqa": (F.causal_attention, torch_attention,
                      [r(1, 4, 4, 2), r(1, 4, 2, 2), r(1, 4, 2, 2)]),
    "attention_mqa": (F.causal_attention, torch_attention,
                      [r(1, 3, 3, 2), r(1, 3, 1, 2), r(1, 3, 1, 2)]),
    "attention_gqa_q_start": (lambda q, k, v: F.causal_attention(q, k, v, q_start=3),
                              lambda q, k, v: torch_attention(q, k, v, q_start=3),
                              [r(1, 2, 4, 2), r(1, 5, 2, 2), r(1, 5, 2, 2)]),
    "attention_decode_one": (lambda q, k, v: F.causal_attention(q, k, v, q_start=4),
                             lambda q, k, v: torch_attention(q, k, v, q_start=4),
                             [r(2, 1, 2, 3), r(2, 5, 1, 3), r(2, 5, 1, 3)]),
    # More than one block of ATTENTION_BLOCK = 64 queries: the later blocks' keys, their
    # diagonal masks and the multi-block backward; and blocks that start inside a KV cache.
    "attention_mha_T65": (F.causal_attention, torch_attention,
                          [r(1, 65, 1, 2), r(1, 65, 1, 2), r(1, 65, 1, 2)]),
    "attention_gqa_T70": (F.causal_attention, torch_attention,
                          [r(2, 70, 2, 2), r(2, 70, 1, 2), r(2, 70, 1, 2)]),
    "attention_gqa_T150": (F.causal_attention, torch_attention,
                           [r(1, 150, 2, 2, scale=2.0), r(1, 150, 1, 2), r(1, 150, 1, 2)]),
    "attention_q_start_30_T100": (lambda q, k, v: F.causal_attention(q, k, v, q_start=30),
                                  lambda q, k, v: torch_attention(q, k, v, q_start=30),
                                  [r(1, 100, 2, 2, scale=2.0), r(1, 130, 1, 2),
                                   r(1, 130, 1, 2)]),
    "attention_q_start_70_T70": (lambda q, k, v: F.causal_attention(q, k, v, q_start=70),
                                 lambda q, k, v: torch_attention(q, k, v, q_start=70),
                                 [r(1, 70, 3, 2, scale=2.0), r(1, 140, 1, 2),
                                  r(1, 140, 1, 2)]),
    # the pieces of the reference attention (the scores' -inf entries are only meaningful
    # through the softmax, so the scores are checked as softmax(scores))
    "softmax": (F.softmax, lambda x: x.softmax(-1), [r(2, 3, 5, scale=2.0)]),
    "attention_pattern_gqa_q_start": (
        lambda q, k: F.softmax(F.attention_scores(q, k, q_start=2)),
        lambda q, k: torch_pattern(q, k, q_start=2), [r(2, 3, 4, 3), r(2, 5, 2, 3)]),
    "attention_mix_gqa": (lambda p, v: F.attention_mix(F.softmax(p), v),
                          lambda p, v: torch_mix(p.softmax(-1), v),
                          [r(2, 4, 3, 5), r(2, 5, 2, 3)]),
    "cross_entropy": (lambda z: F.cross_entropy(z, TARGETS),
                      lambda z: torch_cross_entropy(z, TARGETS), [r(2, 3, 5, scale=2.0)]),
    "cross_entropy_2d": (lambda z: F.cross_entropy(z, TARGETS[0]),
                         lambda z: torch_cross_entropy(z, TARGETS[0]), [r(3, 5)]),
}


def _long(a):
    import torch
    return torch.tensor(a, dtype=torch.long)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_gradients_match_central_differences(name, gradcheck):
    fn, _, inputs = CASES[name]
    gradcheck(fn, *inputs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_torch_forward_and_backward(name, torch_check):
    fn, torch_fn, inputs = CASES[name]
    torch_check(fn, torch_fn, *inputs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_keeps_float32(name):
    # The library's working dtype: a float32 op must not silently compute in float64.
    fn, _, inputs = CASES[name]
    if name.startswith("rope"):  # with the float32 tables the model uses
        cos, sin = F.rope_tables(4, 6, theta=100.0)
        R = 2 if name == "rope_partial" else 6
        fn = lambda x: F.rope(x, cos[:, :R], sin[:, :R])  # noqa: E731
    leaves = [Tensor(a.astype(np.float32), requires_grad=True) for a in inputs]
    out = fn(*leaves)
    assert out.dtype == np.float32
    out.backward(np.ones(out.shape, np.float32))
    assert all(leaf.grad.dtype == np.float32 for leaf in leaves)


def test_partial_requires_grad_gives_grads_only_where_asked():
    x, w = Tensor(r(3, 4)), Tensor(r(4, 2), requires_grad=True)
    b = Tensor(r(2), requires_grad=True)
    F.linear(x, w, b).backward(np.ones((3, 2)))
    assert x.grad is None
    np.testing.assert_allclose(w.grad, x.data.sum(0)[:, None] * np.ones((1, 2)))
    np.testing.assert_allclose(b.grad, np.full(2, 3.0))


# --------------------------------------------------------------------------- rope
def test_rope_tables_follow_hf_rotate_half(torch):
    D, theta = 8, 500.0
    cos, sin = F.rope_tables(6, D, theta=theta, dtype=np.float64)
    inv_freq = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    freqs = torch.outer(torch.arange(6, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    np.testing.assert_allclose(cos, emb.cos().numpy(), atol=1e-15)
    np.testing.assert_allclose(sin, emb.sin().numpy(), atol=1e-15)
    cos32, _ = F.rope_tables(6, D)
    assert cos32.dtype == np.float32 and cos32.shape == (6, D)


def test_rope_is_a_rotation_by_relative_position():
    cos, sin = F.rope_tables(8, 4, dtype=np.float64)
    q, k = r(1, 1, 1, 4), r(1, 1, 1, 4)
    rot = lambda x, pos: F.rope(Tensor(x), cos[pos:pos + 1], sin[pos:pos + 1]).data
    np.testing.assert_allclose(rot(q, 0), q)  # position 0: identity
    np.testing.assert_allclose(np.linalg.norm(rot(q, 5)), np.linalg.norm(q))
    # <rope(q, m), rope(k, n)> depends on m - n only
    np.testing.assert_allclose(np.sum(rot(q, 5) * rot(k, 2)), np.sum(rot(q, 6) * rot(k, 3)))


# --------------------------------------------------------------------------- attention
def test_attention_is_causal():
    q, k, v = r(1, 5, 2, 3), r(1, 5, 2, 3), r(1, 5, 2, 3)
    out = F.causal_attention(Tensor(q), Tensor(k), Tensor(v)).data
    k2, v2 = k.copy(), v.copy()
    k2[:, 3:], v2[:, 3:] = 100.0, -100.0  # change the future of positions 0..2
    out2 = F.causal_attention(Tensor(q), Tensor(k2), Tensor(v2)).data
    np.testing.assert_allclose(out2[:, :3], out[:, :3])
    assert not np.allclose(out2[:, 3:], out[:, 3:])
    np.testing.assert_allclose(out[:, 0], v[:, 0])  # the first query sees only itself


def test_attention_q_start_equals_rows_of_full_attention():
    q, k, v = r(2, 6, 4, 2), r(2, 6, 2, 2), r(2, 6, 2, 2)
    full = F.causal_attention(Tensor(q), Tensor(k), Tensor(v)).data
    tail = F.causal_attention(Tensor(q[:, 4:]), Tensor(k), Tensor(v), q_start=4).data
    np.testing.assert_allclose(tail, full[:, 4:], atol=1e-12)


def test_gqa_equals_mha_with_repeated_kv_heads():
    q, k, v = r(1, 4, 6, 2), r(1, 4, 2, 2), r(1, 4, 2, 2)
    gqa = F.causal_attention(Tensor(q), Tensor(k), Tensor(v)).data
    mha = F.causal_attention(Tensor(q), Tensor(np.repeat(k, 3, axis=2)),
                             Tensor(np.repeat(v, 3, axis=2))).data
    np.testing.assert_allclose(gqa, mha, atol=1e-12)


# --------------------------------------------------------------------------- losses, stability
def test_cross_entropy_is_stable_for_huge_logits(torch):
    z = np.array([[1e4, 0.0, -1e4], [3e4, 3e4, 0.0]], dtype=np.float32)
    t = np.array([1, 0])
    logits = Tensor(z, requires_grad=True)
    loss = F.cross_entropy(logits, t)
    loss.backward()
    expected = tf().cross_entropy(torch.tensor(z, requires_grad=True), torch.tensor(t))
    assert np.isfinite(loss.item()) and np.all(np.isfinite(logits.grad))
    np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-6)
    np.testing.assert_allclose(loss.item(), (1e4 + math.log(2)) / 2, rtol=1e-6)


def test_cross_entropy_of_uniform_logits_is_log_vocab():
    loss = F.cross_entropy(Tensor(np.zeros((4, 7), np.float32)), np.array([0, 6, 3, 3]))
    assert loss.dtype == np.float32
    np.testing.assert_allclose(loss.item(), math.log(7), rtol=1e-6)


@pytest.mark.parametrize("targets, message", [
    (np.array([0, 5]), r"\[0, 5\)"),  # target == V
    (np.array([-1, 0]), r"\[0, 5\)"),
    (np.array([0, 1, 2]), "disagree"),
    (np.array([[0, 1]]), "disagree"),
    (np.array([0.0, 1.0]), "integer"),
])
def test_cross_entropy_rejects_bad_targets(targets, message):
    with pytest.raises(ValueError, match=message):
        F.cross_entropy(Tensor(np.zeros((2, 5)), requires_grad=True), targets)


def test_activations_do_not_overflow():
    x = np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0], dtype=np.float32)
    with np.errstate(over="raise", invalid="raise"):
        s = F.silu(Tensor(x)).data
        g = F.gelu(Tensor(x)).data
        sw = F.swiglu(Tensor(x), Tensor(np.ones_like(x))).data
    np.testing.assert_allclose(s, [0.0, -50 / (1 + math.exp(50)), 0.0, 50.0, 1000.0], atol=1e-6)
    np.testing.assert_allclose(g, [0.0, 0.0, 0.0, 50.0, 1000.0], atol=1e-6)
    np.testing.assert_array_equal(sw, s)
