"""Write a glassllm model as a GGUF file llama.cpp runs: `write_gguf(model, path, tokenizer)`.

The container is written by the `gguf` package's GGUFWriter (llama.cpp's own Python writer),
never by hand; the file appears atomically (`formats.atomic`): on any error nothing is left.

What goes in, and why (llama.cpp's `convert_hf_to_gguf.py` / `conversion/*.py` and the
graphs in `src/models/<arch>.cpp` are the source for each rule):
- The architecture: glassllm family -> llama.cpp architecture (`ARCHITECTURES`; Mistral is
  written as `llama`, as llama.cpp's converter does). A switch the architecture's graph cannot
  express (a bias it has no tensor for, another score scale, ...) is refused in one line
  naming the `Config` field, before anything is written.
- The hyper-parameters as `{arch}.*` keys (context, widths, heads, head_dim as key/value
  length, RoPE base and rotated dimensions, norm epsilon, Gemma 2/3's soft-caps, window and
  per-layer sliding pattern, GPT-NeoX's parallel residual).
- Llama's and Mistral's q/k rows permuted to llama.cpp's interleaved-pairs RoPE (glassllm and
  Hugging Face rotate halves; llama.cpp's `llama` graph rotates adjacent pairs), the other
  architectures' kept (llama.cpp rotates halves there: its NEOX rope type).
- Gemma's (1 + w) RMSNorm weights written as 1 + w (llama.cpp's Gemma graphs use plain
  RMSNorm; its converter adds the 1).
- GPT-2's and GPT-NeoX's q, k, v as one `attn_qkv` tensor, q | k | v (what those graphs read).
- The tokenizer as `tokenizer.ggml.*` keys (`_write_tokenizer`).

Tensor types (`tensor_type`), the converter's rule: vectors (norm weights, biases), any
`*_norm.weight` and the learned position table stay float32; every other matrix takes the
requested type; a matrix whose rows are not a whole number of 32-weight blocks falls back to
float16 when q8_0/q4_0 is asked (the converter's QuantError fallback).
"""
from __future__ import annotations

import os

import numpy as np

from ..config import Config
from ..model import GlassLM
from . import gguf_names as names
from .atomic import atomic_replace
from .gguf_quantize import BLOCK_SIZE, QUANTIZERS

TYPES = ("f32", "f16", "q8_0", "q4_0")
# glassllm family -> llama.cpp architecture (GPT-Neo has none in llama.cpp)
ARCHITECTURES = names.ARCH_OF_FAMILY
# Switches a GGUF key or tensor carries, per family, beyond the sizes, rope_theta, norm_eps,
# tie_embeddings and head_dim every family may change. Any other switch must keep the preset's
# value: llama.cpp's graph for that architecture hard-codes it.
_FREE = {"llama": {"attn_bias", "mlp_bias", "sliding_window", "layer_types"},
         "mistral": {"attn_bias", "mlp_bias", "sliding_window", "layer_types"},
         "qwen2": {"sliding_window", "layer_types"}, "qwen3": {"attn_bias"},
         "gemma2": {"attn_softcap", "final_softcap", "sliding_window", "layer_types",
                    "attn_scale"},
         "gemma3": {"sliding_window", "layer_types", "rope_local_theta", "final_softcap",
                    "attn_scale"},
         "neox": {"rotary_pct", "parallel_block"}, "phi": {"rotary_pct"}}
_ALWAYS_FREE = {"rope_theta", "norm_eps", "tie_embeddings"}
_NEEDS_OUTPUT = {"gptneox", "phi2", "olmo2"}   # graphs with no tied fallback: always written
_NEVER_OUTPUT = {"gemma", "gemma2"}            # graphs that always use token_embd as the head
# llama.cpp's file types (llama.h LLAMA_FTYPE_*): general.file_type
_FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7}
_TOKEN_UNUSED = 5  # gguf.TokenType.UNUSED: the converter's "[PAD<i>]" filler ids


def architecture(cfg: Config) -> str:
    """The llama.cpp architecture `cfg` is written as.

    Raises:
        ValueError: one line naming the family or `Config` field llama.cpp cannot run.
    """
    arch = ARCHITECTURES.get(cfg.family)
    if arch is None:
        raise ValueError(f"Config.family {cfg.family!r} has no llama.cpp architecture; GGUF "
                         f"export covers {', '.join(sorted(ARCHITECTURES))}")
    preset = Config.preset(cfg.family, vocab_size=cfg.vocab_size, d_model=cfg.d_model,
                           n_layers=cfg.n_layers, n_heads=cfg.n_heads, max_len=cfg.max_len)
    free = _ALWAYS_FREE | _FREE.get(cfg.family, set())
    for field in sorted(set(preset.to_dict()) - free):
        if field in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                     "max_len", "d_ff", "family"):
            continue
        if getattr(cfg, field) != getattr(preset, field):
            raise ValueError(f"Config.{field} = {getattr(cfg, field)!r}: llama.cpp's {arch} "
                             f"graph has no such switch (its value there is "
                             f"{getattr(preset, field)!r}); the model cannot be written as GGUF")
    _check_arch_limits(cfg, arch)
    return arch


