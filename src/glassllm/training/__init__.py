"""The running of trainings: the program around the loop of `glassllm.train`.

- `plan`: `RunPlan`, a run decided (config, settings, corpus, paths, threads, resume),
  built from `glassllm train`'s options, a TOML file or a checkpoint; `run`: `execute(plan,
  on_event) -> RunResult`, the run `glassllm train` performs (locks, temporaries, history,
  plot, how it ended), callable without the CLI;
- `trainer`: `Trainer` (events, best model file, checkpoints, exact resume, Ctrl-C);
  `settings`: its `TrainSettings`; `events`: what it reports; `errors`: how it stops early;
- `safety`: the guarded step (`TrainStep`: loss scaling, clipping, skips), step CSV;
- `data`: corpora, token files, batches; `distributed`, `launch`: data parallelism over MPI;
- `lock`: one run per output; `runfiles`: a run's file paths, history CSV and plot.
"""
from .errors import NoProgressError, NonFiniteLossError, RunWriteError, TrainingInterrupted
from .events import (Checkpointed, Evaluated, Finished, HealthChecked, HealthWarning, Resumed,
                     Saved, Started, Stepped, TrainSummary)
from .plan import RunPlan
from .run import RunResult, execute
from .settings import TrainSettings
from .trainer import Trainer

__all__ = ["RunPlan", "RunResult", "execute", "Trainer", "TrainSettings", "TrainSummary", "TrainingInterrupted",
           "NonFiniteLossError", "NoProgressError", "RunWriteError", "Started", "Resumed", "Stepped",
           "Evaluated", "Saved", "Checkpointed", "Finished", "HealthChecked", "HealthWarning"]
