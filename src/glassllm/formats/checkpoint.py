"""Training checkpoints: everything needed to continue a run bit for bit.

A checkpoint is one safetensors file (no pickle, so loading one cannot run code):

    tensors   model.<name>          the weights, by `named_parameters()` name (float32)
              optimizer.m.<name>    AdamW's first moment of that parameter
              optimizer.v.<name>    AdamW's second moment
    metadata  format = "glassllm-checkpoint", version = "2"
              state  = one JSON string: step, model config, the optimizer's global `t` and
                       per-parameter update counts and hyper-parameters, the batch sampler's
                       `bit_generator.state`, the trainer settings, the best validation loss
                       and the step it came from, the history, the loss scaler's state, the
                       data's identity (`glassllm.training.data.data_identity`: token counts and
                       SHA-256 of the training and validation streams), the number of
                       ranks that trained it (`world_size`, data parallelism; absent in
                       files from before it, which mean 1) and free-form `extra`
                       (tokenizer, data sources, ...)
              digest = SHA-256 of every tensor and of the other entries
                       (`glassllm.formats.integrity`), checked on load

Loading checks everything before a run may use it, through the reader model files use
(`glassllm.formats.safetensors_io`): the digest (a flipped bit is an error naming the tensor),
then the type and range of every field of the JSON state, then tensor names, dtypes (float32)
and shapes against the stored config, then finiteness (and v >= 0). Each problem is one ValueError line naming the file. Version 1
checkpoints (no digest, no data identity) still load, with every check but the digest; a
`Trainer` refuses to resume one, since it cannot prove the data is the same. Version 2 without
a digest, or a newer version, is refused.

JSON keeps Python floats exactly (shortest round-trip repr) and integers of any size (PCG64's
128-bit state), so a restored run draws the same batches and makes the same updates as one
that never stopped. Writes are atomic: a temporary file in the same directory, fsync, then
`os.replace` (`glassllm.formats.atomic`), so a crash or Ctrl-C mid-write leaves the previous
checkpoint intact; the file gets ordinary (umask) permissions.
"""
from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
from pathlib import Path

import numpy as np

from .. import devices
from . import safetensors_io
from .safetensors_io import check_finite
from ..checks import check_int, check_real, is_int, is_real
from ..model import Config, GlassLM, n_parameter_tensors, parameter_shape
from ..optim import AdamW
from ..amp import PRECISIONS, SKIP_REASONS

CHECKPOINT = safetensors_io.Kind(format="glassllm-checkpoint", version="2", noun="checkpoint",
                                 title="glassllm checkpoint")
FORMAT = CHECKPOINT.format
VERSION = CHECKPOINT.version  # version 1 checkpoints (no digest) still load
TENSOR_GROUPS = ("model.", "optimizer.m.", "optimizer.v.")


@dataclasses.dataclass
class Checkpoint:
    """The state of a training run after `step` completed updates.

    Fields:
        step: number of completed updates; training continues with update index `step`.
        config: the model's `Config.to_dict()`.
        weights: {parameter name: float32 array}.
        optimizer: {"m": {name: array}, "v": {name: array}, "steps": {name: int},
            "t": int, "lr": float, "betas": [b1, b2], "eps": float, "weight_decay": float}.
        rng_state: `np.random.Generator.bit_generator.state` of the batch sampler.
        settings: the trainer settings as a dict (`TrainSettings.to_dict()`).
        best_val_loss: lowest validation loss so far (nats/token), None before any evaluation.
        best_step: the update index it was measured after, None likewise.
        history: one dict per completed update (see `glassllm.train.Trainer`).
        scaler: the loss scaler's `state_dict()` (mixed precision) or None.
        extra: JSON-serialisable run facts the trainer itself does not need (tokenizer JSON,
            data sources, ...).
        data: the data's identity, `glassllm.training.data.data_identity(train, val)`; None in a
            version 1 checkpoint.
        world_size: the number of data-parallel ranks of the run (`glassllm.training.distributed`);
            a resume needs the same number.
        source: the file it was loaded from (not part of the state; None if built in memory).
    """

    step: int
    config: dict
    weights: dict
    optimizer: dict
    rng_state: dict
    settings: dict
    best_val_loss: float | None = None
    best_step: int | None = None
    history: list = dataclasses.field(default_factory=list)
    scaler: dict | None = None
    extra: dict = dataclasses.field(default_factory=dict)
    data: dict | None = None
    world_size: int = 1
    source: str | None = dataclasses.field(default=None, compare=False, repr=False)


