"""Hugging Face checkpoints in and out: `GPT2LMHeadModel` and `LlamaForCausalLM` <-> `GlassLM`.

A checkpoint is a directory as transformers' `save_pretrained` writes it: `config.json` plus
`model.safetensors`, or shards `model-0000i-of-0000n.safetensors` listed in
`model.safetensors.index.json`; both are read, and `to_hf` writes shards when the weights pass
`max_shard_size` (split as huggingface_hub's `split_state_dict_into_shards_factory` does).
Tensors are read and written with the `safetensors` package.

The conversion is a renaming plus two layout facts (the mapping nanoGPT's
`GPT.from_pretrained` makes, model.py, and transformers' modeling_gpt2.py / modeling_llama.py):

- GPT-2 stores its projections as `Conv1D` with weight `[in, out]`, glassllm's `Linear`
  layout, so nothing is transposed; only `attn.c_attn` holds query, key and value side by
  side (`[C, 3C]`) and is split in three.
- Llama stores `nn.Linear` weights `[out, in]`: every projection is transposed. transformers
  applies rotary embedding in the rotate-half convention (to q/k weights it permuted when
  converting Meta's checkpoints); `functional.rope` is rotate-half too, so the weights are used
  as they are -- the parity tests against transformers are the proof.

Anything this code cannot reproduce exactly (rope scaling, sliding windows, biases Llama does
not have, GPT-2's attention variants, another activation) raises ValueError naming the config
field: a different model is never loaded silently. Weights of any float dtype (float16,
bfloat16 through `ml_dtypes`) become float32, glassllm's dtype.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import ml_dtypes  # noqa: F401  -- registers bfloat16 with NumPy, so bf16 checkpoints load
import numpy as np
from safetensors.numpy import save_file

from . import safetensors_io
from .atomic import atomic_replace, atomic_write
from ..checks import check_int, check_real, is_int
from ..model import Config, GlassLM

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SHARD_FILE = "model-{index:05d}-of-{count:05d}.safetensors"  # transformers' shard names
_SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
# save_pretrained's default in transformers 5 (4.x: "5GB"); huggingface_hub's decimal units
DEFAULT_MAX_SHARD_SIZE = "50GB"
_SIZE_UNITS = {"TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3}

# Buffers older transformers versions saved next to the weights; they hold no learned values
# (GPT-2's causal mask, Llama's rotary frequencies), so reading skips them.
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


# --------------------------------------------------------------------------- public API
def is_hf_dir(path) -> bool:
    """True if `path` is a directory holding a `config.json` (a Hugging Face checkpoint)."""
    return Path(path).is_dir() and (Path(path) / CONFIG_FILE).is_file()


def from_hf(path, *, max_len: int | None = None) -> GlassLM:
    """Load a GPT-2 or Llama checkpoint saved by transformers into a float32 `GlassLM`.

    Args:
        path: the checkpoint directory (or a file inside it, e.g. its config.json).
        max_len: optional shorter context than the checkpoint's (`n_positions` /
            `max_position_embeddings`), to keep rope tables and KV caches small; GPT-2 keeps
            the first `max_len` position embeddings.

    Returns:
        GlassLM whose logits match transformers' (eager attention, eval mode) to float32
        rounding.

    Raises:
        FileNotFoundError: no config.json, no weights file, or a shard the index names.
        ValueError: unknown `model_type`, an unsupported config field (named in the message),
            a missing or unexpected tensor, a tensor whose shape differs from the config's.
    """
    directory = _checkpoint_dir(path)
    cfg = config_from_hf(_read_config(directory), where=str(directory / CONFIG_FILE))
    stored_len = cfg.max_len
    if max_len is not None and max_len != stored_len:
        max_len = check_int(max_len, "from_hf: max_len (at most the checkpoint's context "
                            "length)", low=1, high=stored_len)
        cfg = Config.from_dict({**cfg.to_dict(), "max_len": max_len})
    model = GlassLM(cfg)
    state = _state_from_hf(model, read_tensors(directory), directory, stored_len)
    model.load_state_dict(state)
    return model


def to_hf(model: GlassLM, out_dir, tokenizer=None, *, overwrite: bool = False,
          source=None, max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE) -> Path:
    """Write `model` as a Hugging Face checkpoint: `out_dir/config.json` + `model.safetensors`,
    or, when the weights pass `max_shard_size`, shards `model-00001-of-0000N.safetensors` and
    their index `model.safetensors.index.json`, as transformers' `save_pretrained` writes them.

    `transformers.AutoModelForCausalLM.from_pretrained(out_dir)` then builds a
    `GPT2LMHeadModel` (family gpt2) or `LlamaForCausalLM` (family llama) with the same logits.
    Dropout probabilities are written as 0, since glassllm has none: continued training in
    PyTorch starts from the same function. A gpt2-family config's `rope_theta` (unused: GPT-2
    has learned positions) is not written, so `from_hf` gives that field its default.

    Args:
        model: the GlassLM to export.
        out_dir: directory, created if needed; its other files are left as they are.
            A directory that already holds a model.safetensors or config.json (or the
            tokenizer.json / tokenizer_config.json this call writes) is refused unless
            `overwrite=True` (a checkpoint, a training run's model, a tokenizer of one's own
            is never replaced by accident).
        tokenizer: optional. glassllm's byte, BPE and SentencePiece tokenizers are written as
            `tokenizer.json` (the `tokenizers` library's format) + `tokenizer_config.json`,
            which `transformers.AutoTokenizer` loads with the same ids (`write_tokenizer`).
            Its `eot_id` becomes the config's eos_token_id and its start id
            (`glassllm.formats.tokenizer.start_id`: `bos_id`, or `eot_id` when it has none, as
            GPT-2's config has bos = eos = 50256) the bos_token_id, from which
            transformers' `generate()` starts an unconditional sample.
        overwrite: allow replacing an existing checkpoint in out_dir.
        source: optional path of the file `model` was read from; writing over (or removing)
            it is refused even with overwrite=True (it would destroy the model being
            converted).
        max_shard_size: the largest weights file, in bytes (an int) or as huggingface_hub
            writes it ("5GB", "100MB", "500KB": decimal units). Tensors are taken in order
            and a new shard starts when the next one would pass the limit; a tensor larger
            than the limit gets a shard of its own (huggingface_hub's rule). One shard is
            written as `model.safetensors`, with no index. Default "50GB", transformers 5's.

    Each file is written to a temporary name and moved into place (atomic per file); weights
    files of an earlier checkpoint in out_dir that the new one does not use (a single file
    replaced by shards, or shards of another split) are removed, as save_pretrained does;
    config.json comes last, so a directory with it holds a complete checkpoint.

    Returns:
        Path of out_dir.

    Raises:
        ValueError: a gpt2-family model with grouped KV heads (GPT-2 has none); an empty
            out_dir; a max_shard_size that is not a positive size.
        FileExistsError: out_dir is a file, or already holds model.safetensors, its index,
            config.json or a tokenizer file this call writes (and overwrite is False), or
            one of the files to write or remove is `source`.
    """
    if not os.fspath(out_dir):  # Path("") is the current directory: never a silent default
        raise ValueError("to_hf: the output directory path is empty; give a directory such as "
                         "exported/")
    limit = shard_size_bytes(max_shard_size)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} is a file, not a directory; give a directory path")
    cfg = model.cfg
    tensors = _state_to_hf(cfg, model.state_dict())
    shards = _split_into_shards(tensors, limit)
    names = ([WEIGHTS_FILE] if len(shards) == 1 else
             [SHARD_FILE.format(index=i + 1, count=len(shards)) for i in range(len(shards))])
    stale = [p for p in (sorted(out.iterdir()) if out.is_dir() else [])
             if p.name not in names and (p.name in (WEIGHTS_FILE, INDEX_FILE)
                                         or _SHARD_NAME.fullmatch(p.name))]
    if len(shards) > 1:
        stale = [p for p in stale if p.name != INDEX_FILE]
    targets = [out / n for n in names] + [out / INDEX_FILE, out / CONFIG_FILE,
                                          out / TOKENIZER_FILE, out / TOKENIZER_CONFIG_FILE]
    if source is not None:
        for target in targets + stale:
            if target.exists() and os.path.samefile(target, source):
                raise FileExistsError(f"{target} is the model being converted ({source}); "
                                      f"choose another directory")
    writes_tokenizer = tokenizer is not None and stores_tokenizer(tokenizer, cfg.vocab_size)
    guarded = (WEIGHTS_FILE, INDEX_FILE, CONFIG_FILE) + \
        ((TOKENIZER_FILE, TOKENIZER_CONFIG_FILE) if writes_tokenizer else ())
    existing = [n for n in guarded if (out / n).exists()]
    if existing and not overwrite:
        raise FileExistsError(f"{out} already holds {' and '.join(existing)}; choose a new "
                              f"directory or allow overwriting (overwrite=True, --force)")
    hf_config = config_to_hf(cfg)
    if tokenizer is not None:
        from .tokenizer import start_id
        hf_config["bos_token_id"] = start_id(tokenizer)
        hf_config["eos_token_id"] = int(tokenizer.eot_id)
    out.mkdir(parents=True, exist_ok=True)
    for name, shard in zip(names, shards):
        atomic_replace(out / name,
                       lambda tmp, shard=shard: save_file(shard, tmp, metadata={"format": "pt"}))
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
                 "weight_map": {tensor: name for name, shard in zip(names, shards)
                                for tensor in shard}}
        with atomic_write(out / INDEX_FILE, "w") as f:
            f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    for path in stale:  # a reader must not find the earlier checkpoint's weights
        path.unlink()
    if writes_tokenizer:
        write_tokenizer(out, tokenizer, cfg.max_len)
    text = json.dumps(hf_config, indent=2, sort_keys=True) + "\n"
    with atomic_write(out / CONFIG_FILE, "w") as f:
        f.write(text)
    return out


def shard_size_bytes(size) -> int:
    """A shard size in bytes: a positive int, or a string in huggingface_hub's units
    ("5GB" = 5 * 10**9, "100MB", "500KB", "1TB"; `parse_size_to_int`).

    Raises:
        ValueError: anything else (zero, negative, an unknown unit, not a number).
    """
    if is_int(size):
        value = int(size)
    elif isinstance(size, str) and size.strip()[-2:].upper() in _SIZE_UNITS:
        text = size.strip()
        try:
            value = int(float(text[:-2].strip()) * _SIZE_UNITS[text[-2:].upper()])
        except ValueError:
            value = 0
    else:
        value = 0
    if value <= 0:
        raise ValueError(f"max_shard_size={size!r}: give a positive number of bytes or a size "
                         f"such as '5GB', '100MB', '500KB'")
    return value


def _split_into_shards(tensors: dict[str, np.ndarray], limit: int) -> list[dict]:
    """Tensors in order into shards of at most `limit` bytes: a new shard starts when the next
    tensor would pass the limit, and a tensor larger than the limit is a shard of its own
    (huggingface_hub's `split_state_dict_into_shards_factory`). At least one shard."""
    shards, current, size = [], {}, 0
    for name, tensor in tensors.items():
        if tensor.nbytes > limit:
            shards.append({name: tensor})
            continue
        if current and size + tensor.nbytes > limit:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensor
        size += tensor.nbytes
    if current or not shards:
        shards.append(current)
    return shards


def stores_tokenizer(tokenizer, vocab_size: int) -> bool:
    """Whether `to_hf` writes `tokenizer` (as tokenizer.json, which `tokenizer_from_hf` and
    transformers' AutoTokenizer read): glassllm's byte, BPE and SentencePiece tokenizers, when
    they fit the model's vocab_size."""
    from .hf_tokenizer import writable
    return writable(tokenizer) and tokenizer.vocab_size <= vocab_size


def write_tokenizer(out_dir, tokenizer, max_len: int) -> None:
    """Write `tokenizer.json` (built with the `tokenizers` library) and
    `tokenizer_config.json` into `out_dir`, atomically, so that
    `transformers.AutoTokenizer.from_pretrained(out_dir)` encodes as `tokenizer` does
    (`glassllm.formats.hf_tokenizer`)."""
    from .hf_tokenizer import to_hf_tokenizer, tokenizer_config
    text = to_hf_tokenizer(tokenizer).to_str()
    with atomic_write(Path(out_dir) / TOKENIZER_FILE, "w") as f:
        f.write(text)
    config = json.dumps(tokenizer_config(tokenizer, max_len), indent=2, ensure_ascii=False)
    with atomic_write(Path(out_dir) / TOKENIZER_CONFIG_FILE, "w") as f:
        f.write(config + "\n")


def tokenizer_from_hf(path, vocab_size: int | None = None):
    """The tokenizer that goes with a checkpoint directory.

    Looked for, in order: GPT-2's `vocab.json` + `merges.txt`, then `tokenizer.json` (a
    byte-level BPE with an "<|endoftext|>" token, or the byte or SentencePiece layout `to_hf`
    writes), both read by `glassllm.formats.tokenizer.load_tokenizer`. With neither, a model of
    vocab_size 257 gets the `ByteTokenizer` (`to_hf` of glassllm before tokenizer.json was
    written for it),
    any other model none: the result is None (the weights convert alone, as a weights-only
    glassllm file; see `glassllm.formats.files.save`).

    Args:
        path: the checkpoint directory (or a file inside it).
        vocab_size: the model's; checked against the tokenizer's (None: no check, and no
            ByteTokenizer fallback).

    Returns:
        a tokenizer, or None when the directory has no tokenizer files.

    Raises:
        ValueError: unreadable tokenizer files, or a tokenizer with more ids than vocab_size.
    """
    from .tokenizer import ByteTokenizer, load_tokenizer

    directory = _checkpoint_dir(path)
    gpt2_files = (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file()
    if gpt2_files or (directory / TOKENIZER_FILE).is_file():
        tokenizer = load_tokenizer(directory)
    elif vocab_size == ByteTokenizer.vocab_size:
        tokenizer = ByteTokenizer()
    else:
        return None
    if vocab_size is not None and tokenizer.vocab_size > vocab_size:
        raise ValueError(f"{directory}: the tokenizer has {tokenizer.vocab_size} ids, more than "
                         f"the model's vocab_size {vocab_size}")
    return tokenizer


# --------------------------------------------------------------------------- configs
def config_from_hf(hf: dict, where: str = "config.json") -> Config:
    """glassllm Config from a transformers config.json dict (model_type gpt2 or llama).

    Args:
        hf: the parsed config.json.
        where: the file's name, for messages (`from_hf` gives the full path).

    Raises:
        ValueError: unknown model_type, a missing size field, a field of the wrong type (sizes
            must be positive integers, epsilons and rope_theta finite positive numbers,
            tie_word_embeddings a bool), or a field whose value glassllm cannot reproduce. The
            message names the field and `where`.
    """
    model_type = hf.get("model_type")
    if model_type == "gpt2":
        fields = _gpt2_config(hf, where)
    elif model_type == "llama":
        fields = _llama_config(hf, where)
    else:
        raise ValueError(f"{where}: model_type {model_type!r} is not supported "
                         f"(glassllm reads 'gpt2' and 'llama')")
    try:
        return Config(**fields)
    except ValueError as e:  # e.g. hidden size not divisible by the number of heads
        raise ValueError(f"{where}: {e}") from None


_REQUIRED = object()


def _field(hf: dict, name: str, where: str, kind: type = int, default=_REQUIRED):
    """hf[name] checked as a positive integer (kind int) or finite positive number (float);
    `default` when absent or null, ValueError naming the field if required."""
    value = hf.get(name)
    if value is None:
        if default is _REQUIRED:
            raise ValueError(f"{where}: field {name!r} is missing")
        return default
    what = f"{where}: field {name!r}"
    return check_int(value, what, low=1) if kind is int else \
        check_real(value, what, positive=True)


def _require(hf: dict, name: str, allowed, default, where: str) -> None:
    """Raise unless hf[name] (or its transformers default) is one of `allowed`."""
    value = hf.get(name, default)
    if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
        raise ValueError(f"{where}: {name}={value!r} is not supported by glassllm "
                         f"(supported: {list(allowed)})")


def _gpt2_config(hf: dict, where: str) -> dict:
    # gelu_pytorch_tanh is the same tanh approximation as gelu_new, computed by torch.
    _require(hf, "activation_function", ("gelu_new", "gelu_pytorch_tanh"), "gelu_new", where)
    _require(hf, "scale_attn_weights", (True,), True, where)
    _require(hf, "scale_attn_by_inverse_layer_idx", (False,), False, where)
    _require(hf, "reorder_and_upcast_attn", (False,), False, where)
    _require(hf, "add_cross_attention", (False,), False, where)
    _require(hf, "tie_word_embeddings", (True,), True, where)
    return dict(family="gpt2", vocab_size=_field(hf, "vocab_size", where),
                d_model=_field(hf, "n_embd", where), n_layers=_field(hf, "n_layer", where),
                n_heads=_field(hf, "n_head", where), max_len=_field(hf, "n_positions", where),
                # None means 4 * n_embd in both libraries
                d_ff=_field(hf, "n_inner", where, default=None),
                norm_eps=_field(hf, "layer_norm_epsilon", where, float, 1e-5),
                tie_embeddings=True)


def _llama_config(hf: dict, where: str) -> dict:
    _require(hf, "hidden_act", ("silu",), "silu", where)
    _require(hf, "attention_bias", (False,), False, where)
    _require(hf, "mlp_bias", (False,), False, where)
    _require(hf, "rope_scaling", (None,), None, where)
    _require(hf, "sliding_window", (None,), None, where)
    d_model = _field(hf, "hidden_size", where)
    n_heads = _field(hf, "num_attention_heads", where)
    head_dim = _field(hf, "head_dim", where, default=None)
    if head_dim is not None and head_dim * n_heads != d_model:
        raise ValueError(f"{where}: head_dim={head_dim} differs from hidden_size / "
                         f"num_attention_heads = {d_model} / {n_heads}; glassllm needs them equal")
    tie = hf.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise ValueError(f"{where}: field 'tie_word_embeddings' must be true or false, "
                         f"got {tie!r}")
    return dict(family="llama", vocab_size=_field(hf, "vocab_size", where), d_model=d_model,
                n_layers=_field(hf, "num_hidden_layers", where), n_heads=n_heads,
                n_kv_heads=_field(hf, "num_key_value_heads", where, default=n_heads),
                max_len=_field(hf, "max_position_embeddings", where),
                d_ff=_field(hf, "intermediate_size", where),
                rope_theta=_llama_rope_theta(hf, where),
                norm_eps=_field(hf, "rms_norm_eps", where, float, 1e-6), tie_embeddings=tie)


def _llama_rope_theta(hf: dict, where: str) -> float:
    """RoPE base: `rope_parameters` (transformers 5) or `rope_theta` (transformers 4)."""
    theta = _field(hf, "rope_theta", where, float, None)
    params = hf.get("rope_parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise ValueError(f"{where}: field 'rope_parameters' must be an object, got "
                             f"{params!r}")
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"{where}: rope_parameters.rope_type={rope_type!r} is not "
                             f"supported by glassllm (only 'default', unscaled RoPE)")
        extra = sorted(set(params) - {"rope_type", "type", "rope_theta"})
        if extra:
            raise ValueError(f"{where}: rope_parameters field(s) {extra} are not "
                             f"supported by glassllm")
        inner = _field(params, "rope_theta", f"{where}: rope_parameters", float, theta)
        if theta is not None and inner != theta:
            raise ValueError(f"{where}: rope_theta={theta} and "
                             f"rope_parameters.rope_theta={inner} disagree")
        theta = inner
    return 10000.0 if theta is None else theta


def config_to_hf(cfg: Config) -> dict:
    """transformers config.json dict for a glassllm Config (the inverse of `config_from_hf`).

    Raises:
        ValueError: gpt2 family with n_kv_heads != n_heads.
    """
    common = {"vocab_size": cfg.vocab_size, "bos_token_id": None, "eos_token_id": None,
              "pad_token_id": None, "dtype": "float32", "use_cache": True}
    if cfg.family == "gpt2":
        if cfg.n_kv_heads != cfg.n_heads:
            raise ValueError(f"to_hf: GPT-2 has no grouped KV heads, but this gpt2-family model "
                             f"has n_kv_heads={cfg.n_kv_heads} != n_heads={cfg.n_heads}")
        return {**common, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                "n_embd": cfg.d_model, "n_layer": cfg.n_layers, "n_head": cfg.n_heads,
                "n_positions": cfg.max_len, "n_inner": cfg.d_ff,
                "activation_function": "gelu_new", "layer_norm_epsilon": cfg.norm_eps,
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
                "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                "reorder_and_upcast_attn": False, "tie_word_embeddings": True}
    return {**common, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": cfg.d_model, "intermediate_size": cfg.d_ff,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
            "max_position_embeddings": cfg.max_len, "rms_norm_eps": cfg.norm_eps,
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
            "attention_dropout": 0.0,
            # rope_theta for transformers 4.x, rope_parameters for 5.x
            "rope_theta": cfg.rope_theta, "rope_scaling": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
            "tie_word_embeddings": cfg.tie_embeddings}


# --------------------------------------------------------------------------- tensor names
def _tensor_map(cfg: Config) -> list[tuple[str, str, bool]]:
    """(glassllm name, HF name, transpose) for every tensor except GPT-2's fused c_attn.

    HF names are written without GPT-2's optional "transformer." prefix.
    """
    if cfg.family == "gpt2":
        rows = [("token_embedding.weight", "wte.weight", False),
                ("position_embedding.weight", "wpe.weight", False)]
        for i in range(cfg.n_layers):
            b, h = f"blocks.{i}.", f"h.{i}."
            for ours, theirs in (("attention_norm", "ln_1"), ("attention.output", "attn.c_proj"),
                                 ("mlp_norm", "ln_2"), ("mlp.up", "mlp.c_fc"),
                                 ("mlp.down", "mlp.c_proj")):
                for p in ("weight", "bias"):
                    rows.append((f"{b}{ours}.{p}", f"{h}{theirs}.{p}", False))
        rows += [("final_norm.weight", "ln_f.weight", False),
                 ("final_norm.bias", "ln_f.bias", False)]
        return rows
    rows = [("token_embedding.weight", "model.embed_tokens.weight", False)]
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"model.layers.{i}."
        rows += [(f"{b}attention_norm.weight", f"{h}input_layernorm.weight", False),
                 (f"{b}mlp_norm.weight", f"{h}post_attention_layernorm.weight", False)]
        for ours, theirs in (("attention.query", "self_attn.q_proj"),
                             ("attention.key", "self_attn.k_proj"),
                             ("attention.value", "self_attn.v_proj"),
                             ("attention.output", "self_attn.o_proj"),
                             ("mlp.gate", "mlp.gate_proj"), ("mlp.up", "mlp.up_proj"),
                             ("mlp.down", "mlp.down_proj")):
            rows.append((f"{b}{ours}.weight", f"{h}{theirs}.weight", True))
    rows.append(("final_norm.weight", "model.norm.weight", False))
    if not cfg.tie_embeddings:
        rows.append(("lm_head.weight", "lm_head.weight", True))
    return rows


def _qkv_names(i: int) -> list[str]:
    return [f"blocks.{i}.attention.{n}" for n in ("query", "key", "value")]


def _state_from_hf(model: GlassLM, tensors: dict[str, np.ndarray], where: Path,
                   stored_len: int) -> dict:
    """State dict for `model` (float32, glassllm layouts) from HF tensors, every shape checked.

    stored_len: the checkpoint's context length; GPT-2 keeps the first model.cfg.max_len rows
    of its stored position embeddings.
    """
    cfg = model.cfg
    if cfg.family == "gpt2":  # the original OpenAI upload has no "transformer." prefix
        tensors = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    tensors = {k: v for k, v in tensors.items() if not k.endswith(_IGNORED_SUFFIXES)}
    if cfg.tie_embeddings:  # transformers ties lm_head to the embedding; a stored copy is unused
        tensors.pop("lm_head.weight", None)
    shapes = {name: p.shape for name, p in model.named_parameters()}  # expected shapes
    if cfg.family == "gpt2":
        shapes["position_embedding.weight"] = (stored_len, cfg.d_model)
    used: set[str] = set()

    def take(name: str, shape: tuple) -> np.ndarray:
        if name not in tensors:
            raise ValueError(f"{where}: tensor {name!r} is missing from the checkpoint")
        value = tensors[name]
        if tuple(value.shape) != tuple(shape):
            raise ValueError(f"{where}: tensor {name!r} has shape {tuple(value.shape)}, "
                             f"config.json implies {tuple(shape)}")
        used.add(name)
        return np.asarray(value, dtype=np.float32)

    state = {}
    for ours, theirs, transpose in _tensor_map(cfg):
        shape = shapes[ours][::-1] if transpose else shapes[ours]
        value = take(theirs, shape)
        state[ours] = value.T if transpose else value
    if cfg.family == "gpt2":
        C = cfg.d_model
        for i in range(cfg.n_layers):
            weight = take(f"h.{i}.attn.c_attn.weight", (C, 3 * C))
            bias = take(f"h.{i}.attn.c_attn.bias", (3 * C,))
            for ours, w, b in zip(_qkv_names(i), np.split(weight, 3, axis=1),
                                  np.split(bias, 3)):
                state[f"{ours}.weight"], state[f"{ours}.bias"] = w, b
    if cfg.family == "gpt2":
        state["position_embedding.weight"] = state["position_embedding.weight"][:cfg.max_len]
    unexpected = sorted(set(tensors) - used)
    if unexpected:
        raise ValueError(f"{where}: unexpected tensor(s) {unexpected[:8]} for a "
                         f"{cfg.family} model with this config.json")
    return state


def _state_to_hf(cfg: Config, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF tensors (contiguous float32, HF names and layouts) from a glassllm state dict."""
    prefix = "transformer." if cfg.family == "gpt2" else ""
    out = {}
    for ours, theirs, transpose in _tensor_map(cfg):
        value = state[ours].T if transpose else state[ours]
        out[prefix + theirs] = np.ascontiguousarray(value, dtype=np.float32)
    if cfg.family == "gpt2":
        for i in range(cfg.n_layers):
            q, k, v = _qkv_names(i)
            for p, axis in (("weight", 1), ("bias", 0)):
                fused = np.concatenate([state[f"{q}.{p}"], state[f"{k}.{p}"],
                                        state[f"{v}.{p}"]], axis=axis)
                out[f"{prefix}h.{i}.attn.c_attn.{p}"] = fused.astype(np.float32)
    return out


# --------------------------------------------------------------------------- files
def _checkpoint_dir(path) -> Path:
    path = Path(path)
    if path.is_file():  # e.g. .../config.json or .../model.safetensors
        path = path.parent
    if not path.is_dir():
        raise FileNotFoundError(f"Hugging Face checkpoint directory not found: {path}")
    return path


def _read_config(directory: Path) -> dict:
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: a Hugging Face checkpoint directory "
                                f"needs a config.json")
    try:
        hf = json.loads(config_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{config_path}: not valid JSON ({e})") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{config_path}: expected a JSON object")
    return hf


def read_tensors(directory) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint directory, by HF name, as NumPy arrays (stored dtype).

    Reads `model.safetensors`, else the shards named by `model.safetensors.index.json`.

    Raises:
        FileNotFoundError: neither file, or a shard the index names is absent.
        ValueError: an unreadable file, a malformed index, a tensor in two shards.
    """
    directory = Path(directory)
    single, index = directory / WEIGHTS_FILE, directory / INDEX_FILE
    if single.is_file() or os.path.lexists(single):  # a link to nowhere, a FIFO: said below
        files = [single]
    elif index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = [directory / name for name in sorted(set(weight_map.values()))]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{index}: not a safetensors index ({e!r})") from None
    else:
        other = sorted(p.name for p in directory.glob("*.bin"))
        hint = f" (found {other}: re-save with safe_serialization=True)" if other else ""
        raise FileNotFoundError(f"{directory}: no {WEIGHTS_FILE} or {INDEX_FILE}{hint}")
    tensors: dict[str, np.ndarray] = {}
    for file in files:
        if not os.path.lexists(file):  # one that is there but no regular file: said below
            raise FileNotFoundError(f"{file} not found (named by {INDEX_FILE})")
        found = _read_safetensors(file)
        twice = sorted(set(found) & set(tensors))
        if twice:
            raise ValueError(f"{file}: tensor(s) {twice[:8]} are also in another shard")
        tensors.update(found)
    return tensors


def _read_safetensors(file: Path) -> dict[str, np.ndarray]:
    """All tensors of one safetensors file as NumPy arrays (`safetensors_io.open_file`).

    Raises:
        ValueError: naming the file: a damaged file (header, offsets, UTF-8), or a tensor
            dtype NumPy has no type for (float8, float4). A MemoryError or Ctrl-C propagates
            as it is; an OSError keeps its type and names the file.
    """
    with safetensors_io.open_file(file, noun="safetensors weights file") as f:
        return {name: f.tensor(name) for name in f.table()}
