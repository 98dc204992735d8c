"""The files of a training run: where they go, checked before it starts, written when it ends.

`glassllm train --out runs/model.safetensors` writes, beside the model file, the run's
checkpoint (`checkpoint.safetensors`), its history (`history.csv`) and loss plot
(`loss.png`), and its validation losses as they come (`val.csv`, `ValLog`); the per-step CSV
(`--log-csv`) may go anywhere. `run_paths` names them,
`check_output_paths` (from `glassllm.formats.paths`) refuses, before any training, every path
that would fail or do harm later, `make_parent_dirs` creates what is missing, and
`write_history_csv` / `write_plot` write the end products. A new run never writes over
another run's files (`check_no_other_run`; without --out, `free_default_out` picks runs/2/,
runs/3/...), unless told to replace that run (`remove_other_run_files`, --overwrite).
`glassllm.training.lock.lock_outputs` keeps two runs off the same paths.

A Python user of `glassllm.train.Trainer` gets the same files with the same calls:

    paths = run_paths("runs/model.safetensors")
    check_output_paths({"model": paths["model"], "history": paths["history_csv"]})
    make_parent_dirs(paths.values())
    summary = Trainer(settings, train, val, model_path=paths["model"]).run(model)
    write_history_csv(paths["history_csv"], summary.history)
"""
from __future__ import annotations

import csv
import os

from ..formats.atomic import about, atomic_write
# The checks live with the formats (the report checks its --out with them too); a run's
# callers keep using them from here.
from ..formats.paths import check_output_paths, is_inside, same_file  # noqa: F401

HISTORY_COLUMNS = ("step", "train_loss", "val_loss", "lr")
# val.csv: one row per evaluation, written as it happens (train_loss: the mean batch loss of the
# updates since the previous evaluation, as `Evaluated` reports it)
VAL_COLUMNS = ("step", "val_loss", "train_loss")


def run_paths(model_path, checkpoint=None, log_csv=None) -> dict[str, str | None]:
    """The paths of one run, from its model file: {"model", "checkpoint" (given, or
    checkpoint.safetensors beside the model), "log_csv" (given or None), "history_csv",
    "health_jsonl", "val_csv", "plot"} (the last four beside the model file)."""
    model_path = os.fspath(model_path)
    # As the user gave it (relative stays relative: what the CLI prints names the same files
    # the way the user named the model)
    run_dir = os.path.dirname(model_path) if model_path else ""
    return {"model": model_path,
            "checkpoint": os.fspath(checkpoint) if checkpoint is not None
            else os.path.join(run_dir, "checkpoint.safetensors"),
            "log_csv": None if log_csv is None else os.fspath(log_csv),
            "history_csv": os.path.join(run_dir, "history.csv"),
            "health_jsonl": os.path.join(run_dir, "health.jsonl"),
            "val_csv": os.path.join(run_dir, "val.csv"),
            "plot": os.path.join(run_dir, "loss.png")}


# The files `glassllm train` writes beside its model file (the model file's own name varies)
RUN_FILE_NAMES = ("checkpoint.safetensors", "history.csv", "health.jsonl", "val.csv",
                  "loss.png")
SAVED_PATH_KEYS = ("out", "log_csv")  # output paths a checkpoint's extra records
# The per-step CSV `glassllm train --serve` writes beside the model when --log-csv is not given
STEP_LOG_NAME = "steps.csv"
DEFAULT_OUT = os.path.join("runs", "model.safetensors")


