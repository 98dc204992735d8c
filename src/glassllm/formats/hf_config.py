"""config.json of a Hugging Face checkpoint <-> glassllm `Config`, for every supported class.

One reader and one writer per transformers `model_type`: the reader turns the fields that
change the arithmetic into `Config` switches (`glassllm.config`), the writer the switches back
into the fields transformers reads (its `configuration_<model>.py` files, transformers 5; the
4.x spellings `rope_theta`, `rope_scaling`, `rotary_pct`, `rope_local_base_freq` are read too).

Nothing is ignored silently: every field a reader does not consult must be one that never
changes the logits (token ids, dropouts, initialisation, bookkeeping: `_HARMLESS`) or hold an
"off" value (null, false, 0, empty). Any other -- rope scaling, mixture-of-experts, attention
sinks, a field a later transformers adds -- is refused with one line naming the file and the
field, so a different model is never loaded as if it were this one.
"""
from __future__ import annotations

import math

from ..checks import check_int, check_real
from ..config import PRESETS, Config

# Fields that never change a forward pass: ids, dropouts (glassllm has none; eval mode), init,
# bookkeeping, heads other than the LM head, generation defaults; fields the readers below
# replace by what they imply (Qwen2's max_window_layers by layer_types, Gemma 3's pattern);
# is_llama_config, nanotron's marker in SmolLM2's config.json, which transformers ignores;
# cache_implementation ("hybrid" in Gemma 2/3's config.json), the KV cache generate() builds,
# which holds the same keys and values.
_HARMLESS = frozenset("""
    architectures model_type transformers_version _name_or_path name_or_path torch_dtype dtype
    bos_token_id eos_token_id pad_token_id sep_token_id decoder_start_token_id
    use_cache initializer_range initializer_factor gradient_checkpointing output_attentions
    output_hidden_states return_dict is_decoder is_encoder_decoder add_cross_attention
    attention_dropout attn_pdrop resid_pdrop embd_pdrop embed_dropout resid_dropout
    hidden_dropout hidden_dropout_prob attention_probs_dropout_prob classifier_dropout
    summary_type summary_use_proj summary_activation summary_proj_to_labels summary_first_dropout
    id2label label2id num_labels problem_type task_specific_params finetuning_task
    max_length min_length do_sample num_beams temperature top_k top_p repetition_penalty
    tokenizer_class prefix chunk_size_feed_forward pruned_heads tie_encoder_decoder
    torchscript use_bfloat16 output_scores return_dict_in_generate
    max_window_layers use_sliding_window _sliding_window_pattern sliding_window_pattern
    is_llama_config cache_implementation
""".split())

ARCHITECTURES = {  # model_type -> the transformers class `to_hf` writes
    "gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "gpt_neox": "GPTNeoXForCausalLM",
    "gpt_neo": "GPTNeoForCausalLM", "phi": "PhiForCausalLM", "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
}
MODEL_TYPES = {  # glassllm family -> model_type
    "gpt2": "gpt2", "llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
    "neox": "gpt_neox", "gptneo": "gpt_neo", "phi": "phi", "gemma": "gemma",
    "gemma2": "gemma2", "gemma3": "gemma3_text", "olmo2": "olmo2",
}


