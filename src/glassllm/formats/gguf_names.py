"""GGUF names: glassllm families <-> llama.cpp architectures, parameters <-> GGUF tensors, Config
fields <-> GGUF metadata keys, and the layout changes llama.cpp's converter makes.

Every name comes from the `gguf` package's own tables (`gguf.MODEL_ARCH_NAMES`,
`gguf.TENSOR_NAMES`, `gguf.Keys`), so a rename in llama.cpp shows up here as a failing test,
not as a file llama.cpp cannot read. The layout facts are those of llama.cpp's
`convert_hf_to_gguf.py` (its `conversion/` modules: llama.py, gemma.py, gpt_neox.py, gpt2.py):

- GGUF stores a matrix as PyTorch's `nn.Linear.weight` is stored, (out, in) in NumPy's shape
  (ggml's ne[0] is `in`): glassllm's `Linear` holds (in, out), so every projection is
  transposed. Embeddings are (vocab, d_model) in both.
- `llama` (so Mistral, which llama.cpp runs as `llama`): llama.cpp turns adjacent pairs
  (2i, 2i+1) of each head (its rope type NORM, Meta's layout), where Hugging Face and glassllm
  turn the halves (i, i + D/2). `LlamaModel.permute` reorders the rows of q and k per head from
  halves to pairs; `permute_qk` is that, `unpermute_qk` its inverse (the same as llama2.c
  export.py's `permute_original` and its inverse, see `formats.llama2c`). Every other
  architecture here uses rope type NEOX (rotate-half): rows as stored.
- `gemma`, `gemma2`, `gemma3`: llama.cpp's RMSNorm multiplies by w, Gemma's by (1 + w), so the
  converter stores every `*norm.weight` plus 1 (q/k norms included).
- `gpt2`, `gptneox`: q, k and v in one `attn_qkv` tensor, rows [q; k; v] (GPT-NeoX's per-head
  interleaving is undone by the converter). `phi2` may hold either form (llama.cpp reads both).

Config fields <-> keys: `KEYS` below; what llama.cpp assumes when a key is absent is in
`formats.gguf_read` (which reads) and `formats.gguf_write` (which writes).
"""
from __future__ import annotations

import re

import gguf
import numpy as np

from ..config import Config

_ARCH = gguf.MODEL_ARCH
_T = gguf.MODEL_TENSOR


def _arch(a) -> str:
    return gguf.MODEL_ARCH_NAMES[a]


# glassllm family -> llama.cpp architecture (`general.architecture`)
ARCH_OF_FAMILY = {
    "llama": _arch(_ARCH.LLAMA), "mistral": _arch(_ARCH.LLAMA), "qwen2": _arch(_ARCH.QWEN2),
    "qwen3": _arch(_ARCH.QWEN3), "gemma": _arch(_ARCH.GEMMA), "gemma2": _arch(_ARCH.GEMMA2),
    "gemma3": _arch(_ARCH.GEMMA3), "phi": _arch(_ARCH.PHI2), "neox": _arch(_ARCH.GPTNEOX),
    "gpt2": _arch(_ARCH.GPT2), "olmo2": _arch(_ARCH.OLMO2),
}
# llama.cpp architecture -> glassllm family (`llama` reads as Llama: llama.cpp runs Mistral
# with full attention, so a `llama` file holds no sliding window)
FAMILY_OF_ARCH = {arch: family for family, arch in ARCH_OF_FAMILY.items()
                  if family != "mistral"}
PAIR_ROPE_ARCHS = frozenset({_arch(_ARCH.LLAMA)})      # q/k rows permuted (rope type NORM)
NORM_PLUS_ONE_ARCHS = frozenset({_arch(_ARCH.GEMMA), _arch(_ARCH.GEMMA2), _arch(_ARCH.GEMMA3)})
FUSED_QKV_ARCHS = frozenset({_arch(_ARCH.GPT2), _arch(_ARCH.GPTNEOX)})  # attn_qkv required

# glassllm parameter (without .weight/.bias) -> GGUF tensor
_TOP = {"token_embedding": _T.TOKEN_EMBD, "position_embedding": _T.POS_EMBD,
        "final_norm": _T.OUTPUT_NORM, "lm_head": _T.OUTPUT}
_BLOCK = {"attention_norm": _T.ATTN_NORM, "mlp_norm": _T.FFN_NORM,
          "attention_post_norm": _T.ATTN_POST_NORM, "mlp_post_norm": _T.FFN_POST_NORM,
          "attention.query": _T.ATTN_Q, "attention.key": _T.ATTN_K,
          "attention.value": _T.ATTN_V, "attention.output": _T.ATTN_OUT,
          "attention.q_norm": _T.ATTN_Q_NORM, "attention.k_norm": _T.ATTN_K_NORM,
          "mlp.gate": _T.FFN_GATE, "mlp.up": _T.FFN_UP, "mlp.down": _T.FFN_DOWN}
