"""Training safety belts: a guarded training step, a per-step CSV log, a skip alert.

`TrainStep` runs one optimizer update in the order that keeps mixed precision and clipping
correct (PyTorch's automatic-mixed-precision recipe, torch/amp/grad_scaler.py;
Micikevicius et al. 2018):

    autocast forward -> loss (float32) -> loss finite?          no: skip "nonfinite_loss"
    -> scaler.scale(loss).backward() -> scaler.unscale_(opt)
    -> unscaled gradients finite? (global L2 norm)               no: skip "nonfinite_grad"
    -> clip the global L2 norm to `clip` -> scaler.step(opt, lr) -> scaler.update()

With `micro_batches=K` (gradient accumulation) and/or a communicator of N ranks (data
parallelism, `glassllm.training.distributed`), the forward/backward runs on K slices of this rank's
rows; their scaled gradients are added in one float32 `GradientBuffer`, summed over the ranks
(one Allreduce), multiplied by 1/(N*K), and the step goes on from `unscale_` on the reduced
gradients: the mean gradient of the N*K micro-batches, as one batch of N*K times the rows
would give up to float32 rounding (nanoGPT's `gradient_accumulation_steps` with DDP). The
loss checked and reported is the mean of the N*K micro-batch losses. Every rank sees the same
reduced values, so every rank takes the same branch (skip, clip, step) and the GradScaler's
inf check agrees across ranks: an overflow on one rank is an inf in everyone's sum.

`scaler.update()` runs on every step, skipped ones too: that is how a skip halves the scale.
A skipped step never calls `optimizer.step`, so weights, AdamW moments and per-parameter step
counts stay bit-for-bit what they were. In precision "fp32" with the scaler disabled, a clean
step is exactly `glassllm.train.train`'s update (same clip, same AdamW call), so the two give
identical weights.

`StepCSVLog` writes one flushed CSV row per attempted step; `SkipRateMonitor` raises
`SkipRateExceeded` when skips stop being rare. Nothing here prints.
"""
from __future__ import annotations

import csv
import dataclasses
import math
import os
from collections import deque

import numpy as np

from .. import amp
from ..checks import check_int
from ..amp import PRECISIONS, SKIP_REASONS
from ..formats.atomic import about
from .distributed import GradientBuffer, SerialCommunicator
from ..optim import clip_grad_norm, global_grad_norm

CSV_COLUMNS = ("step", "lr", "grad_l2_pre_clip", "grad_l2_post_clip", "loss", "skipped",
               "skip_reason", "scaler_scale")


@dataclasses.dataclass
class StepRecord:
    """What happened in one attempted training step (one CSV row).

    step: index of the step (as passed by the caller). lr: the learning rate given for it.
    grad_l2_pre_clip / grad_l2_post_clip: global L2 norm of the unscaled gradients before and
        after clipping (NaN when not measured: no backward ran, or the step was skipped).
        On a "nonfinite_grad" skip pre_clip holds the measured inf/NaN. post_clip is derived,
        pre_clip times the clip's factor (the norm measured again would differ only by the
        float32 rounding of the scaled gradients).
    loss: the batch's loss in nats/token (float32 value, unscaled; may be inf/NaN).
    skipped: True if the optimizer did not step. skip_reason: "" | "nonfinite_loss" |
        "nonfinite_grad". scaler_scale: the loss scale *after* this step's update() (so a
        skipped step shows the halved scale; 1.0 when the scaler is disabled).
    """
    step: int
    lr: float
    grad_l2_pre_clip: float
    grad_l2_post_clip: float
    loss: float
    skipped: bool
    skip_reason: str
    scaler_scale: float

    def as_row(self) -> list[str]:
        """The CSV cells, in CSV_COLUMNS order. Floats use repr (round-trips; 'inf', 'nan')."""
        return [str(int(self.step)), repr(float(self.lr)), repr(float(self.grad_l2_pre_clip)),
                repr(float(self.grad_l2_post_clip)), repr(float(self.loss)),
                "1" if self.skipped else "0", self.skip_reason, repr(float(self.scaler_scale))]


