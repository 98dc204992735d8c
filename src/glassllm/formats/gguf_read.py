"""Read a GGUF file (llama.cpp's format) into a float32 `GlassLM` and its tokenizer.

    model, tokenizer = read_gguf("model.gguf")      # also: glassllm.load("model.gguf")

The container is parsed by the `gguf` package's own `GGUFReader` (llama.cpp's Python reader);
this module turns what it returns into glassllm's terms:

- the hyper-parameters from the `{arch}.*` keys (`config_from_keys`), with llama.cpp's
  defaults where a key is absent (llama.cpp src/llama-model.cpp `load_hparams`): RoPE base
  10000, rotated width = head_dim = d_model / n_heads, n_kv_heads = n_heads; Gemma 2's
  soft-caps 50 and 30; Gemma 2/3's sliding-window patterns (every other layer from layer 0;
  five of six), Gemma 3's local RoPE base 10000; the attention scale 1/sqrt(head_dim) (for
  the 27B Gemmas, 1/sqrt(d_model / n_heads), as llama.cpp sets it by layer count). Biases and
  the untied head follow from which tensors the file holds.
- the tokenizer from `tokenizer.ggml.*` (`formats.gguf_vocab`);
- the tensors by their GGUF names (`formats.gguf_names`), dequantized to float32
  (`formats.gguf_quants`), with llama.cpp's layout changes undone.

A key of the architecture that this module does not read is refused unless its value is "off"
(0, false, empty): rope scaling, experts, alibi, logit scales and the like would compute
another model. Every refusal is one ValueError line naming the file and the key or tensor;
so is every damaged file (wrong magic, truncated, an unknown tensor type, a tensor whose
bytes or shape disagree with what the keys imply).
"""
from __future__ import annotations

import math
import os
import re

import numpy as np

from ..config import PRESETS, Config
from ..model import GlassLM
from . import gguf_names as names
from .gguf_quants import SUPPORTED, dequantize

_SLIDING, _FULL = "sliding_attention", "full_attention"
# Keys glassllm never needs: bookkeeping, and what a loader or sampler reads
_HARMLESS_PREFIXES = ("general.", "tokenizer.", "GGUF.", "split.", "quantize.")
# {arch}.* keys that change nothing glassllm computes (llama.cpp's own use: the vocab size
# also given by token_embd; `value_length` checked equal to key_length where read)
_HARMLESS_KEYS = ("vocab_size", "tensor_data_layout", "rope.scaling.type", "pooling_type",
                  "expert_gating_func")


