"""Model files: save, load and export GlassLM weights as safetensors.

A file is one safetensors container (Hugging Face's format, github.com/huggingface/safetensors:
an 8-byte header size, a JSON header, raw tensor bytes), read and written only through the
`safetensors` package, by glassllm's one reader and writer (`glassllm.formats.safetensors_io`):

- tensors: one per parameter, named by `named_parameters()` (`blocks.0.attention.query.weight`,
  ...), float32 (`save`) or float16 (`export_float16`); `load` accepts both.
- ``__metadata__`` (strings only, by the format's rule):
    "format":    "glassllm" -- marks the file as ours; anything else is refused as foreign;
    "config":    JSON text of `Config.to_dict()` -- the format's metadata holds strings only,
                 so the nested description is one JSON string; the model is rebuilt from the
                 file alone;
    "tokenizer": the tokenizer's `to_json()`; absent in a weights-only file (`save` without a
                 tokenizer), where `load_tokenizer` returns None. A model's vocabulary need
                 not be a known tokenizer's: weights are the product, a tokenizer is optional
                 metadata (as a Hugging Face checkpoint's tokenizer files are);
    "dtype":     "float32" or "float16", informative;
    "version":   "2" -- the format version; "2" added the digest (files without a version are
                 version 1);
    "digest":    SHA-256 of every tensor and of the other metadata entries
                 (`glassllm.formats.integrity`), checked by `load` and `load_tokenizer`.

Files of version 1 (written before the digest existed, no "version" entry) still load, without
that check: they are validated as before (names, shapes, dtypes, finiteness) but a flipped bit
in their data cannot be seen. A file that claims version 2 must carry its digest, and a newer
version is refused (it was written by a newer glassllm).

Every write is atomic: the file is written under a temporary name in the destination's
directory, flushed to disk, then renamed over the destination with `os.replace`, so a crash
or an error never leaves a half-written model (nor a stray temporary file). Every problem a
reader can meet -- missing file, truncated or foreign file, corrupt JSON, wrong names or shapes,
non-finite weights, a damaged byte anywhere -- becomes FileNotFoundError or a ValueError naming
the file (and the tensor) and the problem.
"""
from __future__ import annotations

import json
import os

import numpy as np

from . import safetensors_io
from .safetensors_io import check_finite
from ..model import Config, GlassLM, n_parameter_tensors, parameter_shape, parameter_shapes
from ..tensor import no_grad
from ..tokenizers import tokenizer_from_json


def _model_directory_hint(path: str) -> str:
    names = ("config.json", "model.safetensors")
    has = [n for n in names if os.path.isfile(os.path.join(path, n))]
    odd = [n for n in names if os.path.lexists(os.path.join(path, n)) and n not in has]
    return (f"; a Hugging Face model directory needs config.json + model.safetensors (this "
            f"one has {' and '.join(has) or 'neither'}" +
            "".join(f"; its {n} is no regular file: a link to nowhere, a device or a pipe"
                    for n in odd) + ")")


MODEL_FILE = safetensors_io.Kind(format="glassllm", version="2", noun="model file",
                                 title="glassllm model", directory_hint=_model_directory_hint)
FORMAT = MODEL_FILE.format
VERSION = MODEL_FILE.version  # written by this glassllm; version 1 files (no digest) still load
FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504.0
_LOADABLE_DTYPES = {"F32": np.float32, "F16": np.float16}


# --------------------------------------------------------------------------- writing
def save(model: GlassLM, path, tokenizer=None) -> None:
    """Write `model` (float32) and its tokenizer to a safetensors file at `path`, atomically.

    Args:
        model: a GlassLM; its config goes in the metadata, its parameters are the tensors.
        path: destination file (str or os.PathLike); replaced if it exists.
        tokenizer: any tokenizer with `to_json()` and `vocab_size` (at most the model's
            vocab_size), stored in the metadata; None (default) writes a weights-only file,
            whatever the model's vocab_size (`load_tokenizer` then returns None, and
            `glassllm generate` asks for `--tokenizer`).

    Raises:
        ValueError: a parameter holds NaN/inf (a broken model is never written), the
            tokenizer has more ids than the model's vocab_size, or `path` is empty.
        FileNotFoundError / PermissionError: the destination directory is missing / not writable.
    """
    path = _destination(path)
    _check_tokenizer_fits(tokenizer, model.cfg, where=path)
    tensors = {}
    for name, p in model.named_parameters():
        check_finite(name, p.numpy(), where=path)
        tensors[name] = np.ascontiguousarray(p.numpy(), dtype=np.float32)
    _atomic_save_file(tensors, _metadata(model.cfg, tokenizer, "float32"), path)