def optimizer_state(model: GlassLM, optimizer: AdamW) -> dict:
    """AdamW's state keyed by parameter name (copies). The optimizer must hold exactly
    `model.parameters()` in that order, as the trainer builds it.

    Raises:
        ValueError: the optimizer's parameters are not the model's.
    """
    names = _check_same_params(model, optimizer)
    return {
        "m": {n: np.array(devices.to_host(m)) for n, m in zip(names, optimizer.m)},
        "v": {n: np.array(devices.to_host(v)) for n, v in zip(names, optimizer.v)},
        "steps": {n: int(s) for n, s in zip(names, optimizer.steps)},
        "t": int(optimizer.t),
        "lr": float(optimizer.lr),
        "betas": [float(b) for b in optimizer.betas],
        "eps": float(optimizer.eps),
        "weight_decay": float(optimizer.weight_decay),
    }


def load_optimizer_state(model: GlassLM, optimizer: AdamW, state: dict) -> None:
    """Put `optimizer_state` output back into `optimizer` (arrays are copied).

    Raises:
        ValueError: a parameter is missing or a moment's shape differs.
    """
    names = _check_same_params(model, optimizer)
    for key in ("m", "v", "steps"):
        missing = [n for n in names if n not in state[key]]
        if missing:
            raise ValueError(f"checkpoint: optimizer state {key!r} lacks {missing[:3]}")
    for i, (name, p) in enumerate(zip(names, optimizer.params)):
        for key, target in (("m", optimizer.m), ("v", optimizer.v)):
            array = np.asarray(state[key][name])
            if array.shape != p.shape:
                raise ValueError(f"checkpoint: optimizer {key} of {name!r} has shape "
                                 f"{array.shape}, the parameter has {p.shape}")
            target[i] = np.array(array, dtype=p.dtype) if isinstance(p.data, np.ndarray) else \
                devices.to_device(np.array(array, dtype=devices.host_dtype(p.data)), p.device)
        optimizer.steps[i] = int(state["steps"][name])
    optimizer.t = int(state["t"])
    optimizer.lr = float(state["lr"])
    optimizer.betas = tuple(state["betas"])
    optimizer.eps = float(state["eps"])
    optimizer.weight_decay = float(state["weight_decay"])


def _check_same_params(model: GlassLM, optimizer: AdamW) -> list[str]:
    named = list(model.named_parameters())
    if len(named) != len(optimizer.params) or any(
            p is not q for (_, p), q in zip(named, optimizer.params)):
        raise ValueError("checkpoint: the optimizer must hold model.parameters() in order")
    return [n for n, _ in named]


