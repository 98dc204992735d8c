"""GlassLM: a decoder-only transformer, one switchboard for the small open models.

The default, ``family="llama"``, follows Llama (Touvron et al. 2023) as Hugging Face's
`LlamaForCausalLM`: pre-RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP, no
biases. ``family="gpt2"`` follows GPT-2 (Radford et al. 2019) as nanoGPT / `GPT2LMHeadModel`:
pre-LayerNorm, learned positions, tanh-GELU MLP, biases everywhere, tied head. The other
families (GPT-NeoX/Pythia, GPT-Neo, Mistral, Qwen2, Qwen3, Gemma 1/2/3, Phi, OLMo 2) are presets
of the same switches (`glassllm.config.Config`, `PRESETS`): where the norms sit and what they
are, q/k norms, partial rotary, biases, score scale and soft-cap, sliding windows, parallel
blocks, the MLP's activation, embedding scale, final soft-cap.

Parameter names (Linear weights are [in, out]; a norm's bias only for LayerNorm with
norm_bias; Gemma's norm weights are the w of (1 + w), as Hugging Face stores them):

    token_embedding.weight (V, C)            position_embedding.weight (max_len, C) [learned]
    blocks.{i}.attention_norm.weight/bias    [pre/sandwich norms; a parallel block's norm1]
    blocks.{i}.attention.query|key|value|output.weight/bias   (C, H*D) (C, K*D) (C, K*D)
                                                              (H*D, C); biases by attn_bias
    blocks.{i}.attention.q_norm|k_norm.weight  (D,) [qk_norm "head"] or (H*D,)/(K*D,) ["proj"]
    blocks.{i}.attention_post_norm.weight    [sandwich/post norms]
    blocks.{i}.mlp_norm.weight/bias          [pre/sandwich; a parallel block's norm2 unless
                                              shared_norm]
    blocks.{i}.mlp.gate|up|down.weight/bias  (C, F) (C, F) (F, C); gate for SwiGLU/GeGLU only
    blocks.{i}.mlp_post_norm.weight          [sandwich/post norms]
    final_norm.weight/bias                   lm_head.weight (C, V), lm_head.bias [untied]

Every value a reader may want to see goes through `tap(name, value)`, the identity unless a
trace of this model is open in this thread (`glassllm.taps`; the names are the frozen table
`glassllm.lens.trace.NAMES`). The model is weights only (like llama2.c's
`TransformerWeights`); decoding state lives in a `KVCache` (llama2.c's `RunState`). There is
no dropout and no train/eval mode. The shapes of the parameters, needed to check a file before
a possibly huge model is built, are read off these constructors (`parameter_shapes`, below).
"""
from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterator

import numpy as np

from . import functional as F
from . import config, devices, nn
from .config import FAMILIES, Config, dataclass_from_dict  # noqa: F401  (glassllm.model.Config)
from .nn import Embedding, LayerNorm, Linear, Module, RMSNorm
from .taps import attend, hook_for, tap, watch
from .tensor import Tensor