class _Fields:
    """The config.json dict, with a record of the fields read (so the rest can be checked)."""

    def __init__(self, hf: dict, where: str):
        self.hf, self.where, self.read = hf, where, set()

    def raw(self, name: str, default=None):
        self.read.add(name)
        return self.hf.get(name, default)

    def _given(self, name: str, default):
        """The field, null read as "not set" (as transformers reads it): then `default`;
        `...` as the default makes the field required."""
        value = self.raw(name)
        value = default if value is None else value
        if value is ...:
            raise ValueError(f"{self.where}: field {name!r} is missing")
        return value

    def int(self, name: str, default=..., low: int = 1):
        value = self._given(name, default)
        return None if value is None else check_int(value, f"{self.where}: field {name!r}",
                                                    low=low)

    def real(self, name: str, default=..., positive: bool = True):
        value = self._given(name, default)
        return None if value is None else check_real(value, f"{self.where}: field {name!r}",
                                                     positive=positive)

    def off_or_real(self, name: str, default):
        """A real number, or None where null means "off" (a soft-cap): transformers' default
        only when the field is absent."""
        value = self.raw(name, default)
        return None if value is None else check_real(value, f"{self.where}: field {name!r}",
                                                     positive=True)

    def flag(self, name: str, default: bool) -> bool:
        value = self.raw(name, default)
        if not isinstance(value, bool):
            raise ValueError(f"{self.where}: field {name!r} must be true or false, got {value!r}")
        return value

    def require(self, name: str, allowed: tuple, default) -> object:
        """The value of `name` (or transformers' default), refused unless one of `allowed`."""
        value = self.raw(name, default)
        if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
            raise ValueError(f"{self.where}: {name}={value!r} is not supported by glassllm "
                             f"(supported: {list(allowed)})")
        return value

    def check_rest(self) -> None:
        """Refuse any field neither read nor harmless whose value is not "off"."""
        for name in sorted(set(self.hf) - self.read - _HARMLESS):
            value = self.hf[name]
            if value not in (None, False, 0, [], {}, ""):
                raise ValueError(f"{self.where}: field {name!r} (= {_short(value)}) is not "
                                 f"implemented by glassllm; refusing to load a model it would "
                                 f"compute differently")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --------------------------------------------------------------------------- reading
def config_from_hf(hf: dict, where: str = "config.json") -> Config:
    """glassllm Config from a transformers config.json dict (any `model_type` of
    `ARCHITECTURES`).

    Raises:
        ValueError: naming `where` and the field: an unknown model_type, a field glassllm does
            not implement (rope scaling, MoE, ...), a missing or malformed size.
    """
    model_type = hf.get("model_type")
    if not isinstance(model_type, str) or model_type not in _READERS:  # a list is unhashable
        raise ValueError(f"{where}: model_type {model_type!r} is not supported by glassllm "
                         f"(supported: {sorted(_READERS)})")
    fields = _Fields(hf, where)
    kwargs = _READERS[model_type](fields)
    fields.check_rest()
    try:  # every switch explicit: Llama's, then what this class changes
        family = kwargs.pop("family")
        return Config.preset(family, **{**PRESETS["llama"], **kwargs})
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _tie(f: _Fields, default: bool) -> bool:
    return f.flag("tie_word_embeddings", default)


def _rope(f: _Fields, legacy_pct: str | None = None, pct_default: float = 1.0,
          theta_default: float = 10000.0, legacy_theta: str = "rope_theta") -> tuple:
    """(rope_theta, rotary_pct) from `rope_parameters` (transformers 5) or the 4.x top-level
    fields; any rope type but "default" (unscaled RoPE) is refused."""
    theta = f.real(legacy_theta, None)
    pct = f.real(legacy_pct, None) if legacy_pct else None
    scaling = f.raw("rope_scaling")
    if scaling is not None:
        _default_rope(f, scaling, "rope_scaling", allowed=("rope_type", "type"))
    params = f.raw("rope_parameters")
    if params is not None:
        params = _default_rope(f, params, "rope_parameters",
                               allowed=("rope_type", "type", "rope_theta",
                                        "partial_rotary_factor"))
        inner = params.get("rope_theta", theta)
        if theta is not None and inner is not None and float(inner) != theta:
            raise ValueError(f"{f.where}: rope_theta={theta} and rope_parameters.rope_theta="
                             f"{inner} disagree")
        theta = inner
        pct = params.get("partial_rotary_factor", pct)
    theta = theta_default if theta is None else check_real(
        theta, f"{f.where}: field 'rope_parameters.rope_theta'", positive=True)
    pct = pct_default if pct is None else check_real(
        pct, f"{f.where}: field 'partial_rotary_factor'", positive=True)
    return theta, pct


def _default_rope(f: _Fields, params, name: str, allowed: tuple) -> dict:
    if not isinstance(params, dict):
        raise ValueError(f"{f.where}: field {name!r} must be an object, got {params!r}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"{f.where}: {name}.rope_type={rope_type!r} is not supported by "
                         f"glassllm (only 'default', unscaled RoPE)")
    extra = sorted(set(params) - set(allowed))
    if extra:
        raise ValueError(f"{f.where}: {name} field(s) {extra} are not supported by glassllm")
    return params


