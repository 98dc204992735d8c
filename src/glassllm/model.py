"""GlassLM: a decoder-only transformer in two families.

- ``family="llama"`` (default), after Llama (Touvron et al. 2023) as in Hugging Face's
  `LlamaForCausalLM`: pre-RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP,
  no biases, input/output embeddings tied unless `tie_embeddings=False`.
- ``family="gpt2"``, after GPT-2 (Radford et al. 2019) as in nanoGPT / `GPT2LMHeadModel`:
  pre-LayerNorm, learned positions, GELU (tanh) MLP, biases everywhere, tied head.

The model is weights only (like llama2.c's `TransformerWeights`); decoding state lives in
a separate `KVCache` (llama2.c's `RunState`). There is no dropout and no train/eval mode.
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator

import numpy as np

from . import functional as F
from .nn import Embedding, LayerNorm, Linear, Module, RMSNorm
from .tensor import Tensor

FAMILIES = ("llama", "gpt2")

# The glass box's one hook. `glassllm.lens.trace.Trace` puts itself here while it runs; every site
# below that exposes a named value is `if _trace is not None:`, a global lookup and a compare
# when nothing is traced, so the plain forward pays nothing measurable
# (bench/trace_overhead.py). The names are frozen and documented in `glassllm.lens.trace.NAMES`.
_trace = None


@dataclasses.dataclass
class Config:
    """Model hyper-parameters, the single switchboard (nanoGPT's GPTConfig).

    Fields:
        vocab_size: V, number of token ids.
        d_model: C, width of the residual stream.
        n_layers: number of transformer blocks.
        n_heads: query heads; head_dim = d_model // n_heads.
        n_kv_heads: key/value heads (grouped-query attention, llama family); None means
            n_heads. GPT-2 has no grouped-query attention: gpt2 needs n_kv_heads == n_heads.
        max_len: longest sequence (context length) in tokens.
        family: "llama" or "gpt2" (see the module doc).
        d_ff: MLP hidden width. None -> 4*d_model for gpt2; for llama 8/3*d_model rounded up
            to a multiple of 32 (Llama's `multiple_of` rule), so the SwiGLU MLP has about the
            parameters of a 4x GELU MLP.
        rope_theta: RoPE base (llama family).
        norm_eps: epsilon of RMSNorm / LayerNorm.
        tie_embeddings: output projection shares the token embedding (gpt2 always ties).

    NumPy integers/floats are accepted and stored as Python int/float (so `to_dict()` is
    plain JSON).

    Raises:
        ValueError: sizes that are not positive integers (bools refused), rope_theta/norm_eps
            not finite positive numbers, tie_embeddings not a bool, d_model not divisible by
            n_heads, n_heads not divisible by n_kv_heads, odd head_dim with RoPE, unknown
            family, untied gpt2, gpt2 with n_kv_heads != n_heads (neither is GPT-2, nor
            could be written as a `GPT2LMHeadModel` checkpoint).
    """

    vocab_size: int = 257
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None
    max_len: int = 256
    family: str = "llama"
    d_ff: int | None = None
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "max_len"):
            setattr(self, name, _positive_int(name, getattr(self, name)))
        if not isinstance(self.family, str) or self.family not in FAMILIES:
            raise ValueError(f"Config.family must be one of {FAMILIES}, got {self.family!r}")
        if isinstance(self.tie_embeddings, np.bool_):
            self.tie_embeddings = bool(self.tie_embeddings)
        if not isinstance(self.tie_embeddings, bool):  # "no" would be truthy: refuse it
            raise ValueError(f"Config.tie_embeddings must be True or False, got "
                             f"{self.tie_embeddings!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"Config: d_model={self.d_model} is not divisible by "
                             f"n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"Config: n_heads={self.n_heads} is not divisible by "
                             f"n_kv_heads={self.n_kv_heads}")
        if self.family == "llama" and self.head_dim % 2:
            raise ValueError(f"Config: RoPE needs an even head_dim, got {self.head_dim} "
                             f"(d_model={self.d_model} / n_heads={self.n_heads})")
        if self.family == "gpt2" and not self.tie_embeddings:
            raise ValueError("Config: the gpt2 family always ties its embeddings")
        if self.family == "gpt2" and self.n_kv_heads != self.n_heads:
            raise ValueError(f"Config: the gpt2 family has no grouped-query attention: "
                             f"n_kv_heads={self.n_kv_heads} must equal n_heads={self.n_heads}")
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model if self.family == "gpt2" else \
                32 * math.ceil(8 * self.d_model / 3 / 32)
        self.d_ff = _positive_int("d_ff", self.d_ff)
        for name in ("rope_theta", "norm_eps"):
            setattr(self, name, _positive_real(name, getattr(self, name)))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        """Build from `to_dict()` output. Raises ValueError on unknown or invalid fields."""
        return dataclass_from_dict(cls, d)

    def n_params(self) -> int:
        """Parameter count of a model with this config (computed, nothing allocated)."""
        return sum(math.prod(shape) for _, shape in parameter_shapes(self))


def dataclass_from_dict(cls, d: dict):
    """cls(**d) for a dataclass, refusing keys that are not its fields.

    Raises:
        ValueError: "<cls name>: unknown field(s) [...]" (a TypeError from cls(**d) would not
            say which file or setting was wrong); the constructor's own ValueErrors pass through.
    """
    unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {unknown}")
    return cls(**d)


def _positive_int(name: str, value) -> int:
    """value as a Python int (NumPy integers too, so the config saves as JSON), else
    ValueError. bool is refused although Python counts it as an int."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"Config.{name} must be a positive integer, got {value!r}")
    return int(value)


def _positive_real(name: str, value) -> float:
    """value as a finite positive Python float, else ValueError (bools and strings refused)."""
    if isinstance(value, (bool, np.bool_)) or \
            not isinstance(value, (int, float, np.integer, np.floating)) or \
            not (math.isfinite(value) and value > 0):
        raise ValueError(f"Config.{name} must be a finite positive number, got {value!r}")
    return float(value)


def parameter_shapes(cfg: Config) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter of `GlassLM(cfg)`, in `named_parameters()` order,
    without building anything: files and checkpoints are checked against a config with it
    before a possibly huge model is allocated. Lazy, so a corrupt n_layers costs nothing
    until iterated."""
    C, V = cfg.d_model, cfg.vocab_size
    gpt2 = cfg.family == "gpt2"
    yield "token_embedding.weight", (V, C)
    if gpt2:
        yield "position_embedding.weight", (cfg.max_len, C)
    for i in range(cfg.n_layers):
        yield from _block_shapes(cfg, i)
    yield "final_norm.weight", (C,)
    if gpt2:
        yield "final_norm.bias", (C,)
    if not cfg.tie_embeddings:
        yield "lm_head.weight", (C, V)


def n_parameter_tensors(cfg: Config) -> int:
    """len(list(parameter_shapes(cfg))), in O(1)."""
    gpt2 = cfg.family == "gpt2"
    per_block = sum(1 for _ in _block_shapes(cfg, 0))
    return 2 + 2 * gpt2 + (not cfg.tie_embeddings) + cfg.n_layers * per_block


def parameter_shape(cfg: Config, name: str) -> tuple[int, ...] | None:
    """Shape of parameter `name` in `GlassLM(cfg)`, or None if it has no such parameter.
    O(1) whatever n_layers is (block names are matched against block 0's)."""
    parts = name.split(".", 2)
    if parts[0] == "blocks":
        layer = parts[1] if len(parts) == 3 else ""
        if not (layer.isdigit() and str(int(layer)) == layer and int(layer) < cfg.n_layers):
            return None
        return dict(_block_shapes(cfg, 0)).get(f"blocks.0.{parts[2]}")
    return dict(parameter_shapes(dataclasses.replace(cfg, n_layers=1))).get(name)


def _block_shapes(cfg: Config, i: int) -> Iterator[tuple[str, tuple[int, ...]]]:
    C, kv = cfg.d_model, cfg.n_kv_heads * cfg.head_dim
    bias = cfg.family == "gpt2"  # LayerNorm and biases (gpt2) vs RMSNorm, no biases (llama)
    b = f"blocks.{i}."

    def linear(name, d_in, d_out):
        yield f"{b}{name}.weight", (d_in, d_out)
        if bias:
            yield f"{b}{name}.bias", (d_out,)

    def norm(name):
        yield f"{b}{name}.weight", (C,)
        if bias:
            yield f"{b}{name}.bias", (C,)

    yield from norm("attention_norm")
    for name, width in (("query", C), ("key", kv), ("value", kv), ("output", C)):
        yield from linear(f"attention.{name}", C, width)
    yield from norm("mlp_norm")
    if not bias:
        yield from linear("mlp.gate", C, cfg.d_ff)
    yield from linear("mlp.up", C, cfg.d_ff)
    yield from linear("mlp.down", cfg.d_ff, C)


class KVCache:
    """Keys and values of the positions already seen, for decoding one token at a time.

    Buffers are preallocated: k, v of shape (n_layers, B, max_len, n_kv_heads, head_dim),
    float32. `length` is how many positions are filled.
    """

    def __init__(self, cfg: Config, batch_size: int = 1):
        shape = (cfg.n_layers, batch_size, cfg.max_len, cfg.n_kv_heads, cfg.head_dim)
        self.k = np.zeros(shape, dtype=np.float32)
        self.v = np.zeros(shape, dtype=np.float32)
        self.length = 0


class Attention(Module):
    """Multi-head causal self-attention with grouped-query heads (and RoPE for llama)."""

    def __init__(self, cfg: Config, rng: np.random.Generator):
        bias = cfg.family == "gpt2"
        kv_width = cfg.n_kv_heads * cfg.head_dim
        self.query = Linear(cfg.d_model, cfg.d_model, rng, bias)
        self.key = Linear(cfg.d_model, kv_width, rng, bias)
        self.value = Linear(cfg.d_model, kv_width, rng, bias)
        # GPT-2's residual-projection init: std shrinks with depth so the residual stream's
        # variance does not grow with the number of blocks.
        self.output = Linear(cfg.d_model, cfg.d_model, rng, bias,
                             std=0.02 / math.sqrt(2 * cfg.n_layers))
        self.cfg = cfg

    def __call__(self, x: Tensor, rope_cos, rope_sin, cache: KVCache | None, layer: int):
        cfg = self.cfg
        B, T, _ = x.shape
        if _trace is not None:
            x = _trace.tap(f"blocks.{layer}.attention.input", x)
        q = self.query(x).reshape(B, T, cfg.n_heads, cfg.head_dim)
        k = self.key(x).reshape(B, T, cfg.n_kv_heads, cfg.head_dim)
        v = self.value(x).reshape(B, T, cfg.n_kv_heads, cfg.head_dim)
        if rope_cos is not None:
            q = F.rope(q, rope_cos, rope_sin)
            k = F.rope(k, rope_cos, rope_sin)
        if _trace is not None:
            q, k, v = (_trace.tap(f"blocks.{layer}.attention.{name}", t)
                       for name, t in (("q", q), ("k", k), ("v", v)))
        start = 0
        if cache is not None:  # decoding: append this step's keys/values, attend to all
            start = cache.length
            cache.k[layer, :, start:start + T] = k.data
            cache.v[layer, :, start:start + T] = v.data
            k = Tensor(cache.k[layer, :, :start + T])
            v = Tensor(cache.v[layer, :, :start + T])
        if _trace is None:
            y = F.causal_attention(q, k, v, q_start=start)
        else:  # the fused op never forms the T x T pattern: the trace makes it when asked
            y = _trace.tap(f"blocks.{layer}.attention.head_output",
                           _trace.attention(layer, q, k, v, start))
        y = self.output(y.reshape(B, T, cfg.d_model))
        if _trace is not None:
            y = _trace.tap(f"blocks.{layer}.attention.output", y)
        return y


class MLP(Module):
    """SwiGLU (llama): down(silu(gate(x)) * up(x)); GELU (gpt2): down(gelu(up(x)))."""

    def __init__(self, cfg: Config, rng: np.random.Generator):
        self.swiglu = cfg.family == "llama"
        bias = not self.swiglu
        if self.swiglu:
            self.gate = Linear(cfg.d_model, cfg.d_ff, rng, bias)
        self.up = Linear(cfg.d_model, cfg.d_ff, rng, bias)
        self.down = Linear(cfg.d_ff, cfg.d_model, rng, bias,
                           std=0.02 / math.sqrt(2 * cfg.n_layers))

    def __call__(self, x: Tensor, layer: int = 0) -> Tensor:
        if _trace is not None:
            x = _trace.tap(f"blocks.{layer}.mlp.input", x)
        pre = self.gate(x) if self.swiglu else self.up(x)  # the activation's input
        if _trace is not None:
            pre = _trace.tap(f"blocks.{layer}.mlp.hidden_pre", pre)
        if self.swiglu:
            up = self.up(x)
            if _trace is not None:
                up = _trace.tap(f"blocks.{layer}.mlp.up", up)
            hidden = F.swiglu(pre, up)
        else:
            hidden = F.gelu(pre)
        if _trace is not None:
            hidden = _trace.tap(f"blocks.{layer}.mlp.hidden_post", hidden)
        y = self.down(hidden)
        if _trace is not None:
            y = _trace.tap(f"blocks.{layer}.mlp.output", y)
        return y


class Block(Module):
    """Pre-norm transformer block: x + attention(norm(x)), then h + mlp(norm(h))."""

    def __init__(self, cfg: Config, rng: np.random.Generator):
        Norm = RMSNorm if cfg.family == "llama" else LayerNorm
        self.attention_norm = Norm(cfg.d_model, cfg.norm_eps)
        self.attention = Attention(cfg, rng)
        self.mlp_norm = Norm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg, rng)

    def __call__(self, x, rope_cos, rope_sin, cache, layer):
        if _trace is not None:
            x = _trace.tap(f"blocks.{layer}.residual_in", x)
        x = x + self.attention(self.attention_norm(x), rope_cos, rope_sin, cache, layer)
        if _trace is not None:
            x = _trace.tap(f"blocks.{layer}.residual_mid", x)
        x = x + self.mlp(self.mlp_norm(x), layer)
        if _trace is not None:
            x = _trace.tap(f"blocks.{layer}.residual_out", x)
        return x


def _check_fits_in_memory(cfg: Config) -> None:
    """MemoryError if the float32 weights of `GlassLM(cfg)` exceed the physical memory
    (unknown memory size, e.g. no sysconf: no check)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return
    n = cfg.n_params()
    if total > 0 and 4 * n > total:
        raise MemoryError(f"a model of {n:,} parameters needs {4 * n / 2**30:,.1f} GiB for its "
                          f"float32 weights alone, more than this machine's "
                          f"{total / 2**30:,.1f} GiB of memory")


class GlassLM(Module):
    """The language model: token ids in, next-token logits out.

    `GlassLM(cfg, seed=0)` initialises deterministically from `np.random.default_rng(seed)`:
    N(0, 0.02) weights (residual projections 0.02/sqrt(2*n_layers)), unit norm gains, zero
    biases, as nanoGPT.

    Raises:
        MemoryError: the float32 weights alone (4 bytes x `cfg.n_params()`) exceed the
            machine's physical memory. Checked before anything is allocated: each layer's
            arrays would fit, so under Linux's memory overcommit NumPy would never raise, and
            the kernel's OOM killer would end the process silently once memory ran out.
    """

    def __init__(self, cfg: Config, seed: int = 0):
        _check_fits_in_memory(cfg)
        self.cfg = cfg
        rng = np.random.default_rng(seed)
        self.token_embedding = Embedding(cfg.vocab_size, cfg.d_model, rng)
        if cfg.family == "gpt2":
            self.position_embedding = Embedding(cfg.max_len, cfg.d_model, rng)
            self.rope_cos = self.rope_sin = None
        else:
            self.rope_cos, self.rope_sin = F.rope_tables(cfg.max_len, cfg.head_dim,
                                                         cfg.rope_theta)
        self.blocks = [Block(cfg, rng) for _ in range(cfg.n_layers)]
        Norm = RMSNorm if cfg.family == "llama" else LayerNorm
        self.final_norm = Norm(cfg.d_model, cfg.norm_eps)
        if not cfg.tie_embeddings:
            self.lm_head = Linear(cfg.d_model, cfg.vocab_size, rng)

    def check_ids(self, idx, what: str = "idx", start: int = 0) -> np.ndarray:
        """Validate token ids; return them as a (B, T) integer array.

        Raises:
            ValueError: not integers, not 1-D/2-D, empty, start+T > max_len, or an id outside
                [0, vocab_size) (the message gives the first bad id and where it is).
        """
        idx = np.asarray(idx.data if isinstance(idx, Tensor) else idx)
        if idx.ndim == 1:
            idx = idx[None, :]
        if idx.ndim != 2:
            raise ValueError(f"{what} must have shape (B, T) or (T,), got {idx.shape}")
        if not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"{what} must be integer token ids, got dtype {idx.dtype}")
        if idx.shape[1] == 0:
            raise ValueError(f"{what} is empty (T = 0)")
        if start + idx.shape[1] > self.cfg.max_len:
            raise ValueError(f"{what}: sequence length {start + idx.shape[1]} exceeds "
                             f"max_len={self.cfg.max_len}")
        bad = (idx < 0) | (idx >= self.cfg.vocab_size)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"{what}: token id {int(idx[where])} at position {where} is "
                             f"outside [0, {self.cfg.vocab_size})")
        return idx

    def __call__(self, idx, cache: KVCache | None = None) -> Tensor:
        return self.forward(idx, cache)

    def forward(self, idx, cache: KVCache | None = None) -> Tensor:
        """Logits for every position.

        Args:
            idx: int array (B, T), or (T,) treated as a batch of one.
            cache: optional KVCache; positions continue from `cache.length`, which advances by T.

        Returns:
            Tensor (B, T, vocab_size) float32 logits (natural-log scale scores).

        Raises:
            ValueError: see `check_ids`.
        """
        cfg = self.cfg
        start = cache.length if cache is not None else 0
        idx = self.check_ids(idx, start=start)
        T = idx.shape[1]
        x = self.token_embedding(idx)
        if _trace is not None:
            x = _trace.tap("token_embedding", x)
        cos = sin = None
        if cfg.family == "gpt2":
            positions = self.position_embedding(np.arange(start, start + T))
            if _trace is not None:
                positions = _trace.tap("position_embedding", positions)
            x = x + positions
        else:
            cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]
        for layer, block in enumerate(self.blocks):
            x = block(x, cos, sin, cache, layer)
        if cache is not None:
            cache.length = start + T
        x = self.final_norm(x)
        if _trace is not None:
            x = _trace.tap("final_norm", x)
        if cfg.tie_embeddings:
            logits = F.unembed(x, self.token_embedding.weight)
        else:
            logits = self.lm_head(x)
        if _trace is not None:
            logits = _trace.tap("logits", logits)
        return logits

    def loss(self, idx, targets) -> Tensor:
        """Mean next-token cross-entropy in nats (scalar Tensor).

        idx, targets: int arrays of the same shape (B, T) or (T,).
        Raises ValueError on bad ids (either argument) or mismatched shapes.
        """
        idx = self.check_ids(idx)
        targets = self.check_ids(targets, what="targets")
        if targets.shape != idx.shape:
            raise ValueError(f"targets shape {targets.shape} differs from idx shape {idx.shape}")
        # the logits never leave this method, so the loss may reuse their buffer (unless a
        # trace keeps them)
        return F.cross_entropy(self.forward(idx), targets, overwrite_logits=_trace is None)
