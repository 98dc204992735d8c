"""How good a dictionary is, measured as the field measures it (Bricken et al. 2023; Gao et al.
2024, §3-4; SAELens' evals):

- L0: features active per token, averaged over tokens (sparsity);
- FVU, the fraction of variance unexplained: sum ||x - x_hat||^2 / sum ||x - mean(x)||^2 over
  every token (the mean over the tokens evaluated; for a transcoder, y and y_hat);
- dead features: never active on the tokens evaluated; dense: active on more than
  `dense_density` of them (Gao et al. 2024 count latents above 10% as dense);
- cross-entropy loss (next token, nats) three ways: clean; spliced, the value replaced by the
  dictionary's reconstruction as the forward passes it (`run_with_hooks`); zero-ablated, the
  value replaced by zeros; and the loss recovered (zero - spliced) / (zero - clean): 1 when the
  reconstruction is as good as the value for the model, 0 when no better than nothing.

    report = evaluate_dictionary(model, sae, "stories.tokens", out="dicts/resid2")
    print(report)          # a few lines; report.to_json() is stored as evaluation.json

The report is stored beside the dictionary in SAELens' directory as `evaluation.json` (SAELens
ignores other files); `load_report(path)` reads it back.
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from ... import functional as F
from ...formats.atomic import atomic_write
from ...model import GlassLM
from ...tensor import Tensor, no_grad
from ..trace import run_with_cache, run_with_hooks
from .sae import SAE, Transcoder
from .saelens import EVALUATION_FILENAME
from .train import check_names, check_vocabulary, corpus_ids


@dataclasses.dataclass
class DictionaryReport:
    """`evaluate_dictionary`'s measurements (module docstring). density: (d_sae,) the fraction
    of tokens on which each feature is active. Losses in nats per token."""
    hook_name: str
    kind: str
    d_sae: int
    k: int | None
    tokens: int
    l0: float
    fvu: float
    mse: float
    dead: int
    dense: int
    dense_density: float
    ce_clean: float
    ce_spliced: float
    ce_zero: float
    density: np.ndarray

    @property
    def loss_recovered(self) -> float:
        """(zero - spliced) / (zero - clean); NaN when zero-ablation costs nothing."""
        gap = self.ce_zero - self.ce_clean
        return (self.ce_zero - self.ce_spliced) / gap if gap != 0 else float("nan")

    @property
    def dead_fraction(self) -> float:
        return self.dead / self.d_sae

    @property
    def dense_fraction(self) -> float:
        return self.dense / self.d_sae

    def __str__(self) -> str:
        k = f", k={self.k}" if self.k is not None else ""
        return "\n".join([
            f"{self.kind} dictionary of {self.hook_name}: {self.d_sae} features{k}, "
            f"{self.tokens} tokens evaluated",
            f"  L0 {self.l0:.2f} features per token, FVU {self.fvu:.4f} (MSE {self.mse:.4g})",
            f"  dead {self.dead} ({self.dead_fraction:.1%}), dense (> {self.dense_density:.0%} "
            f"of tokens) {self.dense} ({self.dense_fraction:.1%})",
            f"  CE loss clean {self.ce_clean:.4f}, spliced {self.ce_spliced:.4f}, zero-ablated "
            f"{self.ce_zero:.4f} nats: loss recovered {self.loss_recovered:.1%}"])

    def to_json(self) -> dict:
        """A JSON dict of every field (density as a list) and the derived fractions."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["density"] = [float(d) for d in self.density]
        out.update(loss_recovered=self.loss_recovered, dead_fraction=self.dead_fraction,
                   dense_fraction=self.dense_fraction)
        return out

    @classmethod
    def from_json(cls, data: dict) -> "DictionaryReport":
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in names}
        fields["density"] = np.asarray(fields.get("density", []), dtype=np.float64)
        return cls(**fields)


def save_report(report: DictionaryReport, path) -> str:
    """Write `report` as `evaluation.json` in the dictionary's directory `path` (atomically);
    returns the file's path."""
    where = os.path.join(os.fspath(path), EVALUATION_FILENAME)
    with atomic_write(where, "w", doing="cannot write the dictionary's evaluation") as f:
        json.dump(report.to_json(), f, indent=1)
    return where


def load_report(path) -> DictionaryReport | None:
    """The report stored in the dictionary's directory `path`, or None if there is none.

    Raises:
        ValueError: the file is not a report (naming it)."""
    where = os.path.join(os.fspath(path), EVALUATION_FILENAME)
    if not os.path.isfile(where):
        return None
    try:
        with open(where, encoding="utf-8") as f:
            return DictionaryReport.from_json(json.load(f))
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: not a dictionary evaluation ({e})") from None


def mean_cross_entropy(logits: np.ndarray, targets: np.ndarray) -> float:
    """The mean next-token cross-entropy (nats) of logits (B, T, V) against targets (B, T)."""
    with no_grad():
        return float(F.cross_entropy(Tensor(logits), targets).item())


