"""One decoding step of a Llama-architecture GlassLM over plain arrays, llama2.c's `forward` style:
the engine's form of `glassllm.generate.next_token_logits`.

Decoding feeds one token at a time, and for a small model each of the ~15 ops per layer costs
more in Python and NumPy call overhead than in arithmetic (stories260K: about 85% of a token's
time). `step` is the same computation as the engine's `GlassLM.forward` for a single position
against a `KVCache` -- the same registered fast forms the engine forward runs
(its norms, rotations, softmax and gating are `glassllm.engine.compiled`'s, which run the
numba row kernels where numba loads and the NumPy forms otherwise), so the same bits -- with
none of its bookkeeping: no Tensor objects or graph closures, no id validation per layer, one
vector per matrix product. The whole sequence of a layer reads top to
bottom as in llama2.c's run.c.

`GlassLM.forward` stays the definition (and does the prompt, batches, and every other architecture):
`next_token_logits` below runs `step` where it applies and the reference elsewhere; the
registered form of `generate.next_token_logits` is `fast_decode.next_token_logits`, which runs
the whole step compiled for small models and this one otherwise.
`tests/test_decode.py` checks that `step` gives the engine forward's logits exactly, and
`tests/test_kernels.py` that it gives the reference forward's to float32 rounding.
"""
from __future__ import annotations

import math

import numpy as np

from .. import amp, generate, kernels
from ..config import PRESETS
from ..model import GlassLM, KVCache
from . import compiled

_mm = kernels.matmul  # the library's one matrix product (here float32: no autocast)


# The switches `step` computes as Llama's; rope_theta, norm_eps and the head's tying are read
# from the model
_STEP_FIXED = {name: value for name, value in PRESETS["llama"].items()
               if name not in ("rope_theta", "norm_eps", "tie_embeddings")}


def supports(model: GlassLM, cache: KVCache) -> bool:
    """True when `step` applies: a Llama architecture (every switch but rope_theta, norm_eps
    and tie_embeddings at Llama's value, whatever the family's name), a batch of one, float32
    weights, a cache of the model's own shape and no autocast (which rounds every product:
    `GlassLM.forward` does that)."""
    cfg = model.cfg
    return (all(getattr(cfg, name) == value for name, value in _STEP_FIXED.items())
            and _cache_fits(cfg, cache)
            and amp.matmul_dtype() is None
            and model.token_embedding.weight.data.dtype == np.float32)


def _cache_fits(cfg, cache: KVCache) -> bool:
    """A float32 cache of this model's own shape, batch of one: the compiled step indexes it
    without bounds checks (a cache made for another config, fewer layers or positions,
    corrupted the heap), so any other cache takes the reference, which raises."""
    shape = (cfg.n_layers, 1, cfg.max_len, cfg.n_kv_heads, cfg.head_dim)
    return all(a.shape == shape and a.dtype == np.float32 for a in (cache.k, cache.v))


# The engine forward's own registered forms (numba's row kernels, or their NumPy forms): the
# same bits as GlassLM.forward's, with nothing of their saved values kept
def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x (1, C) normalised and scaled by weight (C,)."""
    return compiled.rms_norm_forward(x, weight, eps)[0]


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x (1, H, D) rotated at the position of cos, sin (1, D)."""
    return compiled.rope_forward(x[None], cos, sin)[0][0]


def _swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up, both (1, d_ff)."""
    return compiled.swiglu_forward(gate, up)[0]


def step(model: GlassLM, cache: KVCache, token: int) -> np.ndarray:
    """Logits (V,) float32 for `token` at position cache.length; advances the cache by one.

    Requires `supports(model, cache)`; the token id must be valid (the caller checks it).

    Raises:
        ValueError: the cache is full (cache.length == max_len).
    """
    cfg = model.cfg
    pos = cache.length
    if pos >= cfg.max_len:
        raise ValueError(f"decode.step: the KV cache is full ({cfg.max_len} positions)")
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    G = H // Hkv
    scale = 1.0 / math.sqrt(D)
    cos, sin = model.rope_cos[pos:pos + 1], model.rope_sin[pos:pos + 1]  # (1, D)
    x = model.token_embedding.weight.data[token][None, :]  # (1, C)
    for layer, block in enumerate(model.blocks):
        attention, mlp = block.attention, block.mlp
        # attention: q, k, v of this position; k, v appended to the cache
        h = _rms_norm(x, block.attention_norm.weight.data, cfg.norm_eps)
        q = _rope(_mm(h, attention.query.weight.data).reshape(1, H, D), cos, sin)
        k = _rope(_mm(h, attention.key.weight.data).reshape(1, Hkv, D), cos, sin)
        cache.k[layer, 0, pos] = k[0]
        cache.v[layer, 0, pos] = _mm(h, attention.value.weight.data).reshape(Hkv, D)
        keys = cache.k[layer, 0, :pos + 1].transpose(1, 2, 0)   # (Hkv, D, T)
        values = cache.v[layer, 0, :pos + 1].transpose(1, 0, 2)  # (Hkv, T, D)
        # the G query heads of a KV head as G rows (engine.attention's layout): (Hkv, G, T)
        scores = compiled.softmax_rows_inplace(_mm(q.reshape(Hkv, G, D) * scale, keys))
        y = _mm(scores, values).reshape(1, H * D)
        x = x + _mm(y, attention.output.weight.data)
        # SwiGLU MLP: down(silu(gate) * up)
        h = _rms_norm(x, block.mlp_norm.weight.data, cfg.norm_eps)
        gate, up = _mm(h, mlp.gate.weight.data), _mm(h, mlp.up.weight.data)
        x = x + _mm(_swiglu(gate, up), mlp.down.weight.data)
    cache.length = pos + 1
    x = _rms_norm(x, model.final_norm.weight.data, cfg.norm_eps)
    if cfg.tie_embeddings:
        return _mm(x, model.token_embedding.weight.data.T)[0]
    return _mm(x, model.lm_head.weight.data)[0]


def next_token_logits(model: GlassLM, cache: KVCache, token: int) -> np.ndarray:
    """`generate.next_token_logits`: `step` where it applies (`supports`), else the reference."""
    if supports(model, cache):
        return step(model, cache, token)
    return generate.next_token_logits(model, cache, token)
