"""Training a sparse dictionary on activations streamed from a model.

    sae = train_dictionary(model, "stories.tokens", "blocks.2.residual_out", kind="topk",
                           d_sae=512, k=16, steps=3000, out="dicts/resid2")

The loop, as SAELens and the papers run it, on glassllm's `Tensor` and `AdamW`:

1. activations: windows of `seq_len` tokens are drawn at random from the corpus (a memory-mapped
   token file of `glassllm prepare`, an array of ids, or a text file and a tokenizer), the model
   runs on them with the lens (`run_with_cache(..., names=[hook_name], stop_at=...)`: the forward
   stops at the value read) and every position's value becomes a row of a bounded buffer;
2. the buffer (`ShuffleBuffer`, `buffer_tokens` rows) is shuffled and served in batches; when
   half of it has been served, that half is refilled from the model and the whole reshuffled,
   so a batch mixes many windows and documents (the buffer of Bricken et al. 2023 and SAELens);
3. each step: the loss of the dictionary's kind (`SAE.loss`), its gradient, for topk/jumprelu
   the decoder's gradient along each row removed, an AdamW step (no weight decay; the learning
   rate warmed up then decayed, `optim.lr_schedule`), the decoder rows renormalised;
4. dead features: a feature that has not fired for `dead_tokens` tokens is dead. TopK trains
   them through AuxK (Gao et al. 2024); relu and jumprelu re-initialise them every
   `resample_every` steps during the first half of training towards inputs the dictionary
   reconstructs worst (Bricken et al. 2023, "Neuron resampling");
5. checkpoints: every `checkpoint_every` steps, at the end and on Ctrl-C, the dictionary is
   written to `out` in SAELens' format (`saelens.save_saelens`) beside `training.npz` (the step,
   AdamW's moments, the dead-feature counters; atomic writes), from which a later call with the
   same `out` resumes. The activations after a resume are drawn anew (seeded by the step), so a
   resumed run is not bit-identical to an uninterrupted one.

Progress goes to `on_event` as the small event dataclasses below; nothing here prints.
"""
from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import time
from typing import Callable

import numpy as np

from ...formats.atomic import atomic_replace
from ...formats.token_file import TokenFile, sidecar_path
from ...model import GlassLM
from ...optim import AdamW, lr_schedule
from ...tensor import Tensor
from ..trace import names_for, run_with_cache, select_names, value_shape
from . import saelens
from .sae import SAE, Transcoder

STATE_FILENAME = "training.npz"


# --------------------------------------------------------------------------- events
@dataclasses.dataclass(frozen=True)
class DictionaryStep:
    """After update `step` (0-based) of `steps`: the batch's loss and its mean squared error
    (summed over channels, per token), fraction of variance unexplained, mean L0 (features active
    per token), the fraction of features dead, the learning rate, and rows (tokens) per second."""
    step: int
    steps: int
    loss: float
    mse: float
    fvu: float
    l0: float
    dead_fraction: float
    lr: float
    tokens_per_second: float


@dataclasses.dataclass(frozen=True)
class DictionaryResampled:
    """At update `step`, `count` dead features were re-initialised (relu, jumprelu)."""
    step: int
    count: int


@dataclasses.dataclass(frozen=True)
class DictionaryCheckpointed:
    """The dictionary and its training state after `step` updates were written to `path`."""
    step: int
    path: str


@dataclasses.dataclass(frozen=True)
class DictionaryResumed:
    """Training continues from the checkpoint in `path`, `step` updates already done."""
    step: int
    path: str


