"""Trainer: the training program around the loop of `glassllm.train`.

Same update as `glassllm.train.train`, plus events instead of printing, the best model written
to a file, checkpoints with exact resume, Ctrl-C safety and the mixed-precision step
(`glassllm.training.safety.TrainStep`). Its settings are `glassllm.training.settings`, its
events `glassllm.training.events`, its errors `glassllm.training.errors`.

`Trainer._train` is the loop; each update goes through five phases, one method each:

    x, y = self._sample(run)              # one global batch from the shared sampler
    self._step(run, step, x, y)           # TrainStep; CSV row, health, the skip rules
    if step % eval_every == 0 or step == steps - 1:
        val = self._validate(run, step)   # validation loss (finite), ranks' weights agree
        self._save_if_best(run, step, val)  # the model file
    self._report(run, step)               # history entry, val.csv row, events, checkpoint

`run` (a `_Run`) holds what the run changes on the way: weights, optimizer, sampler, history,
best loss, the open logs and the events of the update in progress.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import math
import os
import warnings
import time  # read as `time.monotonic()` here so tests can patch the clock
from typing import Callable

import numpy as np

from ..formats import checkpoint as ckpt_io
from . import distributed
from ..formats.atomic import atomic_write
from ..formats.paths import same_file
from .data import check_same_data, data_identity
from .errors import NoProgressError, NonFiniteLossError, RunWriteError, TrainingInterrupted
from .events import (Checkpointed, Evaluated, Finished, Resumed, Saved, Started, Stepped,
                     TrainSummary)
from ..lens.health import HealthMonitor
from . import runfiles
from ..model import GlassLM
from ..optim import AdamW, lr_schedule
from .safety import (SkipRateExceeded, SkipRateMonitor, StepCSVLog, StepRecord, TrainStep,
                     check_own_step_log)
from .stopping import STOP_SIGNALS, DeferredStop
from .settings import TrainSettings
from ..tensor import no_grad
from ..devices import namespace


@dataclasses.dataclass
class _Throughput:
    """Training tokens (of all ranks) and seconds, evaluation excluded: in this run() call,
    and since the last evaluation (the interval)."""
    tokens: int = 0
    seconds: float = 0.0
    interval_tokens: int = 0
    interval_seconds: float = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens, self.seconds = self.tokens + tokens, self.seconds + seconds
        self.interval_tokens += tokens
        self.interval_seconds += seconds

    def per_s(self) -> float:
        """Tokens/second over this run() call."""
        return self.tokens / self.seconds

    def interval_per_s(self) -> float:
        """Tokens/second over the interval, which ends here: the next one starts at 0."""
        rate = self.interval_tokens / max(self.interval_seconds, 1e-9)
        self.interval_tokens, self.interval_seconds = 0, 0.0
        return rate


@dataclasses.dataclass
class _Run:
    """What one `Trainer.run` call changes on the way; its phases read and update it."""
    model: GlassLM
    optimizer: AdamW
    train_step: TrainStep
    rng: np.random.Generator  # the batch sampler, np.random.default_rng(settings.seed)
    emit: Callable[[object], None]
    resumed: bool
    history: list = dataclasses.field(default_factory=list)  # one dict per completed update
    best_val: float | None = None
    best_step: int | None = None
    start: int = 0  # the first update of this call (len(history) after a resume)
    model_saved: bool = False  # model_path holds the best model
    skipped_in_a_row: int = 0
    monitor: SkipRateMonitor | None = None
    csv_log: StepCSVLog | None = None
    health: HealthMonitor | None = None
    val_log: runfiles.ValLog | None = None
    speed: _Throughput = dataclasses.field(default_factory=_Throughput)
    started_at: float = 0.0  # time.monotonic() when the updates began
    # The update in progress: from _sample to _report the state is not a whole number of
    # updates, so an interrupt there writes no checkpoint.
    in_step: bool = False
    clock: float = 0.0  # time.perf_counter() at its start
    record: StepRecord | None = None  # its StepRecord (the last one of this call)
    entry: dict | None = None  # its history entry
    events: list = dataclasses.field(default_factory=list)  # sent once it is complete

    def close(self) -> None:
        if self.csv_log is not None:
            self.csv_log.close()
        if self.health is not None:
            self.health.close()
        if self.val_log is not None:
            self.val_log.close()


class Trainer:
    """The training program: events, best-model file, checkpoints, exact resume.

    Args:
        settings: a TrainSettings.
        train_data: `Batches` (glassllm.training.data): `token_count() -> int`,
            `batch(rng, batch_size, seq_len) -> (x, y)` int arrays (B, T) and, for a run that
            writes or resumes checkpoints, `fingerprint() -> str` (its data identity). A
            600-token array (`ArrayBatches`) and a multi-GB memory-mapped file work alike.
        val_data: `Batches` of the validation split, the same way.
        model_path: where the best model is written with `glassllm.formats.files.save` (None: never).
        checkpoint_path: where checkpoints go (None: no checkpoints, even on Ctrl-C).
        tokenizer: stored in the model file and in checkpoints; None (default): the model
            file is weights-only (any vocab_size; see `glassllm.formats.files.save`).
        extra: JSON-serialisable facts stored in checkpoints (e.g. the data sources).
        comm: a communicator (`glassllm.training.distributed`): None or a SerialCommunicator for one
            process, an MPICommunicator for data parallelism over N ranks.
        device: where `run` trains the model ("cpu", "cuda", "cuda:N", "strict"; `model.to`);
            None: where the model is. Batches come from the host, checkpoints and the model
            file are written from it, so a run resumes on any device.

    Raises:
        TypeError: train_data or val_data is not a `Batches` (a plain array, None).
        ValueError: checkpoint_every without a checkpoint_path.

    Every checkpoint records `glassllm.training.data.data_identity(train_data, val_data)` and a resume
    on other data is refused. While `run` lasts, model_path, checkpoint_path and the settings'
    log_csv, health_log and val_log are locked (`glassllm.training.lock`): a second run on one of them is refused, naming the first one.

    Each update is one `glassllm.training.safety.TrainStep` call: loss, backward, clip, AdamW at
    `lr_schedule(step, steps, lr, warmup, min_lr_ratio)`. In fp32 it is exactly `glassllm.train.train`'s
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
                 checkpoint_path=None, tokenizer=None, extra: dict | None = None, comm=None,
                 device: str | None = None):
        for name, data in (("train_data", train_data), ("val_data", val_data)):
            if not (callable(getattr(data, "batch", None)) and
                    callable(getattr(data, "token_count", None))):
                hint = f"; wrap an array of ids as ArrayBatches(ids)" \
                    if isinstance(data, (np.ndarray, list)) else \
                    "; validation picks the best model and needs its own ids" \
                    if data is None else ""
                raise TypeError(f"Trainer: {name} must be a Batches (token_count() and "
                                f"batch(), e.g. glassllm.training.data.ArrayBatches or "
                                f"TokenFile), got {type(data).__name__}{hint}")
        self.settings = settings
        self.train_data = train_data
        self.val_data = val_data
        self.model_path = None if model_path is None else os.fspath(model_path)
        self.checkpoint_path = None if checkpoint_path is None else os.fspath(checkpoint_path)
        self.tokenizer = tokenizer
        self.extra = dict(extra or {})
        self.comm = comm if comm is not None else distributed.SerialCommunicator()
        self.device = device  # `run` moves the model there first (None: where it is)
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
            TrainingInterrupted: Ctrl-C, SIGTERM or SIGHUP (held until the update in progress
                is complete: `glassllm.training.stopping`); the checkpoint (if any) holds every
                completed update, `signum` says which signal.
            RunWriteError: an output could not be written mid-run (a full disk); its history
                holds the completed updates.
        """
        comm = self.comm
        if self.device is not None:  # batches are drawn on the host; the model moves them
            model.to(self.device)
        emit = on_event if on_event is not None else (lambda event: None)
        if comm.rank != 0:
            emit = (lambda event: None)  # rank 0 alone reports
        outputs = self._outputs() if comm.rank == 0 else []
        with contextlib.ExitStack() as held:
            with distributed.agreement(comm):  # a no-op on one process
                self._check_data(model)
                # the locks `execute` already holds are re-entrant: nothing is taken over twice
                runfiles.lock_run_outputs(outputs, held, _warn_removed)
            if comm.size == 1:
                return self._run(model, resume, emit)
            try:
                return self._run(model, resume, emit)
            except BaseException as e:
                if not _raised_on_every_rank(e):
                    distributed.fail(comm, e)  # the others would wait for this rank forever
                raise

    def _run(self, model: GlassLM, resume, emit) -> TrainSummary:
        """The run inside run()'s locks: its state, the loop with Ctrl-C held until the
        update in progress is complete, and on Ctrl-C the checkpoint of the updates done."""
        run = self._prepare(model, resume, emit)
        try:
            with DeferredStop() as interrupt:
                self._train(run, interrupt)
        except OSError as e:  # a file of the run mid-way (a full disk): stop, say how far
            if isinstance(e, (RunWriteError, BrokenPipeError)):
                raise  # BrokenPipeError: the reader of the caller's output left, no file
            raise RunWriteError(e, len(run.history), run.history) from e
        except KeyboardInterrupt as e:
            if isinstance(e, TrainingInterrupted):
                raise
            if self.comm.size > 1 and not isinstance(e, _AgreedStop):
                raise  # one rank's own interrupt (a second Ctrl-C): run() ends the job
            path = None  # a checkpoint only of a whole number of updates
            if not run.in_step and self.checkpoint_path is not None:
                path = self._write_checkpoint(run)
            raise TrainingInterrupted(len(run.history), path, run.history,
                                      signum=getattr(e, "signum", None)) from e
        finally:
            run.close()
        return self._finish(run)

    def _train(self, run: _Run, interrupt) -> None:
        """The loop: every update not yet done, each in five phases; then the end checks."""
        s = self.settings
        if self.comm.size > 1:  # a callback's KeyboardInterrupt is agreed on like Ctrl-C
            run.emit = _interrupt_on_keyboard_interrupt(run.emit, interrupt)
        if run.resumed:
            run.emit(Resumed(run.start, run.best_val))
        else:
            run.emit(Started(self._evaluate(run.model)))
        for step in range(run.start, s.steps):
            signum = self._stop_requested(interrupt, step)
            if signum:
                raise _AgreedStop(signum)
            x, y = self._sample(run)
            self._step(run, step, x, y)
            if step % s.eval_every == 0 or step == s.steps - 1:
                val = self._validate(run, step)
                self._save_if_best(run, step, val)
            self._report(run, step)
        self._judge_the_whole_run(run)

    # ------------------------------------------------------------------ the phases
    def _sample(self, run: _Run) -> tuple[np.ndarray, np.ndarray]:
        """The update begins: one global batch of N*K*B windows of seq_len from the shared
        sampler (the same on every rank; `_step` trains on this rank's rows of it)."""
        run.in_step, run.events, run.clock = True, [], time.perf_counter()
        s = self.settings
        return self.train_data.batch(run.rng, s.grad_accum * s.batch_size * self.comm.size,
                                     s.seq_len)

    def _step(self, run: _Run, step: int, x: np.ndarray, y: np.ndarray) -> None:
        """The update (`TrainStep` on this rank's rows), its CSV row and health measurement,
        then the skip rules, which may stop the run; `Stepped` joins the update's events."""
        s = self.settings
        rows = s.grad_accum * s.batch_size  # this rank's windows per update
        mine = slice(self.comm.rank * rows, (self.comm.rank + 1) * rows)
        lr = lr_schedule(step, s.steps, s.lr, s.warmup, s.min_lr_ratio)
        observed = run.health.observe(step) if run.health is not None \
            else contextlib.nullcontext()
        with observed:
            run.record = record = run.train_step(x[mine], y[mine], lr, step)
        run.speed.add(x.size, time.perf_counter() - run.clock)  # tokens of all ranks
        if run.csv_log is not None:  # every attempted step, the failing one included
            run.csv_log.write(record)
        if run.health is not None:  # its row is written before any divergence stop
            run.events += run.health.after_step(step, record)
        run.entry = {"step": step, "loss": _json_float(record.loss), "lr": lr}
        if not record.skipped and s.clip is not None and record.grad_l2_pre_clip > s.clip:
            run.entry["clipped"] = True  # a resumed run's health counts clip events from it
        self._count_skip(run, step)
        run.events.append(Stepped(step, record.loss, lr, run.speed.per_s(), record.skipped))

    def _count_skip(self, run: _Run, step: int) -> None:
        """A skipped update stops the run where skips are not allowed, and after
        max_consecutive_skips in a row; the skip-rate alert sees every update."""
        record = run.record
        if record.skipped:
            run.entry["skipped"] = record.skip_reason
            run.skipped_in_a_row += 1
            if not self._skips_allowed():
                raise self._diverged(step, record, run.best_step, run.history + [run.entry])
            if run.skipped_in_a_row >= self.settings.max_consecutive_skips:
                raise self._no_progress(step, run.skipped_in_a_row, record, run.best_step,
                                        run.history + [run.entry])
        else:
            run.skipped_in_a_row = 0
        if run.monitor is not None:
            run.monitor.update(record.skipped, step)

    def _validate(self, run: _Run, step: int) -> float:
        """The validation loss after update `step` (a non-finite one stops the run: it is
        never saved, never "best"); with N ranks their weights are compared. Adds the losses
        to the entry and `Evaluated` to the events."""
        val = self._evaluate(run.model)
        if self.comm.size > 1:
            distributed.check_same(
                self.comm, {"weights sha256": distributed.weights_digest(run.model)},
                f"weights after step {step}")
        if not math.isfinite(val):
            raise self._diverged(step, run.record, run.best_step, run.history + [run.entry],
                                 "nonfinite_val_loss", val)
        train_loss = _mean_since_last_eval(run.history, run.entry)
        run.entry["train_loss"] = _json_float(train_loss)
        run.entry["val_loss"] = val
        run.events.append(Evaluated(step, train_loss, val, run.speed.interval_per_s()))
        return val

    def _save_if_best(self, run: _Run, step: int, val: float) -> None:
        """A better validation loss is the new best; the model file (if any) is rewritten
        with it, after a check that the weights are finite, and `Saved` joins the events."""
        if run.best_val is not None and val >= run.best_val:
            return  # not better
        if self.model_path is not None:
            if not _weights_finite(run.model):
                raise self._diverged(step, run.record, run.best_step,
                                     run.history + [run.entry], "nonfinite_weights", val)
            if self.comm.rank == 0:
                self._save_model(run.model)
            run.model_saved = True
            run.events.append(Saved(step, self.model_path, val))
        run.best_val, run.best_step = val, step

    def _report(self, run: _Run, step: int) -> None:
        """The update is complete: its history entry, its val.csv row (an evaluation), its
        events (in order), then the checkpoint after every checkpoint_every updates
        (`Checkpointed`)."""
        run.history.append(run.entry)
        run.in_step = False
        if run.val_log is not None and "val_loss" in run.entry:  # before `Evaluated` is sent
            run.val_log.write(run.entry)
        for event in run.events:
            run.emit(event)
        every = self.settings.checkpoint_every
        if every and (step + 1) % every == 0:
            run.emit(Checkpointed(step + 1, self._write_checkpoint(run)))

    def _judge_the_whole_run(self, run: _Run) -> None:
        """A run too short for the alerts' windows is judged as a whole at its end: one
        that made no update and whose forward pass failed (a non-finite loss, which no loss
        scale cures) stops with NoProgressError. Skips for overflowing gradients alone are the
        GradScaler finding its scale (it halves on each), which an fp16 run of a few steps
        may spend entirely; only max_consecutive_skips of them in a row mean no progress."""
        history = run.history
        # judged on the history, not on this call's updates: a run resumed from the
        # checkpoint of its last update (no update left to make) is judged the same
        if history and run.skipped_in_a_row == len(history) and any(
                h.get("skipped") == "nonfinite_loss" for h in history):
            record = run.record or _record_of(history[-1], run.train_step)
            raise self._no_progress(len(history) - 1, run.skipped_in_a_row, record,
                                    run.best_step, history)
        if run.monitor is not None:
            run.monitor.finish(len(history) - 1)

    def _finish(self, run: _Run) -> TrainSummary:
        """The summary of a completed run, also sent as `Finished`."""
        history = run.history
        evaluated = [h["val_loss"] for h in history if "val_loss" in h]
        summary = TrainSummary(
            steps=len(history), best_step=run.best_step, best_val_loss=run.best_val,
            final_val_loss=evaluated[-1] if evaluated else None, history=history,
            skipped_steps=sum(1 for h in history if h.get("skipped")),
            tokens=run.speed.tokens, elapsed_s=time.monotonic() - run.started_at,
            model_path=self.model_path if run.model_saved else None)
        run.emit(Finished(summary))
        return summary

    # ------------------------------------------------------------------ before the loop
    def _prepare(self, model: GlassLM, resume, emit) -> _Run:
        """The run's state: a new optimizer, step and sampler, or those of the checkpoint
        `resume` (checked to continue this run, on every rank), and its logs opened."""
        s, comm = self.settings, self.comm
        self._data_identity = None
        if self.checkpoint_path is not None or resume is not None:
            self._data_identity = data_identity(self.train_data, self.val_data)
        optimizer = AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
        train_step = TrainStep(model, optimizer, s.precision, s.clip, comm=comm,
                               micro_batches=s.grad_accum)
        run = _Run(model, optimizer, train_step, np.random.default_rng(s.seed), emit,
                   resumed=resume is not None)
        state = None
        if resume is not None:
            state = resume if isinstance(resume, ckpt_io.Checkpoint) \
                else ckpt_io.load_checkpoint(resume)
        if comm.size > 1:
            self._check_ranks_agree(model, state)
        if state is not None:
            with distributed.agreement(comm):
                self._restore(state, model, optimizer, train_step, run.rng)
            run.history, run.best_val, run.best_step = list(state.history), \
                state.best_val_loss, state.best_step
        if comm.size > 1:
            self._check_start_agrees(run)
        self._open_logs(run)
        run.started_at = time.monotonic()
        return run

    def _check_start_agrees(self, run: _Run) -> None:
        """Every rank starts from the same weights, sampler, optimizer step and loss scale."""
        distributed.check_same(self.comm, {
            "weights sha256": distributed.weights_digest(run.model),
            "sampler state": run.rng.bit_generator.state, "optimizer t": run.optimizer.t,
            "scaler": run.train_step.state_dict()}, "state at the start")

    def _open_logs(self, run: _Run) -> None:
        """The counters a resumed run continues, the CSV logs and the health monitor."""
        s = self.settings
        run.start = len(run.history)
        # Whether model_path holds the best model: after a save in this call, or, resumed,
        # when the interrupted run's file is there (resumed with another model_path and no
        # better evaluation since, nothing is ever written there).
        run.model_saved = run.best_step is not None and self.model_path is not None and \
            os.path.exists(self.model_path)
        if s.max_skip_rate is not None:
            run.monitor = SkipRateMonitor(s.max_skip_rate)
            for entry in run.history:  # its window is a function of the skips so far
                run.monitor.update(bool(entry.get("skipped")), entry["step"])
        run.skipped_in_a_row = _trailing_skips(run.history)
        try:
            self._open_files(run)
        except BaseException:
            run.close()  # those already open (a later one refused: another run's file)
            raise

    def _open_files(self, run: _Run) -> None:
        """The files rank 0 writes a row at a time, resumed where the checkpoint is: val.csv
        (first: it refuses a file that is not one before any log is cut), the step log, the
        health monitor's rows."""
        s = self.settings
        if s.val_log is not None and self.comm.rank == 0:  # the evaluations done, then each new
            run.val_log = runfiles.ValLog(s.val_log, run.history, resumed=run.resumed)
        run.csv_log = self._open_csv(run.history, resumed=run.resumed)
        # Rank 0 alone measures health and writes its rows; on resume the rows of updates
        # after the checkpoint are redone.
        if s.health_every is not None and self.comm.rank == 0:
            run.health = HealthMonitor(run.model, run.optimizer, s.health_every, s.clip,
                                       s.health_log,
                                       keep_from=run.start if run.resumed else None)
            if run.resumed:
                run.health.resume_counts(run.history)

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

    def _outputs(self) -> list[str | None]:
        """Every file the run writes (None: not written)."""
        s = self.settings
        return [self.model_path, self.checkpoint_path, s.log_csv, s.health_log, s.val_log]

    def _check_data(self, model: GlassLM) -> None:
        s = self.settings
        if s.seq_len > model.cfg.max_len:
            raise ValueError(f"Trainer: seq_len={s.seq_len} exceeds the model's "
                             f"max_len={model.cfg.max_len}")
        outputs = self._outputs()
        for name, data in (("training", self.train_data), ("validation", self.val_data)):
            source = getattr(data, "path", None)  # a TokenFile: no output may be its file
            for out in outputs if isinstance(source, str) else ():
                if out is not None and (same_file(out, source) or
                                        same_file(out, source + ".json")):
                    raise ValueError(f"Trainer: the output {out} is the {name} data file "
                                     f"{source} (or its sidecar); training would overwrite "
                                     f"its own data")
            n = int(data.token_count())
            if n <= s.seq_len:
                raise ValueError(f"Trainer: the {name} data has {n} tokens; it needs more "
                                 f"than seq_len={s.seq_len}")

    def _evaluate(self, model: GlassLM) -> float:
        """Mean validation loss (nats/token) over eval_batches fixed batches of N*K*B windows,
        in float32, each rank evaluating its rows in K pieces of B and the sums reduced; with
        N = K = 1 and ArrayBatches this equals `glassllm.train.evaluate`(model, ids, B, T, n, seed)."""
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

    def _stop_requested(self, interrupt, step: int) -> int:
        """The stop signal to act on before update `step` (0: none): one pending here, or,
        with N ranks, on any rank (one small allreduce, so every rank stops after the same
        update and names the same signal: the first of SIGINT, SIGTERM, SIGHUP received)."""
        if self.comm.size == 1:
            return interrupt.pending
        flags = np.array([1.0 if interrupt.pending == signum else 0.0
                          for signum in STOP_SIGNALS])
        self.comm.allreduce_sum(flags, what=f"interrupt check before step {step}")
        return next((int(signum) for signum, n in zip(STOP_SIGNALS, flags) if n > 0), 0)

    def _check_ranks_agree(self, model: GlassLM, resume_state) -> None:
        """Every rank runs the same settings, model and data, and resumes the same step."""
        # what only rank 0 uses may differ: where its CSVs go, how often it measures health
        settings = {k: v for k, v in self.settings.to_dict().items()
                    if k not in ("log_csv", "health_every", "health_log", "val_log")}
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

    def _open_csv(self, history: list[dict], resumed: bool):
        path = self.settings.log_csv
        if path is None or self.comm.rank != 0:
            return None
        if resumed and os.path.exists(path):
            check_own_step_log(path, history)  # never rewrite another run's log
            _truncate_csv_rows(path, len(history))  # updates after the checkpoint are redone
        return StepCSVLog(path, append=resumed)

    def _write_checkpoint(self, run: _Run) -> str | None:
        """Write the checkpoint of the state after len(run.history) updates (rank 0; other
        ranks return None after the same checks)."""
        model, history = run.model, run.history
        if not _weights_finite(model):  # a checkpoint is only ever of a usable state
            raise NonFiniteLossError(len(history) - 1, float("nan"), "nonfinite_weights",
                                     *self._kept(run.best_step), history)
        if self.comm.rank != 0:
            return None
        extra = dict(self.extra)
        if self.tokenizer is not None:
            extra["tokenizer"] = self.tokenizer.to_json()
        state = ckpt_io.Checkpoint(
            step=len(history), config=model.cfg.to_dict(), weights=model.state_dict(),
            optimizer=ckpt_io.optimizer_state(model, run.optimizer),
            rng_state=run.rng.bit_generator.state, settings=self.settings.to_dict(),
            best_val_loss=run.best_val, best_step=run.best_step, history=history,
            scaler=run.train_step.state_dict(), extra=extra, data=self._data_identity,
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
    """Every rank agreed to stop at this step boundary (a stop signal on some rank)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


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
        except KeyboardInterrupt as e:
            interrupt.pending = interrupt.pending or getattr(e, "signum", 2)
    return guarded


def _version() -> str:
    from .. import __version__
    return __version__


def _weights_finite(model: GlassLM) -> bool:
    return all(bool(namespace(p.data).all(namespace(p.data).isfinite(p.data)))
               for p in model.parameters())


def _record_of(entry: dict, train_step: TrainStep) -> StepRecord:
    """The StepRecord of a skipped update, rebuilt from its history entry (a resumed run
    that made no update of its own)."""
    nan = float("nan")
    loss = nan if entry.get("loss") is None else entry["loss"]
    return StepRecord(entry["step"], entry["lr"], nan, nan, loss, True, entry["skipped"],
                      train_step.scaler.get_scale())


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


def _warn_removed(event) -> None:
    """The Trainer's word on a temporary file it removed (`runfiles.lock_run_outputs`): a
    warning, as a library caller without an event handler for it sees one."""
    from .events import TemporaryRemoved
    if isinstance(event, TemporaryRemoved):
        warnings.warn(f"removed {event.path}, a temporary file left by a run that had ended "
                      f"without releasing its lock", stacklevel=3)
