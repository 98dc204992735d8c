"""A training run seen from outside, through its files only: the training process is never
asked anything, so watching it costs it nothing.

What `glassllm train` writes beside its model, and when:

- health.jsonl (`--health-every N`): one row every N steps, flushed as written: loss, lr,
  update:data ratios, gradient and weight norms, activation statistics, attention entropy,
  clip/skip events and the warnings that fired (`glassllm.lens.health`);
- a per-step CSV (`--log-csv`; `glassllm train --serve` writes steps.csv beside the model):
  one flushed row per step: step, lr, loss, skipped;
- val.csv: one flushed row per evaluation, as it happens: step, val_loss, train_loss (the
  mean batch loss since the previous evaluation; `glassllm.training.runfiles.ValLog`);
- history.csv at the end (and on Ctrl-C): every step's loss and lr, the validation losses;
- the model file (the best so far, at each evaluation that improves) and checkpoints.

`RunWatcher` reads the files written a row at a time (the per-step CSVs, health.jsonl,
val.csv) incrementally (`RowLog`): each poll reads only the bytes added since the last, at most
`CHUNK_BYTES` of them, and at most `MAX_FILE_BYTES` of a file in all; history.csv (written
whole) is read again when it changes, if not over `MAX_FILE_BYTES`. It survives what a live run
does to them: a file that does not exist yet, a last line still being written (left until
complete), a run restarted (a file replaced: read afresh) or resumed (steps written again: the
rows from the first repeated step on are replaced). A row it cannot use -- not JSON, not an
object with a finite numeric step, a field of the wrong type (`"warnings": 5`), a val.csv row
without a finite step and val_loss -- is skipped and named in `problems`, one line each; a file
that cannot be read likewise: nothing is raised.

`RunWatcher.poll(cursor)` is what the page polls with: only the rows after those the cursor of
its previous answer covers (`after=` in docs/serve.md), so a poll of a run of 30,000 steps
sends the few new rows, not the whole history.
"""
from __future__ import annotations

import bisect
import csv
import json
import math
import os
import secrets
import stat
import threading

from ..checks import check_real
from ..lens.health import BANDS
from ..lens.plots import read_history

MAX_FILE_BYTES = 256 << 20  # of a run file, at most this much is read (said in `problems`)
CHUNK_BYTES = 16 << 20  # read by one poll from one file: the next poll goes on
ANSWER_ROWS = {"steps": 20_000, "health": 1_000, "val": 20_000}  # rows of each file per answer
# The files a poll's cursor follows, in its order: after the watcher's id, each one's (epoch,
# rows), then history.csv's key (`_cursor`)
_CURSOR_LOGS = ("steps", "health", "val")
# what glassllm.training.runfiles.ValLog writes beside the model (serve does not import training)
VAL_FILE = "val.csv"
MAX_PROBLEMS = 20  # named per file; past that counted
_HEAD = 256  # bytes of a file's start kept to see it replaced
_STEP_COLUMNS = {"step", "loss", "lr"}
_HEALTH_NUMBERS = ("loss", "lr", "global_grad_norm", "clip_events", "skipped_steps")
_HEALTH_GROUPS = ("params", "activations", "attention")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def _number(cell):
    """A CSV cell as a float, or None (empty, unparsable, not finite)."""
    try:
        x = float(cell)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _finite_float(text: str):
    """A JSON number's text as a float, or None when it overflows (1e999 reads as inf, which
    no JSON answer can hold): as NaN and Infinity, a value the row does not have."""
    x = float(text)
    return x if math.isfinite(x) else None


def _regular_stat(entry) -> os.stat_result | None:
    """The stat of a directory entry or path when it is a regular file (links followed), else
    None: a FIFO or device would block a read (a thread of the quick lane, for good), and a
    link loop, a dangling link or a file removed since the listing cannot be read at all."""
    try:
        st = entry.stat() if isinstance(entry, os.DirEntry) else os.stat(entry)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _listing(folder: str) -> list:
    """The entries of `folder` by name; [] when it is gone or cannot be listed (a run folder
    removed or replaced between two calls)."""
    try:
        with os.scandir(folder) as entries:
            return sorted(entries, key=lambda e: e.name)
    except OSError:
        return []


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def health_row_problem(row) -> str | None:
    """Why a parsed health.jsonl line cannot be shown (None: it can): not an object, no finite
    numeric step, warnings not a list of strings, a panel group not an object of objects, a
    number field neither a number nor null."""
    if not isinstance(row, dict):
        return f"not a JSON object but {type(row).__name__}"
    try:
        check_real(row.get("step"), "step")
    except ValueError:
        return "no finite numeric step"
    warnings = row.get("warnings")
    if warnings is not None and not (isinstance(warnings, list) and
                                     all(isinstance(w, str) for w in warnings)):
        return f"warnings must be a list of strings, got {json.dumps(warnings)[:40]}"
    for group in _HEALTH_GROUPS:
        value = row.get(group)
        if value is not None and not (isinstance(value, dict) and
                                      all(isinstance(v, dict) for v in value.values())):
            return f"{group} must be an object of objects"
    for key in _HEALTH_NUMBERS:
        if row.get(key) is not None and not _is_number(row[key]):
            return f"{key} must be a number, got {json.dumps(row[key])[:40]}"
    return None