class TrainStep:
    """One guarded training update; call it once per step.

    Args:
        model: anything with `.loss(x, y) -> scalar Tensor` (e.g. GlassLM).
        optimizer: a `glassllm.optim.AdamW` over the model's parameters (`.params`,
            `.zero_grad()`, `.step(lr)`).
        precision: "fp32" (no autocast), "fp16" or "bf16" (matmuls under `amp.autocast`).
        clip: max global L2 norm of the unscaled gradients (`glassllm.train.train` uses 1.0); None: no clip.
        scaler: an `amp.GradScaler`; default: enabled for fp16, disabled for bf16 and fp32
            (bfloat16 has float32's exponent range and does not need loss scaling).
        comm: a communicator (`glassllm.training.distributed`) whose ranks each call this step on
            their share of the batch; default one process.
        micro_batches: K, the number of equal slices of a call's rows run one after the other
            (gradient accumulation); with K = 1 on one process the batch runs whole.

    Raises:
        ValueError: unknown precision, clip <= 0, or micro_batches < 1.
    """

    def __init__(self, model, optimizer, precision: str = "fp32", clip: float | None = 1.0,
                 scaler: amp.GradScaler | None = None, comm=None, micro_batches: int = 1):
        if precision not in PRECISIONS:
            raise ValueError(f"TrainStep: precision must be one of {sorted(PRECISIONS)}, "
                             f"got {precision!r}")
        if clip is not None and not clip > 0:
            raise ValueError(f"TrainStep: clip must be > 0 (or None), got {clip}")
        self.model = model
        self.optimizer = optimizer
        self.precision = precision
        self.clip = clip
        self.scaler = scaler if scaler is not None else amp.GradScaler(
            enabled=(precision == "fp16"))
        self._low = PRECISIONS[precision]
        self.micro_batches = check_int(micro_batches, "TrainStep: micro_batches", low=1)
        self.comm = comm if comm is not None else SerialCommunicator()
        self._buffer: GradientBuffer | None = None  # made at the first accumulated step

    def __call__(self, x, y, lr: float, step: int) -> StepRecord:
        """Forward on batch (x, y) (B, T) ids, backward, checks, clip, AdamW step at `lr`.

        Returns the StepRecord. Exceptions of the model's forward (bad ids, shapes)
        propagate before the weights, AdamW moments and step counts or the loss scale change;
        the gradients are already cleared by then (`optimizer.zero_grad()` comes first, as in
        `glassllm.train.train`'s loop, so every `.grad` is None afterwards).

        Raises:
            ValueError: B not a multiple of micro_batches.
        """
        if self.micro_batches != 1 or self.comm.size != 1:
            return self._accumulated(x, y, lr, step, self.micro_batches)
        self.optimizer.zero_grad()
        scaler = self.scaler
        # Overflow is detected and reported below (a skipped step), so NumPy's warnings about
        # inf/NaN on the way there would only repeat it.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            with amp.autocast(self._low):
                loss = self.model.loss(x, y)
            loss_value = float(loss.item())
            if math.isfinite(loss_value):
                scaler.scale(loss).backward()
            return self._finish(loss_value, lr, step)

    def _accumulated(self, x, y, lr: float, step: int, k: int) -> StepRecord:
        """The step over K micro-batches of this rank and N ranks (module doc)."""
        if len(x) % k:
            raise ValueError(f"TrainStep: {len(x)} rows do not split into {k} micro-batches")
        opt, scaler = self.optimizer, self.scaler
        if self._buffer is None:
            self._buffer = GradientBuffer(opt.params)
        grads = self._buffer
        grads.zero()
        rows = len(x) // k
        local_loss = 0.0
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for i in range(k):
                opt.zero_grad()
                part = slice(i * rows, (i + 1) * rows)
                with amp.autocast(self._low):
                    loss = self.model.loss(x[part], y[part])
                value = float(loss.item())
                local_loss += value  # an inf/NaN stays in the sum: every rank will see it
                if math.isfinite(value):
                    scaler.scale(loss).backward()
                    grads.add(opt.params)
            opt.zero_grad()
            n = k * self.comm.size
            loss_value = grads.reduce(self.comm, local_loss, what=f"step {step}") / n
            if math.isfinite(loss_value):
                grads.to_params(opt.params, 1.0 / n)
            return self._finish(loss_value, lr, step)

    def _finish(self, loss_value: float, lr: float, step: int) -> StepRecord:
        opt, scaler = self.optimizer, self.scaler
        nan = float("nan")
        if not math.isfinite(loss_value):  # checked before backward: no backward ran
            scaler.skip(opt)
            scaler.update()
            return StepRecord(step, lr, nan, nan, loss_value, True, "nonfinite_loss",
                              scaler.get_scale())
        scaler.unscale_(opt)
        pre = global_grad_norm(opt.params)  # measured once: the clip below uses this number
        if scaler.found_inf(opt) or not math.isfinite(pre):
            opt.zero_grad()  # drop the inf/NaN gradients; weights and moments are untouched
            scaler.skip(opt)  # (already recorded by unscale_ when enabled; needed if disabled)
            scaler.update()
            return StepRecord(step, lr, pre, nan, loss_value, True, "nonfinite_grad",
                              scaler.get_scale())
        post = pre
        if self.clip is not None:
            clip_grad_norm(opt.params, self.clip, norm=pre)  # the clip of glassllm.train.train
            if pre > self.clip:  # its factor scaled every gradient: the norm scaled with them
                post = pre * (self.clip / (pre + 1e-6))
        scaler.step(opt, lr)
        scaler.update()
        return StepRecord(step, lr, pre, post, loss_value, False, "", scaler.get_scale())

    def state_dict(self) -> dict:
        """{"precision": str, "scaler": scaler.state_dict()} for checkpoints."""
        return {"precision": self.precision, "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore the scaler state saved by state_dict() (precision is not changed).

        Raises:
            RuntimeError: see GradScaler.load_state_dict.
        """
        scaler_state = state.get("scaler", {})
        if scaler_state or self.scaler.is_enabled():
            self.scaler.load_state_dict(scaler_state)


def check_own_step_log(path, history: list[dict]) -> None:
    """Refuse, before a resume touches it, a step log that is not the resumed run's own.

    A resume keeps a step log's rows of the updates before the checkpoint and rewrites the
    rest; the path it uses may be recorded in the checkpoint relative to it (a moved run) and
    then name another run's log, or any other file. The log is the run's own when its header
    is `CSV_COLUMNS` and its row for the checkpoint's last update holds that update's loss
    (`history[-1]`, as the run recorded it).

    Args:
        path: the existing step log. history: the resumed run's history (dicts with "step"
            and "loss", None for a non-finite loss).

    Raises:
        ValueError: one line naming `path` and what does not match.
    """
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or tuple(rows[0]) != CSV_COLUMNS:
        raise ValueError(f"--log-csv {path} is not a glassllm step log (its header is "
                         f"{rows[0] if rows else 'missing'}); give --log-csv a new path")
    if not history:
        return
    step, loss = str(history[-1]["step"]), history[-1]["loss"]
    column = CSV_COLUMNS.index("loss")
    for row in rows[1:]:
        if row and row[0] == step and len(row) > column and _same_loss(row[column], loss):
            return
    raise ValueError(f"--log-csv {path} is not this run's step log (no row for its step "
                     f"{step} with its loss {loss}): another run's? give --log-csv a new "
                     f"path")


def _same_loss(text: str, loss) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return value == loss if loss is not None else not math.isfinite(value)


class StepCSVLog:
    """Per-step CSV log with the header `step,lr,grad_l2_pre_clip,grad_l2_post_clip,loss,
    skipped,skip_reason,scaler_scale`; one row per `write(record)`, flushed at once so the file
    is complete up to the last finished step after Ctrl-C or a crash. (No fsync: the rows
    survive the process, not a power cut.) A context manager; close() is idempotent.

    Args:
        path: the file. append: if True and the file exists and is non-empty, keep its rows
            and add after them (a resumed run); its header must match.

    Raises:
        ValueError: append=True and the existing file's header is not CSV_COLUMNS.
        OSError: the file cannot be opened or written (a full disk), naming it.
    """

    def __init__(self, path, append: bool = False):
        self.path = os.fspath(path)
        existing = append and os.path.exists(self.path) and os.path.getsize(self.path) > 0
        if existing:
            with open(self.path, newline="") as f:
                header = next(csv.reader(f), [])
            if tuple(header) != CSV_COLUMNS:
                raise ValueError(f"StepCSVLog: {self.path} has header {header}, expected "
                                 f"{list(CSV_COLUMNS)}; cannot append")
        self._file = open(self.path, "a" if existing else "w", newline="")
        self._writer = csv.writer(self._file)
        if not existing:
            try:
                self._writer.writerow(CSV_COLUMNS)
                self._file.flush()
            except OSError as e:
                try:
                    self._file.close()
                except OSError:  # the same failed flush again; the first error is the one
                    pass
                raise about(e, self.path, "cannot write the step log") from None

    def write(self, record: StepRecord) -> None:
        """Append one row and flush it to the operating system (OSError naming the file if
        it cannot be written, e.g. a full disk)."""
        try:
            self._writer.writerow(record.as_row())
            self._file.flush()
        except OSError as e:
            raise about(e, self.path, "cannot write the step log") from None

    def close(self) -> None:
        if not self._file.closed:
            try:
                self._file.close()  # flushes what a failed write left in the buffer
            except OSError as e:
                raise about(e, self.path, "cannot write the step log") from None

    def __enter__(self) -> "StepCSVLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SkipRateExceeded(RuntimeError):
    """Raised by SkipRateMonitor: the rolling skip rate stayed above the limit too long.

    Attributes: rate (float, the rolling skip rate at `step`), step (int), max_rate, window.
    """

    def __init__(self, rate: float, step: int, max_rate: float | None = None,
                 window: int | None = None):
        limit = "" if max_rate is None else f" {max_rate:g}"
        span = "" if window is None else f" for {window} consecutive steps"
        super().__init__(f"skip rate {rate:.3f} stayed above the limit{limit}{span}, at step "
                         f"{step}: too many non-finite steps, training is failing")
        self.rate, self.step, self.max_rate, self.window = rate, step, max_rate, window

    def __reduce__(self):
        return (SkipRateExceeded, (self.rate, self.step, self.max_rate, self.window))


class SkipRateMonitor:
    """Rolling skip-rate alert (a skip counter is an alert, not a log line).

    The rate at a step is skips / steps over the last `window` updates (fewer at the start).
    When that rate is > max_rate on `window` consecutive updates, update() raises
    SkipRateExceeded(rate, step). With window=100 and every step skipped from the start, it
    fires on the 100th step.

    A run shorter than the window would never fire that way, so `finish(step)`, called at
    the end of a run, judges a run of fewer than `window` updates by its whole skip rate: above
    max_rate, it raises SkipRateExceeded as well.

    Args:
        max_rate: the threshold in [0, 1). window: steps in the rolling window (100).

    Raises:
        ValueError: max_rate outside [0, 1) or window < 1.
    """

    def __init__(self, max_rate: float, window: int = 100):
        if not 0.0 <= max_rate < 1.0:
            raise ValueError(f"SkipRateMonitor: max_rate must be in [0, 1), got {max_rate}")
        if int(window) < 1:
            raise ValueError(f"SkipRateMonitor: window must be >= 1, got {window}")
        self.max_rate = float(max_rate)
        self.window = int(window)
        self._recent: deque[bool] = deque(maxlen=self.window)
        self._skips = 0
        self.above_for = 0  # consecutive updates with rate > max_rate
        self.rate = 0.0
        self.seen = 0  # updates recorded in all

    def update(self, skipped: bool, step: int) -> None:
        """Record one step's outcome; raise SkipRateExceeded when the alert condition holds."""
        if len(self._recent) == self.window:
            self._skips -= self._recent[0]
        self._recent.append(bool(skipped))
        self._skips += bool(skipped)
        self.seen += 1
        self.rate = self._skips / len(self._recent)
        self.above_for = self.above_for + 1 if self.rate > self.max_rate else 0
        if self.above_for >= self.window:
            raise SkipRateExceeded(self.rate, step, self.max_rate, self.window)

    def finish(self, step: int) -> None:
        """The end of a run: raise SkipRateExceeded if it had fewer than `window` updates
        and its skip rate (skips / updates, all of them) is above max_rate."""
        if 0 < self.seen < self.window and self.rate > self.max_rate:
            raise SkipRateExceeded(self.rate, step, self.max_rate, self.seen)