def _llama_like(f: _Fields, family: str, act: str = "hidden_act", act_default="silu",
                act_allowed=("silu",), head_dim_default=None, tie_default=False,
                rope: bool = True) -> dict:
    """The fields Llama and its descendants share (sizes, GQA, RoPE base, RMSNorm eps)."""
    d_model = f.int("hidden_size")
    n_heads = f.int("num_attention_heads")
    f.require(act, act_allowed, act_default)
    theta = None
    if rope:
        theta, pct = _rope(f)
        if pct != 1.0:  # this class rotates the whole head
            raise ValueError(f"{f.where}: rope_parameters.partial_rotary_factor={pct} is not "
                             f"supported by glassllm for model_type {f.hf.get('model_type')!r}")
    return dict(family=family, vocab_size=f.int("vocab_size"), d_model=d_model,
                n_layers=f.int("num_hidden_layers"), n_heads=n_heads,
                n_kv_heads=f.int("num_key_value_heads", n_heads),
                head_dim=f.int("head_dim", head_dim_default) or d_model // n_heads,
                max_len=f.int("max_position_embeddings"), d_ff=f.int("intermediate_size"),
                rope_theta=theta, norm_eps=f.real("rms_norm_eps", 1e-6),
                tie_embeddings=_tie(f, tie_default))


def _attention_bias(f: _Fields) -> str:
    """Llama's `attention_bias` puts a bias on q, k, v and o."""
    return "all" if f.flag("attention_bias", False) else "none"


def _windows(f: _Fields, n_layers: int, window, default_sliding) -> dict:
    """sliding_window + layer_types: transformers' per-layer list `layer_types` when given,
    else `default_sliding(i)` says whether layer i slides (each config class's own rule)."""
    types = f.raw("layer_types")
    if types is None:
        types = ["sliding_attention" if window is not None and default_sliding(i)
                 else "full_attention" for i in range(n_layers)]
    if (not isinstance(types, list) or len(types) != n_layers
            or any(t not in ("full_attention", "sliding_attention") for t in types)):
        raise ValueError(f"{f.where}: field 'layer_types' must list 'full_attention' or "
                         f"'sliding_attention' for each of the {n_layers} layers, got "
                         f"{_short(types)}")
    if "sliding_attention" not in types:
        return dict(sliding_window=None, layer_types=None)
    if window is None:
        raise ValueError(f"{f.where}: layer_types has sliding layers but sliding_window is "
                         f"null")
    return dict(sliding_window=check_int(window, f"{f.where}: field 'sliding_window'", low=1),
                layer_types=tuple(types))


def _read_llama(f: _Fields) -> dict:
    f.require("mlp_bias", (False,), False)
    f.require("sliding_window", (None,), None)
    f.require("pretraining_tp", (1,), 1)
    return {**_llama_like(f, "llama"), "attn_bias": _attention_bias(f)}


def _read_mistral(f: _Fields) -> dict:
    out = _llama_like(f, "mistral")
    f.raw("layer_types")  # MistralModel slides on every layer whatever this says
    window = f.raw("sliding_window", 4096)
    n = out["n_layers"]
    return {**out, "sliding_window": window, "layer_types": None if window is None else
            ("sliding_attention",) * n}


def _read_qwen(f: _Fields, family: str) -> dict:
    out = _llama_like(f, family, head_dim_default=128 if family == "qwen3" else None)
    window = f.raw("sliding_window")  # read either way: Qwen2.5 stores one, switched off
    window = window if f.flag("use_sliding_window", False) else None
    first = f.int("max_window_layers", 28, low=0)  # Qwen2Config: layers from here slide
    if family == "qwen2":
        out["attn_bias"] = "qkv"  # Qwen2Attention: bias on q, k, v only
    else:
        out.update(attn_bias=_attention_bias(f), qk_norm="head")
    return {**out, **_windows(f, out["n_layers"], window, lambda i: i >= first)}