def _check_arch_limits(cfg: Config, arch: str) -> None:
    """Facts of single graphs (llama.cpp src/models/<arch>.cpp) a switch check cannot see."""
    scale = 1.0 / np.sqrt(cfg.head_dim)
    if arch in ("gemma2", "gemma3") and cfg.n_layers == {"gemma2": 46, "gemma3": 62}[arch]:
        scale = 1.0 / np.sqrt(cfg.d_model / cfg.n_heads)  # llama.cpp's 27B rule
    if cfg.attn_scale is not None and not np.isclose(cfg.attn_scale, scale, rtol=1e-6):
        raise ValueError(f"Config.attn_scale = {cfg.attn_scale}: llama.cpp's {arch} graph "
                         f"scales scores by {scale:.6g}")
    for field in ("attn_softcap", "final_softcap"):
        if arch == "gemma2" and getattr(cfg, field) is None:
            raise ValueError(f"Config.{field} = None: llama.cpp's gemma2 graph always caps "
                             f"the {'scores' if field == 'attn_softcap' else 'logits'}")
    if arch in _NEVER_OUTPUT and not cfg.tie_embeddings:
        raise ValueError(f"Config.tie_embeddings = False: llama.cpp's {arch} graph uses the "
                         f"token embedding as the output projection")
    if arch in ("qwen2", "gptneox", "phi2", "olmo2", "gpt2") and \
            cfg.n_heads * cfg.head_dim != cfg.d_model:
        raise ValueError(f"Config.head_dim = {cfg.head_dim}: llama.cpp's {arch} graph needs "
                         f"n_heads * head_dim = d_model ({cfg.d_model})")


# --------------------------------------------------------------------------- tensors
def gguf_tensors(model: GlassLM, arch: str) -> dict[str, np.ndarray]:
    """The model's parameters as llama.cpp's `arch` reads them: GGUF name -> float32 array in
    GGUF's NumPy order (`gguf_names.to_gguf`: a matrix (out, in), llama's q/k rows permuted,
    Gemma's norms plus 1; GPT-2's and GPT-NeoX's q, k, v joined into `attn_qkv`).

    Returns:
        dict in the order to write, the head added (a copy of the embedding) where the graph
        has no tied fallback, Phi's head bias added (zeros) where the model has none.
    """
    cfg = model.cfg
    state = {name: p.numpy() for name, p in model.named_parameters()}  # files: from the host
    fused = names.tensor_names(cfg)
    out: dict[str, np.ndarray] = {}
    for ours, value in state.items():
        theirs = fused[ours]
        if ".attn_qkv." in theirs:
            if ".attention.query." in ours:  # once per layer and part, from q's name
                part = ours.rsplit(".", 1)[1]
                q, k, v = (state[ours.replace("query", x)] for x in ("query", "key", "value"))
                out[theirs] = names.join_qkv(q, k, v, part)
            continue
        out[theirs] = names.to_gguf(cfg, ours, value)
    if "output.weight" not in out and arch in _NEEDS_OUTPUT:
        out["output.weight"] = out["token_embd.weight"]  # tied: the graph reads a copy
    if arch == "phi2" and "output.bias" not in out:
        out["output.bias"] = np.zeros(cfg.vocab_size, np.float32)  # the graph always adds one
    return out


def tensor_type(name: str, array: np.ndarray, requested: str) -> str:
    """The type one tensor is stored in (see the module docstring for the rule).

    Args:
        name: GGUF tensor name. array: its float32 data. requested: one of TYPES.
    Returns:
        one of TYPES.
    """
    if array.ndim <= 1 or name.endswith("_norm.weight") or name == "position_embd.weight" \
            or not name.endswith(".weight"):
        return "f32"
    if requested in BLOCK_SIZE and array.shape[-1] % BLOCK_SIZE[requested]:
        return "f16"
    return requested


def _encoded(array: np.ndarray, kind: str) -> tuple[np.ndarray, object]:
    """(data, gguf raw_dtype or None) for GGUFWriter.add_tensor."""
    import gguf
    if kind == "f32":
        return array, None
    if kind == "f16":
        return array.astype(np.float16), None
    return QUANTIZERS[kind](array), getattr(gguf.GGMLQuantizationType, kind.upper())


