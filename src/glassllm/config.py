"""`Config`: a GlassLM's hyper-parameters, checked once when built (nanoGPT's GPTConfig).

The shapes of the parameters are not written here: `glassllm.model.parameter_shapes` reads
them off the layer constructors, so the architecture is described once, in `model.py`.
"""
from __future__ import annotations

import dataclasses
import fractions

import numpy as np

from .checks import check_int, check_real

NORMS = ("rms", "layer")
NORM_POSITIONS = ("pre", "sandwich", "post")
QK_NORMS = (None, "head", "proj")
POSITIONS = ("rope", "learned")
ATTN_BIASES = ("none", "qkv", "out", "all")
MLPS = ("swiglu", "geglu", "gelu", "gelu_tanh")
LAYER_TYPES = ("full_attention", "sliding_attention")  # Hugging Face's own values
GATED_MLPS = ("swiglu", "geglu")
# The longest context a config may name: 2^20 positions, past the 1,010,000 of Qwen2.5-1M,
# the longest of the open models glassllm reads. RoPE's (cos, sin) tables are max_len rows
# built at once (a few GB at 2^20), so a corrupt file's context length of 2^31 is refused
# here in one line instead of exhausting memory.
MAX_LEN_LIMIT = 2 ** 20

# The switches a family preset fills, with Llama's values (the default family). A preset lists
# only where it differs. `layer_types` in a preset is a PATTERN cycled over the layers
# (Gemma 2: sliding, full, sliding, ...); a `layer_types` given to Config is one per layer.
_LLAMA = dict(norm="rms", norm_bias=False, norm_offset=False, norm_position="pre",
              qk_norm=None, positions="rope", rotary_pct=1.0, rope_theta=10000.0,
              rope_local_theta=None, attn_bias="none", mlp_bias=False, lm_head_bias=False,
              attn_scale=None, attn_softcap=None, sliding_window=None, layer_types=None,
              parallel_block=False, shared_norm=False, mlp="swiglu", embed_scale=False,
              final_softcap=None, tie_embeddings=True, norm_eps=1e-5)
_LAYERNORM = dict(norm="layer", norm_bias=True)
_GEMMA = dict(norm_offset=True, mlp="geglu", embed_scale=True, norm_eps=1e-6)
_SLIDING, _FULL = LAYER_TYPES[1], LAYER_TYPES[0]
PRESETS: dict[str, dict] = {family: {**_LLAMA, **diff} for family, diff in {
    # Llama (Touvron et al. 2023); SmolLM2 is this architecture
    "llama": {},
    # GPT-2 (Radford et al. 2019): LayerNorm, learned positions, biases, tanh GELU, tied head
    "gpt2": dict(_LAYERNORM, positions="learned", attn_bias="all", mlp_bias=True,
                 mlp="gelu_tanh"),
    # GPT-NeoX / Pythia (Black et al. 2022; Biderman et al. 2023): parallel residual, rotary
    # over a quarter of each head, exact GELU, untied head
    "neox": dict(_LAYERNORM, rotary_pct=0.25, attn_bias="all", mlp_bias=True, mlp="gelu",
                 parallel_block=True, tie_embeddings=False),
    # GPT-Neo (TinyStories): learned positions, no score scaling, a bias on the attention's
    # output projection only, local attention (window 256) on every other layer
    "gptneo": dict(_LAYERNORM, positions="learned", attn_bias="out", mlp_bias=True,
                   mlp="gelu_tanh", attn_scale=1.0, sliding_window=256,
                   layer_types=(_FULL, _SLIDING)),
    # Mistral 7B (Jiang et al. 2023): Llama with sliding-window attention on every layer
    "mistral": dict(sliding_window=4096, layer_types=(_SLIDING,), tie_embeddings=False),
    # Qwen2 / Qwen2.5: Llama with biases on q, k, v
    "qwen2": dict(attn_bias="qkv", rope_theta=1e6, norm_eps=1e-6),
    # Qwen3: Llama with per-head RMSNorm of q and k before RoPE (head_dim set on its own)
    "qwen3": dict(qk_norm="head", rope_theta=1e6, norm_eps=1e-6),
    # Gemma (Gemma Team 2024): (1 + w) RMSNorm, GeGLU, embeddings scaled by sqrt(d_model)
    "gemma": dict(_GEMMA),
    # Gemma 2: + norms before and after attention and MLP, soft-capped scores and logits,
    # local attention (window 4096) on every other layer, starting with layer 0
    "gemma2": dict(_GEMMA, norm_position="sandwich", attn_softcap=50.0, final_softcap=30.0,
                   sliding_window=4096, layer_types=(_SLIDING, _FULL)),
    # Gemma 3: Gemma 2's norms, per-head q/k norm, 5 local layers (window 512, their own RoPE
    # base) to 1 global, no soft-caps
    "gemma3": dict(_GEMMA, norm_position="sandwich", qk_norm="head", rope_theta=1e6,
                   rope_local_theta=10000.0, sliding_window=512,
                   layer_types=(_SLIDING,) * 5 + (_FULL,)),
    # Phi-1.5 (Li et al. 2023): one LayerNorm feeding parallel attention and MLP, rotary over
    # half of each head, biases everywhere (the head too), untied
    "phi": dict(_LAYERNORM, rotary_pct=0.5, attn_bias="all", mlp_bias=True, lm_head_bias=True,
                mlp="gelu_tanh", parallel_block=True, shared_norm=True, tie_embeddings=False),
    # OLMo 2 (OLMo et al. 2024): RMSNorm of the sublayers' outputs only, RMSNorm over the whole
    # q and k projections, untied
    "olmo2": dict(norm_position="post", qk_norm="proj", rope_theta=500000.0, norm_eps=1e-6,
                  tie_embeddings=False),
}.items()}
FAMILIES = tuple(PRESETS)


