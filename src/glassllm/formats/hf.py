"""Hugging Face checkpoints in and out: every transformers class glassllm computes exactly.

Classes (`hf_config.ARCHITECTURES`): `GPT2LMHeadModel`, `LlamaForCausalLM` (SmolLM2 is one),
`MistralForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `GPTNeoXForCausalLM` (Pythia),
`GPTNeoForCausalLM` (TinyStories), `PhiForCausalLM`, `GemmaForCausalLM`, `Gemma2ForCausalLM`,
`Gemma3ForCausalLM` (text only, model_type gemma3_text), `Olmo2ForCausalLM`. Each is a preset
of `Config`'s switches (docs/architectures.md); `hf_config` reads and writes its config.json,
`hf_tensors` names its tensors.

A checkpoint is a directory as transformers' `save_pretrained` writes it: `config.json` plus
`model.safetensors`, or shards `model-0000i-of-0000n.safetensors` listed in
`model.safetensors.index.json`; both are read, and `to_hf` writes shards when the weights pass
`max_shard_size` (split as huggingface_hub's `split_state_dict_into_shards_factory` does).
Tensors are read and written with the `safetensors` package.

Anything this code cannot reproduce exactly (rope scaling, MoE, a config field it does not
know) raises ValueError naming the file and the field: a different model is never loaded
silently. Weights of any float dtype (float16, bfloat16 through `ml_dtypes`) become float32,
glassllm's dtype; integer or bool tensors, and weights holding NaN or infinity, are refused
naming the file and the tensor.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import ml_dtypes  # noqa: F401  -- registers bfloat16 with NumPy, so bf16 checkpoints load
import numpy as np
from safetensors.numpy import save_file

from . import hf_tensors, safetensors_io
from .atomic import atomic_replace, atomic_write
from .hf_config import (ARCHITECTURES, MODEL_TYPES, config_from_hf,  # noqa: F401 (public)
                        config_to_hf)
from ..checks import check_int, is_int
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
# (GPT-Neo's and GPT-NeoX's masks likewise).
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq",
                     ".attention.bias", ".attention.masked_bias")


# --------------------------------------------------------------------------- public API
def is_hf_dir(path) -> bool:
    """True if `path` is a directory holding a `config.json` (a Hugging Face checkpoint)."""
    return Path(path).is_dir() and (Path(path) / CONFIG_FILE).is_file()


def from_hf(path, *, max_len: int | None = None) -> GlassLM:
    """Load a checkpoint saved by transformers (any class of `ARCHITECTURES`) into a float32
    `GlassLM`.

    Args:
        path: the checkpoint directory (or a file inside it, e.g. its config.json).
        max_len: optional shorter context than the checkpoint's (`n_positions` /
            `max_position_embeddings`), to keep rope tables and KV caches small; learned
            positions (GPT-2, GPT-Neo) keep the first `max_len` rows.

    Returns:
        GlassLM whose logits match transformers' (eager attention, eval mode) to float32
        rounding.

    Raises:
        FileNotFoundError: no config.json, no weights file, or a shard the index names.
        ValueError: one line naming the file and the field or tensor: unknown `model_type`,
            a config field glassllm does not implement, a missing or unexpected tensor, a
            tensor whose shape differs from the config's, an integer/bool tensor, a NaN or
            infinite weight.
    """
    directory = _checkpoint_dir(path)
    cfg = config_from_hf(_read_config(directory), where=str(directory / CONFIG_FILE))
    stored_len = cfg.max_len
    if max_len is not None and max_len != stored_len:
        max_len = check_int(max_len, "from_hf: max_len (at most the checkpoint's context "
                            "length)", low=1, high=stored_len)
        cfg = Config.from_dict({**cfg.to_dict(), "max_len": max_len})
    tensors = read_tensors(directory)
    model = GlassLM(_untied_if_head_differs(cfg, tensors, directory))
    state = _state_from_hf(model, tensors, directory, stored_len)
    model.load_state_dict(state)
    return model


def to_hf(model: GlassLM, out_dir, tokenizer=None, *, overwrite: bool = False,
          source=None, max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE) -> Path:
    """Write `model` as a Hugging Face checkpoint: `out_dir/config.json` + `model.safetensors`,
    or, when the weights pass `max_shard_size`, shards `model-00001-of-0000N.safetensors` and
    their index `model.safetensors.index.json`, as transformers' `save_pretrained` writes them.

    `transformers.AutoModelForCausalLM.from_pretrained(out_dir)` then builds the family's own
    class (`hf_config.MODEL_TYPES`, `ARCHITECTURES`: `GPT2LMHeadModel` for gpt2,
    `GPTNeoXForCausalLM` for neox, ...) with the same logits. Dropout probabilities are written
    as 0, since glassllm has none: continued training in PyTorch starts from the same
    function. Switches a family's class cannot hold (a llama-family model with a soft-cap) are
    refused before anything is written; fields a class has no place for and that do not
    change its arithmetic (a gpt2-family config's `rope_theta`) are not written, so `from_hf`
    gives them their defaults.

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
            (`glassllm.tokenizers.start_id`: `bos_id`, or `eot_id` when it has none, as
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
        ValueError: a model its family's class cannot hold (named fields; e.g. a gpt2-family
            model with grouped KV heads); an empty out_dir; a max_shard_size that is not a
            positive size.
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
    hf_config = config_to_hf(cfg)  # a model its class cannot hold: refused before writing
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
    if tokenizer is not None:
        from ..tokenizers import start_id
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
    from ..tokenizers.hf import writable
    return writable(tokenizer) and tokenizer.vocab_size <= vocab_size


def write_tokenizer(out_dir, tokenizer, max_len: int) -> None:
    """Write `tokenizer.json` (built with the `tokenizers` library) and
    `tokenizer_config.json` into `out_dir`, atomically, so that
    `transformers.AutoTokenizer.from_pretrained(out_dir)` encodes as `tokenizer` does
    (`glassllm.tokenizers.hf`)."""
    from ..tokenizers.hf import to_hf_tokenizer, tokenizer_config
    text = to_hf_tokenizer(tokenizer).to_str()
    with atomic_write(Path(out_dir) / TOKENIZER_FILE, "w") as f:
        f.write(text)
    config = json.dumps(tokenizer_config(tokenizer, max_len), indent=2, ensure_ascii=False)
    with atomic_write(Path(out_dir) / TOKENIZER_CONFIG_FILE, "w") as f:
        f.write(config + "\n")


def tokenizer_from_hf(path, vocab_size: int | None = None):
    """The tokenizer that goes with a checkpoint directory.

    Looked for, in order: GPT-2's `vocab.json` + `merges.txt`, then `tokenizer.json`: the
    layouts `glassllm.tokenizers.load_tokenizer` knows (a byte-level BPE with an
    "<|endoftext|>" token, the byte or SentencePiece layout `to_hf` writes), else any
    tokenizer.json the `tokenizers` library loads (`tokenizer_json.HFTokenizer`: Gemma's
    SentencePiece-style BPE, a byte-level BPE with other special tokens; end-of-text and BOS ids
    from config.json's eos_token_id and bos_token_id, the first of a list). With neither, a
    model of vocab_size 257 gets the `ByteTokenizer` (`to_hf` of glassllm before tokenizer.json
    was written for it),
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
    from ..tokenizers import ByteTokenizer, load_tokenizer

    directory = _checkpoint_dir(path)
    gpt2_files = (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file()
    if gpt2_files:
        tokenizer = load_tokenizer(directory)
    elif (directory / TOKENIZER_FILE).is_file():
        tokenizer = _tokenizer_json(directory)
    elif vocab_size == ByteTokenizer.vocab_size:
        tokenizer = ByteTokenizer()
    else:
        return None
    if vocab_size is not None and tokenizer.vocab_size > vocab_size:
        raise ValueError(f"{directory}: the tokenizer has {tokenizer.vocab_size} ids, more than "
                         f"the model's vocab_size {vocab_size}")
    return tokenizer


def _tokenizer_json(directory: Path):
    """The tokenizer.json of a checkpoint: the layouts glassllm knows first (GPT-2's
    byte-level BPE with <|endoftext|>, those `to_hf` writes), else any tokenizer.json through
    `tokenizer_json.HFTokenizer` (Gemma's SentencePiece-style BPE, a byte-level BPE with other
    special tokens), its end-of-text and BOS ids from config.json."""
    from ..tokenizers import load_tokenizer
    from ..tokenizers.tokenizer_json import HFTokenizer
    try:
        return load_tokenizer(directory / TOKENIZER_FILE)
    except ValueError:
        pass
    ids = {}
    if (directory / CONFIG_FILE).is_file():
        config = _read_config(directory)
        for key in ("eos_token_id", "bos_token_id"):
            value = config.get(key)
            if isinstance(value, list):  # several end ids (Llama 3, Gemma 3): the first
                value = value[0] if value else None
            ids[key] = value if is_int(value) else None
    path = directory / TOKENIZER_FILE
    try:
        return HFTokenizer.from_json(path.read_text(encoding="utf-8"),
                                     ids.get("eos_token_id"), ids.get("bos_token_id"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: {e}") from None


# --------------------------------------------------------------------------- tensors
def _state_from_hf(model: GlassLM, tensors: dict[str, np.ndarray], where: Path,
                   stored_len: int) -> dict:
    """State dict for `model` (float32, glassllm layouts) from HF tensors, every shape,
    dtype and value checked.

    stored_len: the checkpoint's context length; learned positions keep the first
    model.cfg.max_len rows of the stored table.
    """
    cfg = model.cfg
    tensors, in_file = _strip_prefix(cfg, tensors)
    for alias, name in hf_tensors.aliases(cfg).items():
        if alias in tensors and name not in tensors:
            tensors[name] = tensors.pop(alias)
            in_file[name] = in_file.pop(alias)
    if cfg.tie_embeddings:  # transformers ties the head to the embedding; a stored copy
        tensors.pop("lm_head.weight", None)  # (equal: _untied_if_head_differs) is unused
        if cfg.family == "neox":  # Pythia's name for the head
            tensors.pop("embed_out.weight", None)
    shapes = {name: p.shape for name, p in model.named_parameters()}  # expected shapes
    if cfg.positions == "learned":
        shapes["position_embedding.weight"] = (stored_len, cfg.d_model)
    used: set[str] = set()

    def take(name: str, shape: tuple) -> np.ndarray:
        if name not in tensors:
            raise ValueError(f"{where}: tensor {in_file(name)!r} is missing from the checkpoint")
        used.add(name)
        return _float_tensor(tensors[name], in_file(name), shape, where)

    state = {}
    for ours, theirs, transpose in hf_tensors.tensor_map(cfg):
        shape = shapes[ours][::-1] if transpose else shapes[ours]
        value = take(theirs, shape)
        state[ours] = value.T if transpose else value
    for i, name, has_bias in hf_tensors.fused_qkv(cfg):
        for part in ("weight", "bias") if has_bias else ("weight",):
            fused = take(f"{name}.{part}", hf_tensors.fused_shape(cfg, part))
            for ours, value in zip(_qkv_names(i), hf_tensors.split_fused(cfg, part, fused)):
                state[f"{ours}.{part}"] = value
    if cfg.positions == "learned":
        state["position_embedding.weight"] = state["position_embedding.weight"][:cfg.max_len]
    unexpected = sorted(in_file(name) for name in set(tensors) - used)
    if unexpected:
        raise ValueError(f"{where}: unexpected tensor(s) {unexpected[:8]} for a "
                         f"{ARCHITECTURES[MODEL_TYPES[cfg.family]]} with this config.json")
    return state


class _FileNames(dict):
    """Tensor name without the prefix -> the name in the file; called with a name the file
    lacks, the name it would have (errors quote what a reader finds in the file)."""

    def __init__(self, names: dict, prefix: str):
        super().__init__(names)
        self.prefix = prefix

    def __call__(self, name: str) -> str:
        head = name.startswith(("lm_head.", "embed_out."))  # stored without the prefix
        return self.get(name, name if head else self.prefix + name)


def _strip_prefix(cfg: Config, tensors: dict) -> tuple[dict, _FileNames]:
    """(tensors by HF name without `hf_tensors.prefix`, their names in the file); the
    buffers transformers rebuilds (`_IGNORED_SUFFIXES`) left out."""
    pre = hf_tensors.prefix(cfg)  # the original OpenAI GPT-2 upload has no "transformer."
    names = {k.removeprefix(pre) if pre else k: k for k in tensors
             if not k.endswith(_IGNORED_SUFFIXES)}
    prefixed = bool(pre) and any(k.startswith(pre) for k in names.values())
    return {k: tensors[v] for k, v in names.items()}, _FileNames(names, pre if prefixed else "")


def _untied_if_head_differs(cfg: Config, tensors: dict[str, np.ndarray],
                            where: Path) -> Config:
    """`cfg` untied when config.json ties the head to the embedding but the checkpoint stores
    a different head: transformers 5 then keeps the stored head ("both are present in the
    checkpoints with different values, so we will NOT tie them", modeling_utils.py), and
    glassllm computes what transformers computes."""
    if not cfg.tie_embeddings:
        return cfg
    pre = hf_tensors.prefix(cfg)
    stored = {k.removeprefix(pre) if pre else k: v for k, v in tensors.items()}
    embedding = next(theirs for ours, theirs, _ in hf_tensors.tensor_map(cfg)
                     if ours == "token_embedding.weight")
    head = stored.get("lm_head.weight", stored.get("embed_out.weight"))
    if head is None or embedding not in stored or np.array_equal(head, stored[embedding]):
        return cfg
    if cfg.family == "gpt2":  # glassllm's GPT-2 is always tied
        raise ValueError(f"{where}: tensor 'lm_head.weight' differs from {embedding!r} but "
                         f"the gpt2 family ties them; glassllm cannot hold an untied GPT-2")
    return Config.from_dict({**cfg.to_dict(), "tie_embeddings": False})


def _float_tensor(value: np.ndarray, name: str, shape: tuple, where: Path) -> np.ndarray:
    """`value` as float32 after checking its shape, its dtype (a float type: an int8 or bool
    tensor is a quantised or damaged checkpoint, not weights to cast) and its values (finite:
    NaN or infinity would poison every logit downstream)."""
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{where}: tensor {name!r} has shape {tuple(value.shape)}, "
                         f"config.json implies {tuple(shape)}")
    if value.dtype.kind in "biuc" or value.dtype == np.bool_:
        raise ValueError(f"{where}: tensor {name!r} has dtype {value.dtype}, glassllm reads "
                         f"float weights only (a quantised checkpoint is not supported)")
    out = np.asarray(value, dtype=np.float32)
    if not np.isfinite(out).all():
        bad = int(np.size(out) - np.isfinite(out).sum())
        raise ValueError(f"{where}: tensor {name!r} holds {bad} NaN or infinite value(s)")
    return out


def _qkv_names(i: int) -> list[str]:
    return [f"blocks.{i}.attention.{n}" for n in ("query", "key", "value")]


def _state_to_hf(cfg: Config, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF tensors (contiguous float32, HF names and layouts) from a glassllm state dict."""
    pre = hf_tensors.prefix(cfg)
    out = {}
    for ours, theirs, transpose in hf_tensors.tensor_map(cfg):
        value = state[ours].T if transpose else state[ours]
        out[pre + theirs] = np.ascontiguousarray(value, dtype=np.float32)
    for i, name, has_bias in hf_tensors.fused_qkv(cfg):
        for part in ("weight", "bias") if has_bias else ("weight",):
            q, k, v = (state[f"{n}.{part}"] for n in _qkv_names(i))
            out[f"{pre}{name}.{part}"] = np.ascontiguousarray(
                hf_tensors.join_fused(cfg, part, q, k, v), dtype=np.float32)
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