def _read_gemma(f: _Fields, model_type: str) -> dict:
    family = {"gemma": "gemma", "gemma2": "gemma2", "gemma3_text": "gemma3"}[model_type]
    act = "hidden_act" if family == "gemma" else "hidden_activation"
    f.require("use_bidirectional_attention", (None, False), None)
    f.require("attention_bias", (False,), False)
    if family == "gemma":  # GemmaConfig maps a plain "gelu" to the tanh form too
        f.raw("hidden_activation")
    else:  # Gemma2/3MLP read hidden_activation; gemma-2-2b's config.json stores both
        f.raw("hidden_act")
    allowed = ("gelu_pytorch_tanh", "gelu") if family == "gemma" else ("gelu_pytorch_tanh",)
    out = _llama_like(f, family, act=act, act_default="gelu_pytorch_tanh", act_allowed=allowed,
                      head_dim_default=256, tie_default=True, rope=family != "gemma3")
    if family == "gemma3":
        out.update(_gemma3_rope(f))
    out.update(mlp="geglu", norm_offset=True, embed_scale=True)
    if family == "gemma":
        return out
    out.update(norm_position="sandwich",
               attn_scale=_attn_scale(f.real("query_pre_attn_scalar", 256), out["head_dim"]),
               attn_softcap=f.off_or_real("attn_logit_softcapping",
                                          50.0 if family == "gemma2" else None),
               final_softcap=f.off_or_real("final_logit_softcapping",
                                           30.0 if family == "gemma2" else None))
    pattern = 2
    if family == "gemma3":
        out["qk_norm"] = "head"
        pattern = f.int("sliding_window_pattern", f.hf.get("_sliding_window_pattern", 6))
    window = f.raw("sliding_window", 4096)
    return {**out, **_windows(f, out["n_layers"], window, lambda i: (i + 1) % pattern != 0)}


def _attn_scale(scalar: float, head_dim: int) -> float | None:
    """Gemma 2/3 scale scores by query_pre_attn_scalar**-0.5; None (glassllm's 1/sqrt(D))
    when that scalar is head_dim."""
    return None if scalar == head_dim else scalar ** -0.5


def _query_pre_attn_scalar(cfg: Config):
    """The inverse of `_attn_scale`: an int when it is one (Gemma2Config wants an int)."""
    if cfg.attn_scale is None:
        return cfg.head_dim
    scalar = cfg.attn_scale ** -2
    return round(scalar) if math.isclose(scalar, round(scalar), rel_tol=1e-12) else scalar


def _gemma3_rope(f: _Fields) -> dict:
    """Gemma 3's RoPE base per layer kind: rope_parameters {full_attention: {...},
    sliding_attention: {...}} (transformers 5) or rope_theta + rope_local_base_freq (4.x);
    defaults 1e6 (global) and 1e4 (local) as Gemma3TextConfig's."""
    params = f.raw("rope_parameters")
    if params is not None and not (isinstance(params, dict) and
                                   set(params) <= {"full_attention", "sliding_attention"}):
        raise ValueError(f"{f.where}: field 'rope_parameters' must hold 'full_attention' and "
                         f"'sliding_attention' objects, got {_short(params)}")
    params = params or {}
    scaling = f.raw("rope_scaling")
    if scaling is not None:
        _default_rope(f, scaling, "rope_scaling", allowed=("rope_type", "type"))
    legacy = {"full_attention": f.real("rope_theta", None),
              "sliding_attention": f.real("rope_local_base_freq", None)}
    thetas = {}
    for kind, default in (("full_attention", 1e6), ("sliding_attention", 1e4)):
        sub = _default_rope(f, params.get(kind, {}), f"rope_parameters.{kind}",
                            allowed=("rope_type", "type", "rope_theta"))
        value = sub.get("rope_theta", legacy[kind])
        thetas[kind] = default if value is None else check_real(
            value, f"{f.where}: field 'rope_parameters.{kind}.rope_theta'", positive=True)
    return dict(rope_theta=thetas["full_attention"],
                rope_local_theta=thetas["sliding_attention"])


def _read_olmo2(f: _Fields) -> dict:
    out = _llama_like(f, "olmo2")
    out["norm_eps"] = f.real("rms_norm_eps", 1e-5)
    return {**out, "attn_bias": _attention_bias(f), "norm_position": "post", "qk_norm": "proj"}