class Attention(Module):
    """Multi-head causal self-attention with grouped-query heads: q, k, v projections
    (C -> H*D, K*D, K*D), optional q/k norms, RoPE (unless learned positions), the output
    projection H*D -> C. Biases as `cfg.attn_bias` says."""

    def __init__(self, cfg: Config, rng: np.random.Generator):
        qkv_bias = cfg.attn_bias in ("qkv", "all")
        H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.query = Linear(cfg.d_model, H * D, rng, qkv_bias)
        self.key = Linear(cfg.d_model, K * D, rng, qkv_bias)
        self.value = Linear(cfg.d_model, K * D, rng, qkv_bias)
        # GPT-2's residual-projection init: std shrinks with depth so the residual stream's
        # variance does not grow with the number of blocks.
        self.output = Linear(H * D, cfg.d_model, rng, cfg.attn_bias in ("out", "all"),
                             std=0.02 / math.sqrt(2 * cfg.n_layers))
        if cfg.qk_norm is not None:  # RMSNorm of each head ("head") or the whole projection
            per_head = cfg.qk_norm == "head"
            self.q_norm = RMSNorm(D if per_head else H * D, cfg.norm_eps, cfg.norm_offset)
            self.k_norm = RMSNorm(D if per_head else K * D, cfg.norm_eps, cfg.norm_offset)
        self.cfg = cfg

    def __call__(self, x: Tensor, rope, cache: KVCache | None, i: int) -> Tensor:
        """x (B, T, C) of block i -> (B, T, C); rope: the (cos, sin) rows of x's positions for
        this layer, or None (learned positions); cache: the KVCache these positions extend,
        or None."""
        B, T, _ = x.shape
        H, K, D = self.cfg.n_heads, self.cfg.n_kv_heads, self.cfg.head_dim
        x = tap(f"blocks.{i}.attention.input", x)
        q = self._normed(i, "q", self.query(x), B, T, H)
        k = self._normed(i, "k", self.key(x), B, T, K)
        q = tap(f"blocks.{i}.attention.q", _rotate(q, rope))
        k = tap(f"blocks.{i}.attention.k", _rotate(k, rope))
        v = tap(f"blocks.{i}.attention.v", self.value(x).reshape(B, T, K, D))
        y = tap(f"blocks.{i}.attention.head_output", self._attend(i, q, k, v, cache))
        return tap(f"blocks.{i}.attention.output", self.output(y.reshape(B, T, H * D)))

    def _attend(self, i: int, q: Tensor, k: Tensor, v: Tensor, cache: KVCache | None):
        """Causal attention of block i, (B, T, H, D): with the cache's keys and values when
        decoding, the score scale and soft-cap, and the window on a sliding layer. A sliding
        layer's cache keeps every position; the keys past the window are masked."""
        cfg = self.cfg
        start = 0 if cache is None else cache.length
        if cache is not None:  # decoding: this step's keys/values join the cached ones
            k, v = cache.extend(i, k, v)
        window = cfg.sliding_window if cfg.layer_is_sliding(i) else None
        return attend(i, q, k, v, start, scale=cfg.attn_scale, softcap=cfg.attn_softcap,
                      window=window)

    def _normed(self, i: int, which: str, x: Tensor, B: int, T: int, heads: int) -> Tensor:
        """The projection x (B, T, heads*D) as (B, T, heads, D), through the q/k norm if any
        (over the whole projection for "proj", each head for "head"; before RoPE)."""
        qk_norm = self.cfg.qk_norm
        if qk_norm == "proj":
            x = getattr(self, f"{which}_norm")(x)
        x = x.reshape(B, T, heads, self.cfg.head_dim)
        if qk_norm == "head":
            x = getattr(self, f"{which}_norm")(x)
        if qk_norm is not None:
            x = tap(f"blocks.{i}.attention.{which}_normed", x)
        return x


class MLP(Module):
    """Gated (SwiGLU, GeGLU): down(act(gate(x)) * up(x)); plain (GELU): down(act(up(x)))."""

    def __init__(self, cfg: Config, rng: np.random.Generator):
        self.kind = cfg.mlp
        bias = cfg.mlp_bias
        if self.kind in config.GATED_MLPS:
            self.gate = Linear(cfg.d_model, cfg.d_ff, rng, bias)
        self.up = Linear(cfg.d_model, cfg.d_ff, rng, bias)
        self.down = Linear(cfg.d_ff, cfg.d_model, rng, bias,
                           std=0.02 / math.sqrt(2 * cfg.n_layers))

    def __call__(self, x: Tensor, i: int) -> Tensor:
        x = tap(f"blocks.{i}.mlp.input", x)
        if self.kind in config.GATED_MLPS:  # hidden_pre is the activation's input: gate(x)
            g = tap(f"blocks.{i}.mlp.hidden_pre", self.gate(x))
            up = tap(f"blocks.{i}.mlp.up", self.up(x))
            h = F.swiglu(g, up) if self.kind == "swiglu" else F.geglu(g, up)
        else:  # ... or up(x)
            pre = tap(f"blocks.{i}.mlp.hidden_pre", self.up(x))
            h = F.gelu(pre) if self.kind == "gelu_tanh" else F.gelu_exact(pre)
        h = tap(f"blocks.{i}.mlp.hidden_post", h)
        return tap(f"blocks.{i}.mlp.output", self.down(h))