def splice_hooks(sae: SAE, replace: str = "reconstruction") -> list:
    """The `run_with_hooks` hooks that put the dictionary into the forward: the value the
    dictionary predicts (hook_name for an SAE, out_name for a transcoder) replaced by its
    reconstruction (replace="reconstruction") or by zeros (replace="zero")."""
    if replace == "zero":
        name = sae.out_name if isinstance(sae, Transcoder) else sae.hook_name
        return [(name, lambda value, _: np.zeros_like(value))]
    if not isinstance(sae, Transcoder):
        return [(sae.hook_name, lambda value, _: sae.decode(sae.encode(value)).astype(
            value.dtype))]
    seen = {}

    def read(value, _):
        seen["x"] = np.array(value)

    return [(sae.hook_name, read),
            (sae.out_name, lambda value, _: sae.decode(sae.encode(seen["x"])).astype(
                value.dtype))]


def evaluate_dictionary(model: GlassLM, sae: SAE, data, *, tokenizer=None,
                        tokens: int = 32768, seq_len: int = 128, batch_windows: int = 16,
                        seed: int = 1, dense_density: float = 0.1, out=None) -> DictionaryReport:
    """Measure `sae` on the model's values over windows of the corpus `data` (as
    `train.corpus_ids`; a `glassllm prepare` directory: its val.bin): about `tokens`
    positions, in windows of `seq_len` (+1 for the targets) drawn with `seed`,
    `batch_windows` windows per forward. Each batch runs three forwards:
    clean (with the values read), spliced and zero-ablated (`splice_hooks`).

    out: a dictionary directory to store the report in (`save_report`).

    Returns a `DictionaryReport`.

    Raises:
        ValueError: the dictionary's names are not the model's, or their widths differ
            (`train.check_names`); a corpus too small, or of ids past the model's vocabulary;
            FileNotFoundError: no such corpus file.
    """
    check_names(model, sae)  # renames a SAELens dictionary's TransformerLens hook names
    ids = corpus_ids(data, tokenizer, split="val")  # a prepare directory: its held-out part
    check_vocabulary(ids, model, data)
    seq_len = max(1, min(seq_len, model.cfg.max_len, len(ids) - 1))
    rng = np.random.default_rng(seed)
    n_windows = max(1, -(-tokens // seq_len))
    sums = _Sums(sae.d_sae)
    for start in range(0, n_windows, batch_windows):
        count = min(batch_windows, n_windows - start)
        begin = rng.integers(0, len(ids) - seq_len, size=count)
        windows = np.stack([ids[b:b + seq_len + 1] for b in begin]).astype(np.int64)
        _measure_batch(model, sae, windows[:, :-1], windows[:, 1:], sums)
    report = sums.report(sae, dense_density)
    if out is not None:
        save_report(report, out)
    return report


def _measure_batch(model, sae, inputs, targets, sums) -> None:
    """Add one batch's clean values and three losses to `sums`."""
    names = [sae.hook_name] + ([sae.out_name] if isinstance(sae, Transcoder) else [])
    logits, cache = run_with_cache(model, inputs, names=names, max_bytes=None)
    x = cache[sae.hook_name].reshape(-1, sae.d_in)
    y = cache[names[-1]].reshape(-1, sae.d_out)
    if x.shape[-1] != sae.d_in or y.shape[-1] != sae.d_out:
        raise ValueError(f"the dictionary reads width {sae.d_in}, the model's value has "
                         f"{x.shape[-1]}")
    f = sae.encode(x)                                                # (N, S)
    y_hat = sae.decode(f)
    n = len(inputs) * inputs.shape[1]  # token positions: a per-head value has H rows each
    sums.add(y, y_hat, f, n, [mean_cross_entropy(logits, targets) * n,
                           mean_cross_entropy(run_with_hooks(model, inputs, splice_hooks(sae)),
                                              targets) * n,
                           mean_cross_entropy(run_with_hooks(model, inputs,
                                                             splice_hooks(sae, "zero")),
                                              targets) * n])


class _Sums:
    """Running float64 sums over the evaluated tokens."""

    def __init__(self, d_sae: int):
        self.n = self.positions = 0
        self.fired = np.zeros(d_sae, dtype=np.int64)
        self.active = 0
        self.error = self.square = 0.0
        self.total = None
        self.ce = np.zeros(3)

    def add(self, y, y_hat, f, positions, ce) -> None:
        """One batch: values y, y_hat (N, d_out), activations f (N, d_sae) and the three
        losses summed over its `positions` tokens (N rows: H per token for a per-head value)."""
        y = y.astype(np.float64)
        self.n += len(y)
        self.positions += positions
        on = f > 0
        self.fired += on.sum(axis=0)
        self.active += int(on.sum())
        self.error += float(((y - y_hat) ** 2).sum())
        self.square += float((y ** 2).sum())
        self.total = y.sum(axis=0) if self.total is None else self.total + y.sum(axis=0)
        self.ce += ce

    def report(self, sae: SAE, dense_density: float) -> DictionaryReport:
        # sum ||y - mean||^2 = sum ||y||^2 - n ||mean||^2
        variance = self.square - float((self.total ** 2).sum()) / self.n
        density = self.fired / self.n
        clean, spliced, zero = self.ce / self.positions  # losses are per token, not per row
        return DictionaryReport(
            hook_name=sae.hook_name, kind=sae.kind, d_sae=sae.d_sae, k=sae.k, tokens=self.n,
            l0=self.active / self.n, fvu=self.error / max(variance, 1e-300),
            mse=self.error / self.n, dead=int((self.fired == 0).sum()),
            dense=int((density > dense_density).sum()), dense_density=dense_density,
            ce_clean=float(clean), ce_spliced=float(spliced), ce_zero=float(zero),
            density=density)