# --------------------------------------------------------------------------- writing
def write_gguf(model: GlassLM, path, tokenizer=None, *, type: str = "f32") -> dict[str, str]:
    """Write `model` (and its tokenizer) to a GGUF file llama.cpp loads, atomically.

    Args:
        model: a GlassLM of a family in ARCHITECTURES.
        path: the .gguf file (str or os.PathLike); replaced if it exists.
        tokenizer: glassllm's SentencePieceTokenizer or BPETokenizer, or a tokenizer.json
            tokenizer of those two kinds (`_write_tokenizer`); None writes tokenizer model
            "none" (llama.cpp then runs on token ids only).
        type: "f32" | "f16" | "q8_0" | "q4_0", the matrices' type (`tensor_type`).
    Returns:
        GGUF tensor name -> the type it was stored in.
    Raises:
        ValueError: one line: an unknown type, a switch llama.cpp cannot run
            (`architecture`), a parameter holding NaN/inf, a tokenizer it cannot describe.
        OSError: as `atomic_replace` (naming `path`); nothing is left behind.
    """
    import gguf
    if type not in TYPES:
        raise ValueError(f"GGUF type {type!r} is not one of {', '.join(TYPES)}")
    arch = architecture(model.cfg)
    tensors = gguf_tensors(model, arch)
    for name, w in tensors.items():
        if not np.isfinite(w).all():
            raise ValueError(f"{name} holds NaN or inf; a broken model is not written")
    kinds = {name: tensor_type(name, w, type) for name, w in tensors.items()}

    def write(tmp: str) -> None:
        writer = gguf.GGUFWriter(tmp, arch)
        try:
            writer.add_name(f"glassllm {model.cfg.family}")
            writer.add_file_type(_FILE_TYPE[type])
            if type in BLOCK_SIZE:
                writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
            _write_hparams(writer, model.cfg, arch)
            _write_tokenizer(writer, tokenizer, model.cfg.vocab_size)
            for name, w in tensors.items():
                data, raw_dtype = _encoded(w, kinds[name])
                writer.add_tensor(name, data, raw_dtype=raw_dtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()

    atomic_replace(os.fspath(path), write, doing="cannot write the GGUF file")
    return kinds


def _write_hparams(writer, cfg: Config, arch: str) -> None:
    """The `{arch}.*` keys llama.cpp's loader reads (llama-model.cpp, src/models/<arch>.cpp)."""
    sliding = [t == "sliding_attention" for t in (cfg.layer_types or ())]
    context = cfg.max_len
    if arch in ("llama", "qwen2") and cfg.sliding_window is not None and any(sliding):
        # These graphs have no window: within `sliding_window` tokens a windowed layer sees
        # every key, so the advertised training context is capped there (exact up to it).
        context = min(context, cfg.sliding_window)
    writer.add_context_length(context)
    writer.add_embedding_length(cfg.d_model)
    writer.add_block_count(cfg.n_layers)
    writer.add_feed_forward_length(cfg.d_ff)
    writer.add_head_count(cfg.n_heads)
    writer.add_head_count_kv(cfg.n_kv_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_vocab_size(cfg.vocab_size)
    if cfg.norm == "rms":
        writer.add_layer_norm_rms_eps(cfg.norm_eps)
    else:
        writer.add_layer_norm_eps(cfg.norm_eps)
    if cfg.positions == "rope":
        writer.add_rope_freq_base(cfg.rope_theta)
        writer.add_rope_dimension_count(int(cfg.head_dim * cfg.rotary_pct))
    if arch == "gptneox":
        writer.add_parallel_residual(cfg.parallel_block)
    if arch in ("gemma2", "gemma3"):
        _write_gemma_keys(writer, cfg, arch, sliding)


def _write_gemma_keys(writer, cfg: Config, arch: str, sliding: list[bool]) -> None:
    """Gemma 2/3: soft-caps, the window and which layers use it (one bool per layer, read by
    llama.cpp's `load_swa_pattern`), the local layers' RoPE base."""
    if cfg.attn_softcap is not None:
        writer.add_attn_logit_softcapping(cfg.attn_softcap)
    if cfg.final_softcap is not None:
        writer.add_final_logit_softcapping(cfg.final_softcap)
    if cfg.sliding_window is not None and any(sliding):
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_sliding_window_pattern(sliding)
    elif arch == "gemma2":  # the graph always has local layers: make the window cover all
        writer.add_sliding_window(cfg.max_len)
    if arch == "gemma3":
        writer.add_rope_freq_base_swa(cfg.rope_local_theta or cfg.rope_theta)


# --------------------------------------------------------------------------- tokenizer
def stores_tokenizer(tokenizer) -> bool:
    """Whether `write_gguf` can write `tokenizer` as `tokenizer.ggml.*` keys: glassllm's
    SentencePiece and GPT-2 byte-level BPE tokenizers (`_write_tokenizer`); not its byte
    tokenizer (no llama.cpp tokenizer model reads ids as bytes)."""
    from ..tokenizers.bpe import BPETokenizer
    from ..tokenizers.sentencepiece import SentencePieceTokenizer
    return isinstance(tokenizer, (SentencePieceTokenizer, BPETokenizer))


def _write_tokenizer(writer, tokenizer, vocab_size: int) -> None:
    """`tokenizer.ggml.*` keys, as llama.cpp's converter writes them (conversion/base.py
    `_set_vocab_sentencepiece`, `_set_vocab_gpt2`); ids past the tokenizer's own up to the
    model's vocab_size are "[PAD<i>]" pieces of type UNUSED, as there.

    - SentencePieceTokenizer (Llama's, llama2.c's): model "llama", pieces with "▁" for the
      space, their scores, types (UNKNOWN 0, CONTROL BOS 1 / EOS 2, BYTE <0x00>..<0xFF>,
      NORMAL), BOS prepended, dummy-prefix space.
    - BPETokenizer (GPT-2 byte-level BPE): model "gpt2", pre-tokenizer "gpt-2", the pieces in
      byte-level characters, the merge list, "<|endoftext|>" as BOS and EOS (CONTROL).
    - None: model "none"; llama.cpp then runs on ids only.

    Raises:
        ValueError: another kind of tokenizer (named), or more ids than the model has.
    """
    from ..tokenizers.bpe import BPETokenizer
    from ..tokenizers.sentencepiece import SentencePieceTokenizer
    if tokenizer is None:
        writer.add_tokenizer_model("none")
        return
    if tokenizer.vocab_size > vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids but the model's "
                         f"vocab_size is {vocab_size}")
    if isinstance(tokenizer, SentencePieceTokenizer):
        tokens, scores, types = _sentencepiece_vocab(tokenizer)
        writer.add_tokenizer_model("llama")
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)
        writer.add_add_bos_token(True)
        writer.add_add_space_prefix(True)
    elif isinstance(tokenizer, BPETokenizer):
        tokens, scores, types, merges = _bpe_vocab(tokenizer)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_merges(merges)
        writer.add_bos_token_id(tokenizer.eot_id)
        writer.add_eos_token_id(tokenizer.eot_id)
        writer.add_add_bos_token(False)
    else:
        raise ValueError(f"a {type(tokenizer).__name__} cannot be written as GGUF "
                         f"tokenizer keys (glassllm writes SentencePiece and GPT-2 BPE ones)")
    for i in range(len(tokens), vocab_size):
        tokens.append(f"[PAD{i}]")
        scores.append(-1000.0)
        types.append(_TOKEN_UNUSED)
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)