def save_checkpoint(path: str | os.PathLike, ckpt: Checkpoint) -> Path:
    """Write `ckpt` to `path` atomically; return the path. Parent directories are created.

    The checkpoint is checked as `load_checkpoint` checks one, so a run never writes a file it
    could not resume from.

    Raises:
        ValueError: a field of the state of the wrong type or range, a tensor that is not
            float32, has the wrong shape or is not finite, or a state that is not JSON-able
            (the message names `path` and the field).
        IsADirectoryError / OSError: `path` is a directory or cannot be written; the message
            names `path`, never the temporary file.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "the checkpoint path is a directory", str(path))
    tensors, state_json = _encode(ckpt, f"checkpoint {str(path)!r}")
    safetensors_io.write(path, CHECKPOINT, tensors, {"state": state_json},
                         doing="cannot write the checkpoint", make_parents=True)
    return path


def check_checkpoint(ckpt: Checkpoint, where: str = "checkpoint") -> None:
    """Check an in-memory Checkpoint as `load_checkpoint` checks a file (types and ranges of
    the state, tensor names, dtypes, shapes, finiteness).

    Raises:
        ValueError: "<where>: ..." naming the first problem.
    """
    _encode(ckpt, where)


def _encode(ckpt: Checkpoint, where: str) -> tuple[dict, str]:
    """(tensors by file name, state JSON) of a checked checkpoint."""
    tensors = {}
    for prefix, arrays in zip(TENSOR_GROUPS, (ckpt.weights, _get(ckpt.optimizer, "m"),
                                              _get(ckpt.optimizer, "v"))):
        if not isinstance(arrays, dict):
            raise ValueError(f"{where}: {prefix[:-1]} must be a dict of arrays")
        for name, array in arrays.items():
            tensors[prefix + name] = np.ascontiguousarray(array)
    state = {
        "step": ckpt.step,
        "config": ckpt.config,
        "optimizer": {k: v for k, v in ckpt.optimizer.items() if k not in ("m", "v")},
        "rng_state": ckpt.rng_state,
        "settings": ckpt.settings,
        "best_val_loss": _finite_or_none(ckpt.best_val_loss),
        "best_step": ckpt.best_step,
        "history": ckpt.history,
        "scaler": ckpt.scaler,
        "extra": ckpt.extra,
        "data": ckpt.data,
        "world_size": ckpt.world_size,
    }
    try:
        # allow_nan=False: a NaN in the history would be written as a non-JSON token.
        state_json = json.dumps(state, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: the state is not JSON-serialisable: {e}") from None
    state = json.loads(state_json)  # check what a reader will see (tuples become lists, ...)
    cfg = _check_state(state, where, version=VERSION)
    _check_layout(cfg, {k: (a.shape, _DTYPE_NAMES.get(a.dtype, str(a.dtype)))
                        for k, a in tensors.items()}, where)
    for key, array in tensors.items():
        check_finite(key, array, where)
        _check_second_moment(key, array, where)
    return tensors, state_json


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read and check a checkpoint written by `save_checkpoint` (see the module docstring).

    Raises:
        FileNotFoundError: no such file. IsADirectoryError: a directory.
        ValueError: one line naming the file: not a regular file (a device, a pipe), not a
            glassllm checkpoint (foreign safetensors, truncated, corrupt), another version,
            a damaged tensor or state
            (digest), a state field of the wrong type or range, missing/unexpected tensors,
            a dtype other than float32, a wrong shape, a NaN/inf.
    """
    path = Path(path)
    where = f"checkpoint {str(path)!r}"
    contents = safetensors_io.read(
        path, CHECKPOINT, where=where, parse=lambda metadata: _parse_state(metadata, where),
        check_table=lambda parsed, table: _check_layout(parsed[1], table, where),
        check_tensor=lambda key, array: _check_second_moment(key, array, where))
    state, cfg = contents.parsed
    tensors = contents.tensors
    groups = {prefix: {} for prefix in TENSOR_GROUPS}
    for key, array in tensors.items():
        prefix = next(p for p in TENSOR_GROUPS if key.startswith(p))
        groups[prefix][key[len(prefix):]] = array
    optimizer = dict(state["optimizer"])
    optimizer["m"], optimizer["v"] = groups["optimizer.m."], groups["optimizer.v."]
    return Checkpoint(
        step=state["step"], config=cfg.to_dict(), weights=groups["model."],
        optimizer=optimizer, rng_state=state["rng_state"], settings=state["settings"],
        best_val_loss=state["best_val_loss"], best_step=state["best_step"],
        history=state["history"], scaler=state["scaler"], extra=state["extra"],
        data=state.get("data"), world_size=state.get("world_size", 1), source=str(path))


def _parse_state(metadata: dict, where: str) -> tuple[dict, Config]:
    """(the checked JSON state, its model Config) from a checkpoint's metadata."""
    if "state" not in metadata:
        raise ValueError(f"{where} has no state in its metadata")
    try:
        state = json.loads(metadata["state"])
    except ValueError as e:  # JSONDecodeError, or an integer past Python's digit limit
        raise ValueError(f"{where}: the state in the metadata is not valid JSON "
                         f"({' '.join(str(e).split())})") from None
    return state, _check_state(state, where, version=metadata.get("version", "1"))


# ------------------------------------------------------------------------ checking the state
# Every field of the JSON state, its type and range. One function per part, each raising
# ValueError("<where>: state.<field> ...") at the first problem.
_STATE_FIELDS = ("step", "config", "optimizer", "rng_state", "settings", "best_val_loss",
                 "best_step", "history", "scaler", "extra")