class Block(Module):
    """One transformer block, its norms where `cfg.norm_position` puts them:

    - "pre": x + attention(norm(x)), then h + mlp(norm(h));
    - "sandwich" (Gemma 2/3): x + post_norm(attention(norm(x))), the same for the MLP;
    - "post" (OLMo 2): x + post_norm(attention(x)), the same for the MLP;
    - parallel_block (GPT-NeoX, Phi): x + attention(norm1(x)) + mlp(norm2(x)), both sublayers
      reading residual_in (Phi: one norm, norm1 = norm2).
    """

    def __init__(self, cfg: Config, rng: np.random.Generator):
        pre, post = cfg.norm_position != "post", cfg.norm_position != "pre"
        if pre:
            self.attention_norm = _norm(cfg)
        self.attention = Attention(cfg, rng)
        if post:
            self.attention_post_norm = _norm(cfg)
        if pre and not cfg.shared_norm:
            self.mlp_norm = _norm(cfg)
        self.mlp = MLP(cfg, rng)
        if post:
            self.mlp_post_norm = _norm(cfg)
        self.cfg = cfg

    def __call__(self, x: Tensor, rope, cache: KVCache | None, i: int) -> Tensor:
        """The residual stream (B, T, C) through block i (arguments as `Attention`'s)."""
        x = tap(f"blocks.{i}.residual_in", x)
        if self.cfg.parallel_block:
            h = self.attention_norm(x)
            mlp_in = h if self.cfg.shared_norm else self.mlp_norm(x)
            x = tap(f"blocks.{i}.residual_mid", x + self.attention(h, rope, cache, i))
            return tap(f"blocks.{i}.residual_out", x + self.mlp(mlp_in, i))
        a = self.attention(self._pre(x, "attention_norm"), rope, cache, i)
        x = tap(f"blocks.{i}.residual_mid", x + self._post(a, i, "attention"))
        m = self.mlp(self._pre(x, "mlp_norm"), i)
        return tap(f"blocks.{i}.residual_out", x + self._post(m, i, "mlp"))

    def _pre(self, x: Tensor, norm: str) -> Tensor:
        return x if self.cfg.norm_position == "post" else getattr(self, norm)(x)

    def _post(self, y: Tensor, i: int, sublayer: str) -> Tensor:
        if self.cfg.norm_position == "pre":
            return y
        y = getattr(self, f"{sublayer}_post_norm")(y)
        return tap(f"blocks.{i}.{sublayer}.output_normed", y)


