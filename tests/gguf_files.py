"""GGUF files for the tests, written with the `gguf` package's own GGUFWriter (not glassllm's
writer), the way llama.cpp's convert_hf_to_gguf.py lays models out (`formats.gguf_names`)."""
from __future__ import annotations

import json

import gguf
import numpy as np

from glassllm.formats import gguf_names as names
from glassllm.tokenizers import SentencePieceTokenizer
from glassllm.tokenizers.bpe import BPETokenizer

QT = gguf.GGMLQuantizationType


def tiny_model(family: str, seed: int = 0, **overrides):
    """A small random GlassLM of `family` (weights scaled to keep the logits O(1))."""
    from glassllm.model import Config, GlassLM
    kw = dict(vocab_size=300, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_len=32)
    if family == "gpt2":
        kw["n_kv_heads"] = 4
    if family in ("gemma2", "gemma3"):
        kw.update(sliding_window=8, n_layers=3 if family == "gemma2" else 7)
    model = GlassLM(Config.preset(family, **{**kw, **overrides}), seed=seed)
    rng = np.random.default_rng(seed)
    for name, p in model.named_parameters():  # norms and biases away from their inits too
        if p.data.ndim == 1:
            p.data = (p.data + rng.normal(0, 0.1, p.data.shape)).astype(np.float32)
    return model


def _keys(w: gguf.GGUFWriter, cfg) -> None:
    w.add_context_length(cfg.max_len)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.d_ff)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    if cfg.head_dim * cfg.n_heads != cfg.d_model:
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    if cfg.positions == "rope":
        w.add_rope_dimension_count(cfg.rotary_dim)
        w.add_rope_freq_base(cfg.rope_theta)
    if cfg.norm == "rms":
        w.add_layer_norm_rms_eps(cfg.norm_eps)
    else:
        w.add_layer_norm_eps(cfg.norm_eps)
    if cfg.family in ("gemma2", "gemma3", "olmo2") and cfg.sliding_window is not None:
        w.add_sliding_window(cfg.sliding_window)
        if cfg.family == "olmo2":
            w.add_sliding_window_pattern([cfg.layer_is_sliding(i) for i in range(cfg.n_layers)])
    if cfg.rope_local_theta is not None:
        w.add_rope_freq_base_swa(cfg.rope_local_theta)
    if cfg.attn_softcap is not None:
        w.add_attn_logit_softcapping(cfg.attn_softcap)
    if cfg.final_softcap is not None:
        w.add_final_logit_softcapping(cfg.final_softcap)
    if cfg.family == "neox":
        w.add_parallel_residual(cfg.parallel_block)


def _tensor(w: gguf.GGUFWriter, name: str, value: np.ndarray, qtype) -> None:
    value = np.ascontiguousarray(value, dtype=np.float32)
    if qtype == QT.F32 or value.ndim == 1 or value.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0]:
        w.add_tensor(name, value)
    else:
        w.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)


def _tensors(w: gguf.GGUFWriter, model, qtype) -> None:
    cfg = model.cfg
    state = {n: p.data for n, p in model.named_parameters()}
    done = set()
    for ours, theirs in names.tensor_names(cfg).items():
        if ".attn_qkv." in theirs:
            if theirs in done:
                continue
            done.add(theirs)
            part = theirs.rsplit(".", 1)[1]
            base = ours.rsplit(".", 2)[0]  # blocks.i.attention
            value = names.join_qkv(*(state[f"{base}.{x}.{part}"] for x in ("query", "key", "value")),
                                   part)
        else:
            value = names.to_gguf(cfg, ours, state[ours])
        _tensor(w, theirs, value, qtype)


def _vocab(w: gguf.GGUFWriter, tok) -> None:
    if isinstance(tok, SentencePieceTokenizer):
        types = [names.TOKEN_NORMAL] * tok.vocab_size
        types[0], types[1], types[2] = names.TOKEN_UNKNOWN, names.TOKEN_CONTROL, names.TOKEN_CONTROL
        types[3:259] = [names.TOKEN_BYTE] * 256
        w.add_tokenizer_model("llama")
        w.add_token_list([names.sp_piece_to_gguf(p) for p in tok.pieces])
        w.add_token_scores([float(s) for s in tok.scores])
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
    elif isinstance(tok, BPETokenizer):
        spec = json.loads(tok._tok.to_str())
        vocab = {**spec["model"]["vocab"], **{t["content"]: t["id"] for t in spec["added_tokens"]}}
        tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
        special = {t["content"] for t in spec["added_tokens"] if t["special"]}
        merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokens)
        w.add_token_types([names.TOKEN_CONTROL if t in special else names.TOKEN_NORMAL
                           for t in tokens])
        w.add_token_merges(merges)
        w.add_eos_token_id(tok.eot_id)
        w.add_bos_token_id(tok.eot_id)


def write_gguf(path, model, tokenizer=None, qtype=QT.F32) -> None:
    """`model` (and `tokenizer`) as a GGUF file of tensor type `qtype` for the matrices whose
    rows fill whole blocks (the rest F32, as llama.cpp keeps 1-D tensors)."""
    w = gguf.GGUFWriter(str(path), names.ARCH_OF_FAMILY[model.cfg.family])
    _keys(w, model.cfg)
    if tokenizer is not None:
        _vocab(w, tokenizer)
    _tensors(w, model, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