_LINEARS = frozenset({"lm_head", "attention.query", "attention.key", "attention.value",
                      "attention.output", "mlp.gate", "mlp.up", "mlp.down"})
_OURS = re.compile(r"(?:blocks\.(\d+)\.)?(.+)\.(weight|bias)")
_QKV = ("attention.query", "attention.key", "attention.value")

_L, _A, _R = gguf.Keys.LLM, gguf.Keys.Attention, gguf.Keys.Rope
# Config field -> GGUF key template ("{arch}" filled by `key`). norm_eps has two keys: RMSNorm's
# and LayerNorm's (`NORM_EPS_KEYS`). layer_types is written as the per-layer booleans of
# `attention.sliding_window_pattern` (True: sliding).
KEYS = {
    "vocab_size": _L.VOCAB_SIZE, "max_len": _L.CONTEXT_LENGTH, "d_model": _L.EMBEDDING_LENGTH,
    "n_layers": _L.BLOCK_COUNT, "d_ff": _L.FEED_FORWARD_LENGTH, "n_heads": _A.HEAD_COUNT,
    "n_kv_heads": _A.HEAD_COUNT_KV, "head_dim": _A.KEY_LENGTH, "rotary_dim": _R.DIMENSION_COUNT,
    "rope_theta": _R.FREQ_BASE, "rope_local_theta": _R.FREQ_BASE_SWA,
    "sliding_window": _A.SLIDING_WINDOW, "layer_types": _A.SLIDING_WINDOW_PATTERN,
    "attn_scale": _A.SCALE, "attn_softcap": _L.ATTN_LOGIT_SOFTCAPPING,
    "final_softcap": _L.FINAL_LOGIT_SOFTCAPPING, "parallel_block": _L.USE_PARALLEL_RESIDUAL,
}
NORM_EPS_KEYS = {"rms": _A.LAYERNORM_RMS_EPS, "layer": _A.LAYERNORM_EPS}
VALUE_LENGTH_KEY = _A.VALUE_LENGTH  # = head_dim (glassllm's values are head_dim wide)
ARCH_KEY = gguf.Keys.General.ARCHITECTURE


def key(template: str, arch: str) -> str:
    """A key template of `KEYS` for one architecture: key(KEYS["d_model"], "llama") is
    "llama.embedding_length"."""
    return template.format(arch=arch)


# --------------------------------------------------------------------------- tensor names
def gguf_name(ours: str) -> str:
    """The GGUF tensor name of a glassllm parameter: "blocks.0.attention.query.weight" ->
    "blk.0.attn_q.weight". (q, k, v of a fused architecture: see `fused_qkv_name`.)

    Raises:
        KeyError: a name glassllm's model does not have.
    """
    m = _OURS.fullmatch(ours)
    if m is None:
        raise KeyError(ours)
    layer, stem, part = m.groups()
    table = _TOP if layer is None else _BLOCK
    if stem not in table:
        raise KeyError(ours)
    return gguf.TENSOR_NAMES[table[stem]].format(bid=layer) + "." + part


def fused_qkv_name(layer: int, part: str) -> str:
    """"blk.{layer}.attn_qkv.{part}" (part "weight" or "bias")."""
    return gguf.TENSOR_NAMES[_T.ATTN_QKV].format(bid=layer) + "." + part


def tensor_names(cfg: Config, fused: bool | None = None) -> dict[str, str]:
    """glassllm parameter name -> GGUF tensor name for every parameter of `GlassLM(cfg)`.

    With `fused` (default: the architecture requires it, `FUSED_QKV_ARCHS`) the q, k and v
    projections all map to their layer's `attn_qkv` tensor (`join_qkv` / `split_qkv`).
    """
    from ..model import parameter_shapes  # the model's own list of names and shapes
    arch = ARCH_OF_FAMILY[cfg.family]
    fused = arch in FUSED_QKV_ARCHS if fused is None else fused
    names = {}
    for ours, _ in parameter_shapes(cfg):
        m = _OURS.fullmatch(ours)
        if fused and m.group(1) is not None and m.group(2) in _QKV:
            names[ours] = fused_qkv_name(int(m.group(1)), m.group(3))
        else:
            names[ours] = gguf_name(ours)
    return names


