"""The engine's one registered form of `glassllm.generate.next_token_logits`: a whole decoding
step compiled (`numba_kernels.decode_step`, llama2.c's `forward()` loop, on the same row
kernels as the training forward's norms, rotation, softmax and gating) for small
llama-family models where numba loads; `glassllm.engine.decode`'s step otherwise.

Why: for stories260K-sized models each of a layer's ~15 ops costs more in Python and NumPy
call overhead than in arithmetic (bench/llama2c_speed.py: 1 ms of 1.5 ms per token outside
the products). One compiled call per token removes that. Its matrix-vector products are
loops, as run.c's: for models this small a BLAS call costs more than its arithmetic; from
d_model MAX_D_MODEL up the NumPy step (BLAS products) runs instead.

The logits equal the reference forward's to float32 rounding (tests/test_numba_kernels.py):
the sums run in another order than BLAS's.
"""
from __future__ import annotations

import weakref

import numpy as np

from .. import generate
from ..model import GlassLM, KVCache
from . import decode, jit

MAX_D_MODEL = 256  # above: BLAS's products win (decode.step)


def supports(model: GlassLM, cache: KVCache) -> bool:
    """`decode.supports`, RoPE on, and small enough for the loops (d_model <= MAX_D_MODEL)."""
    return (decode.supports(model, cache) and model.cfg.d_model <= MAX_D_MODEL
            and getattr(model, "rope_cos", None) is not None and cache.k.flags.c_contiguous
            and _weights(model) is not None)


# model -> (its weight Tensors, their arrays, the kernel's weight arguments): gathering ~50
# arrays per token costs as much as the token's arithmetic, so it is done once per model and
# checked per token (a Tensor given a new array, e.g. by loading a checkpoint, rebuilds it;
# in-place updates, as AdamW's, need nothing: the kernel reads the same arrays).
_gathered: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _gather(model: GlassLM):
    blocks = model.blocks
    tied = model.cfg.tie_embeddings
    head = model.token_embedding.weight if tied else model.lm_head.weight
    per_layer = [[b.attention_norm.weight for b in blocks],
                 [b.attention.query.weight for b in blocks],
                 [b.attention.key.weight for b in blocks],
                 [b.attention.value.weight for b in blocks],
                 [b.attention.output.weight for b in blocks],
                 [b.mlp_norm.weight for b in blocks],
                 [b.mlp.gate.weight for b in blocks],
                 [b.mlp.up.weight for b in blocks],
                 [b.mlp.down.weight for b in blocks]]
    tensors = [model.token_embedding.weight, head, model.final_norm.weight]
    tensors += [t for group in per_layer for t in group]
    matrices = [t.data for group in per_layer for t in group if t.data.ndim == 2]
    matrices += [] if tied else [head.data]
    vectors = [t.data for t in tensors if t.data.ndim == 1] + [model.token_embedding.weight.data]
    rows = all(m.T.flags.c_contiguous for m in matrices)  # stored (out, in), as llama2.c's
    arguments = None  # the loops index rows directly: other layouts take the NumPy step
    if ((rows or all(m.flags.c_contiguous for m in matrices))
            and all(a.flags.c_contiguous for a in vectors)
            and all(t.data.dtype == np.float32 for t in tensors)):
        def given(a):
            return a.T if rows and a.ndim == 2 else a
        arguments = (head.data if tied else given(head.data), tied, rows,
                     model.final_norm.weight.data,
                     *(tuple(given(t.data) for t in group) for group in per_layer))
    return tensors, [t.data for t in tensors], arguments


def _weights(model: GlassLM):
    """The kernel's weight arguments for `model` (gathered once, checked each call), or None
    where a weight is not a C-contiguous float32 array."""
    entry = _gathered.get(model)
    if entry is None or any(t.data is not a for t, a in zip(entry[0], entry[1])):
        entry = _gather(model)
        _gathered[model] = entry
    return entry[2]


def step(model: GlassLM, cache: KVCache, token: int) -> np.ndarray:
    """Logits (V,) float32 of `token` at cache.length; advances the cache. Requires
    `supports(model, cache)` and numba (`jit.kernels()`).

    Raises:
        ValueError: the cache is full.
    """
    cfg = model.cfg
    pos = cache.length
    if pos >= cfg.max_len:
        raise ValueError(f"decode.step: the KV cache is full ({cfg.max_len} positions)")
    logits = np.empty(cfg.vocab_size, np.float32)
    jit.kernels().decode_step(int(token), pos, model.token_embedding.weight.data,
                              *_weights(model), model.rope_cos, model.rope_sin,
                              cache.k[:, 0], cache.v[:, 0], float(cfg.norm_eps), cfg.n_heads,
                              logits)
    cache.length = pos + 1
    return logits


def next_token_logits(model: GlassLM, cache: KVCache, token: int) -> np.ndarray:
    """`generate.next_token_logits`: the compiled step where it applies, else the engine's."""
    if jit.kernels() is not None and supports(model, cache):
        return step(model, cache, token)
    return decode.next_token_logits(model, cache, token)


FAST_FORMS = [(generate.next_token_logits, next_token_logits)]