def _sentencepiece_vocab(tok) -> tuple[list[str], list[float], list[int]]:
    """(pieces with "▁" for " ", scores, gguf.TokenType values) of a SentencePieceTokenizer."""
    from ..tokenizers.sentencepiece import SP_BYTE_OFFSET
    tokens, types = [], []
    for i, piece in enumerate(tok.pieces):
        if i == 0:
            types.append(names.TOKEN_UNKNOWN)
        elif i in (1, 2):
            types.append(names.TOKEN_CONTROL)  # BOS, EOS
        elif SP_BYTE_OFFSET <= i < SP_BYTE_OFFSET + 256:
            types.append(names.TOKEN_BYTE)
            piece = f"<0x{i - SP_BYTE_OFFSET:02X}>"
        else:
            types.append(names.TOKEN_NORMAL)
        tokens.append(names.sp_piece_to_gguf(piece))
    return tokens, [float(s) for s in tok.scores], types


def _bpe_vocab(tok) -> tuple[list[str], list[float], list[int], list[str]]:
    """(pieces, scores, types, merges "a b") of a byte-level BPETokenizer."""
    import json
    spec = json.loads(tok.to_json())["tokenizer"]
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    by_id = {i: t for t, i in spec["model"]["vocab"].items()}
    for t in spec.get("added_tokens", []):
        by_id[t["id"]] = t["content"]
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(tok.vocab_size)]
    types = [names.TOKEN_CONTROL if i in special else names.TOKEN_NORMAL if i in by_id
             else _TOKEN_UNUSED for i in range(tok.vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens, [0.0] * len(tokens), types, merges