class GGUFFile:
    """A GGUF file opened by `gguf.GGUFReader`: its keys as Python values, its tensors by
    name, every problem one line naming `path`.

    Attributes:
        path: the file (str). fields: key -> value (str, int, float, bool or a list).
        tensors: GGUF name -> `gguf.ReaderTensor` (raw bytes, ggml type, ne).
    """

    def __init__(self, path):
        import gguf
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"{self.path}: no such file")
        with open(self.path, "rb") as fh:
            head = fh.read(4)
        if head != b"GGUF":  # gguf.GGUF_MAGIC, as the file's first 4 bytes
            raise ValueError(f"{self.path}: not a GGUF file: it starts with {head!r}, not "
                             f"b'GGUF' (wrong magic)")
        try:
            reader = _bounded_reader()(self.path)
            self.fields = {k: f.contents() for k, f in reader.fields.items()}
            self.tensors = {t.name: t for t in reader.tensors}
        except (ValueError, KeyError, IndexError, TypeError, OverflowError,
                UnicodeDecodeError) as e:  # what GGUFReader raises on a damaged header
            raise ValueError(f"{self.path}: not a readable GGUF file (truncated or damaged): "
                             f"{_why(e)}") from None
        except OSError as e:
            raise ValueError(f"{self.path}: cannot read: {e.strerror or e}") from None
        for t in self.tensors.values():
            self._check_tensor(t)

    def _check_tensor(self, t) -> None:
        """The tensor's type is one glassllm dequantizes and its bytes are all in the file."""
        import gguf
        qtype = gguf.GGMLQuantizationType(int(t.tensor_type))
        if qtype not in SUPPORTED:
            raise ValueError(f"{self.path}: tensor {t.name!r} has type {qtype.name}, which "
                             f"glassllm does not read (supported: "
                             f"{', '.join(q.name for q in SUPPORTED)})")
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n = int(np.prod([int(x) for x in t.shape], dtype=object))
        if int(t.shape[0]) % block:
            raise ValueError(f"{self.path}: tensor {t.name!r} ({qtype.name}) has rows of "
                             f"{int(t.shape[0])} values, not a multiple of its block of {block}")
        if t.data.nbytes != n // block * type_size:
            raise ValueError(f"{self.path}: tensor {t.name!r} needs {n // block * type_size} "
                             f"bytes, the file holds {t.data.nbytes} (truncated or damaged)")

    def get(self, key: str, default=None):
        return self.fields.get(key, default)

    def array(self, name: str) -> np.ndarray:
        """Tensor `name` as float32 of its NumPy shape (ggml's ne reversed)."""
        t = self.tensors[name]
        shape = tuple(int(x) for x in reversed(t.shape))
        try:
            return dequantize(t.data, t.tensor_type, shape)
        except ValueError as e:
            raise ValueError(f"{self.path}: tensor {name!r}: {e}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(x) for x in reversed(self.tensors[name].shape))


def _bounded_reader():
    """`gguf.GGUFReader` whose every read must lie inside the file. GGUFReader trusts each
    count and length it reads, and a slice past the end comes back short, not as an error: one
    flipped bit in an array's count (2^56 elements) looped over empty reads, each kept, until
    memory ran out. Its one read primitive, `_get`, now refuses a short read."""
    import gguf

    class BoundedReader(gguf.GGUFReader):
        def _get(self, offset, dtype, count=1, override_order=None):
            if int(offset) + np.dtype(dtype).itemsize * int(count) > len(self.data):
                raise ValueError(f"{int(count)} values of {np.dtype(dtype).name} at byte "
                                 f"{int(offset)} run past the end of the file "
                                 f"({len(self.data)} bytes)")
            return super()._get(offset, dtype, count, override_order)

    return BoundedReader


def _why(e: Exception) -> str:
    """GGUFReader's complaint in one line; an unknown tensor type said as such."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if "is not a valid GGMLQuantizationType" in text:
        return f"unknown tensor type {re.findall(r'[0-9]+', text.split(' is not')[0])[-1]}"
    return text if len(text) <= 200 else text[:197] + "..."


# --------------------------------------------------------------------------- the model
def read_gguf(path) -> tuple[GlassLM, object]:
    """(float32 GlassLM, tokenizer) from a GGUF file. The tokenizer is None when the file has
    no `tokenizer.ggml.model`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: one line naming the file: a damaged file, an architecture or key glassllm
            does not implement, a missing, unexpected or mis-shaped tensor, a tokenizer it
            cannot represent.
    """
    from .gguf_vocab import tokenizer_from_gguf
    f = GGUFFile(path)
    cfg = config_from_keys(f)
    return model_from_gguf(f, cfg), tokenizer_from_gguf(f)


def model_from_gguf(f: GGUFFile, cfg: Config) -> GlassLM:
    """The GlassLM of `cfg` holding `f`'s tensors (dequantized, layouts undone).

    Raises:
        ValueError: naming the file and tensor: missing, unexpected, mis-shaped, or holding
            NaN or infinite values.
    """
    from ..model import parameter_shapes
    fused = names.fused_qkv_name(0, "weight") in f.tensors
    wanted = names.tensor_names(cfg, fused=fused)
    state, fused_parts = {}, {}
    for ours, shape in parameter_shapes(cfg):
        theirs = wanted[ours]
        fused_part = theirs.rsplit(".", 1)[1] if ".attn_qkv." in theirs else None
        _check_shape(f, theirs, _fused_shape(cfg, fused_part) if fused_part else
                     names.gguf_shape(ours, shape), ours, cfg)
        if fused_part is None:
            state[ours] = names.from_gguf(cfg, ours, f.array(theirs))
        else:
            if theirs not in fused_parts:  # dequantized once, split in three
                fused_parts[theirs] = names.split_qkv(cfg, f.array(theirs), fused_part)
            state[ours] = fused_parts[theirs][("query", "key", "value").index(
                ours.split(".")[3])]
        if not np.isfinite(state[ours]).all():
            raise ValueError(f"{f.path}: tensor {theirs!r} holds NaN or infinite values")
    _check_rest(f, cfg, set(wanted.values()))
    model = GlassLM(cfg)
    model.load_state_dict(state)
    return model


def _fused_shape(cfg: Config, part: str) -> tuple[int, ...]:
    rows = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    return (rows, cfg.d_model) if part == "weight" else (rows,)


def _check_shape(f: GGUFFile, name: str, want: tuple, ours: str, cfg: Config) -> None:
    if name not in f.tensors:
        raise ValueError(f"{f.path}: tensor {name!r} is missing (a "
                         f"{names.ARCH_OF_FAMILY[cfg.family]} model with these keys has it)")
    if f.shape(name) != want:
        raise ValueError(f"{f.path}: tensor {name!r} has shape {f.shape(name)}, the keys "
                         f"imply {want} ({ours})")


def _check_rest(f: GGUFFile, cfg: Config, used: set) -> None:
    """Tensors the model does not use: a copy of the tied head is allowed (old GPT-2
    conversions write one); llama.cpp's `rope_freqs` (scaled RoPE) and anything else are
    refused."""
    for name in sorted(set(f.tensors) - used):
        if name == "output.weight" and cfg.tie_embeddings and \
                np.array_equal(f.array(name), f.array("token_embd.weight")):
            continue
        raise ValueError(f"{f.path}: tensor {name!r} is not part of a glassllm {cfg.family} "
                         f"model (not implemented; refusing to load a model computed "
                         f"differently)")


# --------------------------------------------------------------------------- the keys
def config_from_keys(f: GGUFFile) -> Config:
    """glassllm Config from the file's keys and tensor list (see the module docstring).

    Raises:
        ValueError: naming the file and key: an unsupported architecture, a missing or
            malformed size, a key glassllm does not implement.
    """
    arch = f.get(names.ARCH_KEY)
    if arch not in names.FAMILY_OF_ARCH:
        raise ValueError(f"{f.path}: general.architecture {arch!r} is not supported by "
                         f"glassllm (supported: {sorted(names.FAMILY_OF_ARCH)})")
    keys = _Keys(f, arch)
    family = names.FAMILY_OF_ARCH[arch]
    kw = _sizes(keys, f)
    kw.update(_switches(keys, f, family, kw))
    keys.check_rest()
    try:
        return Config.preset(family, **kw)
    except ValueError as e:
        raise ValueError(f"{f.path}: {e}") from None


class _Keys:
    """The `{arch}.*` keys, with a record of those read (the rest must be "off")."""

    def __init__(self, f: GGUFFile, arch: str):
        self.f, self.arch, self.read = f, arch, set()

    def get(self, template: str, default=None, kind=int, zero=...):
        """The key's value (`kind`: a positive int or float, or as stored); absent: `default`
        (... for required); 0 where `zero` is given: `zero`."""
        name = names.key(template, self.arch)
        self.read.add(name)
        value = self.f.get(name)
        if zero is not ... and value == 0 and not isinstance(value, bool):
            return zero
        if value is None:
            if default is ...:
                raise ValueError(f"{self.f.path}: key {name!r} is missing")
            return default
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value) and value > 0) if kind in (int, float) else True
        if not ok or (kind is int and value != int(value)):
            raise ValueError(f"{self.f.path}: key {name!r} = {_short(value)} is not a "
                             f"positive {kind.__name__}")
        if kind is float:
            return _decimal(value)
        return kind(value) if kind is int else value

    def check_rest(self) -> None:
        prefix = self.arch + "."
        for name in sorted(self.f.fields):
            if name.startswith(_HARMLESS_PREFIXES) or name in self.read:
                continue
            value = self.f.fields[name]
            if name.startswith(prefix) and name[len(prefix):] in _HARMLESS_KEYS:
                continue
            if not name.startswith(prefix) or value not in (None, False, 0, [], "", "none"):
                raise ValueError(f"{self.f.path}: key {name!r} (= {_short(value)}) is not "
                                 f"implemented by glassllm; refusing to load a model it "
                                 f"would compute differently")


def _decimal(value) -> float:
    """A float key as the decimal it was written from: GGUF stores floats as float32, so 1e-5
    reads 9.99999974e-06; the shortest decimal that rounds to the same float32 is 1e-05
    (a float64 key that is no float32 stays as it is)."""
    value = float(value)
    if float(np.float32(value)) != value:
        return value
    return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _sizes(k: _Keys, f: GGUFFile) -> dict:
    K = names.KEYS
    d_model, n_heads = k.get(K["d_model"], ...), k.get(K["n_heads"], ...)
    kw = dict(d_model=d_model, n_heads=n_heads, n_layers=k.get(K["n_layers"], ...),
              d_ff=k.get(K["d_ff"], ...), max_len=k.get(K["max_len"], ...),
              n_kv_heads=k.get(K["n_kv_heads"], n_heads))
    if "token_embd.weight" not in f.tensors:
        raise ValueError(f"{f.path}: tensor 'token_embd.weight' is missing")
    kw["vocab_size"] = f.shape("token_embd.weight")[0]
    head_dim = k.get(K["head_dim"], None)
    value_dim = k.get(names.VALUE_LENGTH_KEY, head_dim)
    if value_dim != head_dim:
        raise ValueError(f"{f.path}: value_length {value_dim} differs from key_length "
                         f"{head_dim}; glassllm's heads have one width")
    kw["head_dim"] = head_dim if head_dim is not None and head_dim * n_heads != d_model \
        else None
    return kw


def _switches(k: _Keys, f: GGUFFile, family: str, kw: dict) -> dict:
    """RoPE, norms, windows, caps, biases and the head, from keys and tensor names."""
    K, preset = names.KEYS, PRESETS[family]
    head_dim = kw["head_dim"] or kw["d_model"] // kw["n_heads"]
    sw = dict(rope_theta=k.get(K["rope_theta"], 10000.0, float))
    rotary = k.get(K["rotary_dim"], head_dim)
    sw["rotary_pct"] = rotary / head_dim
    if rotary != head_dim and family not in ("phi", "neox"):  # pairs/halves differ otherwise
        raise ValueError(f"{f.path}: rope.dimension_count {rotary} differs from the head "
                         f"width {head_dim}; glassllm's {family} rotates whole heads")
    if int(head_dim * sw["rotary_pct"]) != rotary:
        raise ValueError(f"{f.path}: rope.dimension_count {rotary} is not representable for "
                         f"head_dim {head_dim}")
    eps_key = names.NORM_EPS_KEYS[preset["norm"]]
    sw["norm_eps"] = k.get(eps_key, ..., float)
    sw.update(_windows(k, f, family, kw["n_layers"]))
    sw["attn_scale"] = k.get(K["attn_scale"], None, float)
    if (family, kw["n_layers"]) in (("gemma2", 46), ("gemma3", 62)):  # the 27B models
        sw["attn_scale"] = (kw["d_model"] / kw["n_heads"]) ** -0.5
    caps = {"gemma2": (50.0, 30.0)}.get(family, (None, None))
    for name, default in zip(("attn_softcap", "final_softcap"), caps):
        sw[name] = k.get(K[name], default, float, zero=None)  # 0: no cap
    if k.get(names.CAUSAL_KEY, True, bool) is not True:  # false: a bidirectional encoder
        raise ValueError(f"{f.path}: key {names.key(names.CAUSAL_KEY, k.arch)!r} is false; "
                         f"glassllm's models are causal language models")
    if family == "neox":
        sw["parallel_block"] = bool(k.get(K["parallel_block"], True, bool))
    sw.update(_from_tensors(f, family))
    return sw


def _windows(k: _Keys, f: GGUFFile, family: str, n_layers: int) -> dict:
    """sliding_window, layer_types and Gemma 3's local RoPE base. llama.cpp runs `llama`,
    `qwen2`, `qwen3`, `phi2`, `gptneox`, `gpt2`, `gemma` with full attention whatever the file
    says, so a window key there is read and not used."""
    K = names.KEYS
    window = k.get(K["sliding_window"], ... if family == "gemma2" else None)
    pattern = k.get(K["layer_types"], None, list)
    out = dict(sliding_window=None, layer_types=None)
    if family == "gemma3":
        out["rope_local_theta"] = k.get(K["rope_local_theta"], 10000.0, float)
    if family not in ("gemma2", "gemma3", "olmo2") or window is None:
        return out
    if pattern is None:
        pattern = {"gemma2": (True, False), "gemma3": (True,) * 5 + (False,)}.get(family)
        if pattern is None:  # olmo2 without a pattern: every layer full
            return out
        pattern = [pattern[i % len(pattern)] for i in range(n_layers)]
    if len(pattern) != n_layers:
        raise ValueError(f"{f.path}: sliding_window_pattern has {len(pattern)} entries for "
                         f"{n_layers} layers")
    out["sliding_window"] = window
    out["layer_types"] = tuple(_SLIDING if s else _FULL for s in pattern)
    return out


def _from_tensors(f: GGUFFile, family: str) -> dict:
    """Biases and the untied head: llama.cpp uses those tensors when present."""
    has = f.tensors.__contains__
    qkv = has("blk.0.attn_q.bias") or has("blk.0.attn_qkv.bias")
    out = has("blk.0.attn_output.bias")
    sw = dict(attn_bias={(False, False): "none", (True, False): "qkv", (False, True): "out",
                         (True, True): "all"}[(qkv, out)],
              mlp_bias=has("blk.0.ffn_up.bias"), lm_head_bias=has("output.bias"),
              tie_embeddings=not has("output.weight") or family == "gpt2")
    if PRESETS[family]["norm"] == "layer":
        sw["norm_bias"] = has("output_norm.bias")
    return sw
