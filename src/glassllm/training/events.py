"""The events of a training run: what `Trainer.run` reports, in this order.

The loop never prints; the caller decides. A fresh run starts with `Started`, a resumed
one with `Resumed`. Each update, once it is complete, sends: on a health step `HealthChecked`
and any `HealthWarning` (`glassllm.lens.health`), then `Stepped`, then on an evaluation step
`Evaluated` and, when validation improved and there is a model file, `Saved`; after them
`Checkpointed` when a checkpoint was written. A run that did all its steps ends with
`Finished`.
"""
from __future__ import annotations

import dataclasses

from ..lens.health import HealthChecked, HealthWarning  # noqa: F401 (a run's events too)
from ..lens.health import readable_repr


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



# ------------------------------------------------------------------ the run around the loop
# What `glassllm.training.run.execute` (and `RunPlan`'s building) reports besides the loop's
# events: the notes and warnings the library never prints. In order: `CorpusNote`s while the
# data is read; `LockTakenOver`, `TemporaryRemoved` and `RunReplaced` (--overwrite) when the
# outputs are locked; on the writing rank `RunBegins`, any `WarmupOutlastsRun` and
# `LoopBegins`; the loop's events;
# `LoopEnded` once the loop has returned or raised, before the run's files are written;
# `PlotFailed` if loss.png could not be drawn.


@dataclasses.dataclass(frozen=True)
class CorpusNote:
    """A remark on the data read (`Corpus.notes`), e.g. a file of a data folder skipped."""
    name: str
    note: str


@dataclasses.dataclass(frozen=True)
class LockTakenOver:
    """An output's lock was left by a process no longer running (`holder`: its lock file's
    JSON, pid, host, started, argv) and is now this run's."""
    holder: dict


@dataclasses.dataclass(frozen=True)
class TemporaryRemoved:
    """`path`, a temporary file left beside an output by the run whose lock was taken over
    (killed outright, it never cleaned up), was removed."""
    path: str


@dataclasses.dataclass(frozen=True)
class RunReplaced:
    """The files of the run this one replaces (`overwrite`) were removed, `paths`, before its
    first write."""
    paths: tuple


@dataclasses.dataclass(frozen=True)
class RunBegins:
    """The run is about to train (the writing rank): the model's config and parameter count,
    the corpus (`Corpus`), the settings, the number of ranks, the best model's path, the thread
    count and why it was chosen (in words), and which BLAS computes the products (in words)."""
    config: object
    parameters: int
    corpus: object
    settings: object
    ranks: int
    model_path: str
    threads: int
    threads_why: str
    blas: str


@dataclasses.dataclass(frozen=True)
class WarmupOutlastsRun:
    """steps < warmup: the learning rate climbs to `peak` (lr * steps / warmup,
    `optim.lr_schedule`) and never decays."""
    steps: int
    warmup: int
    lr: float
    peak: float


@dataclasses.dataclass(frozen=True)
class LoopBegins:
    """The training loop starts (the writing rank), for `steps` updates in all."""
    steps: int


@dataclasses.dataclass(frozen=True)
class LoopEnded:
    """The training loop returned or raised; the run's files are written next."""


@dataclasses.dataclass(frozen=True)
class PlotFailed:
    """loss.png was not drawn (the run's results are saved): "<png> not written: <error>"."""
    message: str


# print(event) in a notebook or a loop over `Trainer.run()`: rounded floats, not
# train_loss=5.5240302085876465 (lens.health.readable_repr); dataclass keeps a __repr__ set here
for _event in [value for value in list(globals().values())
               if isinstance(value, type) and dataclasses.is_dataclass(value)
               and value.__module__ == __name__]:
    _event.__repr__ = readable_repr
del _event
