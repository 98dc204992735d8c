"""A training run seen from outside, through its files only: the training process is never
asked anything, so watching it costs it nothing.

What `glassllm train` writes beside its model, and when:

- health.jsonl (`--health-every N`): one row every N steps, flushed as written: loss, lr,
  update:data ratios, gradient and weight norms, activation statistics, attention entropy,
  clip/skip events and the warnings that fired (`glassllm.lens.health`);
- a per-step CSV (`--log-csv`; `glassllm train --serve` writes steps.csv beside the model):
  one flushed row per step: step, lr, loss, skipped;
- history.csv at the end (and on Ctrl-C): every step's loss and lr, the validation losses;
- the model file (the best so far, at each evaluation that improves) and checkpoints.

`RunWatcher.snapshot()` reads them as they are at that moment and survives what a live run
does to them: a file that does not exist yet, a last line still being written (dropped until
complete), a run restarted (files replaced: read afresh) or resumed (steps written again: the
last row of each step wins). A file that cannot be read is reported in `problems`, one line
each, never raised. Reads are cached by (size, modification time): polling an idle run reads
nothing.
"""
from __future__ import annotations

import csv
import io
import math
import os

from ..lens.health import BANDS, read_health
from ..lens.plots import read_history

MAX_FILE_BYTES = 256 << 20  # a run file larger than this is not read (reported)
_STEP_COLUMNS = {"step", "loss", "lr"}


def _complete_lines(path: str) -> str:
    """The file's text up to its last newline (a row still being written is left out)."""
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{path}: over {MAX_FILE_BYTES >> 20} MiB, not read")
    end = data.rfind(b"\n")
    return data[:end + 1].decode("utf-8", errors="replace")


def _number(cell):
    """A CSV cell as a float, or None (empty, unparsable, not finite)."""
    try:
        x = float(cell)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def read_step_log(path: str) -> dict:
    """A per-step CSV (columns step, lr, loss and optionally skipped / skip_reason) as
    {"step", "loss", "lr"} lists (None where a cell is empty) plus "skips": [{step, reason}];
    one row per step, the last written winning (a resumed run writes some steps again)."""
    rows = {}
    for row in csv.DictReader(io.StringIO(_complete_lines(path))):
        step = _number(row.get("step"))
        if step is None:
            continue
        rows[int(step)] = row
    steps = sorted(rows)
    skips = [dict(step=s, reason=rows[s].get("skip_reason") or "skipped") for s in steps
             if (rows[s].get("skipped") or "").strip().lower() in ("1", "true")]
    return dict(step=steps, loss=[_number(rows[s].get("loss")) for s in steps],
                lr=[_number(rows[s].get("lr")) for s in steps], skips=skips)


def _history_lists(history: dict) -> dict:
    """`read_history`'s NaN-holed lists -> JSON lists with None."""
    return {k: [None if v is None or not math.isfinite(v) else v for v in values]
            for k, values in history.items()}


class RunWatcher:
    """The files of one run directory (which may not exist yet)."""

    def __init__(self, run_dir: str):
        self.run_dir = os.path.abspath(run_dir)
        self._cache: dict[str, tuple] = {}

    def _cached(self, name: str, read):
        """read(path) of the run's file `name`, re-read only when its size or time changed;
        (None, None) when it does not exist, (None, message) when it cannot be read."""
        path = os.path.join(self.run_dir, name)
        try:
            st = os.stat(path)
        except OSError:
            self._cache.pop(name, None)
            return None, None
        key = (st.st_size, st.st_mtime_ns, st.st_ino)
        hit = self._cache.get(name)
        if hit is not None and hit[0] == key:
            return hit[1], hit[2]
        try:
            value, problem = read(path), None
        except (OSError, ValueError, csv.Error) as e:
            value, problem = None, f"{name}: {' '.join(str(e).split())[:200]}"
        self._cache[name] = (key, value, problem)
        return value, problem

    def step_logs(self) -> list[str]:
        """The CSVs of the run directory whose header has step, loss and lr (per-step logs),
        history.csv excepted."""
        found = []
        if not os.path.isdir(self.run_dir):
            return found
        for entry in sorted(os.scandir(self.run_dir), key=lambda e: e.name):
            if entry.name.endswith(".csv") and entry.name != "history.csv" and \
                    not entry.name.startswith(".") and entry.is_file():
                try:
                    with open(entry.path, encoding="utf-8", errors="replace") as f:
                        header = set(f.readline().strip().split(","))
                except OSError:
                    continue
                if _STEP_COLUMNS <= header:
                    found.append(entry.name)
        return found

    def version(self) -> str:
        """Changes whenever a file the page shows changes (sizes and times of the directory's
        files): the page polls with it and gets `unchanged` when nothing moved."""
        if not os.path.isdir(self.run_dir):
            return "absent"
        parts = []
        for entry in sorted(os.scandir(self.run_dir), key=lambda e: e.name):
            if entry.name.endswith((".csv", ".jsonl", ".safetensors")) and entry.is_file():
                st = entry.stat()
                parts.append(f"{entry.name}:{st.st_size}:{st.st_mtime_ns}")
        return str(hash(tuple(parts)) & 0xFFFFFFFFFFFF)

    def snapshot(self) -> dict:
        """Everything the training page shows, as JSON-ready lists (see the module doc)."""
        problems = []
        history, p = self._cached("history.csv", lambda path: _history_lists(read_history(path)))
        problems += [p] if p else []
        logs = {}
        for name in self.step_logs():
            value, p = self._cached(name, read_step_log)
            problems += [p] if p else []
            if value is not None:
                logs[name] = value
        health, p = self._cached("health.jsonl", read_health)
        problems += [p] if p else []
        health = health or []
        steps = max(logs.values(), key=lambda v: len(v["step"])) if logs else None
        warnings = [dict(step=row.get("step"), message=str(m)) for row in health
                    for m in (row.get("warnings") or []) if isinstance(m, str)]
        warnings += [dict(step=s["step"], message=f"step {s['step']} skipped: {s['reason']}")
                     for s in (steps or {}).get("skips", [])]
        return dict(run_dir=self.run_dir, exists=os.path.isdir(self.run_dir),
                    history=history, steps=steps, health=health, bands=BANDS,
                    warnings=warnings, problems=problems, version=self.version())
