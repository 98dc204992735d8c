"""Trainer: the training program around spec 001's loop (`glassllm.train`).

Same update as `glassllm.train.train`, plus events instead of printing, the best model written
to a file, checkpoints with exact resume, Ctrl-C safety and the mixed-precision step
(`glassllm.training.safety.TrainStep`).
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import math
import numbers
import os
import signal
import threading
import warnings
import time  # read as `time.monotonic()` here so tests can patch the clock
from typing import Callable

import numpy as np

from ..formats import checkpoint as ckpt_io
from . import distributed
from ..formats.atomic import atomic_write, remove_leftover_temporaries
from .data import check_same_data, data_identity
from ..lens.health import HealthChecked, HealthMonitor, HealthWarning  # noqa: F401 (run's events)
from .lock import lock_outputs
from ..model import GlassLM, dataclass_from_dict
from ..optim import AdamW, clip_grad_norm, lr_schedule
from .safety import PRECISIONS, SkipRateExceeded, SkipRateMonitor, StepCSVLog, TrainStep
from ..tensor import no_grad
from ..train import CLIP_NORM, EVAL_BATCHES, EVAL_SEED, evaluate, get_batch


@dataclasses.dataclass
class TrainSettings:
    """What a training run does not change on the way (004's `settings`).

    The defaults are the `glassllm train` defaults: with the default model (llama family,
    d_model 128, 4 layers, 4 heads, 2 KV heads) they train on tinyshakespeare to a validation
    loss of 1.75 nats per byte (nanoGPT's CPU recipe: 1.88 after 2000 steps of 12 x 64) in
    about 2 minutes on two CPU cores (README). 1000 steps rather than 2000 keep a wide time
    margin on a busy machine; the loss is below 2.0 from step ~400.

    Fields:
        steps: AdamW updates in the whole run (a resumed run counts the earlier ones).
        batch_size, seq_len: B windows of T tokens per micro-batch of one rank; an update is
            grad_accum micro-batches on each of N ranks, N * grad_accum * B * T tokens.
        grad_accum: K, micro-batches per update (nanoGPT's gradient_accumulation_steps):
            the sampler draws one batch of N*K*B windows (the windows one batch of that size
            would have), each rank runs its K*B rows as K micro-batches of B, and the mean
            gradient makes one clip and one AdamW step. Evaluation batches have N*K*B windows
            too, so the validation loss does not depend on how they are split.
        lr: peak learning rate of `lr_schedule` (warmup then cosine to lr * min_lr_ratio).
        warmup: linear warmup steps.
        clip: max global L2 norm of the (unscaled) gradients, spec 001's 1.0.
        eval_every: evaluate after update `step` when step % eval_every == 0, and after the
            last update (spec 001's rhythm).
        eval_batches: batches per evaluation, of N * grad_accum * batch_size windows of
            seq_len (N ranks), drawn with the fixed `eval_seed`, so every evaluation sees the
            same windows.
        seed: seed of the batch sampler `np.random.default_rng(seed)`.
        precision: "fp32", "fp16" (autocast + dynamic loss scaling) or "bf16" (autocast).
        log_csv: path of the per-step CSV of spec 003 (None: no CSV).
        max_skip_rate: stop with SkipRateExceeded when the rolling skip rate stays above this
            for 100 steps, or, in a run of fewer than 100 steps, when the skip rate of the
            whole run is above it at its end (None: no alert).
        max_consecutive_skips: stop with NoProgressError when this many updates in a row
            were skipped (inf/NaN loss or gradients), in any precision: the run is making no
            real update. A run that ends with every one of its updates skipped, one of them
            for a non-finite loss, fails too, however short (gradient overflows alone are the
            fp16 loss scale backing off, as it should at the start of a run). The default 25 is beyond any healthy fp16 start: the loss scale
            halves on each skip, and 2**16 / 2**25 leaves no gradient representable.
        checkpoint_every: write a checkpoint after every N completed updates (None: only on
            Ctrl-C). Needs the trainer's checkpoint_path.
        weight_decay: AdamW's decoupled decay. min_lr_ratio: the schedule's floor.
        health_every: measure training health every N updates (`glassllm.lens.health`: per-tensor
            update:data ratio, gradient and weight norms, activation statistics, attention
            entropy, clip and skip counts) and report `HealthChecked` / `HealthWarning`
            events; None: never. It does not change the updates (bit-identical).
        health_log: health.jsonl to append those rows to (None: events only); needs
            health_every.

    Raises:
        ValueError: a field out of range (named in the message).
    """

    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 64
    lr: float = 2e-3
    warmup: int = 100
    clip: float = CLIP_NORM
    eval_every: int = 100
    eval_batches: int = 20
    seed: int = 0
    precision: str = "fp32"
    log_csv: str | None = None
    max_skip_rate: float | None = None
    max_consecutive_skips: int = 25
    checkpoint_every: int | None = None
    weight_decay: float = 0.1
    min_lr_ratio: float = 0.1
    eval_seed: int = EVAL_SEED
    health_every: int | None = None
    health_log: str | None = None
    grad_accum: int = 1

    # Field types, checked strictly: int(2.7) == 2 and int(True) == 1 would let a float or a
    # bool through, and a NumPy integer would not survive the checkpoint's JSON.
    INT_FIELDS = ("steps", "batch_size", "seq_len", "warmup", "eval_every", "eval_batches",
                  "seed", "checkpoint_every", "eval_seed", "max_consecutive_skips",
                  "health_every", "grad_accum")
    FLOAT_FIELDS = ("lr", "clip", "max_skip_rate", "weight_decay", "min_lr_ratio")

    def __post_init__(self):
        for name in self.INT_FIELDS + self.FLOAT_FIELDS:
            value = getattr(self, name)
            if value is None and name in ("checkpoint_every", "max_skip_rate", "health_every"):
                continue
            setattr(self, name, _checked_number(name, value, integer=name in self.INT_FIELDS))
        for name in ("log_csv", "health_log"):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, (str, os.PathLike)):
                    raise ValueError(f"TrainSettings.{name} must be a path or None, "
                                     f"got {value!r}")
                setattr(self, name, os.fspath(value))
        if self.health_every is not None and self.health_every <= 0:
            raise ValueError(f"TrainSettings.health_every must be positive, "
                             f"got {self.health_every}")
        if self.health_log is not None and self.health_every is None:
            raise ValueError("TrainSettings.health_log needs health_every")
        positive = ("batch_size", "seq_len", "eval_every", "eval_batches",
                    "max_consecutive_skips", "grad_accum")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"TrainSettings.{name} must be positive, "
                                 f"got {getattr(self, name)}")
        for name in ("steps", "warmup", "seed", "eval_seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainSettings.{name} must be >= 0, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"TrainSettings.lr must be a positive number, got {self.lr}")
        if not self.clip > 0:
            raise ValueError(f"TrainSettings.clip must be positive, got {self.clip}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainSettings.precision must be one of {sorted(PRECISIONS)}, "
                             f"got {self.precision!r}")
        if self.max_skip_rate is not None and not 0.0 <= self.max_skip_rate < 1.0:
            raise ValueError(f"TrainSettings.max_skip_rate must be in [0, 1), "
                             f"got {self.max_skip_rate}")
        if self.checkpoint_every is not None and self.checkpoint_every <= 0:
            raise ValueError(f"TrainSettings.checkpoint_every must be positive, "
                             f"got {self.checkpoint_every}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"TrainSettings.min_lr_ratio must be in [0, 1], "
                             f"got {self.min_lr_ratio}")
        if self.weight_decay < 0:
            raise ValueError(f"TrainSettings.weight_decay must be >= 0, got {self.weight_decay}")

    # Fields that only say where output goes: a resumed run may change them.
    OUTPUT_FIELDS = ("log_csv", "checkpoint_every", "health_every", "health_log")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainSettings":
        """Inverse of to_dict. Raises ValueError on unknown or invalid fields."""
        return dataclass_from_dict(cls, d)


# Events: what the loop reports. The loop never prints; the caller decides (004).
@dataclasses.dataclass(frozen=True)
class Started:
    """Before the first update of a fresh run: validation loss of the initial weights (nats)."""
    val_loss: float


@dataclasses.dataclass(frozen=True)
class Resumed:
    """A run continues from a checkpoint: `step` updates were already done."""
    step: int
    best_val_loss: float | None


@dataclasses.dataclass(frozen=True)
class Stepped:
    """After every update `step` (0-based): its batch loss before the update (nats/token; inf
    or NaN on a skipped step; the mean over every micro-batch of every rank), the learning
    rate, and training throughput in tokens/second of all ranks together, averaged over this
    run() call (evaluation time excluded)."""
    step: int
    loss: float
    lr: float
    tokens_per_s: float
    skipped: bool = False


@dataclasses.dataclass(frozen=True)
class Evaluated:
    """After update `step`: mean batch loss of the updates since the previous evaluation
    (train_loss, nats/token, skipped steps excluded; NaN if all skipped), validation loss
    (nats/token) and the training throughput over those updates (tokens/second)."""
    step: int
    train_loss: float
    val_loss: float
    tokens_per_s: float


@dataclasses.dataclass(frozen=True)
class Saved:
    """The model file was (atomically) rewritten: validation improved to val_loss at `step`."""
    step: int
    path: str
    val_loss: float


@dataclasses.dataclass(frozen=True)
class Checkpointed:
    """A checkpoint of the state after `step` completed updates was written to `path`."""
    step: int
    path: str


@dataclasses.dataclass(frozen=True)
class TrainSummary:
    """The outcome of a finished run.

    steps: updates done in total (resumed ones included). best_step / best_val_loss: the
    evaluation the model file holds (None if there was none). final_val_loss: the last
    evaluation. history: one dict per update, as in the checkpoint. skipped_steps: updates
    skipped for non-finite values. tokens: tokens trained on in this run() call. elapsed_s:
    wall time of this call. model_path: where the best model is (None if not saved: no
    model_path, no evaluation, or a resume with a new model_path that no later evaluation
    improved on, when the best model is where the interrupted run wrote it).
    """
    steps: int
    best_step: int | None
    best_val_loss: float | None
    final_val_loss: float | None
    history: list
    skipped_steps: int
    tokens: int
    elapsed_s: float
    model_path: str | None


@dataclasses.dataclass(frozen=True)
class Finished:
    """The run completed all its steps."""
    summary: TrainSummary


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (or another KeyboardInterrupt) stopped the run.

    step: updates completed. checkpoint_path: the checkpoint written for them, or None (no
    checkpoint_path was given, or a second Ctrl-C arrived in the middle of an update, when the
    state is not one a checkpoint may hold). history: one dict per completed update. A
    KeyboardInterrupt, so callers that only know Ctrl-C still stop.
    """

    def __init__(self, step: int, checkpoint_path: str | None, history: list | None = None):
        where = f"; checkpoint {checkpoint_path}" if checkpoint_path else "; no checkpoint"
        super().__init__(f"training interrupted after {step} updates{where}")
        self.step, self.checkpoint_path = step, checkpoint_path
        self.history = history if history is not None else []


class NonFiniteLossError(FloatingPointError, ValueError):
    """The run diverged: the training loss or gradient norm became inf/NaN in a run that does
    not skip such steps (fp32 without max_skip_rate), or the validation loss or the weights did
    (in any run: the weights themselves are broken). Nothing is written when it is raised; a
    model file saved at an earlier, finite evaluation stays as it was (`kept_path`, the update
    `kept_step` it holds).

    Attributes: step (the failing update), value (the non-finite quantity that `reason`
    names: the training loss, the gradient norm before clipping or the validation loss), reason
    ("nonfinite_loss" | "nonfinite_grad" | "nonfinite_val_loss" | "nonfinite_weights" |
    "no_progress"), kept_path, kept_step, history (one dict per completed update and one
    for the failing one, as in `Trainer`'s history; the CLI writes it to history.csv).
    """

    _WHAT = {"nonfinite_loss": "training loss",
             "nonfinite_grad": "gradient norm (before clipping)",
             "nonfinite_val_loss": "validation loss", "nonfinite_weights": "model's weights"}

    def __init__(self, step: int, value: float, reason: str, kept_path: str | None = None,
                 kept_step: int | None = None, history: list | None = None,
                 message: str | None = None):
        kept = (f"{kept_path} keeps the best model, from step {kept_step}"
                if kept_path is not None else "no model file was written")
        if message is None:
            what = self._WHAT[reason]
            found = "are not finite" if reason == "nonfinite_weights" else \
                f"is not finite ({value})"
            message = f"the {what} {found}; the run diverged (a lower learning rate may help)"
        super().__init__(f"step {step}: {message}; training stopped, {kept}")
        self.step, self.value, self.reason = step, value, reason
        self.loss = value  # the name of earlier versions
        self.kept_path, self.kept_step = kept_path, kept_step
        self.history = history if history is not None else []


class NoProgressError(NonFiniteLossError):
    """Every update of the last `skipped` steps was skipped (`max_consecutive_skips` in a row,
    or the whole of a shorter run with a non-finite loss among them): inf/NaN losses or
    gradients, in any precision. The message names the last step's skip reason and its loss."""

    def __init__(self, step: int, skipped: int, reason: str, loss: float, scale: float,
                 kept_path=None, kept_step=None, history=None):
        what = {"nonfinite_loss": f"non-finite training loss ({loss})",
                "nonfinite_grad": "non-finite gradients"}.get(reason, reason)
        scaled = f", loss scale {scale:g}" if scale != 1.0 else ""
        super().__init__(step, loss, "no_progress", kept_path, kept_step, history,
                         message=f"the last {skipped} updates were all skipped (last: {what}"
                                 f"{scaled}); the run is making no progress")
        self.skipped = skipped
        self.skip_reason = reason


class _DeferredInterrupt:
    """Hold Ctrl-C until the current update has finished, so a checkpoint written for it is
    exactly the state after a whole number of updates. A second Ctrl-C interrupts at once.

    Only in the main thread and only when SIGINT has Python's default handler (signal
    handlers can only be set there, and a program that set its own keeps it)."""

    def __init__(self):
        self.pending = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum, frame):
        if self.pending:
            raise KeyboardInterrupt
        self.pending = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


class Trainer:
    """The training loop of spec 004: events, best-model file, checkpoints, exact resume.

    Args:
        settings: a TrainSettings.
        train_data, val_data: `Batches` (glassllm.training.data): `token_count() -> int`,
            `batch(rng, batch_size, seq_len) -> (x, y)` int arrays (B, T) and, for a run that
            writes or resumes checkpoints, `fingerprint() -> str` (its data identity). A
            600-token array (`ArrayBatches`) and a multi-GB memory-mapped file work alike.
        model_path: where the best model is written with `glassllm.formats.files.save` (None: never).
        checkpoint_path: where checkpoints go (None: no checkpoints, even on Ctrl-C).
        tokenizer: stored in the model file and in checkpoints; None (default): the model
            file is weights-only (any vocab_size; see `glassllm.formats.files.save`).
        extra: JSON-serialisable facts stored in checkpoints (e.g. the data sources).
        comm: a communicator (`glassllm.training.distributed`): None or a SerialCommunicator for one
            process, an MPICommunicator for data parallelism over N ranks.

    Every checkpoint records `glassllm.training.data.data_identity(train_data, val_data)` and a resume
    on other data is refused. While `run` lasts, model_path, checkpoint_path and log_csv are
    locked (`glassllm.training.lock`): a second run on one of them is refused, naming the first one.

    Each update is one `glassllm.training.safety.TrainStep` call: loss, backward, clip, AdamW at
    `lr_schedule(step, steps, lr, warmup, min_lr_ratio)`. In fp32 it is exactly spec 001's
    `train()` update, so with `ArrayBatches(data)` and the same seed both give the same weights.
    Validation is in float32 (no autocast), `eval_batches` batches drawn with `eval_seed`.
    With grad_accum = K > 1 an update is K micro-batches whose gradients are averaged
    (`TrainStep`); with K = 1 on one process it is the very same update as before.

    Data parallelism (comm of N > 1 ranks), every rank calling `run` with the same arguments:
    every rank draws the same global batch of N*K*B windows from the shared seed and trains on
    rows [rank*K*B, (rank+1)*K*B) of it; the gradients are summed over the ranks in one
    float32 Allreduce, so clip and AdamW run identically on every rank. Evaluation is split the
    same way and the loss sums reduced. Only rank 0 writes (model file, checkpoints, log_csv),
    takes the output locks and emits events; throughput counts the tokens of all ranks. At the
    start the ranks' settings, model, data and weights are compared, and at every evaluation
    the weights' SHA-256 (`RanksDisagree` on any difference, on every rank). Ctrl-C (which
    mpiexec forwards to every rank) is agreed on at the next step boundary: every rank stops
    after the same update and rank 0 writes the checkpoint. A checkpoint records N and is
    resumed under the same N only. An error on one rank only (a bug, a failing write on rank
    0, a second Ctrl-C in the middle of an update) ends the whole job with `comm.abort`,
    naming the rank, rather than leaving the others waiting.
    """

    def __init__(self, settings: TrainSettings, train_data, val_data, model_path=None,
                 checkpoint_path=None, tokenizer=None, extra: dict | None = None, comm=None):
        self.settings = settings
        self.train_data = train_data
        self.val_data = val_data
        self.model_path = None if model_path is None else os.fspath(model_path)
        self.checkpoint_path = None if checkpoint_path is None else os.fspath(checkpoint_path)
        self.tokenizer = tokenizer
        self.extra = dict(extra or {})
        self.comm = comm if comm is not None else distributed.SerialCommunicator()
        if settings.checkpoint_every is not None and self.checkpoint_path is None:
            raise ValueError("Trainer: checkpoint_every needs a checkpoint_path")

    # ------------------------------------------------------------------ the loop
    def run(self, model: GlassLM, resume=None,
            on_event: Callable[[object], None] | None = None) -> TrainSummary:
        """Train `model` in place; return the summary (also sent as `Finished`).

        Args:
            resume: None (fresh run), a checkpoint path, or a `checkpoint.Checkpoint`. The
                model's config, the settings (except log_csv, checkpoint_every) and the data
                (its `data_identity`) must be the checkpoint's; weights, optimizer, sampler,
                history and best loss are restored, and the result is bit-identical to a run
                that never stopped.
            on_event: called with each event; an exception it raises stops the run
                (KeyboardInterrupt from it is handled like Ctrl-C).

        The run locks model_path, checkpoint_path and log_csv (`glassllm.training.lock`) until it
        returns; a run that writes or resumes checkpoints records the data's identity, so its
        train_data and val_data need a `fingerprint()` (ArrayBatches and TokenFile have one).

        Raises:
            ValueError: data too short for seq_len, seq_len > max_len, a checkpoint that does
                not match the model, the settings, the data or the number of ranks, data
                without a fingerprint when checkpoints are involved.
            glassllm.training.distributed.RanksDisagree: ranks with different settings, data or
                weights (at the start, or the weights at an evaluation).
            glassllm.training.lock.OutputLocked: another run holds one of the output paths.
            NonFiniteLossError: non-finite loss/gradient in a run that does not skip (fp32 and
                no max_skip_rate), or a non-finite validation loss or weights; the model file
                and checkpoint are not written. NoProgressError (a NonFiniteLossError):
                max_consecutive_skips updates in a row skipped, or every update of the run
                with a non-finite loss among them.
            glassllm.training.safety.SkipRateExceeded: too many skipped steps (max_skip_rate).
            TrainingInterrupted: Ctrl-C; the checkpoint (if any) holds every completed update.
        """
        comm = self.comm
        emit = on_event if on_event is not None else (lambda event: None)
        if comm.rank != 0:
            emit = (lambda event: None)  # rank 0 alone reports
        outputs = [self.model_path, self.checkpoint_path, self.settings.log_csv,
                   self.settings.health_log] if comm.rank == 0 else []
        with contextlib.ExitStack() as held:
            with distributed.agreement(comm):  # a no-op on one process
                self._check_data(model)
                lock = held.enter_context(lock_outputs(outputs))
            for path in lock.stale_paths:  # a run killed outright may have left temporaries
                for tmp in remove_leftover_temporaries(path):
                    warnings.warn(f"removed {tmp}, a temporary file left by a run that had "
                                  f"ended without releasing its lock", stacklevel=2)
            if comm.size == 1:
                return self._run(model, resume, emit)
            try:
                return self._run(model, resume, emit)
            except BaseException as e:
                if not _raised_on_every_rank(e):
                    distributed.fail(comm, e)  # the others would wait for this rank forever
                raise

    def _run(self, model: GlassLM, resume, emit) -> TrainSummary:
        s, comm = self.settings, self.comm
        self._data_identity = None
        if self.checkpoint_path is not None or resume is not None:
            self._data_identity = data_identity(self.train_data, self.val_data)
        optimizer = AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
        train_step = TrainStep(model, optimizer, s.precision, s.clip, comm=comm,
                               micro_batches=s.grad_accum)
        rng = np.random.default_rng(s.seed)
        history: list[dict] = []
        best_val, best_step = None, None
        state = None
        if resume is not None:
            state = resume if isinstance(resume, ckpt_io.Checkpoint) \
                else ckpt_io.load_checkpoint(resume)
        if comm.size > 1:
            self._check_ranks_agree(model, state)
        if state is not None:
            with distributed.agreement(comm):
                self._restore(state, model, optimizer, train_step, rng)
            history, best_val, best_step = list(state.history), state.best_val_loss, \
                state.best_step
        if comm.size > 1:
            distributed.check_same(comm, {"weights sha256": distributed.weights_digest(model),
                                          "sampler state": rng.bit_generator.state,
                                          "optimizer t": optimizer.t,
                                          "scaler": train_step.state_dict()},
                                   "state at the start")
        rows = s.grad_accum * s.batch_size  # this rank's windows per update
        mine = slice(comm.rank * rows, (comm.rank + 1) * rows)
        start = len(history)
        # Whether model_path holds the best model: after a save in this call, or, resumed,
        # when the interrupted run's file is there (resumed with another model_path and no
        # better evaluation since, nothing is ever written there).
        model_saved = best_step is not None and self.model_path is not None and \
            os.path.exists(self.model_path)
        monitor = None
        if s.max_skip_rate is not None:
            monitor = SkipRateMonitor(s.max_skip_rate)
            for entry in history:  # its window is a function of the skips so far
                monitor.update(bool(entry.get("skipped")), entry["step"])
        skipped_in_a_row = _trailing_skips(history)
        csv_log = self._open_csv(start, resumed=resume is not None)
        health = None
        # Rank 0 alone measures health and writes its rows; on resume the rows of updates
        # after the checkpoint are redone.
        if s.health_every is not None and comm.rank == 0:
            health = HealthMonitor(model, optimizer, s.health_every, s.clip, s.health_log,
                                   keep_from=start if resume is not None else None)
        started_at = time.monotonic()
        train_time, tokens = 0.0, 0
        interval_time, interval_tokens = 0.0, 0
        in_step = False
        record = None  # the last step's StepRecord in this call
        try:
            with _DeferredInterrupt() as interrupt:
                if comm.size > 1:  # a callback's KeyboardInterrupt is agreed on like Ctrl-C
                    emit = _interrupt_on_keyboard_interrupt(emit, interrupt)
                if resume is None:
                    emit(Started(self._evaluate(model)))
                else:
                    emit(Resumed(start, best_val))
                for step in range(start, s.steps):
                    if self._stop_requested(interrupt, step):
                        raise _AgreedStop
                    in_step = True
                    events = []
                    t0 = time.perf_counter()
                    # One global batch from the shared sampler; each rank trains on its rows.
                    x, y = self.train_data.batch(rng, rows * comm.size, s.seq_len)
                    n = x.size  # tokens of all ranks
                    lr = lr_schedule(step, s.steps, s.lr, s.warmup, s.min_lr_ratio)
                    observed = health.observe(step) if health is not None \
                        else contextlib.nullcontext()
                    with observed:
                        record = train_step(x[mine], y[mine], lr, step)
                    dt = time.perf_counter() - t0
                    if csv_log is not None:  # every attempted step, the failing one included
                        csv_log.write(record)
                    if health is not None:  # its row is written before any divergence stop
                        events += health.after_step(step, record)
                    entry = {"step": step, "loss": _json_float(record.loss), "lr": lr}
                    if record.skipped:
                        entry["skipped"] = record.skip_reason
                        skipped_in_a_row += 1
                        if not self._skips_allowed():
                            raise self._diverged(step, record, best_step, history + [entry])
                        if skipped_in_a_row >= s.max_consecutive_skips:
                            raise self._no_progress(step, skipped_in_a_row, record, best_step,
                                                    history + [entry])
                    else:
                        skipped_in_a_row = 0
                    if monitor is not None:
                        monitor.update(record.skipped, step)
                    train_time, tokens = train_time + dt, tokens + n
                    interval_time, interval_tokens = interval_time + dt, interval_tokens + n
                    events.append(Stepped(step, record.loss, lr, tokens / train_time,
                                          record.skipped))
                    if step % s.eval_every == 0 or step == s.steps - 1:
                        val = self._evaluate(model)
                        if comm.size > 1:
                            distributed.check_same(
                                comm, {"weights sha256": distributed.weights_digest(model)},
                                f"weights after step {step}")
                        if not math.isfinite(val):  # never saved, never "best"
                            raise self._diverged(step, record, best_step, history + [entry],
                                                 "nonfinite_val_loss", val)
                        train_loss = _mean_since_last_eval(history, entry)
                        entry["train_loss"] = _json_float(train_loss)
                        entry["val_loss"] = val
                        events.append(Evaluated(step, train_loss, val,
                                                interval_tokens / max(interval_time, 1e-9)))
                        interval_time, interval_tokens = 0.0, 0
                        if best_val is None or val < best_val:
                            if self.model_path is not None:
                                if not _weights_finite(model):
                                    raise self._diverged(step, record, best_step,
                                                         history + [entry],
                                                         "nonfinite_weights", val)
                                if comm.rank == 0:
                                    self._save_model(model)
                                model_saved = True
                                events.append(Saved(step, self.model_path, val))
                            best_val, best_step = val, step
                    history.append(entry)
                    in_step = False
                    for event in events:
                        emit(event)
                    if s.checkpoint_every and (step + 1) % s.checkpoint_every == 0:
                        path = self._write_checkpoint(model, optimizer, train_step, rng,
                                                      history, best_val, best_step)
                        emit(Checkpointed(step + 1, path))
                # A run too short for the alerts' windows is judged as a whole at its end: one
                # that made no update and whose forward pass failed (a non-finite loss, which
                # no loss scale cures) stops with an error. Skips for overflowing gradients
                # alone are the GradScaler finding its scale (it halves on each), which an
                # fp16 run of a few steps may spend entirely; only max_consecutive_skips of
                # them in a row mean no progress.
                if record is not None and skipped_in_a_row == len(history) and any(
                        h.get("skipped") == "nonfinite_loss" for h in history):
                    raise self._no_progress(len(history) - 1, skipped_in_a_row, record,
                                            best_step, history)
                if monitor is not None:
                    monitor.finish(len(history) - 1)
        except KeyboardInterrupt as e:
            if isinstance(e, TrainingInterrupted):
                raise
            if comm.size > 1 and not isinstance(e, _AgreedStop):
                raise  # one rank's own interrupt (a second Ctrl-C): run() ends the job
            path = None
            if not in_step and self.checkpoint_path is not None:
                path = self._write_checkpoint(model, optimizer, train_step, rng, history,
                                              best_val, best_step)
            raise TrainingInterrupted(len(history), path, history) from e
        finally:
            if csv_log is not None:
                csv_log.close()
            if health is not None:
                health.close()
        evaluated = [h["val_loss"] for h in history if "val_loss" in h]
        summary = TrainSummary(
            steps=len(history), best_step=best_step, best_val_loss=best_val,
            final_val_loss=evaluated[-1] if evaluated else None, history=history,
            skipped_steps=sum(1 for h in history if h.get("skipped")), tokens=tokens,
            elapsed_s=time.monotonic() - started_at,
            model_path=self.model_path if model_saved else None)
        emit(Finished(summary))
        return summary

    # ------------------------------------------------------------------ pieces
    def _kept(self, best_step: int | None) -> tuple[str | None, int | None]:
        """The model file an earlier finite evaluation wrote, and its step (or None, None)."""
        if best_step is not None and self.model_path is not None and \
                os.path.exists(self.model_path):
            return self.model_path, best_step
        return None, None

    def _diverged(self, step: int, record, best_step: int | None, history: list,
                  reason: str | None = None, value: float | None = None) -> NonFiniteLossError:
        """The error for a non-finite quantity; without `reason`, the step's own skip: its
        loss (nonfinite_loss) or its gradient norm before clipping (nonfinite_grad)."""
        if reason is None:
            reason = record.skip_reason
            value = record.loss if reason == "nonfinite_loss" else record.grad_l2_pre_clip
        return NonFiniteLossError(step, value, reason, *self._kept(best_step), history)

    def _no_progress(self, step: int, skipped: int, record, best_step: int | None,
                     history: list) -> NoProgressError:
        return NoProgressError(step, skipped, record.skip_reason, record.loss,
                               record.scaler_scale, *self._kept(best_step), history)

    def _skips_allowed(self) -> bool:
        # Mixed precision expects the odd overflow (the scaler backs off and the step is
        # skipped); in fp32 a non-finite loss means the run diverged, unless the user asked
        # for skipping with an alert threshold.
        return self.settings.precision != "fp32" or self.settings.max_skip_rate is not None

    def _check_data(self, model: GlassLM) -> None:
        s = self.settings
        if s.seq_len > model.cfg.max_len:
            raise ValueError(f"Trainer: seq_len={s.seq_len} exceeds the model's "
                             f"max_len={model.cfg.max_len}")
        for name, data in (("training", self.train_data), ("validation", self.val_data)):
            n = int(data.token_count())
            if n <= s.seq_len:
                raise ValueError(f"Trainer: the {name} data has {n} tokens; it needs more "
                                 f"than seq_len={s.seq_len}")

    def _evaluate(self, model: GlassLM) -> float:
        """Mean validation loss (nats/token) over eval_batches fixed batches of N*K*B windows,
        in float32, each rank evaluating its rows in K pieces of B and the sums reduced; with
        N = K = 1 and ArrayBatches this equals spec 001's evaluate(model, ids, B, T, n, seed)."""
        s, comm = self.settings, self.comm
        rng = np.random.default_rng(s.eval_seed)
        rows = s.grad_accum * s.batch_size
        total = 0.0
        with no_grad():
            for _ in range(s.eval_batches):
                x, y = self.val_data.batch(rng, rows * comm.size, s.seq_len)
                for i in range(comm.rank * rows, (comm.rank + 1) * rows, s.batch_size):
                    part = slice(i, i + s.batch_size)
                    total += float(model.loss(x[part], y[part]).item())
        if comm.size > 1:
            summed = np.array([total])
            comm.allreduce_sum(summed, what="validation loss")
            total = float(summed[0])
        return total / (s.eval_batches * s.grad_accum * comm.size)

    def _stop_requested(self, interrupt, step: int) -> bool:
        """Whether to stop before update `step`: Ctrl-C is pending here, or, with N ranks,
        on any rank (one small allreduce, so every rank stops after the same update)."""
        if self.comm.size == 1:
            return interrupt.pending
        flag = np.array([1.0 if interrupt.pending else 0.0])
        self.comm.allreduce_sum(flag, what=f"interrupt check before step {step}")
        return bool(flag[0] > 0)

    def _check_ranks_agree(self, model: GlassLM, resume_state) -> None:
        """Every rank runs the same settings, model and data, and resumes the same step."""
        # what only rank 0 uses may differ: where its CSVs go, how often it measures health
        settings = {k: v for k, v in self.settings.to_dict().items()
                    if k not in ("log_csv", "health_every", "health_log")}
        data = self._data_identity or {
            "train": {"tokens": int(self.train_data.token_count())},
            "val": {"tokens": int(self.val_data.token_count())}}
        facts = {"ranks": self.comm.size, "settings": settings,
                 "model config": model.cfg.to_dict(), "data": data,
                 "resumed step": None if resume_state is None else resume_state.step,
                 "glassllm": _version(), "numpy": np.__version__}
        distributed.check_same(self.comm, facts, "settings, model and data")

    def _save_model(self, model: GlassLM) -> None:
        from ..formats.files import save
        save(model, self.model_path, tokenizer=self.tokenizer)

    def _open_csv(self, start: int, resumed: bool):
        path = self.settings.log_csv
        if path is None or self.comm.rank != 0:
            return None
        if resumed and os.path.exists(path):
            _truncate_csv_rows(path, start)  # rows of updates after the checkpoint are redone
        return StepCSVLog(path, append=resumed)

    def _write_checkpoint(self, model, optimizer, train_step, rng, history, best_val,
                          best_step) -> str | None:
        """Write the checkpoint (rank 0; other ranks return None after the same checks)."""
        if not _weights_finite(model):  # a checkpoint is only ever of a usable state
            raise NonFiniteLossError(len(history) - 1, float("nan"), "nonfinite_weights",
                                     *self._kept(best_step), history)
        if self.comm.rank != 0:
            return None
        extra = dict(self.extra)
        if self.tokenizer is not None:
            extra["tokenizer"] = self.tokenizer.to_json()
        state = ckpt_io.Checkpoint(
            step=len(history), config=model.cfg.to_dict(), weights=model.state_dict(),
            optimizer=ckpt_io.optimizer_state(model, optimizer),
            rng_state=rng.bit_generator.state, settings=self.settings.to_dict(),
            best_val_loss=best_val, best_step=best_step, history=history,
            scaler=train_step.state_dict(), extra=extra, data=self._data_identity,
            world_size=self.comm.size)
        ckpt_io.save_checkpoint(self.checkpoint_path, state)
        return self.checkpoint_path

    def _restore(self, state, model, optimizer, train_step, rng) -> None:
        """Check that `state` continues this run (model, settings, data), then load it."""
        where = f"checkpoint {state.source!r}" if state.source else "the checkpoint"
        if state.source is None:  # built in memory: check it as a file would be checked
            ckpt_io.check_checkpoint(state)
        if state.config != model.cfg.to_dict():
            raise ValueError(f"Trainer: {where}'s model config {state.config} differs "
                             f"from the model's {model.cfg.to_dict()}")
        try:  # a checkpoint older than a setting holds its default (grad_accum: 1)
            saved = TrainSettings.from_dict(state.settings).to_dict()
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: invalid settings: {e}") from None
        mine = self.settings.to_dict()
        differ = sorted(k for k, v in saved.items()
                        if k not in TrainSettings.OUTPUT_FIELDS and mine.get(k) != v)
        if differ:
            pairs = ", ".join(f"{k}: checkpoint {saved[k]!r} vs {mine.get(k)!r}"
                              for k in differ)
            raise ValueError(f"Trainer: resume needs the settings of {where} ({pairs})")
        if state.world_size != self.comm.size:
            raise ValueError(
                f"Trainer: {where} was written by a run of {state.world_size} rank(s) and this "
                f"run has {self.comm.size}; resume it with the same number of ranks (mpiexec "
                f"-n {state.world_size}): the global batch and the order of the gradient sums "
                f"depend on it, so another number would not continue the same run")
        check_same_data(state.data, self.train_data, self.val_data, where=f"resume from {where}")
        model.load_state_dict(state.weights)
        ckpt_io.load_optimizer_state(model, optimizer, state.optimizer)
        rng.bit_generator.state = state.rng_state
        if state.scaler:
            train_step.load_state_dict(state.scaler)


class _AgreedStop(KeyboardInterrupt):
    """Every rank agreed to stop at this step boundary (Ctrl-C on some rank)."""


# What the Trainer raises on every rank at once (decided on reduced values); anything else
# escaping a multi-rank run happened on one rank only and ends the job (Trainer.run).
_EVERY_RANK_ERRORS = (TrainingInterrupted, NonFiniteLossError, SkipRateExceeded,
                      distributed.RanksDisagree, distributed.RanksFailed)


def _raised_on_every_rank(e: BaseException) -> bool:
    return isinstance(e, _EVERY_RANK_ERRORS) or distributed.raised_on_every_rank(e)


def _interrupt_on_keyboard_interrupt(emit, interrupt):
    """emit, with a KeyboardInterrupt from the callback turned into a pending interrupt, to
    be agreed on by all ranks at the next step boundary."""
    def guarded(event):
        try:
            emit(event)
        except KeyboardInterrupt:
            interrupt.pending = True
    return guarded


def _version() -> str:
    from .. import __version__
    return __version__


def _checked_number(name: str, value, integer: bool):
    """value as a Python int (integer=True) or finite float; ValueError naming the field for a
    bool, a float where an int belongs, a string, inf or NaN."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
            (integer and not isinstance(value, numbers.Integral)):
        kind = "an integer" if integer else "a number"
        raise ValueError(f"TrainSettings.{name} must be {kind}, got {value!r}")
    if integer:
        return int(value)
    if not math.isfinite(value):
        raise ValueError(f"TrainSettings.{name} must be a finite number, got {value!r}")
    return float(value)


def _weights_finite(model: GlassLM) -> bool:
    return all(np.isfinite(p.data).all() for p in model.parameters())


def _trailing_skips(history: list[dict]) -> int:
    """How many updates at the end of `history` were skipped in a row."""
    n = 0
    for entry in reversed(history):
        if not entry.get("skipped"):
            break
        n += 1
    return n


def _json_float(x: float):
    """A float for the history, None when inf/NaN (JSON and CSV carry no inf/NaN)."""
    return float(x) if math.isfinite(x) else None


def _mean_since_last_eval(history: list[dict], entry: dict) -> float:
    losses = [entry["loss"]]
    for h in reversed(history):
        if "val_loss" in h:
            break
        losses.append(h["loss"])
    finite = [x for x in losses if x is not None]
    return float(np.mean(finite)) if finite else float("nan")


def _truncate_csv_rows(path: str, start: int) -> None:
    """Keep the header and the rows of steps < start (atomically rewritten)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        return
    kept = [rows[0]] + [r for r in rows[1:] if r and r[0].isdigit() and int(r[0]) < start]
    if len(kept) == len(rows):
        return
    with atomic_write(path, "w", newline="") as f:
        csv.writer(f).writerows(kept)