def _read_neox(f: _Fields) -> dict:
    d_model, n_heads = f.int("hidden_size"), f.int("num_attention_heads")
    f.require("hidden_act", ("gelu",), "gelu")
    theta, pct = _rope(f, legacy_pct="rotary_pct", pct_default=0.25,
                      legacy_theta="rotary_emb_base")
    f.raw("rope_theta")
    bias = f.flag("attention_bias", True)
    return dict(family="neox", vocab_size=f.int("vocab_size"), d_model=d_model,
                n_layers=f.int("num_hidden_layers"), n_heads=n_heads, n_kv_heads=n_heads,
                head_dim=d_model // n_heads, max_len=f.int("max_position_embeddings"),
                d_ff=f.int("intermediate_size"), rope_theta=theta, rotary_pct=pct,
                norm_eps=f.real("layer_norm_eps", 1e-5), tie_embeddings=_tie(f, False),
                norm="layer", norm_bias=True, attn_bias="all" if bias else "none",
                mlp_bias=True, mlp="gelu",
                parallel_block=f.flag("use_parallel_residual", True))


def _read_gptneo(f: _Fields) -> dict:
    d_model, n_layers = f.int("hidden_size"), f.int("num_layers")
    f.require("activation_function", ("gelu_new",), "gelu_new")
    # GPTNeoConfig derives attention_layers from attention_types (its default: global/local
    # alternating over 24 layers); a stored attention_layers is that expansion
    types = f.raw("attention_types")
    layers = f.raw("attention_layers")
    if types is not None or layers is None:
        try:
            layers = [kind for kinds, times in (types or [[["global", "local"], 12]])
                      for _ in range(times) for kind in kinds]
        except (TypeError, ValueError):
            raise ValueError(f"{f.where}: field 'attention_types' must be a list of "
                             f"[[kinds...], times], got {_short(types)}") from None
    if not isinstance(layers, list) or any(k not in ("global", "local") for k in layers) \
            or len(layers) != n_layers:
        derived = types is not None or f.hf.get("attention_layers") is None
        field = "attention_types" if derived else "attention_layers"  # the one they came from
        raise ValueError(f"{f.where}: field {field!r} must name 'global' or 'local' for each "
                         f"of the {n_layers} layers, got {_short(types if derived else layers)}")
    types = tuple("sliding_attention" if k == "local" else "full_attention" for k in layers)
    window = f.int("window_size", 256)
    return dict(family="gptneo", vocab_size=f.int("vocab_size"), d_model=d_model,
                n_layers=n_layers, n_heads=f.int("num_heads"), max_len=f.int(
                    "max_position_embeddings"),
                d_ff=f.int("intermediate_size", None) or 4 * d_model,
                norm_eps=f.real("layer_norm_epsilon", 1e-5), tie_embeddings=_tie(f, True),
                norm="layer", norm_bias=True, positions="learned", attn_bias="out",
                mlp_bias=True, mlp="gelu_tanh", attn_scale=1.0,
                sliding_window=window if "sliding_attention" in types else None,
                layer_types=types if "sliding_attention" in types else None)


def _read_phi(f: _Fields) -> dict:
    d_model, n_heads = f.int("hidden_size"), f.int("num_attention_heads")
    f.require("hidden_act", ("gelu_new",), "gelu_new")
    f.require("qk_layernorm", (False,), False)
    theta, pct = _rope(f, legacy_pct="partial_rotary_factor", pct_default=0.5)
    return dict(family="phi", vocab_size=f.int("vocab_size"), d_model=d_model,
                n_layers=f.int("num_hidden_layers"), n_heads=n_heads,
                n_kv_heads=f.int("num_key_value_heads", n_heads), head_dim=d_model // n_heads,
                max_len=f.int("max_position_embeddings"), d_ff=f.int("intermediate_size"),
                rope_theta=theta, rotary_pct=pct, norm_eps=f.real("layer_norm_eps", 1e-5),
                tie_embeddings=_tie(f, False), norm="layer", norm_bias=True,
                attn_bias="all", mlp_bias=True, mlp="gelu_tanh", parallel_block=True,
                shared_norm=True, lm_head_bias=True)