class _FromPreset:
    """The default of a switch: "the family preset's value" (so an explicit None, e.g.
    qk_norm=None for a qwen3 config, still overrides the preset)."""

    def __repr__(self) -> str:
        return "PRESET"


PRESET = _FromPreset()


@dataclasses.dataclass
class Config:
    """Model hyper-parameters, the single switchboard (nanoGPT's GPTConfig).

    Every architecture is one set of switch values; a family names a preset of them
    (`PRESETS`, `Config.preset`). A switch left out takes the family's value; one given
    overrides it. After construction every field holds its value (`to_dict()` is complete).

    Sizes:
        vocab_size: V, number of token ids.
        d_model: C, width of the residual stream.
        n_layers: number of transformer blocks.
        n_heads: H, query heads.
        n_kv_heads: K, key/value heads (grouped-query attention); None means n_heads.
        head_dim: D, width of one head; None means d_model // n_heads (which must divide).
            Qwen3 and Gemma set it on its own: the projections are C -> H*D and H*D -> C.
        max_len: longest sequence (context length) in tokens, at most MAX_LEN_LIMIT (2^20).
        d_ff: MLP hidden width. None -> 4*d_model for a plain GELU MLP; for a gated one
            (SwiGLU, GeGLU) 8/3*d_model rounded up to a multiple of 32 (Llama's `multiple_of`
            rule), so it has about the parameters of a 4x GELU MLP.

    Family: `family`, the preset's name, one of FAMILIES: "llama" (default), "gpt2", "neox"
    (GPT-NeoX, Pythia), "gptneo" (GPT-Neo, TinyStories), "mistral", "qwen2", "qwen3", "gemma",
    "gemma2", "gemma3", "phi", "olmo2".

    Switches (Llama's value first):
        norm: "rms" (RMSNorm) | "layer" (LayerNorm). norm_bias: LayerNorm has a bias.
        norm_offset: RMSNorm scales by (1 + w) (Gemma; w stored as Hugging Face stores it,
            initialised to 0). norm_eps: the norms' epsilon.
        norm_position: "pre" (x + f(norm(x))) | "sandwich" (x + post_norm(f(norm(x))): Gemma
            2/3) | "post" (x + post_norm(f(x)): OLMo 2).
        qk_norm: None | "head" (RMSNorm over each head's D channels of q and k, before RoPE:
            Qwen3, Gemma 3) | "proj" (RMSNorm over the whole H*D query and K*D key
            projection, before RoPE: OLMo 2). Same kind as `norm_offset` says.
        positions: "rope" (rotary, Su et al. 2021) | "learned" (a table of max_len rows).
        rotary_pct: fraction of head_dim rotated (GPT-NeoX rotary_pct, Phi
            partial_rotary_factor): the first int(D * rotary_pct) channels, rotate-half over
            them; the rest pass unrotated. rope_theta: RoPE base.
        rope_local_theta: RoPE base of the sliding-window layers (Gemma 3), None: rope_theta.
        attn_bias: "none" | "qkv" (q, k, v projections: Qwen2) | "out" (output projection
            only: GPT-Neo) | "all". mlp_bias: the MLP's projections have biases.
        lm_head_bias: the untied output projection has a bias (Phi).
        attn_scale: the scores' factor, None -> 1/sqrt(head_dim) (Gemma 2:
            query_pre_attn_scalar**-0.5; GPT-Neo: 1.0).
        attn_softcap: scores become c * tanh(scores / c) (Gemma 2), None: no cap.
        sliding_window: W, a sliding layer's query i sees keys i-W < j <= i. None: no window.
        layer_types: per layer "full_attention" | "sliding_attention" (Hugging Face's field
            and values), a tuple of n_layers; None: every layer full. A family preset gives a
            pattern, cycled over the layers.
        parallel_block: x + attention(norm1(x)) + mlp(norm2(x)) (GPT-NeoX
            use_parallel_residual); shared_norm: one norm feeds both (Phi).
        mlp: "swiglu" (silu(gate) * up) | "geglu" (gelu_tanh(gate) * up, Gemma) | "gelu" (exact,
            erf) | "gelu_tanh" (GPT-2's).
        embed_scale: the token embeddings are multiplied by sqrt(d_model), rounded to float32
            (Gemma). final_softcap: logits become c * tanh(logits / c) (Gemma 2).
        tie_embeddings: the output projection is the token embedding transposed.

    NumPy integers/floats are accepted and stored as Python int/float (so `to_dict()` is
    plain JSON; a JSON list for layer_types is stored as a tuple).

    Raises:
        ValueError (one line, naming the field): sizes that are not integers >= 1 (bools
            refused), max_len past MAX_LEN_LIMIT, reals not finite positive numbers, a switch
            outside its values, d_model not divisible by n_heads (head_dim None), n_heads not
            divisible by n_kv_heads, an odd rotated width with RoPE, layer_types of another
            length than n_layers or a sliding layer without sliding_window, impossible combinations
            (norm_bias or a LayerNorm with norm_offset, shared_norm without parallel_block, a
            parallel block with sandwich/post norms, lm_head_bias on a tied head), unknown
            family, gpt2 untied or with n_kv_heads != n_heads (not writable as a
            `GPT2LMHeadModel`).
    """

    vocab_size: int = 257
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None
    max_len: int = 256
    family: str = "llama"
    d_ff: int | None = None
    head_dim: int | None = None
    rope_theta: float = PRESET
    norm_eps: float = PRESET
    tie_embeddings: bool = PRESET
    norm: str = PRESET
    norm_bias: bool = PRESET
    norm_offset: bool = PRESET
    norm_position: str = PRESET
    qk_norm: str | None = PRESET
    positions: str = PRESET
    rotary_pct: float = PRESET
    rope_local_theta: float | None = PRESET
    attn_bias: str = PRESET
    mlp_bias: bool = PRESET
    lm_head_bias: bool = PRESET
    attn_scale: float | None = PRESET
    attn_softcap: float | None = PRESET
    sliding_window: int | None = PRESET
    layer_types: tuple | None = PRESET
    parallel_block: bool = PRESET
    shared_norm: bool = PRESET
    mlp: str = PRESET
    embed_scale: bool = PRESET
    final_softcap: float | None = PRESET

    @classmethod
    def preset(cls, family: str, **overrides) -> "Config":
        """The `family` preset's switches, with `overrides` (any field) on top.
        Raises ValueError as the constructor."""
        return cls(family=family, **overrides)

    def __post_init__(self):
        if not isinstance(self.family, str) or self.family not in FAMILIES:
            raise ValueError(f"Config.family must be one of {FAMILIES}, got {self.family!r}")
        self._fill_from_preset()
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads"):
            setattr(self, name, check_int(getattr(self, name), f"Config.{name}", low=1))
        self.max_len = check_int(self.max_len, "Config.max_len", low=1, high=MAX_LEN_LIMIT)
        self._check_switches()
        self._check_heads_and_family()
        if self.d_ff is None:
            # ceil(8 d / 3 / 32) in integers: exact for any d_model (a float overflows
            # past 1e308 and rounds past 2^53)
            self.d_ff = 32 * -(-8 * self.d_model // (3 * 32)) if self.mlp in GATED_MLPS \
                else 4 * self.d_model
        self.d_ff = check_int(self.d_ff, "Config.d_ff", low=1)

    def _fill_from_preset(self) -> None:
        preset = PRESETS[self.family]
        for name, value in preset.items():
            if getattr(self, name) is PRESET:
                if name == "layer_types" and value is not None:  # a pattern, cycled
                    n = check_int(self.n_layers, "Config.n_layers", low=1)
                    value = tuple(value[i % len(value)] for i in range(n))
                setattr(self, name, value)

    def _check_switches(self) -> None:
        for name in ("tie_embeddings", "norm_bias", "norm_offset", "mlp_bias", "lm_head_bias",
                     "parallel_block", "shared_norm", "embed_scale"):
            setattr(self, name, _check_bool(getattr(self, name), name))
        for name, values in (("norm", NORMS), ("norm_position", NORM_POSITIONS),
                             ("qk_norm", QK_NORMS), ("positions", POSITIONS),
                             ("attn_bias", ATTN_BIASES), ("mlp", MLPS)):
            if getattr(self, name) not in values or isinstance(getattr(self, name), bool):
                raise ValueError(f"Config.{name} must be one of {values}, got "
                                 f"{getattr(self, name)!r}")
        for name in ("rope_theta", "norm_eps"):
            setattr(self, name, check_real(getattr(self, name), f"Config.{name}", positive=True))
        for name in ("rope_local_theta", "attn_scale", "attn_softcap", "final_softcap"):
            if getattr(self, name) is not None:
                setattr(self, name, check_real(getattr(self, name), f"Config.{name}",
                                               positive=True))
        self.rotary_pct = check_real(self.rotary_pct, "Config.rotary_pct", high=1.0,
                                     positive=True)
        if self.sliding_window is not None:
            self.sliding_window = check_int(self.sliding_window, "Config.sliding_window", low=1)
        self._check_layer_types()
        if self.norm == "layer" and self.norm_offset:
            raise ValueError("Config.norm_offset: the (1 + w) scale is Gemma's RMSNorm's; "
                             "norm='layer' has none")
        if self.norm == "rms" and self.norm_bias:
            raise ValueError("Config.norm_bias: RMSNorm has no bias (norm='rms')")
        if self.shared_norm and not self.parallel_block:
            raise ValueError("Config.shared_norm needs parallel_block=True (one norm feeding "
                             "parallel attention and MLP)")
        if self.parallel_block and self.norm_position != "pre":
            raise ValueError(f"Config.parallel_block: a parallel block is pre-norm, got "
                             f"norm_position={self.norm_position!r}")
        if self.lm_head_bias and self.tie_embeddings:
            raise ValueError("Config.lm_head_bias needs an untied head (tie_embeddings=False)")

    def _check_layer_types(self) -> None:
        types = self.layer_types
        if types is None:
            return
        if isinstance(types, (str, bytes)) or not hasattr(types, "__len__"):
            raise ValueError(f"Config.layer_types must be a list of {LAYER_TYPES} or None, "
                             f"got {types!r}")
        types = tuple(types)
        bad = [t for t in types if t not in LAYER_TYPES]
        if bad:
            raise ValueError(f"Config.layer_types: {bad[0]!r} is not one of {LAYER_TYPES}")
        if len(types) != self.n_layers:
            raise ValueError(f"Config.layer_types has {len(types)} entries for "
                             f"n_layers={self.n_layers}")
        if _SLIDING in types and self.sliding_window is None:
            raise ValueError("Config.layer_types has sliding_attention layers but "
                             "sliding_window is None")
        self.layer_types = types

    def _check_heads_and_family(self) -> None:
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"Config: d_model={self.d_model} is not divisible by "
                                 f"n_heads={self.n_heads}")
            self.head_dim = self.d_model // self.n_heads
        self.head_dim = check_int(self.head_dim, "Config.head_dim", low=1)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"Config: n_heads={self.n_heads} is not divisible by "
                             f"n_kv_heads={self.n_kv_heads}")
        if self.positions == "rope" and (self.rotary_dim < 2 or self.rotary_dim % 2):
            raise ValueError(f"Config: RoPE needs an even head_dim x rotary_pct >= 2, got "
                             f"{self.rotary_dim} (head_dim={self.head_dim}, "
                             f"rotary_pct={self.rotary_pct})")
        if self.family == "gpt2" and not self.tie_embeddings:
            raise ValueError("Config: the gpt2 family always ties its embeddings")
        if self.family == "gpt2" and self.n_kv_heads != self.n_heads:
            raise ValueError(f"Config: the gpt2 family has no grouped-query attention: "
                             f"n_kv_heads={self.n_kv_heads} must equal n_heads={self.n_heads}")

    @property
    def rotary_dim(self) -> int:
        """Channels of each head RoPE turns: int(head_dim * rotary_pct) (as GPT-NeoX and Phi
        compute it; exact for any head_dim, where a float product would overflow)."""
        if self.rotary_pct == 1.0:
            return self.head_dim
        try:  # float arithmetic, as theirs: int(10 * 0.3) is 3
            return int(self.head_dim * self.rotary_pct)
        except OverflowError:  # a head_dim past float's range (a damaged file)
            return int(fractions.Fraction(self.head_dim) * fractions.Fraction(self.rotary_pct))

    def layer_is_sliding(self, layer: int) -> bool:
        """True when block `layer` attends within `sliding_window` only."""
        return self.layer_types is not None and self.layer_types[layer] == _SLIDING

    def to_dict(self) -> dict:
        """Every field, plain JSON values (layer_types a tuple, written as a list). head_dim is
        None when it is d_model // n_heads, so a dict edited to another d_model or n_heads
        (and an older reader) derives it again."""
        d = dataclasses.asdict(self)
        if self.head_dim * self.n_heads == self.d_model:
            d["head_dim"] = None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        """Build from `to_dict()` output, or an older dict without the switches (they take
        the family's preset). Raises ValueError on unknown or invalid fields."""
        return dataclass_from_dict(cls, d)

    def n_params(self) -> int:
        """Parameter count of `GlassLM(self)` (a tied head counted once), in O(1), nothing
        allocated: `parameter_count(self)`."""
        return parameter_count(self)


