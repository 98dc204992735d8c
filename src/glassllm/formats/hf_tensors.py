"""Tensor names and layouts of each Hugging Face class <-> glassllm parameter names.

`tensor_map(cfg)` lists (glassllm name, HF name, transpose) for every tensor stored one to one;
`fused_qkv(cfg)` describes the tensors that hold query, key and value together (GPT-2's
`c_attn`, GPT-NeoX's `query_key_value`), split and joined by `split_fused` / `join_fused`.

Layout facts (transformers' modeling_<model>.py files):
- `nn.Linear` stores weights [out, in], glassllm's `Linear` [in, out]: transposed. GPT-2's
  `Conv1D` stores [in, out]: not transposed.
- GPT-2's `c_attn` is [C, 3C] with q, k, v side by side.
- GPT-NeoX's `query_key_value` is [3C, C] whose output, viewed as (heads, 3 * head_dim), holds
  per head [q_h, k_h, v_h] (`GPTNeoXAttention.forward`: `view(..., -1, 3 * head_size)` then
  `chunk(3)`): interleaved by head, not three blocks.
- RoPE is rotate-half in both libraries, so q/k weights are used as stored.
"""
from __future__ import annotations

import numpy as np

from ..config import Config

# glassllm names of the attention/MLP projections, in HF order q, k, v, o / gate, up, down
_ATTN = ("attention.query", "attention.key", "attention.value", "attention.output")
_MLP = ("mlp.gate", "mlp.up", "mlp.down")


def prefix(cfg: Config) -> str:
    """The prefix save_pretrained writes before GPT-2 / GPT-Neo names (stripped on read)."""
    return "transformer." if cfg.family in ("gpt2", "gptneo") else ""


def aliases(cfg: Config) -> dict[str, str]:
    """Other names a checkpoint may use for a tensor: stored name -> the HF name in
    `tensor_map`. GPT-NeoX's head is `embed_out` in Pythia's files and in transformers 4,
    `lm_head` in what transformers 5 saves (it renames embed_out on load); `to_hf` writes
    embed_out, which both read."""
    if cfg.family != "neox" or cfg.tie_embeddings:
        return {}
    return {"lm_head.weight": "embed_out.weight", "lm_head.bias": "embed_out.bias"}


def tensor_map(cfg: Config) -> list[tuple[str, str, bool]]:
    """(glassllm name, HF name without `prefix(cfg)`, transpose) for every one-to-one tensor.

    Raises:
        ValueError: a family with no Hugging Face class.
    """
    builder = {"gpt2": _gpt2, "gptneo": _gptneo, "neox": _neox, "phi": _phi}.get(
        cfg.family, _llama_like)
    rows = builder(cfg)
    if not cfg.tie_embeddings:
        head = "embed_out" if cfg.family == "neox" else "lm_head"
        rows.append(("lm_head.weight", f"{head}.weight", True))
        if cfg.lm_head_bias:
            rows.append(("lm_head.bias", f"{head}.bias", False))
    return rows


def _linear(rows, ours: str, theirs: str, bias: bool, transpose: bool = True) -> None:
    rows.append((f"{ours}.weight", f"{theirs}.weight", transpose))
    if bias:
        rows.append((f"{ours}.bias", f"{theirs}.bias", False))


def _norm(rows, cfg: Config, ours: str, theirs: str) -> None:
    rows.append((f"{ours}.weight", f"{theirs}.weight", False))
    if cfg.norm_bias:
        rows.append((f"{ours}.bias", f"{theirs}.bias", False))


def _attn_biases(cfg: Config) -> tuple[bool, bool]:
    """(q/k/v have biases, the output projection has one)."""
    return cfg.attn_bias in ("qkv", "all"), cfg.attn_bias in ("out", "all")


def _llama_like(cfg: Config) -> list:
    """Llama and its descendants: model.layers.{i}.self_attn / mlp / the norms."""
    rows = [("token_embedding.weight", "model.embed_tokens.weight", False)]
    qkv_bias, out_bias = _attn_biases(cfg)
    norms = {"pre": (("attention_norm", "input_layernorm"),
                     ("mlp_norm", "post_attention_layernorm")),
             "sandwich": (("attention_norm", "input_layernorm"),
                          ("attention_post_norm", "post_attention_layernorm"),
                          ("mlp_norm", "pre_feedforward_layernorm"),
                          ("mlp_post_norm", "post_feedforward_layernorm")),
             "post": (("attention_post_norm", "post_attention_layernorm"),
                      ("mlp_post_norm", "post_feedforward_layernorm"))}[cfg.norm_position]
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"model.layers.{i}."
        for ours, theirs in norms:
            _norm(rows, cfg, b + ours, h + theirs)
        for ours, theirs in zip(_ATTN, ("q_proj", "k_proj", "v_proj", "o_proj")):
            _linear(rows, b + ours, f"{h}self_attn.{theirs}",
                    out_bias if ours == _ATTN[3] else qkv_bias)
        if cfg.qk_norm is not None:
            rows += [(f"{b}attention.q_norm.weight", f"{h}self_attn.q_norm.weight", False),
                     (f"{b}attention.k_norm.weight", f"{h}self_attn.k_norm.weight", False)]
        for ours, theirs in zip(_MLP, ("gate_proj", "up_proj", "down_proj")):
            _linear(rows, b + ours, f"{h}mlp.{theirs}", cfg.mlp_bias)
    _norm(rows, cfg, "final_norm", "model.norm")
    return rows


