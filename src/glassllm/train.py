"""Batches, evaluation and the training loop a reader can write by hand.

`train()` is exactly this loop, which a reader can also write by hand and get the same
weights and history:

    rng = np.random.default_rng(seed)
    opt = AdamW(model.parameters(), lr=lr)
    for step in range(steps):
        x, y = get_batch(data, batch_size, seq_len, rng)
        loss = model.loss(x, y)
        opt.zero_grad(); loss.backward()
        clip_grad_norm(model.parameters(), 1.0)
        opt.step(lr_schedule(step, steps, lr, warmup))
"""
from __future__ import annotations

import importlib
import time  # read as `time.monotonic()` here so tests can patch the clock
import warnings

import numpy as np

from .checks import check_int
from .model import GlassLM
from .optim import AdamW, clip_grad_norm, lr_schedule
from .tensor import no_grad

TRAIN_DEADLINE_S = 7200.0  # fixed wall-clock limit of one train() call, validation included
CLIP_NORM = 1.0
EVAL_BATCHES = 10
EVAL_SEED = 1234


def get_batch(data: np.ndarray, batch_size: int, seq_len: int,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sample `batch_size` random windows of `seq_len` tokens and their next-token targets.

    The one batch sampler of the library: both `glassllm.training.data.Batches`
    implementations call it, so every source draws the same
    windows from the same rng state.

    Args:
        data: 1-D token ids (any integer dtype; a np.memmap works and is read lazily:
            only the (batch_size, seq_len + 1) gathered ids are read).
        rng: the generator the window starts are drawn from (with replacement).

    Returns:
        x, y: (batch_size, seq_len) arrays of data's dtype, y[:, t] == data[start + t + 1],
        so y[:, :-1] == x[:, 1:]. Every start in [0, len(data) - seq_len - 1] can be drawn,
        the last window with complete targets included. Ids are not validated.

    Raises:
        ValueError: batch_size or seq_len not positive, data not 1-D, len(data) <= seq_len.
    """
    if batch_size <= 0 or seq_len <= 0:
        raise ValueError(f"get_batch: batch_size ({batch_size}) and seq_len ({seq_len}) "
                         "must be positive")
    if np.ndim(data) != 1:
        raise ValueError(f"get_batch: data must be 1-D token ids, got shape {np.shape(data)}")
    if len(data) <= seq_len:
        raise ValueError(f"get_batch: need len(data) > seq_len, got {len(data)} tokens for "
                         f"seq_len={seq_len}")
    starts = rng.integers(0, len(data) - seq_len, size=batch_size)
    window = starts[:, None] + np.arange(seq_len + 1)
    chunk = np.asarray(data[window])  # (B, T+1), one gather
    return chunk[:, :-1].copy(), chunk[:, 1:].copy()


def evaluate(model: GlassLM, data: np.ndarray, batch_size: int, seq_len: int,
             n_batches: int = 10, seed: int = 1234) -> float:
    """Mean cross-entropy (nats per token) over `n_batches` sampled batches.

    Windows come from `get_batch` with `np.random.default_rng(seed)`, so a fixed seed gives
    the same windows; this is a sample, not a pass over the whole corpus. Runs under
    `no_grad`: weights and existing gradients are untouched. Perplexity is exp(loss).

    Raises:
        ValueError: n_batches <= 0, and whatever get_batch / the model raise.
    """
    if n_batches <= 0:
        raise ValueError(f"evaluate: n_batches must be positive, got {n_batches}")
    rng = np.random.default_rng(seed)
    total = 0.0
    with no_grad():
        for _ in range(n_batches):
            x, y = get_batch(data, batch_size, seq_len, rng)
            total += float(model.loss(x, y).item())
    return total / n_batches


class _Deadline:
    """A wall-clock limit that starts now: `check(step)` raises TimeoutError once `seconds`
    have passed. The clock is this module's `time.monotonic()` (tests patch it)."""

    def __init__(self, seconds: float):
        self.seconds, self.started = seconds, time.monotonic()

    def check(self, step: int) -> None:
        elapsed = time.monotonic() - self.started
        if elapsed > self.seconds:
            raise TimeoutError(f"train: the {self.seconds:.0f} s deadline expired at step "
                               f"{step} ({elapsed:.0f} s elapsed)")


def train(model: GlassLM, data: np.ndarray, steps: int, batch_size: int = 16,
          seq_len: int = 128, lr: float = 0.003, warmup: int = 100, seed: int = 0,
          val_data: np.ndarray | None = None, eval_every: int = 100,
          keep_best: bool = False, log=print, device: str | None = None) -> list[dict]:
    """Train `model` in place for `steps` AdamW updates; return the history.

    Each step: sample a batch (`get_batch` from `np.random.default_rng(seed)`), loss,
    zero_grad, backward, clip the global gradient norm to 1, `lr_schedule(step, steps, lr,
    warmup)`, AdamW step. A new optimizer is made on every call (no moments carry over).

    Returns:
        One dict per completed update: {"step": int (from 0), "loss": float (the batch's loss
        before the update, nats/token), "lr": float (the rate applied)}, plus "val_loss" when
        val_data is given and step % eval_every == 0 or step is the last. Validation measures
        the weights after the update with `evaluate(model, val_data, batch_size, seq_len)`
        (10 batches, seed 1234).

    keep_best: copy the weights whenever val_loss improves and restore the best copy at the
        end, also when training fails (in `finally`). No effect without val_data. Optimizer
        state and gradients are not restored. No early stopping, no file is written.
    log: called with one line of text per step; None for silence. An exception it raises
        stops training.
    device: move the model there first ("cpu", "cuda", "cuda:N", "strict"; `model.to`);
        None: train where the model is. Batches are drawn on the host and moved by the model.

    Raises:
        ValueError: steps < 0, warmup < 0 or eval_every <= 0 (before any update); batch,
            shape and id errors come from get_batch and the model.
        TimeoutError: the run (validation included) passed TRAIN_DEADLINE_S seconds,
            checked between steps and their stages; no partial history is returned.
    """
    check_int(steps, "train: steps", low=0)
    check_int(warmup, "train: warmup", low=0)
    check_int(eval_every, "train: eval_every", low=1)
    deadline = _Deadline(TRAIN_DEADLINE_S)  # checked between the NumPy operations
    if device is not None:
        model.to(device)
    params = model.parameters()
    optimizer = AdamW(params, lr=lr)
    rng = np.random.default_rng(seed)
    history: list[dict] = []
    best_loss, best_state = float("inf"), None
    try:
        for step in range(steps):
            deadline.check(step)
            x, y = get_batch(data, batch_size, seq_len, rng)
            loss = model.loss(x, y)
            optimizer.zero_grad()
            loss.backward()
            deadline.check(step)
            clip_grad_norm(params, CLIP_NORM)
            step_lr = lr_schedule(step, steps, lr, warmup)
            optimizer.step(step_lr)
            entry = {"step": step, "loss": float(loss.item()), "lr": step_lr}
            if val_data is not None and (step % eval_every == 0 or step == steps - 1):
                deadline.check(step)
                entry["val_loss"] = evaluate(model, val_data, batch_size, seq_len,
                                             EVAL_BATCHES, EVAL_SEED)
                deadline.check(step)
                if keep_best and entry["val_loss"] < best_loss:
                    best_loss, best_state = entry["val_loss"], model.state_dict()
            history.append(entry)
            if log is not None:
                log(_format_entry(entry))
    finally:
        if best_state is not None:
            model.load_state_dict(best_state)
    return history


def _format_entry(entry: dict) -> str:
    line = f"step {entry['step']}: loss {entry['loss']:.4f}, lr {entry['lr']:.3g}"
    if "val_loss" in entry:
        line += f", val_loss {entry['val_loss']:.4f}"
    return line



# The training program (Trainer, its settings, events and errors) lived here before 0.2; its
# home is glassllm.training. Importing it from here still works, with a DeprecationWarning.
_MOVED_TO_TRAINING = ("TrainSettings", "Trainer", "TrainSummary", "TrainingInterrupted",
                      "NonFiniteLossError", "NoProgressError", "Started", "Resumed", "Stepped",
                      "Evaluated", "Saved", "Checkpointed", "Finished", "HealthChecked",
                      "HealthWarning")


def __getattr__(name: str):
    if name not in _MOVED_TO_TRAINING:
        raise AttributeError(f"module 'glassllm.train' has no attribute {name!r}")
    warnings.warn(f"glassllm.train.{name} moved to glassllm.training.{name}; import it from "
                  f"there (the old path goes in a later release)", DeprecationWarning,
                  stacklevel=2)
    return getattr(importlib.import_module("glassllm.training"), name)
