"""Training checkpoints: everything needed to continue a run bit for bit.

A checkpoint is one safetensors file (no pickle, so loading one cannot run code):

    tensors   model.<name>          the weights, by `named_parameters()` name (float32)
              optimizer.m.<name>    AdamW's first moment of that parameter
              optimizer.v.<name>    AdamW's second moment
    metadata  format = "glassllm-checkpoint", version = "1"
              state  = one JSON string: step, model config, the optimizer's global `t` and
                       per-parameter update counts and hyper-parameters, the batch sampler's
                       `bit_generator.state`, the trainer settings, the best validation loss
                       and the step it came from, the history, the loss scaler's state and
                       free-form `extra` (tokenizer, data sources, ...)

JSON keeps Python floats exactly (shortest round-trip repr) and integers of any size (PCG64's
128-bit state), so a restored run draws the same batches and makes the same updates as one
that never stopped. Writes are atomic: a temporary file in the same directory, fsync, then
`os.replace` (`glassllm.atomic`), so a crash or Ctrl-C mid-write leaves the previous
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
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from .atomic import atomic_replace
from .model import Config, GlassLM
from .optim import AdamW

FORMAT = "glassllm-checkpoint"
VERSION = "1"


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


def optimizer_state(model: GlassLM, optimizer: AdamW) -> dict:
    """AdamW's state keyed by parameter name (copies). The optimizer must hold exactly
    `model.parameters()` in that order, as the trainer builds it.

    Raises:
        ValueError: the optimizer's parameters are not the model's.
    """
    names = _check_same_params(model, optimizer)
    return {
        "m": {n: m.copy() for n, m in zip(names, optimizer.m)},
        "v": {n: v.copy() for n, v in zip(names, optimizer.v)},
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
            target[i] = np.array(array, dtype=p.dtype)
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

    Raises:
        ValueError: a weight or moment is not a float array, or `state` is not JSON-able.
        IsADirectoryError / OSError: `path` is a directory or cannot be written; the message
            names `path`, never the temporary file.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "the checkpoint path is a directory", str(path))
    tensors = {}
    for prefix, arrays in (("model.", ckpt.weights), ("optimizer.m.", ckpt.optimizer["m"]),
                           ("optimizer.v.", ckpt.optimizer["v"])):
        for name, array in arrays.items():
            tensors[prefix + name] = np.ascontiguousarray(array)
    state = {
        "step": int(ckpt.step),
        "config": ckpt.config,
        "optimizer": {k: v for k, v in ckpt.optimizer.items() if k not in ("m", "v")},
        "rng_state": ckpt.rng_state,
        "settings": ckpt.settings,
        "best_val_loss": _finite_or_none(ckpt.best_val_loss),
        "best_step": ckpt.best_step,
        "history": ckpt.history,
        "scaler": ckpt.scaler,
        "extra": ckpt.extra,
    }
    try:
        # allow_nan=False: a NaN in the history would be written as a non-JSON token.
        state_json = json.dumps(state, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint: state is not JSON-serialisable: {e}") from None
    metadata = {"format": FORMAT, "version": VERSION, "state": state_json}
    atomic_replace(path, lambda tmp: save_file(tensors, tmp, metadata=metadata),
                   doing="cannot write the checkpoint", make_parents=True)
    return path


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint written by `save_checkpoint`.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not a glassllm checkpoint (foreign safetensors, truncated,
            corrupt, another version, or missing tensors), with the path in the message.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"checkpoint {str(path)!r} is a directory, not a file")
    try:
        with safe_open(str(path), framework="numpy") as f:
            metadata = f.metadata() or {}
            if metadata.get("format") != FORMAT:
                raise ValueError(f"{str(path)!r} is not a glassllm checkpoint (format "
                                 f"{metadata.get('format')!r})")
            if metadata.get("version") != VERSION:
                raise ValueError(f"checkpoint {str(path)!r} has version "
                                 f"{metadata.get('version')!r}, this glassllm reads {VERSION}")
            tensors = {name: f.get_tensor(name) for name in f.keys()}
        state = json.loads(metadata["state"])
    except (SafetensorError, OSError, json.JSONDecodeError, KeyError, UnicodeError) as e:
        raise ValueError(f"checkpoint {str(path)!r} is unreadable or corrupt: "
                         f"{type(e).__name__}: {e}") from None
    return _from_parts(path, tensors, state)


def _from_parts(path: Path, tensors: dict, state: dict) -> Checkpoint:
    try:
        config = Config.from_dict(state["config"])
        groups = {"model.": {}, "optimizer.m.": {}, "optimizer.v.": {}}
        for key, array in tensors.items():
            prefix = next((p for p in groups if key.startswith(p)), None)
            if prefix is None:
                raise ValueError(f"unexpected tensor {key!r}")
            groups[prefix][key[len(prefix):]] = array
        names = set(groups["model."])
        for prefix, arrays in groups.items():
            if set(arrays) != names:
                odd = sorted(set(arrays) ^ names)[:3]
                raise ValueError(f"weights and {prefix[:-1]} name different tensors: {odd}")
        optimizer = dict(state["optimizer"])
        optimizer["m"], optimizer["v"] = groups["optimizer.m."], groups["optimizer.v."]
        return Checkpoint(
            step=int(state["step"]), config=config.to_dict(), weights=groups["model."],
            optimizer=optimizer, rng_state=state["rng_state"], settings=state["settings"],
            best_val_loss=state.get("best_val_loss"), best_step=state.get("best_step"),
            history=state["history"], scaler=state.get("scaler"),
            extra=state.get("extra") or {})
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"checkpoint {str(path)!r} is incomplete or inconsistent: {e}") from None


def _finite_or_none(x):
    return None if x is None or not math.isfinite(x) else float(x)