def _gpt2(cfg: Config) -> list:
    rows = [("token_embedding.weight", "wte.weight", False),
            ("position_embedding.weight", "wpe.weight", False)]
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"h.{i}."
        for ours, theirs in (("attention_norm", "ln_1"), ("attention.output", "attn.c_proj"),
                             ("mlp_norm", "ln_2"), ("mlp.up", "mlp.c_fc"),
                             ("mlp.down", "mlp.c_proj")):
            _linear(rows, b + ours, h + theirs, True, transpose=False)
    _norm(rows, cfg, "final_norm", "ln_f")
    return rows


def _gptneo(cfg: Config) -> list:
    rows = [("token_embedding.weight", "wte.weight", False),
            ("position_embedding.weight", "wpe.weight", False)]
    qkv_bias, out_bias = _attn_biases(cfg)
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"h.{i}."
        _norm(rows, cfg, b + "attention_norm", h + "ln_1")
        for ours, theirs in zip(_ATTN, ("q_proj", "k_proj", "v_proj", "out_proj")):
            _linear(rows, b + ours, f"{h}attn.attention.{theirs}",
                    out_bias if ours == _ATTN[3] else qkv_bias)
        _norm(rows, cfg, b + "mlp_norm", h + "ln_2")
        _linear(rows, b + "mlp.up", h + "mlp.c_fc", cfg.mlp_bias)
        _linear(rows, b + "mlp.down", h + "mlp.c_proj", cfg.mlp_bias)
    _norm(rows, cfg, "final_norm", "ln_f")
    return rows


def _neox(cfg: Config) -> list:
    rows = [("token_embedding.weight", "gpt_neox.embed_in.weight", False)]
    _, out_bias = _attn_biases(cfg)
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"gpt_neox.layers.{i}."
        _norm(rows, cfg, b + "attention_norm", h + "input_layernorm")
        _norm(rows, cfg, b + "mlp_norm", h + "post_attention_layernorm")
        _linear(rows, b + "attention.output", h + "attention.dense", out_bias)
        _linear(rows, b + "mlp.up", h + "mlp.dense_h_to_4h", cfg.mlp_bias)
        _linear(rows, b + "mlp.down", h + "mlp.dense_4h_to_h", cfg.mlp_bias)
    _norm(rows, cfg, "final_norm", "gpt_neox.final_layer_norm")
    return rows


def _phi(cfg: Config) -> list:
    rows = [("token_embedding.weight", "model.embed_tokens.weight", False)]
    qkv_bias, out_bias = _attn_biases(cfg)
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"model.layers.{i}."
        _norm(rows, cfg, b + "attention_norm", h + "input_layernorm")
        for ours, theirs in zip(_ATTN, ("q_proj", "k_proj", "v_proj", "dense")):
            _linear(rows, b + ours, f"{h}self_attn.{theirs}",
                    out_bias if ours == _ATTN[3] else qkv_bias)
        _linear(rows, b + "mlp.up", h + "mlp.fc1", cfg.mlp_bias)
        _linear(rows, b + "mlp.down", h + "mlp.fc2", cfg.mlp_bias)
    _norm(rows, cfg, "final_norm", "model.final_layernorm")
    return rows


# --------------------------------------------------------------------------- fused q, k, v
def fused_qkv(cfg: Config) -> list[tuple[int, str, bool]]:
    """(layer, HF name without its .weight/.bias, has bias) of every fused q/k/v tensor."""
    if cfg.family == "gpt2":
        return [(i, f"h.{i}.attn.c_attn", True) for i in range(cfg.n_layers)]
    if cfg.family == "neox":
        return [(i, f"gpt_neox.layers.{i}.attention.query_key_value",
                 cfg.attn_bias in ("qkv", "all")) for i in range(cfg.n_layers)]
    return []


def fused_shape(cfg: Config, part: str) -> tuple[int, ...]:
    """The stored shape of a fused tensor's "weight" or "bias"."""
    width = 3 * cfg.n_heads * cfg.head_dim
    if part == "bias":
        return (width,)
    return (cfg.d_model, width) if cfg.family == "gpt2" else (width, cfg.d_model)


def split_fused(cfg: Config, part: str, value: np.ndarray) -> list[np.ndarray]:
    """A fused weight/bias -> [q, k, v] in glassllm's layout (weights [in, out])."""
    if part == "weight" and cfg.family == "neox":
        value = value.T  # nn.Linear [3C, C] -> [C, 3C]
    if cfg.family == "gpt2":
        return np.split(value, 3, axis=-1)
    H, D = cfg.n_heads, cfg.head_dim  # neox: per head [q_h, k_h, v_h]
    grouped = value.reshape(*value.shape[:-1], H, 3, D)
    return [np.ascontiguousarray(grouped[..., j, :].reshape(*value.shape[:-1], H * D))
            for j in range(3)]


def join_fused(cfg: Config, part: str, q, k, v) -> np.ndarray:
    """The inverse of `split_fused`: [q, k, v] in glassllm's layout -> the stored tensor."""
    if cfg.family == "gpt2":
        return np.concatenate([q, k, v], axis=-1)
    H, D = cfg.n_heads, cfg.head_dim
    lead = q.shape[:-1]
    grouped = np.stack([t.reshape(*lead, H, D) for t in (q, k, v)], axis=-2)
    joined = grouped.reshape(*lead, 3 * H * D)
    return joined.T if part == "weight" else joined