def _check_bool(value, name: str) -> bool:
    if isinstance(value, np.bool_):
        value = bool(value)
    if not isinstance(value, bool):  # "no" would be truthy: refuse it
        raise ValueError(f"Config.{name} must be True or False, got {value!r}")
    return value


def parameter_count(cfg: Config) -> int:
    """Number of parameters of `GlassLM(cfg)`, from the shapes the config implies (the table
    of shapes in `glassllm.model`'s docstring; tests/test_model.py checks it against the built
    model of every family preset, tied and untied). C d_model, H/K query/key-value heads of D
    channels, F d_ff, V vocab_size; Linear weights C x out plus a bias of out.

        head:  token embedding V*C, + learned positions max_len*C
        block: attention q C*HD, k and v C*KD each, output HD*C (biases by attn_bias),
               q/k norms (D each per head, HD and KD per projection), MLP gate (gated
               kinds) and up C*F, down F*C (biases by mlp_bias), norms by norm_position
        tail:  final norm, + untied head C*V (+ V with lm_head_bias)
    A norm is C weights, 2C for a LayerNorm with a bias (RMSNorm has none).
    """
    c, hd, kd, f = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, \
        cfg.d_ff
    norm = c * (2 if cfg.norm == "layer" and cfg.norm_bias else 1)
    qkv_bias, out_bias = cfg.attn_bias in ("qkv", "all"), cfg.attn_bias in ("out", "all")
    attention = c * hd + 2 * c * kd + hd * c + qkv_bias * (hd + 2 * kd) + out_bias * c
    attention += {None: 0, "head": 2 * cfg.head_dim, "proj": hd + kd}[cfg.qk_norm]
    gated = cfg.mlp in GATED_MLPS
    mlp = (1 + gated) * c * f + f * c + cfg.mlp_bias * ((1 + gated) * f + c)
    pre, post = cfg.norm_position != "post", cfg.norm_position != "pre"
    norms = norm * (pre + (pre and not cfg.shared_norm) + 2 * post)
    head = cfg.vocab_size * c + (cfg.max_len * c if cfg.positions == "learned" else 0)
    tail = norm + (0 if cfg.tie_embeddings else c * cfg.vocab_size + cfg.lm_head_bias
                   * cfg.vocab_size)
    return int(head + cfg.n_layers * (attention + mlp + norms) + tail)


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