class GlassLM(Module):
    """The language model: token ids in, next-token logits out.

    `GlassLM(cfg, seed=0)` initialises deterministically from `np.random.default_rng(seed)`:
    N(0, 0.02) weights (residual projections 0.02/sqrt(2*n_layers)), unit norm gains, zero
    biases, as nanoGPT. `device` ("cpu", "cuda", "cuda:N", "strict"; None: "cpu" or the
    environment's GLASSLLM_DEVICE, `glassllm.devices`) is where the weights live: they are drawn
    on the host and then moved, so one seed gives the same weights on every device.
    `model.to(device)` moves a model later.

    Raises:
        MemoryError: the float32 weights alone (4 bytes x `cfg.n_params()`) exceed the
            machine's physical memory. Checked before anything is allocated: each layer's
            arrays would fit, so under Linux's memory overcommit NumPy would never raise, and
            the kernel's OOM killer would end the process silently once memory ran out.
        ValueError: an unknown device name, or "cuda" without CuPy or a GPU
                (`glassllm.devices.DeviceUnavailable`).
    """

    def __init__(self, cfg: Config, seed: int = 0, device: str | None = None):
        device = devices.parse(device)
        _check_fits_in_memory(cfg)
        self.cfg = cfg
        rng = np.random.default_rng(seed)
        self.token_embedding = Embedding(cfg.vocab_size, cfg.d_model, rng)
        if cfg.positions == "learned":
            self.position_embedding = Embedding(cfg.max_len, cfg.d_model, rng)
        self.rope_cos, self.rope_sin = _rope_tables(cfg, cfg.rope_theta)
        # the sliding layers' own RoPE base (Gemma 3); None: they use the tables above
        self.rope_local_cos, self.rope_local_sin = _rope_tables(cfg, cfg.rope_local_theta)
        self.blocks = [Block(cfg, rng) for _ in range(cfg.n_layers)]
        self.final_norm = _norm(cfg)
        if not cfg.tie_embeddings:
            self.lm_head = Linear(cfg.d_model, cfg.vocab_size, rng, cfg.lm_head_bias)
        if device != "cpu" and not nn.building_shapes_only():
            self.to(device)

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
        start = 0 if cache is None else cache.length
        idx = self.check_ids(idx, start=start)
        with watch(self, idx, start, cache):  # a trace of this model sees the taps
            x, rope = self.embed(idx, start)
            local = self.local_rope(start, idx.shape[1])
            for i, block in enumerate(self.blocks):
                sliding = local is not None and self.cfg.layer_is_sliding(i)
                x = block(x, local if sliding else rope, cache, i)
            if cache is not None:
                cache.length = start + idx.shape[1]
            return self.logits(tap("final_norm", self.final_norm(x)))

    def embed(self, idx: np.ndarray, start: int) -> tuple[Tensor, tuple | None]:
        """The residual stream's start for ids (B, T) at positions start..start+T: token rows
        (times sqrt(d_model) in float32 with embed_scale, Gemma) + learned position rows
        (learned positions), and the RoPE rows (cos, sin) of those positions (None with
        learned positions)."""
        T = idx.shape[1]
        x = self.token_embedding(idx)
        if self.cfg.embed_scale:  # Hugging Face rounds the factor to the dtype first (as a
            x = x * math.sqrt(self.cfg.d_model)  # Python float does, NumPy's NEP 50)
        x = tap("token_embedding", x)
        if self.cfg.positions == "learned":
            positions = self.position_embedding(np.arange(start, start + T))
            return x + tap("position_embedding", positions), None
        return x, (self.rope_cos[start:start + T, :], self.rope_sin[start:start + T, :])

    def local_rope(self, start: int, T: int) -> tuple | None:
        """The sliding layers' RoPE rows of positions start..start+T (their own base,
        rope_local_theta), or None when they share `embed`'s."""
        if self.rope_local_cos is None:
            return None
        return self.rope_local_cos[start:start + T, :], self.rope_local_sin[start:start + T, :]

    def logits(self, x: Tensor) -> Tensor:
        """The final norm's output (B, T, C) -> logits (B, T, V): `unembed`, soft-capped with
        final_softcap (then "logits_pre_softcap" is traced before the cap)."""
        z = self.unembed(x)
        if self.cfg.final_softcap is None:
            return tap("logits", z)
        z = tap("logits_pre_softcap", z)
        return tap("logits", F.softcap(z, self.cfg.final_softcap))

    def unembed(self, x: Tensor) -> Tensor:
        """(B, T, C) -> (B, T, V) logits before any soft-cap: the token embedding transposed,
        or lm_head (with its bias, Phi)."""
        if self.cfg.tie_embeddings:
            return F.unembed(x, self.token_embedding.weight)
        return self.lm_head(x)

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
        # trace of this model keeps them)
        return F.cross_entropy(self.forward(idx), targets,
                               overwrite_logits=hook_for(self) is None)

    def check_ids(self, idx, what: str = "idx", start: int = 0) -> np.ndarray:
        """Validate token ids; return them as a (B, T) integer array.

        Raises:
            ValueError: not integers, not 1-D/2-D, empty, start+T > max_len, or an id outside
                [0, vocab_size) (the message gives the first bad id and where it is).
        """
        idx = devices.to_host(idx.data if isinstance(idx, Tensor) else idx)  # checked on host
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