def _read_gpt2(f: _Fields) -> dict:
    # gelu_pytorch_tanh is the same tanh approximation as gelu_new, computed by torch.
    f.require("activation_function", ("gelu_new", "gelu_pytorch_tanh"), "gelu_new")
    f.require("scale_attn_weights", (True,), True)
    f.require("scale_attn_by_inverse_layer_idx", (False,), False)
    f.require("reorder_and_upcast_attn", (False,), False)
    f.require("add_cross_attention", (False,), False)
    f.require("tie_word_embeddings", (True,), True)
    f.raw("n_ctx")  # the old name of n_positions; the weights' shape is what counts
    return dict(family="gpt2", vocab_size=f.int("vocab_size"), d_model=f.int("n_embd"),
                n_layers=f.int("n_layer"), n_heads=f.int("n_head"),
                max_len=f.int("n_positions"),
                # None means 4 * n_embd in both libraries
                d_ff=f.int("n_inner", None), norm_eps=f.real("layer_norm_epsilon", 1e-5),
                tie_embeddings=True, norm="layer", norm_bias=True, positions="learned",
                attn_bias="all", mlp_bias=True, mlp="gelu_tanh")


_READERS = {
    "gpt2": _read_gpt2, "llama": _read_llama, "mistral": _read_mistral,
    "qwen2": lambda f: _read_qwen(f, "qwen2"), "qwen3": lambda f: _read_qwen(f, "qwen3"),
    "gemma": lambda f: _read_gemma(f, "gemma"), "gemma2": lambda f: _read_gemma(f, "gemma2"),
    "gemma3_text": lambda f: _read_gemma(f, "gemma3_text"), "olmo2": _read_olmo2,
    "gpt_neox": _read_neox, "gpt_neo": _read_gptneo, "phi": _read_phi,
}


# --------------------------------------------------------------------------- writing
def config_to_hf(cfg: Config) -> dict:
    """transformers config.json dict for a glassllm Config: the class of its family
    (`MODEL_TYPES`), every arithmetic field written out (the inverse of `config_from_hf`).

    Raises:
        ValueError: a family with no transformers class, or switches that class cannot hold
            (e.g. a llama-family model with a soft-cap): the message names the fields.
    """
    if cfg.family not in _WRITERS:
        raise ValueError(f"to_hf: family {cfg.family!r} has no transformers class "
                         f"(supported: {sorted(_WRITERS)})")
    model_type = MODEL_TYPES[cfg.family]
    hf = {"architectures": [ARCHITECTURES[model_type]], "model_type": model_type,
          "vocab_size": cfg.vocab_size, "bos_token_id": None, "eos_token_id": None,
          "pad_token_id": None, "dtype": "float32", "use_cache": True,
          **_WRITERS[cfg.family](cfg)}
    back = config_from_hf(hf, where="to_hf").to_dict()
    differ = sorted(k for k, v in cfg.to_dict().items()
                    if not _same(back.get(k), v) and k not in _unused(cfg))
    if differ:
        shown = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in differ[:4])
        raise ValueError(f"to_hf: a {ARCHITECTURES[model_type]} checkpoint cannot hold this "
                         f"{cfg.family}-family model's {shown}")
    return hf


def _unused(cfg: Config) -> set[str]:
    """Fields that change nothing in this model (a class need not store them): RoPE's with
    learned positions, the window's with no sliding layer."""
    unused = set()
    if cfg.positions == "learned":
        unused |= {"rope_theta", "rotary_pct", "rope_local_theta"}
    if cfg.layer_types is None or "sliding_attention" not in cfg.layer_types:
        unused |= {"sliding_window", "layer_types", "rope_local_theta"}
    return unused