# --------------------------------------------------------------------------- corpus
def corpus_ids(data, tokenizer=None, split: str = "train") -> np.ndarray:
    """The corpus as a 1-D array of token ids: `data` an array of ids, a `TokenFile`, a token file
    of `glassllm prepare` (memory-mapped: read by pages as windows are drawn), a directory of
    `glassllm prepare` (its `{split}.bin`: train.bin to train on, val.bin to evaluate), or a
    text file encoded with `tokenizer` (read whole).

    Raises:
        FileNotFoundError: no such file, or a directory without `{split}.bin`.
        ValueError: a text file without a tokenizer, or a corpus of fewer than 2 tokens.
    """
    where = ""  # the file, for the message of a corpus too small
    if isinstance(data, TokenFile):
        ids = data.tokens
    elif isinstance(data, np.ndarray):
        ids = data.reshape(-1)
    else:
        path = os.fspath(data)
        if os.path.isdir(path):  # as `glassllm train --data DIR` and `features show` read one
            if not os.path.isfile(os.path.join(path, f"{split}.bin")):
                raise FileNotFoundError(f"{path}: a directory without {split}.bin (not one "
                                        f"`glassllm prepare` wrote)")
            path = os.path.join(path, f"{split}.bin")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such corpus file")
        if os.path.isfile(sidecar_path(path)):
            ids = TokenFile(path).tokens
        elif tokenizer is None:
            raise ValueError(f"{path}: a text corpus needs the model's tokenizer (or give a "
                             f"token file of `glassllm prepare`)")
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                ids = np.asarray(tokenizer.encode(f.read()))
        where = f"{path}: "
    if len(ids) < 2:
        raise ValueError(f"{where}the corpus holds {len(ids)} token(s); windows need at least 2")
    return ids


HELD_OUT = 0.1  # the tail of a one-file corpus kept for evaluation (nanoGPT's prepare: 90/10)


def train_and_evaluation_corpora(model: GlassLM, data, tokenizer=None, eval_data=None):
    """(train_ids, eval_ids, words): what a dictionary of `model` trains on and is evaluated
    on, so its measurements are of text it never saw. A `glassllm prepare` directory: its
    train.bin and val.bin; `eval_data` given: `data` whole and `eval_data` (its val.bin if a
    directory); otherwise one corpus, its last tenth (HELD_OUT) held out, as nanoGPT's
    prepare.py splits a corpus 90/10. `words` says which, for a reader ("the last 10% of X
    (N tokens)"). Ids are checked against the model's vocabulary here, where the files'
    names are known (`check_vocabulary`).

    Raises:
        FileNotFoundError / ValueError: as `corpus_ids` and `check_vocabulary`; a one-file
            corpus whose tenth is under 2 tokens (one line naming it: give an evaluation
            corpus).
    """
    if eval_data is not None or (not isinstance(data, (np.ndarray, TokenFile)) and
                                 os.path.isdir(os.fspath(data))):
        other = data if eval_data is None else eval_data
        train_ids, eval_ids = corpus_ids(data, tokenizer), corpus_ids(other, tokenizer, "val")
        words = f"{_name(other)} (held out)"
    else:
        ids = corpus_ids(data, tokenizer)
        n_eval, other = int(len(ids) * HELD_OUT), data
        if n_eval < 2:
            raise ValueError(f"{_name(data)}: {len(ids)} tokens are too few to hold out a "
                             f"tenth for the evaluation; give a larger corpus or a separate "
                             f"one to evaluate on")
        train_ids, eval_ids = ids[:len(ids) - n_eval], ids[len(ids) - n_eval:]
        words = f"the last {HELD_OUT:.0%} of {_name(data)} ({n_eval} tokens, held out from " \
                f"training)"
    check_vocabulary(train_ids, model, data)
    check_vocabulary(eval_ids, model, other)
    return train_ids, eval_ids, words


def _name(data) -> str:
    return os.fspath(data) if isinstance(data, (str, os.PathLike)) else "the corpus"


def check_vocabulary(ids: np.ndarray, model: GlassLM, data) -> None:
    """Raise ValueError naming the corpus when an id is outside the model's vocabulary (a
    token file of another tokenizer): the forward's own message names no file, and an id
    drawn rarely would fail mid-run. Reads a memory-mapped corpus once."""
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= model.cfg.vocab_size:
        raise ValueError(f"{_name(data)}: token id {low if low < 0 else high} is "
                         f"outside the model's vocabulary [0, {model.cfg.vocab_size}) (a token "
                         f"file of another tokenizer?)")