def other_run_files(paths: dict, keep=()) -> list[str]:
    """The files already at a new run's paths or in its folder that a run writes: the model
    file, checkpoint.safetensors, history.csv, health.jsonl, val.csv, loss.png and steps.csv
    beside it,
    and the run's own --checkpoint and --log-csv wherever they are. Named as the user named
    the model (relative stays relative), sorted, each once.

    paths: `run_paths` of the new run ({"model", "checkpoint", "log_csv", ...}).
    keep: paths that are never another run's files (`same_file`): the run's own inputs, its
        data and --init-from, whatever they are named (a text file called steps.csv).
    """
    run_dir = os.path.dirname(os.fspath(paths["model"]))
    candidates = [paths["model"], *(os.path.join(run_dir, n)
                                    for n in (*RUN_FILE_NAMES, STEP_LOG_NAME)),
                  paths.get("checkpoint"), paths.get("log_csv"), paths.get("history_csv"),
                  paths.get("health_jsonl"), paths.get("val_csv"), paths.get("plot")]
    found = {}
    for path in candidates:
        # lexists: a dangling link at a run's path is still a file the run would replace
        if path is not None and os.path.lexists(path) and \
                not any(same_file(path, k) for k in keep):
            found.setdefault(os.path.abspath(path), os.fspath(path))
    return sorted(found.values())


def check_no_other_run(paths: dict, keep=(), out_label: str = "--out") -> None:
    """Refuse a new run whose paths or folder hold another run's files (`other_run_files`):
    a second run would replace that run's model, history and plot, and leave its checkpoint,
    step log and health beside its own files, one folder read as one run made of two. A
    folder of an interrupted run (its checkpoint there) is refused too: `--resume` continues
    it, `--overwrite` replaces it.

    Raises:
        ValueError: one line naming the files and the two ways on (--out NEW, --overwrite).
    """
    found = other_run_files(paths, keep)
    if not found:
        return
    run_dir = os.path.dirname(os.fspath(paths["model"])) or "."
    ckpt = [p for p in found if os.path.basename(p) == "checkpoint.safetensors"]
    resume = f"; or continue it with --resume {ckpt[0]}" if ckpt else ""
    # a --checkpoint or --log-csv elsewhere: a new folder alone would not free it
    elsewhere = " (and new --checkpoint/--log-csv paths)" if any(
        not same_file(os.path.dirname(os.path.abspath(p)), os.path.abspath(run_dir))
        for p in found) else ""
    raise ValueError(f"{out_label} {paths['model']}: {run_dir} holds another run's files "
                     f"({', '.join(found)}); give --out in a new folder{elsewhere}, or "
                     f"--overwrite to replace that whole run{resume}")


def free_default_out(base: str = DEFAULT_OUT) -> str:
    """Where a new run writes when no --out is given: `base` (runs/model.safetensors) if its
    folder holds no run's files, else the first free numbered folder beside it
    (runs/2/model.safetensors, runs/3/...), so that a second run never replaces the first.
    A folder whose run is still in progress (its model's lock file there, no file written
    yet) is not free either."""
    def taken(model: str) -> bool:
        from .lock import lock_path
        return bool(other_run_files(run_paths(model))) or os.path.lexists(lock_path(model))
    if not taken(base):
        return base
    folder, name = os.path.split(base)
    n = 2
    while taken(os.path.join(folder, str(n), name)):
        n += 1
    return os.path.join(folder, str(n), name)


def remove_other_run_files(paths: dict, keep=()) -> list[str]:
    """Remove the files of the run a new one replaces (`other_run_files`, `keep` left;
    --overwrite), after its locks are taken and before its first write: the folder then holds
    the new run's files only, never a mix of two runs. Returns the paths removed.

    Raises:
        OSError: a file cannot be removed, naming it.
    """
    removed = []
    for path in other_run_files(paths, keep):
        try:
            os.remove(path)
        except FileNotFoundError:  # gone since it was listed: nothing to remove
            continue
        removed.append(path)
    return removed


def relative_paths(named: dict, checkpoint) -> dict:
    """{key: path relative to the checkpoint's folder} of the paths given (None left out):
    what a checkpoint records, so that a run moved as a whole resumes where it now is."""
    base = os.path.dirname(os.path.abspath(checkpoint))
    return {key: os.path.relpath(os.path.abspath(path), base)
            for key, path in named.items() if path is not None}