class RowLog:
    """One file written a row per line (kind "csv": a per-step CSV with a header; "val":
    val.csv; "jsonl": health.jsonl), read incrementally: `refresh()` reads what was added. `rows` are
    (step, value) in step order; `epoch` changes whenever they change other than by rows
    appended (the file replaced, a resumed run writing steps again), so a reader holding the
    first n rows of an epoch needs only rows[n:] while the epoch stays."""

    def __init__(self, path: str, kind: str, next_epoch):
        self.path, self.kind, self._next_epoch = path, kind, next_epoch
        self.name = os.path.basename(path)
        self._reset()

    def _reset(self) -> None:
        self.rows, self.steps, self.problems = [], [], []
        self.offset = self.line = self.dropped = 0
        self.header, self.ino, self.head, self.full = None, None, b"", False
        self.epoch = self._next_epoch()

    def refresh(self) -> None:
        """Read what the file gained since the last refresh (OSError: said in problems)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self.offset:
                self._reset()
            return
        except OSError as e:  # a link loop, a folder without permission
            self._problem(f"cannot be read: {' '.join(str(e).split())[:200]}")
            return
        if not stat.S_ISREG(st.st_mode):  # opening a FIFO would wait for a writer, forever
            self._problem("not a regular file: not read")
            return
        try:
            with open(self.path, "rb") as f:
                if st.st_ino != self.ino or st.st_size < self.offset or \
                        f.read(len(self.head)) != self.head:
                    self._reset()  # replaced: a run restarted
                    self.ino = st.st_ino
                if st.st_size > self.offset and not self.full:
                    self._read(f, st.st_size)
        except OSError as e:
            self._problem(f"cannot be read: {' '.join(str(e).split())[:200]}")

    def _read(self, f, size: int) -> None:
        budget = min(CHUNK_BYTES, MAX_FILE_BYTES - self.offset)
        if budget <= 0:
            self.full = True
            self._problem(f"over {_size(MAX_FILE_BYTES)}: the rows after are not read")
            return
        f.seek(self.offset)
        data = f.read(min(budget, size - self.offset))
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) >= budget:  # one line longer than a whole chunk
                self.full = True
                self._problem(f"line {self.line + 1} is over {_size(budget)}: not read")
            return  # else a row still being written
        for raw in data[:end + 1].split(b"\n")[:-1]:
            self.line += 1
            self._line(raw)
        self.offset += end + 1
        if len(self.head) < _HEAD:
            f.seek(0)
            self.head = f.read(_HEAD)[:self.offset]

    def _line(self, raw: bytes) -> None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self._problem(f"line {self.line} is not UTF-8 text; skipped")
            return
        if not text.strip():
            return
        if self.kind in ("csv", "val"):
            self._csv_line(text)
            return
        try:
            row = json.loads(text, parse_constant=lambda _: None, parse_float=_finite_float)
        except (ValueError, RecursionError) as e:
            self._problem(f"line {self.line} is not a JSON line ({str(e)[:60]}); skipped")
            return
        problem = health_row_problem(row)
        if problem is not None:
            self._problem(f"line {self.line}: {problem}; skipped")
            return
        self._add(float(row["step"]), row)

    def _csv_line(self, text: str) -> None:
        try:
            cells = next(csv.reader([text]))
        except (csv.Error, StopIteration):
            self._problem(f"line {self.line} is not a CSV row; skipped")
            return
        if self.header is None:
            self.header = [c.strip() for c in cells]
            return
        row = dict(zip(self.header, cells))
        if self.kind == "val":
            self._val_row(row)
            return
        step = _number(row.get("step"))
        if step is None:
            return
        skipped = (row.get("skipped") or "").strip().lower() in ("1", "true")
        self._add(int(step), (int(step), _number(row.get("loss")), _number(row.get("lr")),
                              (row.get("skip_reason") or "skipped") if skipped else None))

    def _val_row(self, row: dict) -> None:
        """A val.csv row -> (step, val_loss, train_loss or None); one without a whole-number
        step or a finite val_loss is skipped and said."""
        step, val = _number(row.get("step")), _number(row.get("val_loss"))
        if step is None or step != int(step):
            self._problem(f"line {self.line}: step {str(row.get('step'))[:40]!r} is not a "
                          f"whole number; skipped")
            return
        if val is None:
            self._problem(f"line {self.line}: val_loss {str(row.get('val_loss'))[:40]!r} is "
                          f"not a finite number; skipped")
            return
        self._add(int(step), (int(step), val, _number(row.get("train_loss"))))

    def _add(self, step, row) -> None:
        """Append a row; a step at or before the last one is a resumed run writing steps
        again: the rows from it on are replaced (the last written wins)."""
        if self.steps and step <= self.steps[-1]:
            cut = bisect.bisect_left(self.steps, step)
            del self.rows[cut:], self.steps[cut:]
            self.epoch = self._next_epoch()
        self.rows.append(row)
        self.steps.append(step)

    def _problem(self, message: str) -> None:
        message = f"{self.name}: {message}"
        if message in self.problems:  # a file that stays unreadable: said once, not per poll
            return
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(message)
        else:
            self.dropped += 1

    def all_problems(self) -> list[str]:
        more = [f"{self.name}: {self.dropped} more problems"] if self.dropped else []
        return self.problems + more


def steps_view(rows) -> dict:
    """Per-step rows -> {"step", "loss", "lr"} lists (None where a cell is empty) and
    "skips": [{step, reason}]."""
    return dict(step=[r[0] for r in rows], loss=[r[1] for r in rows], lr=[r[2] for r in rows],
                skips=[dict(step=r[0], reason=r[3]) for r in rows if r[3] is not None])


def val_view(rows) -> dict:
    """val.csv rows -> {"step", "val_loss", "train_loss"} lists (None where train_loss is
    empty)."""
    return dict(step=[r[0] for r in rows], val_loss=[r[1] for r in rows],
                train_loss=[r[2] for r in rows])


def warnings_of(health: list, steps: dict | None) -> list[dict]:
    """The warnings of health rows (each row's list) and of skipped steps: [{step, message}]."""
    found = [dict(step=row.get("step"), message=m) for row in health
             for m in (row.get("warnings") or [])]
    return found + [dict(step=s["step"], message=f"step {s['step']} skipped: {s['reason']}")
                    for s in (steps or {}).get("skips", [])]


def _history_lists(history: dict) -> dict:
    """`read_history`'s NaN-holed lists -> JSON lists with None."""
    return {k: [None if v is None or not math.isfinite(v) else v for v in values]
            for k, values in history.items()}


def _read_history_capped(path: str) -> dict:
    if _regular_stat(path) is None:
        raise ValueError("not a regular file: not read")
    size = os.path.getsize(path)
    if size > MAX_FILE_BYTES:
        raise ValueError(f"{_size(size)}, over {_size(MAX_FILE_BYTES)}: not read")
    return _history_lists(read_history(path))


def _cursor(text: str) -> tuple | None:
    """An `after` cursor's numbers (watcher, then the epoch and rows of each of _CURSOR_LOGS,
    then history key), or None when it is "" or not one."""
    parts = text.split("-")
    # isascii: str.isdigit() holds for "²" and "٣" too, which int() refuses or reads as 3
    if len(parts) != 2 + 2 * len(_CURSOR_LOGS) or not all(p.isascii() and p.isdigit() and len(p) < 30 for p in parts):
        return None
    return tuple(int(p) for p in parts)


class RunWatcher:
    """The files of one run directory (which may not exist yet); thread-safe."""

    def __init__(self, run_dir: str):
        self.run_dir = os.path.abspath(run_dir)
        self._logs: dict[str, RowLog] = {}
        self._history: tuple = (None, None, None)  # (stat key, value, problem)
        self._epochs = 0
        self._step_log_files: dict[tuple, bool] = {}  # (name, inode) -> a per-step log?
        self._id = secrets.randbelow(1 << 40)  # a cursor of another server is not ours
        self._lock = threading.Lock()

    def _next_epoch(self) -> int:
        self._epochs += 1
        return self._epochs

    def step_logs(self) -> list[str]:
        """The CSVs of the run directory whose header has step, loss and lr (per-step logs),
        history.csv and val.csv excepted."""
        found = []
        if not os.path.isdir(self.run_dir):
            return found
        for entry in _listing(self.run_dir):
            if not entry.name.endswith(".csv") or entry.name in ("history.csv", VAL_FILE) or \
                    entry.name.startswith("."):
                continue
            st = _regular_stat(entry)
            if st is not None and self._is_step_log(entry.path, (entry.name, st.st_ino)):
                found.append(entry.name)
        return found

    def _is_step_log(self, path: str, key: tuple) -> bool:
        """Whether the CSV's header has step, loss and lr; read once per file (name, inode),
        not at every poll. A file with no complete header line yet is asked again."""
        if key not in self._step_log_files:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    line = f.readline(4096)
            except OSError:
                return False
            if not line.endswith("\n") and len(line) < 4096:
                return False
            self._step_log_files[key] = _STEP_COLUMNS <= set(line.strip().split(","))
        return self._step_log_files[key]

    def version(self) -> str:
        """Changes whenever a file the page shows changes (sizes and times of the directory's
        files): the page polls with it and gets `unchanged` when nothing moved."""
        if not os.path.isdir(self.run_dir):
            return "absent"
        parts = []
        for entry in _listing(self.run_dir):
            st = _regular_stat(entry) if entry.name.endswith((".csv", ".jsonl", ".safetensors")) \
                else None
            if st is not None:
                parts.append(f"{entry.name}:{st.st_size}:{st.st_mtime_ns}")
        return str(hash(tuple(parts)) & 0xFFFFFFFFFFFF)

    def _log(self, name: str, kind: str) -> RowLog:
        if name not in self._logs:
            self._logs[name] = RowLog(os.path.join(self.run_dir, name), kind, self._next_epoch)
        return self._logs[name]

    def _refresh(self) -> tuple[dict, list[str]]:
        """Every file read up to date: ({"steps": the longest per-step log or None, "health",
        "val"}, problems)."""
        names = self.step_logs()
        kept = ("health.jsonl", VAL_FILE)
        for gone in [n for n in self._logs if n not in kept and n not in names]:
            del self._logs[gone]
        logs = [self._log(n, "csv") for n in names]
        health, val = self._log("health.jsonl", "jsonl"), self._log(VAL_FILE, "val")
        for log in logs + [health, val]:
            log.refresh()
        self._refresh_history()
        problems = [p for log in logs + [health, val] for p in log.all_problems()]
        problems += [self._history[2]] if self._history[2] else []
        steps = max(logs, key=lambda log: len(log.rows)) if logs else None
        return dict(steps=steps, health=health, val=val), problems

    def _refresh_history(self) -> None:
        path = os.path.join(self.run_dir, "history.csv")
        try:
            st = os.stat(path)
        except OSError:
            self._history = (None, None, None)
            return
        key = (st.st_size, st.st_mtime_ns, st.st_ino)
        if self._history[0] == key:
            return
        try:
            value, problem = _read_history_capped(path), None
        except (OSError, ValueError, csv.Error) as e:
            value, problem = None, f"history.csv: {' '.join(str(e).split())[:200]}"
        self._history = (key, value, problem)

    def snapshot(self) -> dict:
        """Everything the training page shows, as JSON-ready lists (see the module doc)."""
        with self._lock:
            logs, problems = self._refresh()
            steps = None if logs["steps"] is None else steps_view(logs["steps"].rows)
            health = list(logs["health"].rows)
            return dict(run_dir=self.run_dir, exists=os.path.isdir(self.run_dir),
                        history=self._history[1], steps=steps, health=health,
                        val=val_view(logs["val"].rows), bands=BANDS,
                        warnings=warnings_of(health, steps), problems=problems,
                        version=self.version())

    def poll(self, after: str) -> dict:
        """What came after the cursor `after` (that of an earlier answer; "" for the start):
        the snapshot's keys, with `steps`, `health`, `val` and `warnings` holding only the rows
        after it, `history` only when it changed (else absent); `incremental` (False: from the
        start, the page drops what it has), `more` (rows left for the next poll), `cursor`."""
        with self._lock:
            logs, problems = self._refresh()
            old = _cursor(after)
            history_key = hash(self._history[0]) & 0xFFFFFFFFFF
            # (epoch, rows) of each followed file; no per-step log: epoch 0, no rows
            held = [(0, []) if logs[name] is None else (logs[name].epoch, logs[name].rows)
                    for name in _CURSOR_LOGS]
            keep = old is not None and old[0] == self._id and all(
                old[1 + 2 * i] == epoch and old[2 + 2 * i] <= len(rows)
                for i, (epoch, rows) in enumerate(held))
            window, cursor, more = {}, [self._id], False
            for i, (name, (epoch, rows)) in enumerate(zip(_CURSOR_LOGS, held)):
                start = old[2 + 2 * i] if keep else 0
                end = min(len(rows), start + ANSWER_ROWS[name])
                window[name], more = rows[start:end], more or end < len(rows)
                cursor += [epoch, end]
            steps_log = logs["steps"]
            steps = None if steps_log is None else steps_view(window["steps"])
            answer = dict(run_dir=self.run_dir, exists=os.path.isdir(self.run_dir),
                          steps=steps, steps_file=None if steps_log is None else steps_log.name,
                          health=window["health"], val=val_view(window["val"]), bands=BANDS,
                          warnings=warnings_of(window["health"], steps), problems=problems,
                          version=self.version(), incremental=keep, more=more,
                          cursor="-".join(map(str, cursor + [history_key])))
            if not keep or old[-1] != history_key:
                answer["history"] = self._history[1]
            return answer