def export_float16(model: GlassLM, path, probe_ids=None, tolerance: float = 1e-2,
                   tokenizer=None) -> dict:
    """Write a float16 copy of `model` (half the bytes), after checking it still works.

    Two checks, both before anything is written:

    1. Range: float16's largest finite value is 65504; a weight with |w| > 65504 would become
       inf, so it raises ValueError naming the tensor.
    2. Logits: the model is rebuilt with every weight rounded to float16 (then computed in
       float32, as `load` will), run on `probe_ids`, and compared with the float32 model.
       **Tolerance rule**: the export passes when
           max |logits_f16 - logits_f32| <= tolerance * max(1, max |logits_f32|),
       i.e. `tolerance` is relative to the largest logit magnitude (floored at 1, so that
       near-zero logits of an untrained model do not demand absolute precision). float16 keeps
       11 significant bits (relative rounding 2**-11 ~ 4.9e-4 per weight); the default 1e-2
       leaves room for those errors adding up through the layers.

    Args:
        model: the float32 GlassLM to export (left unchanged).
        path: destination file; written atomically, only if both checks pass.
        probe_ids: int array (B, T) or (T,) of ids to compare on; default a fixed pseudo-random
            batch of shape (2, min(max_len, 32)) drawn with seed 0.
        tolerance: relative tolerance of the rule above (> 0).
        tokenizer: stored in the metadata as in `save` (default None: weights only).

    Returns:
        dict with "max_abs_logit_diff" (float, logit units), "tolerance" (the absolute bound it
        was compared with), "relative_tolerance", "max_abs_logit", "probe_shape",
        "float16_bytes" (size of the tensor data) and "path".

    Raises:
        ValueError: a weight overflows float16 or is not finite, the logit check fails, bad
            probe ids or tolerance. No file is written in any of these cases.
    """
    path = _destination(path)
    if not tolerance > 0:
        raise ValueError(f"export_float16: tolerance must be > 0, got {tolerance!r}")
    _check_tokenizer_fits(tokenizer, model.cfg, where=path)
    cfg = model.cfg
    tensors = {}
    for name, p in model.named_parameters():
        value = p.numpy()  # files are written from the host
        check_finite(name, value, where=path)
        peak = float(np.max(np.abs(value))) if value.size else 0.0
        if peak > FLOAT16_MAX:
            raise ValueError(f"export_float16 {path}: tensor {name!r} has |w| = {peak:g} > "
                             f"{FLOAT16_MAX:g}, which overflows float16; nothing written")
        tensors[name] = value.astype(np.float16)

    if probe_ids is None:
        probe_ids = np.random.default_rng(0).integers(0, cfg.vocab_size,
                                                      size=(2, min(cfg.max_len, 32)))
    probe_ids = model.check_ids(probe_ids, what="probe_ids")
    rounded = GlassLM(cfg, device=model.device)
    rounded.load_state_dict(tensors)  # casts float16 back up to float32, as `load` does
    with no_grad():
        reference = model(probe_ids).numpy().astype(np.float64)
        approx = rounded(probe_ids).numpy().astype(np.float64)
    max_abs_logit = float(np.max(np.abs(reference)))
    diff = float(np.max(np.abs(approx - reference)))
    bound = tolerance * max(1.0, max_abs_logit)
    report = {
        "max_abs_logit_diff": diff,
        "tolerance": bound,
        "relative_tolerance": float(tolerance),
        "max_abs_logit": max_abs_logit,
        "probe_shape": tuple(probe_ids.shape),
        "float16_bytes": int(sum(t.nbytes for t in tensors.values())),
        "path": path,
    }
    if not diff <= bound:  # also catches NaN
        raise ValueError(f"export_float16 {path}: float16 logits differ from float32 by "
                         f"{diff:.3g} > tolerance {bound:.3g} ({tolerance:g} x max(1, "
                         f"max|logit| = {max_abs_logit:.3g})); nothing written")
    _atomic_save_file(tensors, _metadata(cfg, tokenizer, "float16"), path)
    return report


def _destination(path) -> str:
    path = os.fspath(path)
    if not path:
        raise ValueError("model file path is empty; give a file name such as model.safetensors")
    return path


def _metadata(cfg: Config, tokenizer, dtype: str) -> dict[str, str]:
    metadata = {"config": json.dumps(cfg.to_dict()), "dtype": dtype}
    if tokenizer is not None:  # none: a weights-only file
        metadata["tokenizer"] = tokenizer.to_json()
    return metadata  # safetensors_io.write adds the format, the version and the digest


def _atomic_save_file(tensors: dict, metadata: dict, path) -> None:
    safetensors_io.write(path, MODEL_FILE, tensors, metadata)


