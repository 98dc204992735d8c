"""`Config`: a GlassLM's hyper-parameters, checked once when built (nanoGPT's GPTConfig).

The shapes of the parameters are not written here: `glassllm.model.parameter_shapes` reads
them off the layer constructors, so the architecture is described once, in `model.py`.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .checks import check_int, check_real

FAMILIES = ("llama", "gpt2")


@dataclasses.dataclass
class Config:
    """Model hyper-parameters, the single switchboard.

    Fields:
        vocab_size: V, number of token ids.
        d_model: C, width of the residual stream.
        n_layers: number of transformer blocks.
        n_heads: query heads; head_dim = d_model // n_heads.
        n_kv_heads: key/value heads (grouped-query attention, llama family); None means
            n_heads. GPT-2 has no grouped-query attention: gpt2 needs n_kv_heads == n_heads.
        max_len: longest sequence (context length) in tokens.
        family: "llama" or "gpt2" (see `glassllm.model`).
        d_ff: MLP hidden width. None -> 4*d_model for gpt2; for llama 8/3*d_model rounded up
            to a multiple of 32 (Llama's `multiple_of` rule), so the SwiGLU MLP has about the
            parameters of a 4x GELU MLP.
        rope_theta: RoPE base (llama family).
        norm_eps: epsilon of RMSNorm / LayerNorm.
        tie_embeddings: output projection shares the token embedding (gpt2 always ties).

    NumPy integers/floats are accepted and stored as Python int/float (so `to_dict()` is
    plain JSON).

    Raises:
        ValueError (one line, naming the field): sizes that are not integers >= 1 (bools
            refused), rope_theta/norm_eps not finite positive numbers, tie_embeddings not a
            bool, d_model not divisible by n_heads, n_heads not divisible by n_kv_heads, odd
            head_dim with RoPE, unknown family, untied gpt2, gpt2 with n_kv_heads != n_heads
            (neither is GPT-2, nor could be written as a `GPT2LMHeadModel` checkpoint).
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
            setattr(self, name, check_int(getattr(self, name), f"Config.{name}", low=1))
        if not isinstance(self.family, str) or self.family not in FAMILIES:
            raise ValueError(f"Config.family must be one of {FAMILIES}, got {self.family!r}")
        if isinstance(self.tie_embeddings, np.bool_):
            self.tie_embeddings = bool(self.tie_embeddings)
        if not isinstance(self.tie_embeddings, bool):  # "no" would be truthy: refuse it
            raise ValueError(f"Config.tie_embeddings must be True or False, got "
                             f"{self.tie_embeddings!r}")
        self._check_heads_and_family()
        if self.d_ff is None:
            # ceil(8 d / 3 / 32) in integers: exact for any d_model (a float overflows
            # past 1e308 and rounds past 2^53)
            self.d_ff = 4 * self.d_model if self.family == "gpt2" else \
                32 * -(-8 * self.d_model // (3 * 32))
        self.d_ff = check_int(self.d_ff, "Config.d_ff", low=1)
        for name in ("rope_theta", "norm_eps"):
            setattr(self, name, check_real(getattr(self, name), f"Config.{name}", positive=True))

    def _check_heads_and_family(self) -> None:
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
        """Parameter count of `GlassLM(self)`, in O(1), nothing allocated: what
        `glassllm.model.n_params` reads off the layers (registered below, as this module sits
        under the model and does not import it)."""
        return _count_parameters(self)


def _count_parameters(cfg: Config) -> int:
    raise RuntimeError("Config.n_params needs glassllm.model (import glassllm first)")


def register_parameter_count(count) -> None:
    """`glassllm.model` hands its `n_params(cfg)` over when it is imported: the layers are the
    one description of the parameters' shapes, and the model imports this module, not the
    other way round."""
    global _count_parameters
    _count_parameters = count


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
