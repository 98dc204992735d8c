"""Training health: every N steps, what the update did to each tensor and what the network's
activations look like, as rows of `health.jsonl` and events (`HealthChecked`,
`HealthWarning`).

The numbers are the ones the field's practitioners watch (Karpathy, makemore part 3; cs231n
"ratio of weights:updates"; nanoGPT's todo "logging around network health (gradient clip
events, magnitudes)"):

- per parameter tensor: update_to_data_log10 = log10(||w_after - w_before|| / ||w_before||)
  from the real AdamW change (about -3 is the rule of thumb; much higher means the learning
  rate is too high), grad_norm (the unscaled gradient's L2 norm before clipping), grad_to_data
  (||grad|| / ||w||), weight_norm (||w||);
- per layer: mean and std of the residual stream after the block, and of the MLP's
  pre-activation (its gate for SwiGLU) with its saturated fraction -- the share of units whose
  activation's tanh form is beyond |0.97| (makemore's |tanh| > 0.97; tanh(u) of GELU's
  u = sqrt(2/pi)(x + 0.044715 x^3), tanh(x/2) of SiLU's sigmoid) -- and its dead fraction, the
  share of d_ff units negative at every position of the batch (a GELU/SiLU unit that never
  opens passes almost nothing and learns slowly);
- per head: attention entropy in nats, mean over batch and query positions (log(i+1) is a
  uniform row; 0 a head that looks at one key);
- clip events and skipped (non-finite) steps counted over every step since the last row, never
  only at the sampled step, and the number of non-finite values in weights and gradients.

The activations are the ones of the training step itself: on a health step the step runs
under a `glassllm.lens.trace.Trace` that only reads values (no edits, no gradient capture), so
the update is bit-identical to an unobserved one.

Warnings: when a watched ratio (a weight matrix's update:data ratio -- 1-D biases and norm
gains are measured but not watched, as in makemore; a layer's saturated or dead fraction;
`BANDS`) stays outside its band for `patience` checks in a row, or a check finds
non-finite values: one line per kind (a `HealthWarning` event).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os

import numpy as np

from ..devices import to_host
from ..checks import check_int, check_real
from .trace import Trace

# The healthy band of each watched ratio; a warning when one stays outside for PATIENCE
# checks in a row. update_to_data_log10: AdamW moves each weight by about lr per step while
# gradients agree, so at the default lr 2e-3 a tensor of 0.02-sized weights changes by a few
# percent per step early on (measured on the default run: worst tensor 10^-1.4, median
# 10^-1.8..-2.8) and settles lower; above 10^-1 weights are rewritten within a few steps. The
# low end is far (warmup starts at lr ~ 0). saturated: the default run has 0; a run at lr 1.0
# had 80-96% of its MLP units saturated. dead: early training passes 40% once; half the
# units dead check after check is a broken layer.
BANDS = {"update_to_data_log10": (-6.0, -1.0), "saturated": (0.0, 0.25), "dead": (0.0, 0.5)}
PATIENCE = 3
_TANH_SATURATED = 0.97
_GELU_C = math.sqrt(2.0 / math.pi)


def readable_repr(event) -> str:
    """The repr of an event (a dataclass) a person reads: `Stepped(step=3, loss=5.524, ...)`.

    Floats to 4 significant digits (nats, learning rates; 1000 and above as integers:
    tokens/second, seconds), inside dicts and lists too; a list of over 8 items as its
    length (a summary's history: `history=[2000 items]`). The fields' values are unchanged:
    `dataclasses.astuple` / attribute access give the floats exact."""
    fields = ", ".join(f"{f.name}={_readable(getattr(event, f.name))}"
                       for f in dataclasses.fields(event) if f.repr)
    return f"{type(event).__name__}({fields})"


def _readable(value) -> str:
    if isinstance(value, (float, np.floating)):
        x = float(value)
        if not math.isfinite(x):
            return repr(x)
        if abs(x) >= 1000:
            return f"{x:.0f}"
        text = f"{x:.4g}"
        return text if any(c in text for c in ".e") else text + ".0"  # 1.0, not the int 1
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_readable(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        if len(value) > 8:
            return f"[{len(value)} items]"
        inner = ", ".join(_readable(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' * (len(value) == 1)})"
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and \
            type(value).__repr__ is readable_repr:
        return readable_repr(value)
    return repr(value)


@dataclasses.dataclass(frozen=True)
class HealthChecked:
    """A health row was measured (and written): `row` as in health.jsonl."""
    step: int
    row: dict
    __repr__ = readable_repr


@dataclasses.dataclass(frozen=True)
class HealthWarning:
    """Something left its healthy range: `message` is one line."""
    step: int
    message: str
    __repr__ = readable_repr


def _norm(a: np.ndarray) -> float:
    """L2 norm (BLAS nrm2, in the array's dtype: ample for a diagnostic)."""
    return float(np.linalg.norm(a.reshape(-1)))


def _finite(x: float):
    """JSON has no inf/NaN: None stands for them."""
    return float(x) if math.isfinite(x) else None


def _log10_ratio(num: float, den: float):
    if den == 0 or not math.isfinite(num) or not math.isfinite(den):
        return None
    return math.log10(num / den) if num > 0 else None


def activation_stats(cache, family: str) -> dict:
    """Per layer stats from a trace cache holding blocks.*.residual_out and
    blocks.*.mlp.hidden_pre (see the module doc). family: "gpt2" or any GELU-family MLP kind
    (`Config.mlp` "gelu", "gelu_tanh", "geglu") measures GELU's tanh form; "llama" or
    "swiglu" SiLU's."""
    out = {}
    layer = 0
    while f"blocks.{layer}.residual_out" in cache:
        r = cache[f"blocks.{layer}.residual_out"]
        out[f"blocks.{layer}.residual_out"] = dict(mean=float(r.mean(dtype=np.float64)),
                                                   std=float(r.std(dtype=np.float64)))
        pre = cache[f"blocks.{layer}.mlp.hidden_pre"]
        if family in ("gpt2", "gelu", "gelu_tanh", "geglu"):
            gate = np.tanh(_GELU_C * (pre + 0.044715 * pre ** 3))
        else:  # SiLU: x * sigmoid(x) = x * (1 + tanh(x / 2)) / 2
            gate = np.tanh(pre / 2)
        units = pre.reshape(-1, pre.shape[-1])
        out[f"blocks.{layer}.mlp.hidden_pre"] = dict(
            mean=float(pre.mean(dtype=np.float64)), std=float(pre.std(dtype=np.float64)),
            saturated=float(np.mean(np.abs(gate) > _TANH_SATURATED)),
            dead=float(np.mean(np.all(units < 0, axis=0))))
        layer += 1
    return out


def attention_entropy(cache, n_layers: int) -> dict:
    """{"L{layer}H{head}": {"entropy": nats}} from traced patterns (B, H, T, T)."""
    out = {}
    for layer in range(n_layers):
        p = cache[f"blocks.{layer}.attention.pattern"]
        # -p log p with 0 log 0 = 0 (the masked future): log of max(p, tiny) is finite there
        terms = p * np.log(np.maximum(p, np.finfo(p.dtype).tiny))
        entropy = -terms.sum(-1, dtype=np.float64).mean(axis=(0, 2))  # (H,)
        for h, e in enumerate(entropy):
            out[f"L{layer}H{h}"] = dict(entropy=float(e))
    return out


class HealthMonitor:
    """Measures health every `every` steps around a training step.

        monitor = HealthMonitor(model, optimizer, every=10, clip=1.0, path="runs/health.jsonl")
        with monitor.observe(step):
            record = train_step(x, y, lr, step)      # a glassllm.training.safety.StepRecord
        events = monitor.after_step(step, record)    # [] or [HealthChecked, HealthWarning...]

    Args:
        model: the GlassLM being trained. optimizer: its AdamW (`.params`).
        every: N >= 1; rows at steps 0, N, 2N, ...
        clip: the run's clip norm (a step with a larger pre-clip norm is a clip event).
        path: health.jsonl to append rows to (flushed per row; None: events only).
        bands: the warning rule's bands (module doc; `BANDS` by default).
        patience: how many checks in a row out of band make a warning (module doc).
        keep_from: on resume, rows with step >= keep_from are dropped from an existing file
            first (those steps are redone).

    Raises:
        ValueError: every < 1.
    """

    def __init__(self, model, optimizer, every: int, clip: float | None = None, path=None,
                 bands: dict | None = None, patience: int = PATIENCE,
                 keep_from: int | None = None):
        every = check_int(every, "health every", low=1)
        self.model, self.optimizer, self.every, self.clip = model, optimizer, every, clip
        self.bands, self.patience = dict(BANDS if bands is None else bands), patience
        self.names = {id(p): n for n, p in model.named_parameters()}
        # the update:data warning watches weight matrices only, as makemore's plot does
        # (p.ndim == 2): biases start at 0 and norm gains at 1, so their relative change is
        # large early by construction (gpt2's 17 zero biases flagged a default run)
        self.matrices = {n for n, p in model.named_parameters() if p.data.ndim >= 2}
        self.path = None if path is None else os.fspath(path)
        self._file = None
        if self.path is not None:
            if keep_from is not None and os.path.exists(self.path):
                _truncate_rows(self.path, keep_from)
            self._file = open(self.path, "a", encoding="utf-8")
        self._before: dict[int, np.ndarray] | None = None
        self._trace: Trace | None = None
        self._since = dict(clip_events=0, skipped_steps=0, interval_steps=0)
        self._out_of_band: dict[str, int] = {}
        self._warned: set[str] = set()

    def resume_counts(self, history: list[dict]) -> None:
        """A resumed run: count the updates since the last health row (its interval, skips
        and clip events) from the history of the updates done, as the interrupted run had
        counted them (history entries: "skipped" and "clipped" keys, as `Trainer` writes)."""
        start = len(history)
        last_row = ((start - 1) // self.every) * self.every if start else -1
        since = [h for h in history[last_row + 1:]]
        self._since = dict(clip_events=sum(1 for h in since if h.get("clipped")),
                           skipped_steps=sum(1 for h in since if h.get("skipped")),
                           interval_steps=len(since))

    def wants(self, step: int) -> bool:
        return step % self.every == 0

    @contextlib.contextmanager
    def observe(self, step: int):
        """Around the training step: on a health step, remember the weights and trace the
        forward's activations; otherwise nothing."""
        if not self.wants(step):
            yield
            return
        self._before = {id(p): np.array(p.numpy()) for p in self.optimizer.params}  # host
        names = ["blocks.*.residual_out", "blocks.*.mlp.hidden_pre", "blocks.*.attention.pattern"]
        self._trace = Trace(self.model, names=names, max_bytes=None)
        with self._trace:
            yield

    def after_step(self, step: int, record) -> list:
        """Count this step's clip/skip; on a health step measure, write and return the events."""
        s = self._since
        s["interval_steps"] += 1
        pre = record.grad_l2_pre_clip
        if record.skipped:
            s["skipped_steps"] += 1
        elif self.clip is not None and pre > self.clip:
            s["clip_events"] += 1
        if not self.wants(step) or self._before is None:
            return []
        row = self._measure(step, record)
        self._before, self._trace = None, None
        self._since = dict(clip_events=0, skipped_steps=0, interval_steps=0)
        warnings = self._check(step, row)
        row["warnings"] = [w.message for w in warnings]
        if self._file is not None:
            self._file.write(json.dumps(row, allow_nan=False) + "\n")
            self._file.flush()
        return [HealthChecked(step, row), *warnings]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    # ------------------------------------------------------------------ measuring
    def _measure(self, step: int, record) -> dict:
        pre = record.grad_l2_pre_clip
        post = record.grad_l2_post_clip
        # p.grad holds the clipped gradient: scale back to what backward produced
        unclip = pre / post if post and math.isfinite(pre) and math.isfinite(post) else 1.0
        params, nonfinite = {}, 0
        for p in self.optimizer.params:
            before, data = self._before[id(p)], p.numpy()  # measured on the host
            nonfinite += int(np.size(data) - np.count_nonzero(np.isfinite(data)))
            w = _norm(before)
            update = _norm(data - before)
            g = None
            if p.grad is not None:
                grad = to_host(p.grad)
                nonfinite += int(np.size(grad) - np.count_nonzero(np.isfinite(grad)))
                g = _norm(grad) * unclip
            params[self.names.get(id(p), f"param{len(params)}")] = dict(
                update_to_data_log10=_log10_ratio(update, w),
                grad_norm=None if g is None else _finite(g),
                grad_to_data=None if g is None or w == 0 else _finite(g / w),
                weight_norm=_finite(w))
        cache = self._trace.cache
        cfg = self.model.cfg
        row = dict(step=step, lr=record.lr, loss=_finite(record.loss),
                   global_grad_norm=_finite(pre), clipped=bool(
                       not record.skipped and self.clip is not None and pre > self.clip),
                   **self._since, nonfinite=nonfinite + (not math.isfinite(record.loss)),
                   skipped=bool(record.skipped), params=params)
        if len(cache):  # absent when the step stopped before the forward (e.g. bad ids)
            row["activations"] = _clean(activation_stats(cache, cfg.mlp))
            row["attention"] = _clean(attention_entropy(cache, cfg.n_layers))
        return row

    def _check(self, step: int, row: dict) -> list[HealthWarning]:
        out = []
        for key, (low, high) in self.bands.items():
            group = "params" if key == "update_to_data_log10" else "activations"
            values = {name: stats[key] for name, stats in row.get(group, {}).items()
                      if stats.get(key) is not None and
                      (group != "params" or name in self.matrices)}
            for name, value in values.items():
                series = (key, name)
                outside = not low <= value <= high
                self._out_of_band[series] = self._out_of_band.get(series, 0) + 1 if outside \
                    else 0
                if not outside:
                    self._warned.discard(series)
            long = [n for (k, n), c in self._out_of_band.items()
                    if k == key and c >= self.patience and n in values]
            if not any((key, n) not in self._warned for n in long):
                continue
            worst = max(long, key=lambda n: abs(values[n] - (low + high) / 2))
            value = values[worst]
            what = {"update_to_data_log10": "update:data ratio (log10)",
                    "saturated": "saturated fraction", "dead": "dead-unit fraction"}.get(key, key)
            hint = {"update_to_data_log10": "learning rate too high?" if value > high
                    else "learning stalled?", "saturated": "learning rate too high?",
                    "dead": "units stopped learning"}.get(key, "")
            kind = "weight matrices" if group == "params" else group
            out.append(HealthWarning(step, (
                f"health: {what} outside [{low:g}, {high:g}] for {self.patience}+ checks in a "
                f"row in {len(long)} of {len(values)} {kind} at step {step} (worst {worst}: "
                f"{value:.2f}); {hint}")))
            self._warned.update((key, n) for n in long)
        if row["nonfinite"]:
            out.append(HealthWarning(step, f"health: {row['nonfinite']} non-finite values in "
                                           f"weights, gradients or loss at step {step}"))
        return out


def _clean(d):
    if isinstance(d, dict):
        return {k: _clean(v) for k, v in d.items()}
    return _finite(d) if isinstance(d, float) else d


def _truncate_rows(path: str, start: int) -> None:
    """Keep the rows of steps < start (and drop a torn last line)."""
    from ..formats.atomic import atomic_write
    kept = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] < start:
                kept.append(line if line.endswith("\n") else line + "\n")
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.writelines(kept)


def read_health(path) -> list[dict]:
    """Rows of a health.jsonl, each a dict with a numeric "step"; a torn last line (a run
    killed mid-write) is skipped, and NaN/Infinity (which the writer never emits) read as None,
    the writer's stand-in for a non-finite value.

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file (and line): not UTF-8 text, a line before the last that is
            not JSON, or a row that is not a JSON object with a numeric step.
    """
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    if lines and not lines[-1].strip():
        lines.pop()  # the newline that ends the last row
    rows = []
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        last = n == len(lines)
        try:
            row = json.loads(raw.decode("utf-8"), parse_constant=lambda _: None)
        except UnicodeDecodeError:
            if last:
                break
            raise ValueError(f"{path}:{n}: not a UTF-8 text health file") from None
        except ValueError as e:  # JSONDecodeError, or an integer past Python's digit limit
            if last:
                break
            raise ValueError(f"{path}:{n}: not a JSON line: {e}") from None
        try:
            check_real(row.get("step") if isinstance(row, dict) else None, "step")
        except ValueError:
            raise ValueError(f"{path}:{n}: not a health row (a JSON object with a finite "
                             f"numeric step): {raw[:60].decode('utf-8', 'replace')!r}") from None
        rows.append(row)
    return rows
