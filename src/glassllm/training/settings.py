"""TrainSettings: what a training run does not change on the way, checked when made."""
from __future__ import annotations

import dataclasses
import os

from ..amp import PRECISIONS
from ..checks import check_int, check_real
from ..model import dataclass_from_dict
from ..train import CLIP_NORM, EVAL_SEED

# Every number field of TrainSettings: its check and the range it allows.
_NUMBERS = {
    "steps": (check_int, dict(low=0)), "batch_size": (check_int, dict(low=1)),
    "seq_len": (check_int, dict(low=1)), "warmup": (check_int, dict(low=0)),
    "eval_every": (check_int, dict(low=1)), "eval_batches": (check_int, dict(low=1)),
    "seed": (check_int, dict(low=0)), "checkpoint_every": (check_int, dict(low=1)),
    "eval_seed": (check_int, dict(low=0)), "max_consecutive_skips": (check_int, dict(low=1)),
    "health_every": (check_int, dict(low=1)), "grad_accum": (check_int, dict(low=1)),
    "lr": (check_real, dict(positive=True)), "clip": (check_real, dict(positive=True)),
    "max_skip_rate": (check_real, dict(low=0)),  # and below 1: __post_init__
    "weight_decay": (check_real, dict(low=0)),
    "min_lr_ratio": (check_real, dict(low=0, high=1)),
}
_OPTIONAL = ("checkpoint_every", "max_skip_rate", "health_every")  # None: not used


@dataclasses.dataclass
class TrainSettings:
    """What a training run does not change on the way (the `settings` of a run).

    The defaults are the `glassllm train` defaults: with the default model (llama family,
    d_model 128, 4 layers, 4 heads, 2 KV heads) they train on tinyshakespeare to a validation
    loss of 1.75 nats per byte (nanoGPT's CPU recipe: 1.88 after 2000 steps of 12 x 64) in
    about 2 minutes on two CPU cores (docs/getting-started.md). 1000 steps rather than 2000 keep a wide time
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
        clip: max global L2 norm of the (unscaled) gradients, 1.0 as in `glassllm.train.train`.
        eval_every: evaluate after update `step` when step % eval_every == 0, and after the
            last update (the rhythm of `glassllm.train.train`).
        eval_batches: batches per evaluation, of N * grad_accum * batch_size windows of
            seq_len (N ranks), drawn with the fixed `eval_seed`, so every evaluation sees the
            same windows.
        seed: seed of the batch sampler `np.random.default_rng(seed)`.
        precision: "fp32", "fp16" (autocast + dynamic loss scaling) or "bf16" (autocast).
        log_csv: path of the per-step CSV (`glassllm.training.safety.StepCSVLog`) (None: no CSV).
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
        val_log: val.csv to write each evaluation's row to as it happens
            (`glassllm.training.runfiles.ValLog`; None: in the history only).

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
    val_log: str | None = None

    # Number fields are checked strictly (glassllm.checks, which also words the error):
    # int(2.7) == 2 and int(True) == 1 would let a float or a bool through, and a NumPy
    # integer would not survive the checkpoint's JSON.
    INT_FIELDS = tuple(n for n, (check, _) in _NUMBERS.items() if check is check_int)
    FLOAT_FIELDS = tuple(n for n, (check, _) in _NUMBERS.items() if check is check_real)

    def __post_init__(self):
        for name, (check, bounds) in _NUMBERS.items():
            value = getattr(self, name)
            if value is not None or name not in _OPTIONAL:
                setattr(self, name, check(value, f"TrainSettings.{name}", **bounds))
        if self.max_skip_rate is not None and self.max_skip_rate >= 1.0:  # [0, 1), open at 1
            raise ValueError(f"TrainSettings.max_skip_rate must be a finite number in [0, 1), "
                             f"got {self.max_skip_rate!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainSettings.precision must be one of {sorted(PRECISIONS)}, "
                             f"got {self.precision!r}")
        for name in ("log_csv", "health_log", "val_log"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ValueError(f"TrainSettings.{name} must be a path or None, got {value!r}")
            setattr(self, name, None if value is None else os.fspath(value))
        if self.health_log is not None and self.health_every is None:
            raise ValueError("TrainSettings.health_log needs health_every")

    # Fields that only say where output goes: a resumed run may change them.
    OUTPUT_FIELDS = ("log_csv", "checkpoint_every", "health_every", "health_log", "val_log")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainSettings":
        """Inverse of to_dict. Raises ValueError on unknown or invalid fields."""
        return dataclass_from_dict(cls, d)