def saved_path(value, checkpoint) -> str | None:
    """A path a checkpoint recorded, as a path to use now: relative ones are relative to the
    checkpoint's folder; absolute ones (checkpoints written before paths were relative) are
    kept as they are."""
    if value is None or os.path.isabs(value):
        return value
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(checkpoint)), value))


def resolve_saved_paths(found: dict, checkpoint) -> dict:
    """`found` with its SAVED_PATH_KEYS made usable (`saved_path`)."""
    return {key: saved_path(value, checkpoint) if key in SAVED_PATH_KEYS else value
            for key, value in found.items()}


def check_resume_outputs(paths: dict, checkpoint) -> None:
    """Refuse a resume that would write into a folder holding another run's files.

    A resume writes its model, history, plot, health and validation logs beside its model
    file. When that folder is not the checkpoint's own, and already holds files of those
    names, they belong to another run (a checkpoint of a run moved away, whose recorded paths
    point to where a new run now lives): overwriting them would lose that run.

    Raises:
        ValueError: one line naming the checkpoint, the folder and the files.
    """
    run_dir = os.path.dirname(os.path.abspath(paths["model"]))
    ckpt_dir = os.path.dirname(os.path.abspath(checkpoint))
    if not os.path.isdir(run_dir) or same_file(run_dir, ckpt_dir):
        return
    names = {os.path.basename(paths["model"]), *RUN_FILE_NAMES}
    found = sorted(os.path.join(run_dir, n) for n in names
                   if os.path.lexists(os.path.join(run_dir, n)))
    if found:
        raise ValueError(f"--resume {checkpoint} would write into {run_dir}, which holds "
                         f"another run's files ({', '.join(found)}); give --out in a new "
                         f"folder, or resume a checkpoint beside its own run")


def check_init_from_kept(outputs: dict, init_from) -> None:
    """Refuse an output that would replace the model a fine-tune starts from: `init_from`
    itself (by identity, `same_file`) or a file inside it (a Hugging Face directory).

    outputs: {label: path or None}, as for `check_output_paths`.

    Raises:
        ValueError: one line naming the label, the path and `init_from`.
    """
    for label, path in outputs.items():
        if path is not None and (same_file(path, init_from) or is_inside(path, init_from)):
            raise ValueError(f"{label} {path} would overwrite --init-from {init_from}, the "
                             f"model this run starts from; write the run's files elsewhere")


def lock_run_outputs(paths, held, on_event) -> None:
    """Lock a run's output paths (None entries skipped) until the `contextlib.ExitStack`
    `held` closes (`glassllm.training.lock.lock_outputs`). A lock left by a process that had
    ended is taken over, `on_event(LockTakenOver(holder))`, and the temporaries that run left
    beside its paths are removed, `on_event(TemporaryRemoved(path))` each: a run killed outright
    (SIGKILL, MPI's force abort) never cleaned up. The one place a run takes its locks, for
    `glassllm.training.run.execute` and the Trainer alike.

    Raises:
        OutputLocked, OSError, ValueError: as `lock_outputs` (nothing stays locked).
    """
    from ..formats.atomic import remove_leftover_temporaries
    from .events import LockTakenOver, TemporaryRemoved
    from .lock import lock_outputs
    taken = held.enter_context(lock_outputs(paths))
    for holder in taken.stale:
        on_event(LockTakenOver(holder))
    for path in taken.stale_paths:
        for tmp in remove_leftover_temporaries(path):
            on_event(TemporaryRemoved(tmp))


def make_parent_dirs(paths) -> None:
    """Create the missing parent directories of each path (None entries skipped).

    Raises:
        OSError: a directory cannot be created, naming it.
    """
    for path in paths:
        if path is not None:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def write_history_csv(path, history: list[dict]) -> str:
    """history.csv (step,train_loss,val_loss,lr), one row per update, written atomically:
    train_loss is that update's batch loss (empty when it was not finite), val_loss is empty
    except at evaluations. Floats as repr (they read back exactly). Returns the path.

    Raises:
        OSError: the file cannot be written, naming it.
    """
    with atomic_write(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HISTORY_COLUMNS)
        for h in history:
            w.writerow([h["step"], "" if h["loss"] is None else repr(h["loss"]),
                        repr(h["val_loss"]) if h.get("val_loss") is not None else "",
                        repr(h["lr"])])
    return os.fspath(path)