class ActivationSource:
    """Rows of the value(s) a dictionary reads, from the model on random windows of the corpus.

    `rows(n)` -> (inputs (n', d_in), targets (n', d_out) or None), n' >= n rows, float32: every
    position of ceil(n / seq_len) windows of `seq_len` tokens. Targets are the transcoder's
    `out_name` values of the same positions.
    """

    def __init__(self, model: GlassLM, ids: np.ndarray, hook_name: str,
                 out_name: str | None, seq_len: int, rng: np.random.Generator):
        self.model, self.ids, self.rng = model, ids, rng
        self.seq_len = max(1, min(seq_len, model.cfg.max_len, len(ids)))
        self.names = [one_name(model, n) for n in [hook_name] + ([out_name] if out_name else [])]
        order = names_for(model.cfg)
        self.stop_at = max(self.names, key=order.index)  # the forward stops after the last one

    def rows(self, n: int, windows_per_call: int = 32):
        inputs, targets = [], []
        n_windows = max(1, math.ceil(n / self.seq_len))
        for start in range(0, n_windows, windows_per_call):
            count = min(windows_per_call, n_windows - start)
            begin = self.rng.integers(0, len(self.ids) - self.seq_len + 1, size=count)
            windows = np.stack([self.ids[b:b + self.seq_len] for b in begin]).astype(np.int64)
            _, cache = run_with_cache(self.model, windows, names=self.names,
                                      stop_at=self.stop_at, max_bytes=None)
            inputs.append(_flat(cache[self.names[0]]))
            if len(self.names) > 1:
                targets.append(_flat(cache[self.names[1]]))
        return np.concatenate(inputs), (np.concatenate(targets) if targets else None)


def one_name(model: GlassLM, name: str) -> str:
    """The one value of the names table `name` means (a glassllm or TransformerLens name).

    Raises:
        ValueError: an unknown name (naming the nearest), or a pattern."""
    if not isinstance(name, str) or any(c in name for c in "*?["):
        raise ValueError(f"a dictionary reads one named value, not the pattern {name!r}")
    return select_names(model.cfg, [name])[0]


def use_glassllm_names(model: GlassLM, sae: SAE) -> None:
    """Rename a dictionary's TransformerLens hook names (`blocks.2.hook_resid_post`, as
    SAELens' dictionaries are saved) to glassllm's names of the same values on `model`
    (`lens.transformer_lens_names`), in place: the lens records values under glassllm's names.

    Raises:
        ValueError: a hook glassllm has no value for (one line naming it)."""
    from ..transformer_lens_names import is_transformer_lens_name, to_glassllm
    for attr in ("hook_name", "out_name"):
        name = getattr(sae, attr, None)
        if is_transformer_lens_name(name):
            setattr(sae, attr, to_glassllm(name, model.cfg.family,
                                           model.cfg.positions == "rope"))


def check_names(model: GlassLM, sae: SAE, rows_per_token: int | None = None) -> None:
    """Raise ValueError (one line) when `sae` does not fit `model`: its hook_name (and a
    transcoder's out_name, which the forward must reach after it) is not a value of this
    model, or not of width d_in (d_out); with rows_per_token=1, a value of several rows per
    token (a head's q, (B, T, H, d); a pattern). TransformerLens names are renamed first
    (`use_glassllm_names`)."""
    use_glassllm_names(model, sae)
    cfg = model.cfg
    names = [(sae.hook_name, "reads", sae.d_in)]
    if isinstance(sae, Transcoder):
        names.append((sae.out_name, "writes", sae.d_out))
    for name, verb, width in names:
        layer = name.split(".")[1] if isinstance(name, str) and name.startswith("blocks.") \
            else None
        if layer is not None and not (layer.isdigit() and int(layer) < cfg.n_layers):
            raise ValueError(f"dictionary {verb} {name!r} but the model has {cfg.n_layers} "
                             f"layers")
        try:
            shape = value_shape(cfg, name, 1, 1)
        except (KeyError, IndexError, AttributeError):
            raise ValueError(f"dictionary {verb} {name!r}, which is not a value of this "
                             f"{cfg.family} model (see glassllm.lens.trace.NAMES)") from None
        if rows_per_token == 1 and len(shape) != 3:  # (B, T, d): one row per token
            raise ValueError(f"dictionary {verb} {name!r}, a value of several rows per token "
                             f"(shape {'(B, H, T, T)' if shape[1] != 1 else '(B, T, H, d)'}); "
                             f"the feature views show one row per token (a residual, an MLP's "
                             f"value, an attention output)")
        if shape[-1] != width:
            raise ValueError(f"dictionary {verb} {name!r} of width {width}, but this model's "
                             f"is {shape[-1]}: it was trained on another model")
    order = names_for(cfg)
    if len(names) == 2 and order.index(sae.out_name) <= order.index(sae.hook_name):
        raise ValueError(f"transcoder reads {sae.hook_name!r} and writes {sae.out_name!r}, "
                         f"which the forward computes before it")