# --------------------------------------------------------------------------- layouts
def permute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Rows (n_heads * D, ...) reordered per head from halves (x0..x_{D/2-1}, y0..) to pairs
    (x0, y0, x1, y1, ...): llama.cpp convert_hf_to_gguf.py `LlamaModel.permute` (a weight
    (out, in) or a bias (out,))."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The inverse of `permute_qk`: pairs back to halves."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def _stem(ours: str) -> tuple[str, str]:
    m = _OURS.fullmatch(ours)
    if m is None:
        raise KeyError(ours)
    return m.group(2), m.group(3)


def to_gguf(cfg: Config, ours: str, value: np.ndarray) -> np.ndarray:
    """A glassllm parameter -> the array llama.cpp's converter stores under `gguf_name(ours)`:
    projections transposed to (out, in), llama's q/k rows permuted, Gemma's norms plus 1.
    float32 in, float32 out."""
    arch = ARCH_OF_FAMILY[cfg.family]
    stem, part = _stem(ours)
    value = np.asarray(value, dtype=np.float32)
    if stem in _LINEARS and part == "weight":
        value = value.T
    if arch in PAIR_ROPE_ARCHS and stem in ("attention.query", "attention.key"):
        value = permute_qk(value, cfg.n_heads if stem == "attention.query" else cfg.n_kv_heads)
    if arch in NORM_PLUS_ONE_ARCHS and stem.endswith("norm") and part == "weight":
        value = value + np.float32(1)
    return np.ascontiguousarray(value)


def from_gguf(cfg: Config, ours: str, value: np.ndarray) -> np.ndarray:
    """The inverse of `to_gguf`: a GGUF tensor (float32, numpy shape as `GGUFReader` gives it
    once dequantized) -> glassllm's parameter. Gemma's norms lose 1 again in float32 (exact
    for stored values in [0.5, 2], Sterbenz; so 1 + w is the stored value bit for bit)."""
    arch = ARCH_OF_FAMILY[cfg.family]
    stem, part = _stem(ours)
    value = np.asarray(value, dtype=np.float32)
    if arch in NORM_PLUS_ONE_ARCHS and stem.endswith("norm") and part == "weight":
        value = value - np.float32(1)
    if arch in PAIR_ROPE_ARCHS and stem in ("attention.query", "attention.key"):
        value = unpermute_qk(value, cfg.n_heads if stem == "attention.query" else cfg.n_kv_heads)
    if stem in _LINEARS and part == "weight":
        value = value.T
    return np.ascontiguousarray(value)


def join_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray, part: str) -> np.ndarray:
    """glassllm's q, k, v (weights (C, HD), (C, KD), (C, KD); or biases) -> GGUF's `attn_qkv`:
    weight (HD + 2KD, C) with rows [q; k; v], bias (HD + 2KD,)."""
    joined = np.concatenate([q, k, v], axis=-1)
    return np.ascontiguousarray(joined.T if part == "weight" else joined, dtype=np.float32)


def split_qkv(cfg: Config, value: np.ndarray, part: str) -> list[np.ndarray]:
    """The inverse of `join_qkv`: GGUF's `attn_qkv` -> [q, k, v] in glassllm's layout.

    Raises:
        ValueError: a first axis other than (n_heads + 2 n_kv_heads) * head_dim.
    """
    hd, kd = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    if value.shape[0] != hd + 2 * kd:
        raise ValueError(f"attn_qkv has {value.shape[0]} rows, expected {hd + 2 * kd}")
    parts = np.split(value, [hd, hd + kd], axis=0)
    return [np.ascontiguousarray(p.T if part == "weight" else p) for p in parts]


# --------------------------------------------------------------------------- tokenizer
SP_SPACE = "\u2581"  # SentencePiece's word marker, which llama.cpp's `llama` vocab stores
# tokenizer.ggml.token_type values (llama.cpp's llama_token_type / gguf.TokenType)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL = (int(gguf.TokenType.NORMAL),
                                              int(gguf.TokenType.UNKNOWN),
                                              int(gguf.TokenType.CONTROL))
TOKEN_USER_DEFINED, TOKEN_BYTE = int(gguf.TokenType.USER_DEFINED), int(gguf.TokenType.BYTE)


def sp_piece_to_gguf(piece: str) -> str:
    """A glassllm SentencePiece piece (" " for the word marker, as llama2.c keeps it) -> the
    token text llama.cpp's `llama` vocab stores ("\u2581")."""
    return piece.replace(" ", SP_SPACE)


def sp_piece_from_gguf(token: str) -> str:
    """The inverse of `sp_piece_to_gguf`."""
    return token.replace(SP_SPACE, " ")