class KVCache:
    """Keys and values of the positions already seen, for decoding one token at a time.

    Buffers are preallocated: k, v of shape (n_layers, B, max_len, n_kv_heads, head_dim),
    float32. `length` is how many positions are filled (`GlassLM.forward` advances it).
    A sliding-window layer's buffer keeps every position too: its attention masks the keys
    past the window (`functional.causal_mask`), so decoding gives the full forward's logits;
    it saves no memory (a ring of `sliding_window` rows would, at the cost of positions that
    are no longer the buffer's rows). The buffers live on `device` (the model's); a cache made
    for another device moves there at its first `extend`.
    """

    def __init__(self, cfg: Config, batch_size: int = 1, device: str = "cpu"):
        shape = (cfg.n_layers, batch_size, cfg.max_len, cfg.n_kv_heads, cfg.head_dim)
        self.k = devices.zeros(shape, device)
        self.v = devices.zeros(shape, device)
        self.length = 0

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store this step's k, v (B, T, K, D) of block `layer` at positions length..length+T;
        return the keys and values of every position so far, (B, length + T, K, D)."""
        start, end = self.length, self.length + k.shape[1]
        if type(self.k) is not type(k.data):  # made for another device than the model's
            device = devices.device_of(k.data)
            self.k, self.v = (devices.to_device(a, device) for a in (self.k, self.v))
        self.k[layer, :, start:end, ...] = k.data
        self.v[layer, :, start:end, ...] = v.data
        return Tensor(self.k[layer, :, :end, ...]), Tensor(self.v[layer, :, :end, ...])


def _norm(cfg: Config) -> Module:
    """The model's norm over d_model: RMSNorm (with Gemma's 1 + w if norm_offset) or LayerNorm
    (with a bias if norm_bias)."""
    if cfg.norm == "rms":
        return RMSNorm(cfg.d_model, cfg.norm_eps, cfg.norm_offset)
    return LayerNorm(cfg.d_model, cfg.norm_eps, cfg.norm_bias)


def _rotate(x: Tensor, rope) -> Tensor:
    """RoPE of x (B, T, heads, D) with the rows (cos, sin) of its positions; x if no RoPE."""
    return x if rope is None else F.rope(x, *rope)


def _rope_tables(cfg: Config, theta: float | None):
    """RoPE's (cos, sin) tables (max_len, rotary_dim) of base theta; (None, None) for learned
    positions, a None theta, and in a shapes-only build (they are not parameters)."""
    if cfg.positions != "rope" or theta is None or nn.building_shapes_only():
        return None, None
    return F.rope_tables(cfg.max_len, cfg.rotary_dim, theta)


# --------------------------------------------------------------------------- parameter shapes
# Files and checkpoints are checked against a config before a possibly huge model is built.
# The shapes come from the constructors above: a one-block GlassLM built shapes only
# (`nn.shapes_only`: parameters are zero-stride views, nothing allocated) is read once per
# config; block 0 stands for every block, so each function is O(1) in n_layers.
def parameter_shapes(cfg: Config) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter of `GlassLM(cfg)`, in `named_parameters()` order,
    without building it. Lazy, so a corrupt n_layers costs nothing until iterated."""
    head, block, tail = _layout(cfg)
    yield from head
    for i in range(cfg.n_layers):
        for name, shape in block:
            yield f"blocks.{i}.{name}", shape
    yield from tail


def n_parameter_tensors(cfg: Config) -> int:
    """len(list(parameter_shapes(cfg))), in O(1)."""
    head, block, tail = _layout(cfg)
    return len(head) + cfg.n_layers * len(block) + len(tail)


def parameter_shape(cfg: Config, name: str) -> tuple[int, ...] | None:
    """Shape of parameter `name` in `GlassLM(cfg)`, or None if it has no such parameter.
    O(1) whatever n_layers is (block names are matched against block 0's)."""
    head, block, tail = _layout(cfg)
    parts = name.split(".", 2)
    if parts[0] != "blocks":
        return dict(head + tail).get(name)
    layer = parts[1] if len(parts) == 3 else ""
    if not (layer.isascii() and layer.isdigit() and str(int(layer)) == layer
            and int(layer) < cfg.n_layers):
        return None
    return dict(block).get(parts[2])


def n_params(cfg: Config) -> int:
    """Parameter count of `GlassLM(cfg)` (shared tensors once), in O(1)."""
    head, block, tail = _layout(cfg)
    size = lambda shapes: sum(math.prod(shape) for _, shape in shapes)  # noqa: E731
    return size(head) + cfg.n_layers * size(block) + size(tail)


def _layout(cfg: Config):
    """(head, block, tail) of (name, shape): the parameters before the blocks, those of one
    block (names without "blocks.0."), those after."""
    # the layer types change no parameter's shape: one block without them stands for any
    one_block = {**cfg.to_dict(), "n_layers": 1, "layer_types": None, "sliding_window": None}
    return _layout_of(tuple(one_block.items()))


@functools.lru_cache(maxsize=32)
def _layout_of(fields: tuple) -> tuple[tuple, tuple, tuple]:
    with nn.shapes_only():
        skeleton = GlassLM(Config(**dict(fields)))
    named = [(name, tuple(p.shape)) for name, p in skeleton.named_parameters()]
    first = next(i for i, (name, _) in enumerate(named) if name.startswith("blocks.0."))
    block = [(name[len("blocks.0."):], s) for name, s in named if name.startswith("blocks.0.")]
    return tuple(named[:first]), tuple(block), tuple(named[first + len(block):])


def _check_fits_in_memory(cfg: Config) -> None:
    """MemoryError if the float32 weights of `GlassLM(cfg)` exceed the physical memory
    (unknown memory size, e.g. no sysconf, or a shapes-only build: no check)."""
    if nn.building_shapes_only():
        return
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return
    n = n_params(cfg)
    if total > 0 and 4 * n > total:
        raise MemoryError(f"a model of {n:,} parameters needs {4 * n / 2**30:,.1f} GiB for its "
                          f"float32 weights alone, more than this machine's "
                          f"{total / 2**30:,.1f} GiB of memory")