def _flat(value: np.ndarray) -> np.ndarray:
    return np.array(value, dtype=np.float32).reshape(-1, value.shape[-1])


class ShuffleBuffer:
    """A bounded buffer of activation rows served in shuffled batches.

    Filled with `capacity` rows at the start; `batch(n)` serves the next n rows of the shuffled
    buffer; when half the buffer has been served, the served rows are replaced by fresh ones
    from `source` and the whole buffer is shuffled again. Every row is served at most once.
    """

    def __init__(self, source: ActivationSource, capacity: int, rng: np.random.Generator):
        self.source, self.rng = source, rng
        x, y = source.rows(capacity)
        self.capacity = len(x)
        self.x, self.y = x, y
        self._shuffle()

    def _shuffle(self) -> None:
        order = self.rng.permutation(self.capacity)
        self.x = self.x[order]
        self.y = None if self.y is None else self.y[order]
        self.served = 0

    def batch(self, n: int):
        """(x (n, d_in), y (n, d_out) or None), rows never served before."""
        if self.served + n > self.capacity // 2:
            fresh_x, fresh_y = self.source.rows(self.served)
            self.x[:self.served] = fresh_x[:self.served]
            if self.y is not None:
                self.y[:self.served] = fresh_y[:self.served]
            self._shuffle()
        rows = slice(self.served, self.served + n)
        self.served += n
        return self.x[rows], None if self.y is None else self.y[rows]


# --------------------------------------------------------------------------- the loop
@dataclasses.dataclass
class Progress:
    """What training carries from step to step besides the weights and AdamW: the updates done
    and, per feature, the tokens seen since it last fired (d_sae,)."""
    step: int
    since_fired: np.ndarray


def default_lr(d_sae: int) -> float:
    """2e-4 at 16,384 features, scaled as 1 / sqrt(d_sae) (Gao et al. 2024, §A.2's fit)."""
    return 2e-4 * math.sqrt(16384 / d_sae)


