"""Loss curves: a training history -> an image (PNG, SVG, PDF...) of loss and learning rate against step.

matplotlib is imported inside the functions, and only its object API with the Agg canvas is
used (no pyplot): importing glassllm stays fast, and a caller's own matplotlib backend and
figures are left alone.
"""
from __future__ import annotations

import csv
import json
import math
import os

from ..formats.atomic import atomic_replace

HISTORY_NAMES = ("history.csv", "history.jsonl")

# Column names accepted for each series; the first is the canonical one.
_ALIASES = {
    "step": ("step",),
    "train_loss": ("train_loss", "loss"),
    "val_loss": ("val_loss",),
    "lr": ("lr", "learning_rate"),
}


def _number(value) -> float:
    """A float from a CSV/JSON cell; empty, missing or unparsable cells give NaN."""
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _normalize(rows) -> dict[str, list[float]]:
    """Rows (dicts) -> {"step", "train_loss", "val_loss", "lr"}: lists of floats, NaN where a
    row has no value. Rows without a step are skipped.

    Raises:
        ValueError: no row has a step.
    """
    out = {key: [] for key in _ALIASES}
    for row in rows:
        values = {}
        for key, names in _ALIASES.items():
            name = next((n for n in names if n in row and row[n] not in (None, "")), None)
            values[key] = _number(row[name]) if name else math.nan
        if math.isnan(values["step"]):
            continue
        for key in out:
            out[key].append(values[key])
    if not out["step"]:
        raise ValueError("history has no rows with a step")
    return out


def read_history(path) -> dict[str, list[float]]:
    """Read a history file: CSV with a header (columns step, train_loss or loss, val_loss,
    lr; extra columns ignored, empty cells allowed) or JSON lines (one object per line, the
    same keys; blank lines ignored).

    Returns:
        {"step", "train_loss", "val_loss", "lr"} -> lists of floats, NaN where missing.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a bad JSON line, a file that is not UTF-8 text / CSV (the message names
            the file), or no row with a step.
    """
    path = os.fspath(path)
    with open(path, newline="", encoding="utf-8") as f:
        try:
            rows = _json_rows(path, f) if path.endswith((".jsonl", ".json")) \
                else list(csv.DictReader(f))
        except UnicodeDecodeError as e:  # a binary file: say which one
            raise ValueError(f"{path}: not a UTF-8 text history file (byte {e.start} of a "
                             f"read block cannot be decoded)") from None
        except csv.Error as e:  # e.g. NUL bytes
            raise ValueError(f"{path}: not a CSV history file ({e})") from None
    try:
        return _normalize(rows)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _json_rows(path: str, lines) -> list[dict]:
    """The objects of a JSON-lines history, blank lines skipped; ValueError "path:N: not a
    JSON line" for a bad one."""
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not a JSON line: {e}") from None
    return rows


def find_history(run_dir) -> str:
    """The history file of a run directory: history.csv, else history.jsonl.

    Raises:
        FileNotFoundError: neither exists.
    """
    for name in HISTORY_NAMES:
        path = os.path.join(run_dir, name)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{run_dir}: no {' or '.join(HISTORY_NAMES)} in it")


def plot_history(history, path) -> str:
    """Draw train/val loss (nats per token) and learning rate against step; write an image.

    Args:
        history: a list of dicts (as `glassllm.train.train` returns: step, loss or
            train_loss, val_loss, lr) or the path of a CSV / JSON-lines history file.
        path: the image to write, atomically (temp file + os.replace); its suffix picks the
            format (.png, .svg, .pdf, ... any format matplotlib's Agg canvas writes; no suffix
            means PNG).

    Returns:
        path.

    Raises:
        ValueError: the history has no row with a step; an image suffix matplotlib cannot
            write; an empty path. FileNotFoundError: no such history file, or the image's
            directory is missing. IsADirectoryError: `path` is a directory. Messages name
            the user's paths.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = os.fspath(path)
    if not path:
        raise ValueError("the image path is empty; give a file name such as loss.png")
    image_format = _image_format(path, FigureCanvasAgg.get_supported_filetypes())

    series = (read_history(history) if isinstance(history, (str, os.PathLike))
              else _normalize(history))
    step = series["step"]
    fig = Figure(figsize=(8, 6), dpi=100)
    FigureCanvasAgg(fig)
    loss_ax, lr_ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for key, label, style in (("train_loss", "train", "-"), ("val_loss", "validation", "o-")):
        points = [(s, v) for s, v in zip(step, series[key]) if not math.isnan(v)]
        if points:
            xs, ys = zip(*points)
            loss_ax.plot(xs, ys, style, label=label, markersize=3)
    loss_ax.set_ylabel("loss (nats/token)")
    loss_ax.grid(alpha=0.3)
    if loss_ax.lines:
        loss_ax.legend()
    lr_points = [(s, v) for s, v in zip(step, series["lr"]) if not math.isnan(v)]
    if lr_points:
        xs, ys = zip(*lr_points)
        lr_ax.plot(xs, ys, color="tab:green")
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_xlabel("step")
    lr_ax.grid(alpha=0.3)
    fig.tight_layout()

    # OSErrors name the user's path, never the temporary's (see glassllm.formats.atomic).
    atomic_replace(path, lambda tmp: fig.savefig(tmp, format=image_format))
    return path


def _image_format(path: str, supported: dict) -> str:
    """The matplotlib format for `path`'s suffix; checks the destination before drawing."""
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory; give an image file path such as "
                                f"{os.path.join(path, 'loss.png')}")
    directory = os.path.dirname(path)
    if directory and not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write {path}: directory {directory} does not exist")
    suffix = os.path.splitext(path)[1].lower().lstrip(".")
    if not suffix:
        return "png"
    if suffix not in supported:
        raise ValueError(f"{path}: cannot write .{suffix} images; use one of "
                         f"{', '.join('.' + k for k in sorted(supported))}")
    return suffix