# --------------------------------------------------------------------------- reading
def load(path) -> GlassLM:
    """Rebuild a GlassLM from a file written by `save` or `export_float16`, with no other input.

    float16 tensors are upcast to float32. Before any weight is read, the header is checked:
    format marker, config, tensor names, shapes and dtypes.

    Returns:
        GlassLM with the stored config and weights (float32).

    Raises:
        FileNotFoundError: `path` does not exist.
        IsADirectoryError: `path` is a directory.
        ValueError: not a regular file (a device, a FIFO), not safetensors (random bytes,
            truncated, corrupt header), a
            safetensors file of another library (no "format": "glassllm" metadata), has a
            missing or corrupt config, missing/unexpected tensor names, wrong shapes,
            unsupported dtypes or non-finite weights, a tensor or metadata entry that differs
            from its digest (named), a version 2 file without a digest, or a newer version.
            The message names the file and the problem.
    """
    path = os.fspath(path)
    contents = safetensors_io.read(
        path, MODEL_FILE, parse=lambda metadata: _config_from(metadata, path),
        check_table=lambda cfg, table: _check_names_shapes_dtypes(cfg, table, path))
    cfg = contents.parsed
    try:
        model = GlassLM(cfg)
    except MemoryError:
        raise ValueError(f"{path}: its config asks for a model too large to build "
                         f"({cfg.to_dict()})") from None
    model.load_state_dict(contents.tensors)  # copies into float32 (the F16 upcast happens here)
    return model


def load_tokenizer(path):
    """The tokenizer stored in a glassllm file, or None for a weights-only file (one written
    by `save`/`export_float16` without a tokenizer). Files written before weights-only files
    existed always carry a tokenizer, and load as they did.

    Returns:
        a ByteTokenizer or BPETokenizer (see `glassllm.tokenizers.tokenizer_from_json`),
        or None.

    Raises:
        FileNotFoundError / IsADirectoryError: as `load`.
        ValueError: not a glassllm file (as `load`), a corrupt tokenizer description, or a
            tokenizer with more ids than the model's vocab_size.
    """
    path = os.fspath(path)
    # the tokenizer is metadata: the metadata digest covers it, no tensor need be read
    contents = safetensors_io.read(path, MODEL_FILE, tensors=False,
                                   parse=lambda metadata: _config_from(metadata, path))
    cfg = contents.parsed
    text = contents.metadata.get("tokenizer")
    if text is None:
        return None
    try:
        tokenizer = tokenizer_from_json(text)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: corrupt tokenizer description in the metadata: {e}") from None
    _check_tokenizer_fits(tokenizer, cfg, where=path)
    return tokenizer


def _config_from(metadata: dict, path: str) -> Config:
    text = metadata.get("config")
    if text is None:
        raise ValueError(f"{path}: the metadata has no model config")
    try:
        fields = json.loads(text)
    except ValueError as e:  # JSONDecodeError, or an integer past Python's digit limit
        raise ValueError(f"{path}: the model config in the metadata is not valid JSON "
                         f"({e})") from None
    if not isinstance(fields, dict):
        raise ValueError(f"{path}: the model config must be a JSON object, got "
                         f"{type(fields).__name__}")
    try:
        return Config.from_dict(fields)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: invalid model config: {e}") from None


def _check_names_shapes_dtypes(cfg: Config, found: dict, path: str) -> None:
    """The file's tensors (name -> (shape, dtype)) must be exactly those the config implies,
    computed by `parameter_shape(s)` without allocating anything; the walk over expected names
    stops once a few missing ones are known, so a corrupt config (n_layers = 10**9, d_model =
    10**9) fails in microseconds instead of building the model."""
    unexpected = [n for n in found if parameter_shape(cfg, n) is None]
    n_missing = n_parameter_tensors(cfg) - (len(found) - len(unexpected))
    missing = []
    if n_missing:
        for name, _ in parameter_shapes(cfg):  # at most len(found) + 6 steps
            if name not in found:
                missing.append(name)
                if len(missing) > 5:
                    break
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensor(s) {_few(missing, total=n_missing)}")
        if unexpected:
            parts.append(f"unexpected tensor(s) {_few(unexpected)}")
        raise ValueError(f"{path}: tensors do not match the config: " + "; ".join(parts))
    for name, want in parameter_shapes(cfg):
        shape, dtype = found[name]
        if shape != want:
            raise ValueError(f"{path}: tensor {name!r} has shape {shape}, the config "
                             f"expects {want}")
        if dtype not in _LOADABLE_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {dtype}; glassllm loads "
                             f"{sorted(_LOADABLE_DTYPES)}")


def _few(names: list[str], n: int = 5, total: int | None = None) -> str:
    total = len(names) if total is None else total
    return str(names[:n]) + (f" and {total - n} more" if total > n else "")


def _check_tokenizer_fits(tokenizer, cfg: Config, where: str) -> None:
    if tokenizer is not None and tokenizer.vocab_size > cfg.vocab_size:
        raise ValueError(f"{where}: the tokenizer has {tokenizer.vocab_size} ids but the "
                         f"model's vocab_size is {cfg.vocab_size}")