def train_dictionary(model: GlassLM, data, hook_name: str, *, kind: str = "topk", d_sae: int,
                     k: int | None = None, steps: int, out=None, out_name: str | None = None,
                     tokenizer=None, batch_size: int = 4096, lr: float | None = None,
                     warmup: int | None = None, seq_len: int = 128,
                     buffer_tokens: int | None = None, seed: int = 0,
                     dead_tokens: int | None = None, resample_every: int | None = None,
                     checkpoint_every: int = 1000, on_event: Callable | None = None,
                     **options) -> SAE:
    """Train a dictionary of `kind` with `d_sae` features on the value `hook_name` of `model`
    (a `Transcoder` predicting `out_name` when given), for `steps` updates of `batch_size` rows.

    Args:
        data: the corpus (`corpus_ids`: a token file, an id array, a text file + `tokenizer`).
        out: the directory to write (SAELens' format + `training.npz`); resumes from it when it
            holds a checkpoint of the same settings. None: nothing written.
        lr: AdamW's rate (None: `default_lr`), warmed up over `warmup` steps (None: steps // 20)
            then decayed along a cosine to a tenth (`optim.lr_schedule`).
        seq_len: tokens per window; buffer_tokens: the shuffle buffer's rows (None: 32 batches).
        dead_tokens: a feature silent for this many tokens is dead (None: 25 batches).
        resample_every: relu/jumprelu resampling period in steps (None: steps // 10; 0: never).
        checkpoint_every: steps between checkpoints (with `out`).
        on_event: called with each `DictionaryStep`, `DictionaryResampled`,
            `DictionaryCheckpointed`, `DictionaryResumed`.
        options: more `SAE` arguments (l1_coefficient, aux_k, threshold, ...).

    Returns the trained `SAE` / `Transcoder`. Ctrl-C writes a checkpoint, then re-raises.

    Raises:
        ValueError: an unknown name, bad sizes or options, a corpus too small, an `out` holding
            a dictionary of other settings; a loss or weight that became NaN or infinite
            (nothing more written). FileNotFoundError: no such corpus file.
    """
    if steps < 1 or batch_size < 1:
        raise ValueError(f"train_dictionary: steps ({steps}) and batch_size ({batch_size}) "
                         f"must be at least 1")
    if out is not None:
        check_out_directory(out)
    if lr is not None and not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        # a NaN or negative rate trained a NaN (or worsening) dictionary and saved it
        raise ValueError(f"train_dictionary: lr must be a positive finite number, got {lr!r}")
    emit = on_event or (lambda event: None)
    sae = new_dictionary(model, hook_name, out_name, kind=kind, d_sae=d_sae, k=k, seed=seed,
                         **options)
    check_names(model, sae)  # a transcoder's out_name computed before its hook_name
    if out is not None:  # a dictionary SAELens' format cannot hold: refused before training
        saelens.architecture_of(sae)
    ids = corpus_ids(data, tokenizer)
    check_vocabulary(ids, model, data)
    opt = AdamW(sae.parameters(), lr=lr or default_lr(d_sae), betas=(0.9, 0.999),
                weight_decay=0.0)
    progress = resume(out, sae, opt, emit)
    rng = np.random.default_rng([seed, progress.step])
    source = ActivationSource(model, ids, sae.hook_name, out_name and sae.out_name, seq_len, rng)
    buffer = ShuffleBuffer(source, max(buffer_tokens or 32 * batch_size, 2 * batch_size), rng)
    if progress.step == 0:
        initialise_b_dec(sae, buffer)
    plan = dict(steps=steps, lr=opt.lr, warmup=steps // 20 if warmup is None else warmup,
                batch_size=batch_size, dead_tokens=dead_tokens or 25 * batch_size,
                resample_every=steps // 10 if resample_every is None else resample_every)
    try:
        _loop(sae, opt, buffer, progress, plan, out, checkpoint_every, emit, rng)
    except KeyboardInterrupt:
        if out is not None:
            checkpoint(out, sae, opt, progress, emit)
        raise
    if out is not None:
        checkpoint(out, sae, opt, progress, emit)
    return sae


def check_out_directory(out) -> None:
    """Raise ValueError (naming it) when `out` cannot become a dictionary's directory: it is
    empty, or it or the nearest of its parents that exists is a file. Said before training,
    not at the first checkpoint."""
    if not os.fspath(out):  # normpath would make it ".", and save_saelens fail on ""
        raise ValueError("out is an empty path; name the dictionary's directory")
    path = os.path.normpath(os.fspath(out))
    while path not in ("", ".", os.sep) and not os.path.lexists(path):
        path = os.path.dirname(path)
    if path not in ("", ".") and not os.path.isdir(path):
        where = "is" if path == os.path.normpath(os.fspath(out)) else f"is inside {path}, which is"
        raise ValueError(f"{os.fspath(out)}: {where} a file; a dictionary is written to a "
                         f"directory")


def _loop(sae, opt, buffer, progress, plan, out, checkpoint_every, emit, rng) -> None:
    """The updates from progress.step to plan["steps"] (module docstring, steps 3-5)."""
    started, rows = time.perf_counter(), 0
    while progress.step < plan["steps"]:
        step = progress.step
        lr = lr_schedule(step, plan["steps"], plan["lr"], plan["warmup"])
        x, y = buffer.batch(plan["batch_size"])
        dead = progress.since_fired >= plan["dead_tokens"]
        parts, f = update(sae, opt, x, y, lr, dead)
        if not (math.isfinite(parts["loss"]) and
                all(np.isfinite(p.data).all() for p in sae.parameters())):
            # stopped before any checkpoint holds it: load_saelens refuses a NaN dictionary
            raise ValueError(f"train_dictionary: the dictionary diverged at step {step} (a "
                             f"loss or weight not finite; lr {lr:.3g} too high?); "
                             + ("nothing saved" if out is None else
                                f"{out} keeps its last checkpoint, if any"))
        progress.since_fired += len(x)
        progress.since_fired[(f > 0).any(axis=0)] = 0
        progress.step = step + 1
        rows += len(x)
        target = x if y is None else y
        variance = float(((target - target.mean(axis=0)) ** 2).sum(axis=-1).mean())
        emit(DictionaryStep(step, plan["steps"], parts["loss"], parts["mse"],
                            parts["mse"] / max(variance, 1e-30),
                            float((f > 0).sum(axis=-1).mean()), float(dead.mean()), lr,
                            rows / max(time.perf_counter() - started, 1e-9)))
        every = plan["resample_every"]
        if sae.kind != "topk" and every and (step + 1) % every == 0 and step < plan["steps"] // 2:
            count = resample_dead(sae, opt, x, y, dead, rng)
            progress.since_fired[dead] = 0
            emit(DictionaryResampled(step, count))
        if out is not None and checkpoint_every and progress.step % checkpoint_every == 0 \
                and progress.step < plan["steps"]:
            checkpoint(out, sae, opt, progress, emit)


def update(sae: SAE, opt: AdamW, x: np.ndarray, y: np.ndarray | None, lr: float,
           dead: np.ndarray) -> tuple[dict, np.ndarray]:
    """One training step on the batch x (N, d_in) (y (N, d_out) for a transcoder): loss,
    backward, the decoder's parallel gradient removed, AdamW, the decoder rows renormalised
    (kinds that constrain the decoder), jumprelu thresholds kept >= 0. Returns (the loss's
    parts with "loss" added, the feature activations f (N, d_sae))."""
    loss, parts, f = sae.loss(Tensor(x), None if y is None else Tensor(y), dead=dead)
    opt.zero_grad()
    loss.backward()
    if sae.constrain_decoder:
        sae.remove_parallel_gradient()
    opt.step(lr)
    if sae.constrain_decoder:
        sae.normalize_decoder()
    if sae.kind == "jumprelu":
        np.maximum(sae.threshold.data, 0.0, out=sae.threshold.data)
    return {"loss": loss.item(), **parts}, f


def new_dictionary(model: GlassLM, hook_name: str, out_name: str | None, **options) -> SAE:
    """An `SAE` of the value `hook_name` (or a `Transcoder` to `out_name`), its sizes read from
    the names table."""
    hook_name = one_name(model, hook_name)
    d_in = _width(model, hook_name)
    if out_name is None:
        return SAE(d_in, hook_name=hook_name, **options)
    out_name = one_name(model, out_name)
    d_out = _width(model, out_name)
    return Transcoder(d_in, options.pop("d_sae"), d_out, hook_name=hook_name, out_name=out_name,
                      **options)


def _width(model: GlassLM, name: str) -> int:
    """The last axis of the value `name`, a fixed width of the model.

    Raises:
        ValueError: a value whose last axis is a sequence position (attention scores and
            patterns, (B, H, T, T)): no dictionary has a width to read it with."""
    width = value_shape(model.cfg, name, 1, 1)[-1]
    if value_shape(model.cfg, name, 1, 2)[-1] != width:
        raise ValueError(f"{name}: its last axis is the key position, not a fixed width; a "
                         f"dictionary reads a value of one width per position (a residual, "
                         f"an MLP's hidden value, a head's q/k/v)")
    return width


def initialise_b_dec(sae: SAE, buffer: ShuffleBuffer) -> None:
    """b_dec <- the mean of the buffer's targets: the reconstruction starts at the data's
    centre (SAELens' b_dec_init_method "mean"; Bricken et al. 2023 use the geometric median)."""
    target = buffer.x if buffer.y is None else buffer.y
    sae.b_dec.data[...] = target.mean(axis=0)


def resample_dead(sae: SAE, opt: AdamW, x, y, dead: np.ndarray, rng) -> int:
    """Re-initialise the dead features (Bricken et al. 2023, "Neuron resampling"): each takes an
    input of the batch drawn with probability proportional to the square of its reconstruction
    loss; its decoder row becomes that target's direction (at the alive rows' mean norm), its
    encoder column the input's direction times 0.2 the alive columns' mean norm, its bias 0, its
    threshold the initial one, and AdamW's moments of these entries restart at 0. Returns how
    many were re-initialised."""
    count = int(dead.sum())
    if count == 0:
        return 0
    target = x if y is None else y
    loss = ((target - sae.decode(sae.encode(x))) ** 2).sum(axis=-1).astype(np.float64)
    weights = loss ** 2
    p = weights / weights.sum() if weights.sum() > 0 else None
    picked = rng.choice(len(x), size=count, p=p)
    alive = ~dead if (~dead).any() else dead
    dec_norm = np.linalg.norm(sae.W_dec.data[alive], axis=-1).mean()
    enc_norm = np.linalg.norm(sae.W_enc.data[:, alive], axis=0).mean()
    unit = lambda a: a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)  # noqa
    sae.W_dec.data[dead] = unit(target[picked]) * dec_norm
    sae.W_enc.data[:, dead] = (unit(x[picked]) * 0.2 * enc_norm).T
    sae.b_enc.data[dead] = 0.0
    if sae.kind == "jumprelu":
        sae.threshold.data[dead] = float(np.median(sae.threshold.data[alive]))
    by_feature = {id(sae.W_enc): (slice(None), dead)}          # W_enc's features: its columns
    for p in (sae.b_enc, sae.W_dec, getattr(sae, "threshold", None)):
        if p is not None:
            by_feature[id(p)] = dead                             # the others': their rows
    for p, m, v in zip(opt.params, opt.m, opt.v):
        if id(p) in by_feature:
            m[by_feature[id(p)]] = 0.0
            v[by_feature[id(p)]] = 0.0
    return count