# (group, key, title, log scale) of the health panels: one per kind of number
HEALTH_PANELS = (
    ("params", "update_to_data_log10", "update:data ratio (log10) per tensor", False),
    ("params", "grad_norm", "gradient norm per tensor", True),
    ("params", "grad_to_data", "grad:data ratio per tensor", True),
    ("params", "weight_norm", "weight norm per tensor", False),
    ("activations", "std", "activation std per layer", False),
    ("activations", "saturated", "saturated fraction per layer", False),
    ("activations", "dead", "dead-unit fraction per layer", False),
    ("attention", "entropy", "attention entropy per head (nats)", False),
)


def plot_health(rows, path, bands: dict | None = None) -> str:
    """Draw a run's health rows (`glassllm.lens.health`, health.jsonl) against step, one panel
    per kind (HEALTH_PANELS, plus the global gradient norm with clip and skip events), each
    watched ratio's healthy band shaded; write an image (format from path's suffix).

    rows: a list of dicts or the path of a health.jsonl. Returns path.
    Raises ValueError: no rows, or an image suffix matplotlib cannot write.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from .health import BANDS, read_health

    path = os.fspath(path)
    image_format = _image_format(path, FigureCanvasAgg.get_supported_filetypes())
    if isinstance(rows, (str, os.PathLike)):
        rows = read_health(rows)
    rows = [r for r in rows if isinstance(r, dict) and isinstance(r.get("step"), (int, float))]
    if not rows:
        raise ValueError("no health rows to plot (train with --health-every N)")
    bands = BANDS if bands is None else bands
    steps = [r["step"] for r in rows]
    fig = Figure(figsize=(14, 10), dpi=90)
    FigureCanvasAgg(fig)
    axes = fig.subplots(3, 3).reshape(-1)
    for ax, (group, key, title, log) in zip(axes, HEALTH_PANELS):
        names = list(dict.fromkeys(n for r in rows for n in (r.get(group) or {})))
        for name in names:
            ys = [_number(((r.get(group) or {}).get(name) or {}).get(key)) for r in rows]
            if not all(math.isnan(y) for y in ys):
                ax.plot(steps, ys, linewidth=1, label=name if len(names) <= 8 else None)
        if key in bands:
            ax.axhspan(*bands[key], color="tab:green", alpha=0.08)
        if log and ax.lines:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        if 0 < len(names) <= 8 and ax.lines:
            ax.legend(fontsize=6)
    ax = axes[-1]
    ax.plot(steps, [_number(r.get("global_grad_norm")) for r in rows], label="grad norm")
    for key, marker in (("clip_events", "x"), ("skipped_steps", "v")):
        counts = [_number(r.get(key)) for r in rows]
        hits = [(s, c) for s, c in zip(steps, counts) if c and not math.isnan(c)]
        if hits:
            ax.plot(*zip(*hits), marker, linestyle="none", label=key.replace("_", " "))
    ax.set_title("global gradient norm, clip / skip events since last row", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    for ax in axes[-3:]:
        ax.set_xlabel("step")
    fig.tight_layout()
    atomic_replace(path, lambda tmp: fig.savefig(tmp, format=image_format))
    return path
