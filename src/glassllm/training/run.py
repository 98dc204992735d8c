"""A training run, executed: `execute(plan, on_event) -> RunResult`.

`execute` does, once, everything around `Trainer.run` that a run of `glassllm train` needs:
it locks the outputs (a lock left by a dead run taken over, its temporaries removed), builds
the model (or takes the fine-tune's), chooses the thread count, trains with stop signals held
to a step boundary (`glassllm.training.stopping.DeferredStop`), writes history.csv and
loss.png, and says how the run ended in a `RunResult`: complete, interrupted by a signal,
non-finite, skip rate exceeded, ranks disagreeing, or a file that could not be written.
It never prints: notes and warnings are events (`glassllm.training.events`) for `on_event`.

Under MPI every rank executes the plan and trains; rank 0 alone locks, writes files and
sends events (the others train in silence), as nanoGPT's master_process does.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import time

from . import runfiles, stopping
from .events import (Checkpointed, LoopBegins, LoopEnded, PlotFailed, RunBegins,
                     RunReplaced, WarmupOutlastsRun)

COMPLETE, INTERRUPTED, NON_FINITE = "complete", "interrupted", "non_finite"
SKIP_RATE, RANKS_DISAGREE, WRITE_ERROR = "skip_rate", "ranks_disagree", "write_error"


@dataclasses.dataclass(frozen=True)
class RunResult:
    """How a run ended.

    Attributes:
        reason: COMPLETE, INTERRUPTED (Ctrl-C, SIGTERM, SIGHUP), NON_FINITE (diverged or no
            progress), SKIP_RATE, RANKS_DISAGREE or WRITE_ERROR.
        exit_code: the process's: 0 complete, 128 + signum interrupted, 1 otherwise.
        summary: the `TrainSummary` of a complete run (None otherwise).
        error: the exception that ended an incomplete run (None when complete).
        signum: the signal of an interrupted run (2 SIGINT, 15 SIGTERM, 1 SIGHUP), else None.
        step, checkpoint: an interrupted run's updates done and the checkpoint holding them
            (its own, else the last periodic one; (0, None) when none was written).
        history_csv, plot: the files written (None when not: not the writing rank, no history,
            the plot failed). history_error: the OSError that kept history.csv from being
            written after a WRITE_ERROR. late_signal: a stop signal that arrived after the last
            step of a complete run (0 if none). elapsed_s: wall seconds from the first update
            to the files written.
    """
    reason: str
    exit_code: int
    summary: object = None
    error: BaseException | None = None
    signum: int | None = None
    step: int = 0
    checkpoint: str | None = None
    history_csv: str | None = None
    plot: str | None = None
    history_error: OSError | None = None
    late_signal: int = 0
    elapsed_s: float = 0.0


def execute(plan, on_event=None, around=None) -> RunResult:
    """Run `plan` (`glassllm.training.plan.RunPlan`) to its end: lock, train, write, report.

    on_event: called with every event (the loop's and the run's, module docstring) on the
        writing rank; default: none. around: a function of the plan returning a context
        manager entered once the outputs are locked and left before they are released (the
        CLI's `--serve` server).

    Stop signals are held from the loop's start until the files are written: inside the loop
    until a step boundary, where the run stops with a checkpoint (INTERRUPTED); after the last
    step until the end, and the run, complete, reports it as `late_signal`. Call it under
    `stopping.signals_raise()` for SIGTERM and SIGHUP to act as Ctrl-C.

    Raises:
        glassllm.training.lock.OutputLocked: another run holds an output (nothing written).
        OSError: an output's lock or folder cannot be made; an old run's file cannot be
            removed (plan.overwrite); history.csv not writable at the end.
        ValueError: an output is another's lock file; a new run's folder holds another run's
            files by the time it is locked (written since the plan was made, or by an earlier
            execute of this plan: give the plan overwrite=True to replace them). Other errors
            (a bug) propagate.
    """
    from . import distributed
    emit = on_event if on_event is not None else (lambda event: None)
    with contextlib.ExitStack() as held:
        # a lock refused on rank 0 stops every rank here, before the loop's first collective
        with distributed.agreement(plan.comm):
            if plan.comm.rank == 0:
                lock_outputs(plan, held, emit)
        if around is not None:
            held.enter_context(around(plan))
        with stopping.DeferredStop() as late:
            try:
                return _execute_held(plan, emit, late)
            finally:
                # ended or stopped, files written: a signal from here on is a repeat (under MPI
                # a rank stopped by the others' agreement may get its own SIGTERM only now)
                stopping.stop_begun()


def lock_outputs(plan, held: contextlib.ExitStack, emit) -> None:
    """Make the outputs' folders and lock them until `held` closes; a lock left by a dead run
    is taken over (`LockTakenOver`) and its temporaries removed (`TemporaryRemoved`):
    `runfiles.lock_run_outputs`. With `plan.overwrite`, the files of the run it replaces are
    removed then (`runfiles.remove_other_run_files`), once no other run can be writing them,
    and said (`RunReplaced`)."""
    runfiles.make_parent_dirs(plan.outputs.values())
    runfiles.lock_run_outputs(plan.outputs.values(), held, emit)
    if plan.overwrite and plan.resume is None:
        # the whole old run goes before the first write: never a folder of two runs' files
        removed = runfiles.remove_other_run_files(plan.paths, keep=plan.inputs())
        if removed:
            emit(RunReplaced(tuple(removed)))
    elif plan.resume is None:
        # checked again under the locks: a run that wrote there since the plan was made (in
        # another process, or an earlier execute of this same plan) is not replaced either
        runfiles.check_no_other_run(plan.paths, keep=plan.inputs())


def _execute_held(plan, emit, late) -> RunResult:
    """The run inside its locks, stop signals held: build, train, end."""
    import numpy as np

    from ..engine import cpu
    trainer, model, threads = _trainer(plan, emit)
    checkpoints = []  # the Checkpointed event of checkpoint_every, if one came

    def relay(event) -> None:
        if isinstance(event, Checkpointed):
            checkpoints[:] = [event]
        emit(event)

    writer = plan.comm.rank == 0
    if writer:
        emit(LoopBegins(plan.settings.steps))
    started, ended = time.monotonic(), None
    try:
        # A diverging run overflows inside NumPy; the loop itself detects and reports
        # non-finite losses, so NumPy's RuntimeWarnings would only garble a progress bar.
        # threads None: the process default, which follows the load (_follows_the_load)
        pinned = cpu.use_threads(threads) if threads is not None else contextlib.nullcontext()
        with pinned, np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            summary = trainer.run(model, resume=plan.resume, on_event=relay if writer else None)
    except BaseException as e:
        if _reason(e) is None:
            raise  # not one of a run's ends (a bug, an interrupt outside the loop)
        ended = e
    finally:
        if writer:  # before any file is written: a progress bar ends its line first
            emit(LoopEnded())
    if ended is not None:
        return _stopped(plan, ended, checkpoints, emit)
    return _complete(plan, summary, started, late, emit)


def _trainer(plan, emit):
    """(Trainer, model, threads) of the plan; on the writing rank `RunBegins` and any
    `WarmupOutlastsRun` sent."""
    from ..engine import blas, cpu
    from ..model import GlassLM
    from .trainer import Trainer
    settings, corpus, paths = plan.settings, plan.corpus, plan.paths
    # A fine-tune trains a copy: the plan's model stays the weights it starts from, so a second
    # execute of the same plan starts where the first did (as a new run starts from its seed).
    model = copy.deepcopy(plan.initial_model) if plan.initial_model is not None else \
        GlassLM(plan.config, seed=settings.seed)
    if plan.device is not None:
        model.to(plan.device)
    # Output paths relative to the checkpoint's folder: a run moved as a whole (`mv runs
    # archive`) resumes where it now is, never into the folder it came from.
    extra = {"data": corpus.describe(),
             **runfiles.relative_paths({"out": paths["model"], "log_csv": settings.log_csv},
                                       paths["checkpoint"])}
    if plan.initial_model is not None:
        extra["init_from"] = os.path.abspath(plan.init_from)
    if _follows_the_load(plan):
        threads, why = cpu.apply_default_threads()  # then revisited between ops
    else:
        threads, why = choose_threads(plan.comm, plan.threads)  # measured when not given
        if plan.threads_kept:
            why = "the resumed run's, for the same bits"
        # The count in effect is kept for a resume, measured or given: on NumPy's BLAS the
        # last bits of a product depend on where its rows are cut (docs/performance.md), so
        # a resume on another count (the load measured anew) would not continue bit for bit.
        extra["threads"] = threads
    trainer = Trainer(settings, corpus.train, corpus.val, model_path=paths["model"],
                      checkpoint_path=paths["checkpoint"], tokenizer=corpus.tokenizer,
                      extra=extra, comm=plan.comm)
    blas.backend()  # GLASSLLM_BLAS=mkl without a usable MKL: a clear error before any work
    if plan.comm.rank == 0:
        emit(RunBegins(plan.config, sum(p.size for p in model.parameters()), corpus, settings,
                       plan.comm.size, paths["model"], threads, why, blas.describe()))
        if 0 < settings.steps < settings.warmup:
            emit(WarmupOutlastsRun(settings.steps, settings.warmup, settings.lr,
                                   settings.lr * settings.steps / settings.warmup))
    return trainer, model, threads if "threads" in extra else None


def _follows_the_load(plan) -> bool:
    """Whether the run computes on the process default, revisited as the load changes
    (`glassllm.engine.cpu.ThreadGovernor`), rather than a count fixed at its start: when no
    count is asked for (--threads, GLASSLLM_THREADS, a resumed run's), one process, and a BLAS
    whose bits do not depend on the count (MKL in its strict reproducible mode), so that a
    resume still continues bit for bit. On NumPy's BLAS the count is measured once and kept."""
    from ..engine import blas, cpu
    return (plan.threads is None and plan.comm.size == 1
            and cpu.default_threads_from_environment()[0] is None
            and blas.backend() == "mkl")


def _reason(e: BaseException) -> str | None:
    """The run's end an exception of the loop means (None: it is not one, it propagates)."""
    from .distributed import RanksDisagree
    from .errors import NonFiniteLossError, RunWriteError, TrainingInterrupted
    from .safety import SkipRateExceeded
    reasons = ((TrainingInterrupted, INTERRUPTED), (NonFiniteLossError, NON_FINITE),
               (SkipRateExceeded, SKIP_RATE), (RanksDisagree, RANKS_DISAGREE),
               (RunWriteError, WRITE_ERROR))
    return next((r for kind, r in reasons if isinstance(e, kind)), None)


def _stopped(plan, e: BaseException, checkpoints: list, emit) -> RunResult:
    """The RunResult of a loop that raised `e` (one of `_reason`'s), its history written on
    the writing rank."""
    reason, writer = _reason(e), plan.comm.rank == 0
    if reason == INTERRUPTED:
        return _interrupted(plan, e, checkpoints, emit) if writer else \
            RunResult(INTERRUPTED, stopping.exit_code(e), error=e, signum=e.signum, step=e.step)
    history = getattr(e, "history", None) if writer else None
    if not history:
        return RunResult(reason, 1, error=e)
    if reason != WRITE_ERROR:
        return RunResult(reason, 1, error=e, history_csv=runfiles.write_history_csv(
            plan.paths["history_csv"], history))
    try:  # a full disk: the history of the updates done, if there is room for it
        return RunResult(reason, 1, error=e, history_csv=runfiles.write_history_csv(
            plan.paths["history_csv"], history))
    except OSError as again:
        return RunResult(reason, 1, error=e, history_error=again)


def _interrupted(plan, e, checkpoints: list, emit) -> RunResult:
    """An interrupted run's result on the writing rank: history and plot written, and the
    checkpoint that continues it (its own, else the last periodic one)."""
    history_csv = plot = None
    if e.history:
        history_csv = runfiles.write_history_csv(plan.paths["history_csv"], e.history)
        plot = _plot(plan, history_csv, emit)
    # No checkpoint for this moment (Ctrl-C inside an update): the last periodic one.
    step, path = (e.step, e.checkpoint_path) if e.checkpoint_path else \
        (checkpoints[0].step, checkpoints[0].path) if checkpoints else (0, None)
    return RunResult(INTERRUPTED, stopping.exit_code(e), error=e, signum=e.signum, step=step,
                     checkpoint=path, history_csv=history_csv, plot=plot)


def _complete(plan, summary, started: float, late, emit) -> RunResult:
    """A complete run's result, history.csv and loss.png written on the writing rank."""
    history_csv = plot = None
    if plan.comm.rank == 0:
        history_csv = runfiles.write_history_csv(plan.paths["history_csv"], summary.history)
        plot = _plot(plan, history_csv, emit)
    return RunResult(COMPLETE, 0, summary=summary, history_csv=history_csv, plot=plot,
                     late_signal=late.pending, elapsed_s=time.monotonic() - started)


def _plot(plan, history_csv: str, emit) -> str | None:
    """loss.png from the history; a failure is a `PlotFailed` event, never an error: the
    run's results are saved."""
    return runfiles.write_plot(history_csv, plan.paths["plot"],
                               on_failure=lambda message: emit(PlotFailed(message)))


def choose_threads(comm, requested: int | None) -> tuple[int, str]:
    """`cpu.choose_threads`, except that GLASSLLM_THREADS (under an explicit count) pins the
    count, and ranks of an MPI job on one host share its cores (each measuring the others as
    load would be a race): cores // ranks on the host."""
    from ..engine import cpu
    if requested is None:  # GLASSLLM_THREADS pins the count for a run as for the library
        requested, source = cpu.default_threads_from_environment()
        if requested is not None:
            return requested, f"{source}={requested}"
    local = comm.local_size() if comm.size > 1 else 1
    if requested is not None or local == 1:
        return cpu.choose_threads(requested)
    cores = len(cpu.available_cpus())
    return max(1, cores // local), f"{local} MPI ranks share this host's {cores} cores"
