"""The running of trainings: the program around spec 001's loop (`glassllm.train`).

- `trainer`: `Trainer` (events, best model file, checkpoints, exact resume, Ctrl-C), its
  settings, events and errors;
- `safety`: the guarded step (`TrainStep`: loss scaling, clipping, skips), step CSV;
- `data`: corpora, token files, batches; `distributed`, `launch`: data parallelism over MPI;
- `lock`: one run per output; `runfiles`: a run's file paths, history CSV and plot.
"""
from .trainer import (Checkpointed, Evaluated, Finished, HealthChecked, HealthWarning,
                      NoProgressError, NonFiniteLossError, Resumed, Saved, Started, Stepped,
                      Trainer, TrainingInterrupted, TrainSettings, TrainSummary)

__all__ = ["Trainer", "TrainSettings", "TrainSummary", "TrainingInterrupted",
           "NonFiniteLossError", "NoProgressError", "Started", "Resumed", "Stepped",
           "Evaluated", "Saved", "Checkpointed", "Finished", "HealthChecked", "HealthWarning"]