# --------------------------------------------------------------------------- checkpoints
def checkpoint(out, sae: SAE, opt: AdamW, progress: Progress, emit) -> None:
    """Write the dictionary (SAELens' format) and `training.npz` (the step, AdamW's moments and
    counts, the dead-feature counters, the settings) into the directory `out`, atomically, with
    Ctrl-C, SIGTERM and SIGHUP held until all three files are written (`training.lock.
    signals_held`): a second Ctrl-C while the first one's checkpoint was written left the
    weights without training.npz, which a resume refuses."""
    from ...training.lock import signals_held
    out = os.fspath(out)
    with signals_held():
        _write_checkpoint(out, sae, opt, progress)
        emit(DictionaryCheckpointed(progress.step, out))


def _write_checkpoint(out: str, sae: SAE, opt: AdamW, progress: Progress) -> None:
    saelens.save_saelens(sae, out)
    arrays = {"step": np.int64(progress.step), "since_fired": progress.since_fired,
              "adam_t": np.int64(opt.t), "adam_steps": np.asarray(opt.steps, np.int64),
              "settings": np.asarray(json.dumps(sae.config(), sort_keys=True))}
    for (name, _), m, v in zip(sae.named_parameters(), opt.m, opt.v):
        arrays[f"m.{name}"], arrays[f"v.{name}"] = m, v

    def write(tmp):
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        with open(tmp, "wb") as f:
            f.write(buffer.getvalue())

    atomic_replace(os.path.join(out, STATE_FILENAME), write,
                   doing="cannot write the dictionary's training state")