def _same(a, b) -> bool:
    """Equal, floats to 1e-12 (a scale written as query_pre_attn_scalar comes back through
    x**-2 and y**-0.5)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12)
    return a == b


def _write_llama_like(cfg: Config, act: str = "hidden_act", act_value: str = "silu") -> dict:
    return {"hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
            "max_position_embeddings": cfg.max_len, "rms_norm_eps": cfg.norm_eps,
            act: act_value, "attention_dropout": 0.0,
            # rope_theta for transformers 4.x, rope_parameters for 5.x
            "rope_theta": cfg.rope_theta, "rope_scaling": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "tie_word_embeddings": cfg.tie_embeddings}


def _write_windows(cfg: Config) -> dict:
    types = list(cfg.layer_types or ["full_attention"] * cfg.n_layers)
    return {"sliding_window": cfg.sliding_window, "layer_types": types}


def _write_llama(cfg: Config) -> dict:
    return {**_write_llama_like(cfg), "attention_bias": cfg.attn_bias == "all",
            "mlp_bias": False}


def _write_mistral(cfg: Config) -> dict:
    if cfg.layer_types and set(cfg.layer_types) != {"sliding_attention"}:
        return {**_write_llama_like(cfg), **_write_windows(cfg)}  # refused by the check
    return {**_write_llama_like(cfg), "sliding_window": cfg.sliding_window}


def _write_qwen(cfg: Config) -> dict:
    out = {**_write_llama_like(cfg), **_write_windows(cfg),
           "use_sliding_window": cfg.sliding_window is not None, "max_window_layers": 0}
    if cfg.family == "qwen3":
        out["attention_bias"] = cfg.attn_bias == "all"
    return out


def _write_gemma(cfg: Config) -> dict:
    if cfg.family == "gemma":
        return _write_llama_like(cfg, "hidden_act", "gelu_pytorch_tanh")
    out = {**_write_llama_like(cfg, "hidden_activation", "gelu_pytorch_tanh"),
           **_write_windows(cfg), "query_pre_attn_scalar": _query_pre_attn_scalar(cfg),
           "attn_logit_softcapping": cfg.attn_softcap,
           "final_logit_softcapping": cfg.final_softcap}
    if cfg.family == "gemma3":
        del out["rope_theta"], out["rope_scaling"]
        out["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_local_theta}}
    return out


def _write_olmo2(cfg: Config) -> dict:
    return {**_write_llama_like(cfg), "attention_bias": cfg.attn_bias == "all"}


def _write_neox(cfg: Config) -> dict:
    return {"hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "max_position_embeddings": cfg.max_len, "layer_norm_eps": cfg.norm_eps,
            "hidden_act": "gelu", "attention_bias": cfg.attn_bias == "all",
            "use_parallel_residual": cfg.parallel_block, "hidden_dropout": 0.0,
            "attention_dropout": 0.0, "tie_word_embeddings": cfg.tie_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta,
                                "partial_rotary_factor": cfg.rotary_pct}}


def _write_gptneo(cfg: Config) -> dict:
    kinds = ["local" if t == "sliding_attention" else "global"
             for t in (cfg.layer_types or ["full_attention"] * cfg.n_layers)]
    return {"hidden_size": cfg.d_model, "num_layers": cfg.n_layers, "num_heads": cfg.n_heads,
            "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.max_len,
            "attention_types": [[[kind], 1] for kind in kinds], "attention_layers": kinds,
            "window_size": cfg.sliding_window or 256, "activation_function": "gelu_new",
            "layer_norm_epsilon": cfg.norm_eps, "resid_dropout": 0.0, "embed_dropout": 0.0,
            "attention_dropout": 0.0, "tie_word_embeddings": cfg.tie_embeddings}


def _write_phi(cfg: Config) -> dict:
    return {"hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_kv_heads, "max_position_embeddings": cfg.max_len,
            "layer_norm_eps": cfg.norm_eps, "hidden_act": "gelu_new", "qk_layernorm": False,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0,
            "tie_word_embeddings": cfg.tie_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta,
                                "partial_rotary_factor": cfg.rotary_pct}}


def _write_gpt2(cfg: Config) -> dict:
    return {"n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
            "n_positions": cfg.max_len, "n_inner": cfg.d_ff,
            "activation_function": "gelu_new", "layer_norm_epsilon": cfg.norm_eps,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False, "tie_word_embeddings": True}


_WRITERS = {
    "gpt2": _write_gpt2, "llama": _write_llama, "mistral": _write_mistral,
    "qwen2": _write_qwen, "qwen3": _write_qwen, "gemma": _write_gemma, "gemma2": _write_gemma,
    "gemma3": _write_gemma, "olmo2": _write_olmo2, "neox": _write_neox,
    "gptneo": _write_gptneo, "phi": _write_phi,
}