def val_row(entry: dict) -> list[str]:
    """The val.csv row of an evaluation's history entry (step, val_loss, train_loss; floats as
    repr, which read back exactly; train_loss empty when not finite)."""
    train = entry.get("train_loss")
    return [str(entry["step"]), repr(entry["val_loss"]), "" if train is None else repr(train)]


class ValLog:
    """val.csv (`VAL_COLUMNS`): one row per evaluation, appended and flushed as it happens, so
    that a reader (`glassllm serve --run`) sees each validation loss at once rather than in
    history.csv at the end; like the per-step log, complete up to the last finished update after
    Ctrl-C, SIGTERM or a crash (flushed, not fsynced). A context manager; close() is idempotent.

    Opening writes the header and one row per evaluation of `history` (a resumed run's updates
    done: the file then holds exactly the evaluations the checkpoint holds, any rows of the
    interrupted run after it dropped, a missing file written again), atomically, then appends.

    Args:
        path: the file. history: the history entries done (dicts with "step", and "val_loss"
            and "train_loss" at evaluations); () for a new run.
        resumed: an existing file must be a val.csv (its header `VAL_COLUMNS`) to be rewritten.

    Raises:
        ValueError: resumed, and the file at `path` is not a val.csv (never rewritten).
        OSError: the file cannot be written (a full disk), naming it.
    """

    def __init__(self, path, history=(), resumed: bool = False):
        self.path = os.fspath(path)
        if resumed and os.path.exists(self.path):
            with open(self.path, newline="", encoding="utf-8", errors="replace") as f:
                header = next(csv.reader([f.readline(4096)]), [])
            if tuple(header) != VAL_COLUMNS:
                raise ValueError(f"{self.path} is not a glassllm val.csv (its header is "
                                 f"{header or 'missing'}); a resume would rewrite it: move it "
                                 f"away, or give --out in a new folder")
        with atomic_write(self.path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(VAL_COLUMNS)
            w.writerows(val_row(h) for h in history if h.get("val_loss") is not None)
        try:
            self._file = open(self.path, "a", newline="")
        except OSError as e:
            raise about(e, self.path, "cannot write the validation log") from None
        self._writer = csv.writer(self._file)

    def write(self, entry: dict) -> None:
        """Append the row of an evaluation's history entry and flush it to the operating system
        (OSError naming the file if it cannot be written)."""
        try:
            self._writer.writerow(val_row(entry))
            self._file.flush()
        except OSError as e:
            raise about(e, self.path, "cannot write the validation log") from None

    def close(self) -> None:
        if not self._file.closed:
            try:
                self._file.close()  # flushes what a failed write left in the buffer
            except OSError as e:
                raise about(e, self.path, "cannot write the validation log") from None

    def __enter__(self) -> "ValLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_plot(history_csv, png, on_failure=None) -> str | None:
    """loss.png from a history CSV (`glassllm.lens.plots.plot_history`). Returns its path, or None
    if plotting is unavailable or fails: the run's results are already saved, and a missing
    picture must not turn success into an error -- but it is said, never swallowed.

    Args:
        on_failure: called with a one-line message ("<png> not written: <error type>:
            <error>") when the plot fails; default: `warnings.warn(message, RuntimeWarning)`.
            The CLI prints it as one stderr line. Ctrl-C (KeyboardInterrupt) propagates.
    """
    try:
        from ..lens.plots import plot_history
        return plot_history(history_csv, png)
    except Exception as e:  # noqa: BLE001 -- matplotlib backends fail in many ways; reported
        detail = " ".join(str(e).split()) or "no message"
        message = f"{os.fspath(png)} not written: {type(e).__name__}: {detail}"
        if on_failure is None:
            import warnings
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        else:
            on_failure(message)
        return None