def resume(out, sae: SAE, opt: AdamW, emit) -> Progress:
    """The progress of the checkpoint in `out` (its weights and AdamW's state loaded into sae
    and opt), or a fresh start when `out` is None or holds no dictionary.

    Raises:
        ValueError: `out` holds a dictionary of other settings, or one without training state.
    """
    fresh = Progress(0, np.zeros(sae.d_sae, dtype=np.int64))
    if out is None or not os.path.exists(os.path.join(os.fspath(out), saelens.CFG_FILENAME)):
        return fresh
    out = os.fspath(out)
    state_path = os.path.join(out, STATE_FILENAME)
    if not os.path.isfile(state_path):
        raise ValueError(f"{out}: holds a dictionary without {STATE_FILENAME}; nothing to "
                         f"resume (choose another output directory)")
    state = read_state(state_path)
    saved = state["settings"]
    asked = json.loads(json.dumps(sae.config(), sort_keys=True))
    for key in asked:
        if saved.get(key) != asked[key]:
            raise ValueError(f"{out}: holds a dictionary with {key} = {saved.get(key)!r}, "
                             f"not {asked[key]!r}; resume with the same settings or choose "
                             f"another output directory")
    check_state(state, state_path, sae)
    loaded = saelens.load_saelens(out)
    for (name, p), (_, q), m, v in zip(sae.named_parameters(), loaded.named_parameters(),
                                       opt.m, opt.v):
        p.data[...] = q.data
        m[...], v[...] = state[f"m.{name}"], state[f"v.{name}"]
    opt.t, opt.steps = int(state["adam_t"]), [int(s) for s in state["adam_steps"]]
    progress = Progress(int(state["step"]), state["since_fired"].astype(np.int64))
    emit(DictionaryResumed(progress.step, out))
    return progress


