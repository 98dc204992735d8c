"""How a training run stops early: Ctrl-C, divergence (inf/NaN), no progress."""
from __future__ import annotations


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP (or another KeyboardInterrupt) stopped the run.

    step: updates completed. checkpoint_path: the checkpoint written for them, or None (no
    checkpoint_path was given, or a second Ctrl-C arrived in the middle of an update, when the
    state is not one a checkpoint may hold). history: one dict per completed update. signum:
    the signal (2 SIGINT, 15 SIGTERM, 1 SIGHUP; `glassllm.training.stopping`). A
    KeyboardInterrupt, so callers that only know Ctrl-C still stop.
    """

    def __init__(self, step: int, checkpoint_path: str | None, history: list | None = None,
                 signum: int | None = None):
        where = f"; checkpoint {checkpoint_path}" if checkpoint_path else "; no checkpoint"
        super().__init__(f"training interrupted after {step} updates{where}")
        self.step, self.checkpoint_path = step, checkpoint_path
        self.history = history if history is not None else []
        self.signum = int(signum) if signum else 2  # SIGINT

    def __reduce__(self):
        return (TrainingInterrupted, (self.step, self.checkpoint_path, self.history,
                                      self.signum))


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



class RunWriteError(OSError):
    """A file of the run could not be written in the middle of it (a full disk, a lost
    mount, a removed folder): the run stops. Not the user's input, so the CLI exits 1, not 2.

    errno, strerror, filename: those of the OSError. step: updates completed. history: one
    dict per completed update (the CLI writes it to history.csv if it can)."""

    def __init__(self, error: OSError, step: int, history: list):
        super().__init__(error.errno, error.strerror or str(error), error.filename)
        self.step, self.history = step, list(history)

    def __str__(self) -> str:
        where = f"{self.filename}: " if self.filename is not None else ""
        return f"{where}{self.strerror} (after {self.step} updates; the run stopped)"

    def __reduce__(self):
        return (_rebuild_write_error, (self.errno, self.strerror, self.filename, self.step,
                                       self.history))


def _rebuild_write_error(errno, strerror, filename, step, history):
    return RunWriteError(OSError(errno, strerror, filename), step, history)