_OPTIONAL_STATE_FIELDS = ("world_size",)  # newer than version 2 itself; absent means 1
_OPTIMIZER_FIELDS = ("steps", "t", "lr", "betas", "eps", "weight_decay")
# "clipped": true on an update whose gradient norm was clipped (a resumed run's health
# counts clip events since the last health row from it)
_HISTORY_FIELDS = {"step", "loss", "lr", "train_loss", "val_loss", "skipped", "clipped"}
_SCALER_FIELDS = ("scale", "growth_factor", "backoff_factor", "growth_interval",
                  "_growth_tracker")
_DTYPE_NAMES = {np.dtype(np.float32): "F32"}


def _check_state(state, where: str, version: str) -> Config:
    """Check the decoded JSON state; return its model Config."""
    if not isinstance(state, dict):
        raise ValueError(f"{where}: the state must be a JSON object, got {_kind(state)}")
    wanted = _STATE_FIELDS + (("data",) if version != "1" else ())
    missing = [k for k in wanted if k not in state]
    unknown = sorted(set(state) - set(wanted) - set(_OPTIONAL_STATE_FIELDS))
    if missing or unknown:
        raise ValueError(f"{where}: the state " + "; ".join(
            ([f"lacks {missing}"] if missing else []) + ([f"has unknown {unknown}"]
                                                       if unknown else [])))
    step = _int(state, "step", where)
    if "world_size" in state:
        _int(state, "world_size", where, low=1)
    if not isinstance(state["config"], dict):
        raise ValueError(f"{where}: state.config must be an object, got "
                         f"{_kind(state['config'])}")
    try:
        cfg = Config.from_dict(state["config"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: state.config is invalid: {e}") from None
    _check_optimizer(state["optimizer"], cfg, where)
    _check_rng_state(state["rng_state"], where)
    settings = state["settings"]
    if not isinstance(settings, dict) or not all(
            isinstance(v, (int, float, str, type(None))) for v in settings.values()):
        raise ValueError(f"{where}: state.settings must be an object of numbers, strings and "
                         f"nulls, got {_short(settings)}")
    if "grad_accum" in settings:  # newer than the format (absent: 1); the rest: TrainSettings
        _int(settings, "grad_accum", where, label="state.settings.grad_accum", low=1)
    best_val, best_step = state["best_val_loss"], state["best_step"]
    if (best_val is None) != (best_step is None):
        raise ValueError(f"{where}: state.best_val_loss and state.best_step must both be set "
                         f"or both null, got {best_val!r} and {best_step!r}")
    if best_val is not None:
        _number(state, "best_val_loss", where)
        _int(state, "best_step", where, below=step)
    _check_history(state["history"], step, where)
    _check_scaler(state["scaler"], settings.get("precision"), where)
    if not isinstance(state["extra"], dict):
        raise ValueError(f"{where}: state.extra must be an object, got {_kind(state['extra'])}")
    if state.get("data") is not None:
        check_identity(state["data"], f"{where}: state")
    return cfg


def check_identity(identity, where: str) -> None:
    """The structure of a `data_identity` dict read back from a file.

    Raises:
        ValueError: "<where>: ..." naming the malformed part.
    """
    if not isinstance(identity, dict) or set(identity) != {"train", "val"}:
        raise ValueError(f"{where}: data must be an object with 'train' and 'val', got "
                         f"{_short(identity)}")
    for name, part in identity.items():
        if not isinstance(part, dict) or set(part) != {"tokens", "sha256"} or \
                not (is_int(part["tokens"]) and part["tokens"] >= 0) or \
                not _is_hex64(part["sha256"]):
            raise ValueError(f"{where}: data.{name} must be {{'tokens': int >= 0, 'sha256': "
                             f"64 hex digits}}, got {_short(part)}")


def _is_hex64(x) -> bool:
    return isinstance(x, str) and len(x) == 64 and all(c in "0123456789abcdef" for c in x)


def _check_optimizer(opt, cfg: Config, where: str) -> None:
    name = "state.optimizer"
    if not isinstance(opt, dict) or set(opt) != set(_OPTIMIZER_FIELDS):
        raise ValueError(f"{where}: {name} must be an object with exactly "
                         f"{list(_OPTIMIZER_FIELDS)}, got {_short(opt)}")
    steps = opt["steps"]
    if not isinstance(steps, dict) or len(steps) != n_parameter_tensors(cfg) or any(
            parameter_shape(cfg, k) is None for k in steps):
        raise ValueError(f"{where}: {name}.steps must map each parameter name of the config "
                         f"to its update count")
    for key in steps:
        _int(steps, key, where, label=f"{name}.steps[{key!r}]")
    _int(opt, "t", where, label=f"{name}.t")
    _number(opt, "lr", where, label=f"{name}.lr", low=0.0)
    betas = opt["betas"]
    if not isinstance(betas, list) or len(betas) != 2 or not all(
            is_real(b) and 0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"{where}: {name}.betas must be two numbers in [0, 1), got "
                         f"{_short(betas)}")
    _number(opt, "eps", where, label=f"{name}.eps", positive=True)
    _number(opt, "weight_decay", where, label=f"{name}.weight_decay", low=0.0)


def _check_rng_state(rng, where: str) -> None:
    """numpy's PCG64 `bit_generator.state` (what `np.random.default_rng` uses)."""
    ok = (isinstance(rng, dict) and set(rng) == {"bit_generator", "state", "has_uint32",
                                                 "uinteger"}
          and rng["bit_generator"] == "PCG64" and isinstance(rng["state"], dict)
          and set(rng["state"]) == {"state", "inc"}
          and all(is_int(v) and 0 <= v < 2**128 for v in rng["state"].values())
          and rng["has_uint32"] in (0, 1) and is_int(rng["has_uint32"])
          and is_int(rng["uinteger"]) and 0 <= rng["uinteger"] < 2**32)
    if ok:
        try:
            np.random.default_rng().bit_generator.state = rng
        except (TypeError, ValueError, KeyError):
            ok = False
    if not ok:
        raise ValueError(f"{where}: state.rng_state is not a PCG64 state (bit_generator, "
                         f"state: {{state, inc}} < 2**128, has_uint32 0/1, uinteger < 2**32), "
                         f"got {_short(rng)}")


def _check_history(history, step: int, where: str) -> None:
    if not isinstance(history, list) or len(history) != step:
        raise ValueError(f"{where}: state.history must be a list of {step} entries (one per "
                         f"update), got {_kind(history)}"
                         + (f" of {len(history)}" if isinstance(history, list) else ""))
    for i, entry in enumerate(history):
        label = f"state.history[{i}]"
        if not isinstance(entry, dict) or not {"step", "loss", "lr"} <= set(entry) or \
                not set(entry) <= _HISTORY_FIELDS:
            raise ValueError(f"{where}: {label} must be an object with step, loss, lr (and "
                             f"optionally train_loss, val_loss, skipped, clipped), got {_short(entry)}")
        if entry["step"] != i or not is_int(entry["step"]):
            raise ValueError(f"{where}: {label}.step must be {i}, got {entry['step']!r}")
        for key in ("loss", "train_loss"):
            if key in entry and entry[key] is not None:
                _number(entry, key, where, label=f"{label}.{key}")
        _number(entry, "lr", where, label=f"{label}.lr", low=0.0)
        if "val_loss" in entry:
            _number(entry, "val_loss", where, label=f"{label}.val_loss")
        if "clipped" in entry and entry["clipped"] is not True:
            raise ValueError(f"{where}: {label}.clipped must be true when present, got "
                             f"{entry['clipped']!r}")
        if "skipped" in entry and entry["skipped"] not in SKIP_REASONS[1:]:
            raise ValueError(f"{where}: {label}.skipped must be one of {list(SKIP_REASONS[1:])}"
                             f", got {entry['skipped']!r}")


def _check_scaler(scaler, precision, where: str) -> None:
    """`TrainStep.state_dict()`: the precision (the settings' one, when they name it) and the
    GradScaler's state, which is empty unless the precision is fp16."""
    if scaler is None:
        return
    if not isinstance(scaler, dict) or set(scaler) != {"precision", "scaler"} or \
            not isinstance(scaler["precision"], str) or scaler["precision"] not in PRECISIONS \
            or not isinstance(scaler["scaler"], dict):
        raise ValueError(f"{where}: state.scaler must be null or {{precision: one of "
                         f"{sorted(PRECISIONS)}, scaler: object}}, got {_short(scaler)}")
    if precision is not None and scaler["precision"] != precision:
        raise ValueError(f"{where}: state.scaler.precision is {scaler['precision']!r} but "
                         f"state.settings.precision is {precision!r}")
    inner = scaler["scaler"]
    if bool(inner) != (scaler["precision"] == "fp16"):
        raise ValueError(f"{where}: state.scaler.scaler must be "
                         + ("a GradScaler state for fp16" if scaler["precision"] == "fp16"
                            else f"empty for {scaler['precision']}") + f", got {_short(inner)}")
    if not inner:
        return  # a disabled GradScaler (fp32, bf16)
    if set(inner) != set(_SCALER_FIELDS):
        raise ValueError(f"{where}: state.scaler.scaler must have exactly "
                         f"{list(_SCALER_FIELDS)}, got {_short(inner)}")
    label = "state.scaler.scaler"
    _number(inner, "scale", where, label=f"{label}.scale", positive=True)
    _number(inner, "growth_factor", where, label=f"{label}.growth_factor", positive=True)
    _number(inner, "backoff_factor", where, label=f"{label}.backoff_factor", positive=True)
    _int(inner, "growth_interval", where, label=f"{label}.growth_interval", low=1)
    _int(inner, "_growth_tracker", where, label=f"{label}._growth_tracker")


def _check_layout(cfg: Config, found: dict, where: str) -> None:
    """Tensor names, shapes and dtypes (name -> (shape, safetensors dtype)) against the config:
    exactly model./optimizer.m./optimizer.v. + every parameter name, float32, its shape."""
    counts = dict.fromkeys(TENSOR_GROUPS, 0)
    for key, (shape, dtype) in found.items():
        prefix = next((p for p in TENSOR_GROUPS if key.startswith(p)), None)
        want = None if prefix is None else parameter_shape(cfg, key[len(prefix):])
        if want is None:
            raise ValueError(f"{where}: unexpected tensor {key!r} (not model., optimizer.m. or "
                             f"optimizer.v. + a parameter of the config)")
        counts[prefix] += 1
        if tuple(shape) != tuple(want):
            raise ValueError(f"{where}: tensor {key!r} has shape {tuple(shape)}, the config "
                             f"expects {tuple(want)}")
        if dtype != "F32":
            raise ValueError(f"{where}: tensor {key!r} has dtype {dtype}; checkpoints hold "
                             f"float32 (F32)")
    expected = n_parameter_tensors(cfg)
    short = {p[:-1]: n for p, n in counts.items() if n != expected}
    if short:
        raise ValueError(f"{where}: tensors are missing: the config has {expected} parameters, "
                         f"the file holds " + ", ".join(f"{n} under {p}"
                                                        for p, n in short.items()))


def _check_second_moment(key: str, array: np.ndarray, where: str) -> None:
    if key.startswith("optimizer.v.") and np.any(array < 0):
        raise ValueError(f"{where}: tensor {key!r} (a second moment) holds negative values")


def _int(d: dict, key: str, where: str, label: str | None = None, low: int = 0,
         below: int | None = None) -> int:
    """d[key], an integer in [low, below); ValueError "<where>: <label> must be ..." if not."""
    return check_int(d[key], f"{where}: {label or 'state.' + key}", low=low,
                     high=None if below is None else below - 1)


def _number(d: dict, key: str, where: str, label: str | None = None,
            low: float | None = None, positive: bool = False) -> float:
    """d[key], a finite number >= low (> 0 when positive); ValueError naming the field if not."""
    return check_real(d[key], f"{where}: {label or 'state.' + key}", low=low,
                      positive=positive)


def _kind(x) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(x), type(x).__name__)


def _short(x, n: int = 60) -> str:
    text = repr(x)
    return text if len(text) <= n else text[:n] + "..."


def _get(d, key):
    return d.get(key) if isinstance(d, dict) else None


def _finite_or_none(x):
    return float(x) if is_real(x) and math.isfinite(x) else None