def read_state(path: str) -> dict:
    """`training.npz` of a checkpoint as a dict of arrays, its "settings" parsed (a dict).

    Raises:
        ValueError: one line naming the file: not a readable .npz (truncated, not a zip, object
            arrays), or "settings" missing or not a JSON object.
    """
    import zipfile
    try:
        with np.load(path, allow_pickle=False) as npz:
            state = {key: npz[key] for key in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: not a readable training state ({' '.join(str(e).split())})"
                         ) from None
    try:
        state["settings"] = json.loads(str(state["settings"]))
    except (KeyError, ValueError):
        state["settings"] = None
    if not isinstance(state["settings"], dict):
        raise ValueError(f"{path}: entry 'settings' is missing or not a JSON object")
    return state


def check_state(state: dict, path: str, sae: SAE) -> None:
    """Every entry of `read_state`'s dict checked against `sae`: "step", "adam_t" (>= 0),
    "adam_steps" (one per parameter), "since_fired" (d_sae,), "m.NAME" / "v.NAME" of each
    parameter's shape; numbers, finite.

    Raises:
        ValueError: one line naming the file and the entry: missing, of the wrong shape or type,
            or not finite (a resumed run would train, and save over the checkpoint, a NaN
            dictionary).
    """
    params = dict(sae.named_parameters())
    want = {"step": (), "adam_t": (), "adam_steps": (len(params),), "since_fired": (sae.d_sae,)}
    want.update({f"{mv}.{name}": p.shape for name, p in params.items() for mv in "mv"})
    for key, shape in want.items():
        if key not in state:
            raise ValueError(f"{path}: entry {key!r} is missing")
        value = state[key]
        if value.shape != shape or value.dtype.kind not in "iuf":
            raise ValueError(f"{path}: entry {key!r} has shape {value.shape} and dtype "
                             f"{value.dtype}; expected numbers of shape {shape}")
        if not np.isfinite(value).all() or key in ("step", "adam_t") and value < 0:
            raise ValueError(f"{path}: entry {key!r} holds a negative, NaN or infinite value")
