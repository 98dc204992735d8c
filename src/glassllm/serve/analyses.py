"""The answers of the model API, as JSON-ready dicts: each one a call of the library's own
analyses (`glassllm.lens.interpret`, `glassllm.lens.trace`, `glassllm.generate`) on one
prompt, with its cost checked against `Limits` before it runs. Nothing here computes a number
of its own: values are the library's, rounded for the page.

Every function takes a `Loaded` (the model, its tokenizer and token texts) and ids (T,) and
runs in a worker thread under the model's lock (`glassllm.serve.app`).
"""
from __future__ import annotations

import math

import numpy as np

from .. import functional as F
from ..generate import mask_padding
from ..lens import interpret
from ..lens.trace import estimate_bytes, run_with_cache, select_names
from .fields import RequestError
from .limits import Limits

DIGITS = 5


def rounded(a, digits: int = DIGITS):
    """Nested lists of floats rounded to `digits` (NaN and inf -> None: JSON has neither)."""
    a = np.asarray(a, dtype=np.float64)
    out = np.round(a, digits).tolist()
    return out if np.all(np.isfinite(a)) else _finite_only(out)


def _finite_only(x):
    if isinstance(x, list):
        return [_finite_only(v) for v in x]
    return x if math.isfinite(x) else None


def one(x, digits: int = DIGITS):
    """One float rounded (None when not finite)."""
    x = float(x)
    return round(x, digits) if math.isfinite(x) else None


def _memory_check(loaded, names, T: int, limits: Limits, extra: int = 0) -> None:
    cfg = loaded.model.cfg
    need = estimate_bytes(cfg, select_names(cfg, names), 1, T) + extra
    if need > limits.memory_bytes:
        raise RequestError(f"this analysis would hold {need / 2**20:,.0f} MiB for {T} tokens, "
                           f"over the server's limit of {limits.memory_bytes / 2**20:,.0f} MiB;"
                           f" use a shorter prompt", status=413)


def _tops(loaded, ids, probs) -> list:
    """[[text, probability, id], ...] of parallel id/probability rows."""
    return [[loaded.texts(i), one(p), int(i)] for i, p in zip(ids, probs)]


def _vocab_limit(loaded) -> int:
    """The ids a guess the server picks itself may be: the tokenizer's (a padded
    vocabulary's other ids have no token; `glassllm.generate.mask_padding`, as generation).
    Where the model's own top-k holds one, it is listed as "(padding id N)"."""
    return int(loaded.tokenizer.vocab_size)


def _tokens(loaded, ids) -> dict:
    return dict(ids=[int(i) for i in ids], texts=[loaded.texts(i) for i in ids])


# --------------------------------------------------------------------------- analyze
def check_analysis(loaded, T: int, limits: Limits) -> None:
    """Refuse before running: the logit lens keeps (L+1, T, V) float64 arrays three times."""
    cfg = loaded.model.cfg
    lens = 3 * (cfg.n_layers + 1) * T * cfg.vocab_size * 8
    _memory_check(loaded, ["blocks.*.residual_*", "blocks.*.attention.pattern", "logits"], T,
                  limits, lens)


def analyze(loaded, ids: np.ndarray, k: int, limits: Limits) -> dict:
    """Tokens, surprise (`token_surprise`), logit lens (`logit_lens`), head types
    (`head_scores` of the traced patterns, as `glassllm inspect`) and, when it fits the limit,
    every head's attention."""
    model = loaded.model
    s = interpret.token_surprise(model, ids, k=k)
    lens = interpret.logit_lens(model, ids, k=k)
    _, cache = run_with_cache(model, ids, names=["blocks.*.attention.pattern"])
    patterns = cache.stack("blocks.{layer}.attention.pattern")[:, 0]  # (L, H, T, T)
    heads = {}
    for kind in interpret.HEAD_KINDS:
        detection = interpret.detection_pattern(ids, kind)
        heads[kind] = dict(scores=rounded(interpret.head_scores(patterns, detection), 3),
                           measurable=bool(detection.sum() > 0))
    T = len(ids)
    L, H = patterns.shape[:2]
    attention = _attention_rows(patterns) if L * H * T * (T + 1) // 2 <= \
        limits.attention_values else None
    return dict(
        model=loaded.name, tokens=_tokens(loaded, ids),
        surprise=dict(nats=rounded(s.nats), bits=rounded(s.bits), rank=s.rank.tolist(),
                      top=[_tops(loaded, i, p) for i, p in zip(s.top_ids, s.top_probs)],
                      mean_nats=one(s.mean_nats, 6), mean_bits=one(s.mean_nats / math.log(2), 6)),
        lens=dict(layers=lens.layers,
                  top=[[_tops(loaded, i, p) for i, p in zip(ri, rp)]
                       for ri, rp in zip(lens.top_ids, lens.top_probs)],
                  target_prob=rounded(lens.target_prob), target_rank=lens.target_rank.tolist(),
                  self_check=one(lens.max_last_layer_diff, 9)),
        heads=heads, attention=attention)


def _attention_rows(patterns: np.ndarray) -> list:
    """(L, H, T, T) -> [layer][head][query] = the weights on keys 0..query (the rest are 0)."""
    full = rounded(patterns, 4)  # one rounding of the whole array, then the rows cut
    return [[[row[:i + 1] for i, row in enumerate(head)] for head in layer] for layer in full]


def attention(loaded, ids: np.ndarray, layer: int | None, limits: Limits) -> dict:
    """Attention patterns of one layer (or all), traced (`blocks.{layer}.attention.pattern`)."""
    cfg = loaded.model.cfg
    T = len(ids)
    layers = list(range(cfg.n_layers)) if layer is None else [layer]
    values = len(layers) * cfg.n_heads * T * (T + 1) // 2
    if values > limits.attention_values:
        raise RequestError(f"{values:,} attention weights for {len(layers)} layer(s), over the "
                           f"server's limit of {limits.attention_values:,}: ask for one layer",
                           status=413)
    names = [f"blocks.{i}.attention.pattern" for i in layers]
    _memory_check(loaded, names, T, limits)
    _, cache = run_with_cache(loaded.model, ids, names=names)
    return dict(layers=layers, tokens=_tokens(loaded, ids),
                attention=_attention_rows(np.stack([cache[n][0] for n in names])))


# --------------------------------------------------------------------------- attribution
def attribution(loaded, ids: np.ndarray, position: int, token, against, limits: Limits) -> dict:
    """Direct logit attribution (`logit_attribution`) at `position`, its self-check's result:
    the parts' sum, the model's logit, and the residual error. token None: the model's top
    guess (among the tokenizer's ids: `_vocab_limit`)."""
    cfg = loaded.model.cfg
    T = len(ids)
    _memory_check(loaded, ["blocks.*.attention.head_output", "blocks.*.mlp.output", "logits"], T,
                  limits)
    a = interpret.logit_attribution(loaded.model, ids, position=position, token=token,
                                    against=against, vocab_limit=_vocab_limit(loaded))
    return dict(position=a.position, token=int(a.token), token_text=loaded.texts(a.token),
                against=None if a.against is None else int(a.against),
                against_text=None if a.against is None else loaded.texts(a.against),
                labels=a.labels, values=rounded(a.values), heads=rounded(a.heads()),
                total=one(a.total, 6), of=a.of,  # "logit before the final soft-cap": Gemma 2
                residual_error=one(a.residual_error, 9), tokens=_tokens(loaded, ids),
                self_check="passed: the parts sum to the model's logit within 1e-4 "
                           "(relative), and their vectors to the final residual",
                n_layers=cfg.n_layers, n_heads=cfg.n_heads)


# --------------------------------------------------------------------------- interventions
def check_ablation(loaded, T: int, limits: Limits) -> None:
    cfg = loaded.model.cfg
    _memory_check(loaded, ["blocks.*.attention.head_output", "blocks.*.mlp.output", "logits"], T,
                  limits, 4 * T * cfg.vocab_size * 8)


def ablation(loaded, ids: np.ndarray, heads, mlps, how: str, position: int, k: int) -> dict:
    """Heads and MLPs ablated (`interpret.ablate`, zero or mean over this prompt): the loss on
    the prompt (predicting tokens 2..T) with and without, and at `position` the next-token
    distribution and logits of both runs."""
    model = loaded.model
    x, y = ids[None, :-1], ids[None, 1:]
    reference = ids[None, :]  # mean ablation: the mean over this whole prompt
    _, clean_loss = interpret.ablate(model, x, y)
    _, ablated_loss = interpret.ablate(model, x, y, heads=heads, mlps=mlps, how=how,
                                       reference=reference)
    clean, _ = interpret.ablate(model, ids[None, :])
    ablated, _ = interpret.ablate(model, ids[None, :], heads=heads, mlps=mlps, how=how,
                                  reference=reference)
    z0, z1 = clean[0, position].astype(np.float64), ablated[0, position].astype(np.float64)
    p0, p1 = F.softmax_rows(z0), F.softmax_rows(z1)
    top0 = np.argsort(-p0, kind="stable")[:k]
    top1 = np.argsort(-p1, kind="stable")[:k]
    shown = list(dict.fromkeys([*top0.tolist(), *top1.tolist()]))
    rows = [dict(id=int(i), text=loaded.texts(i), clean_prob=one(p0[i]), ablated_prob=one(p1[i]),
                 clean_logit=one(z0[i]), ablated_logit=one(z1[i])) for i in shown]
    return dict(clean_loss=one(clean_loss, 6), ablated_loss=one(ablated_loss, 6),
                loss_change=one(ablated_loss - clean_loss, 6), position=position,
                heads=[list(map(int, h)) for h in heads], mlps=[int(m) for m in mlps], how=how,
                clean_top=_tops(loaded, top0, p0[top0]), ablated_top=_tops(loaded, top1, p1[top1]),
                rows=rows, tokens=_tokens(loaded, ids))


PATCH_TARGETS = ("residual_in", "residual_mid", "residual_out", "attention.output",
                 "mlp.output", "attention.head_output")


def check_patching(loaded, T: int, target: str, limits: Limits) -> None:
    cfg = loaded.model.cfg
    cells = cfg.n_layers * (cfg.n_heads if target == "attention.head_output" else T)
    if cells * T > limits.patch_forwards:
        raise RequestError(f"this sweep is {cells:,} forwards of {T} tokens, over the server's "
                           f"limit of {limits.patch_forwards:,} token-forwards; use a shorter "
                           f"prompt", status=413)
    _memory_check(loaded, [f"blocks.*.{target}", "logits"], T, limits,
                  3 * T * cfg.vocab_size * 4)


def patching(loaded, clean: np.ndarray, corrupted: np.ndarray, target: str, correct, wrong,
             position: int, should_stop=None) -> dict:
    """Activation patching (`interpret.patching_sweep`) of the clean run's `target` into the
    corrupted run, one cell at a time: layer x position (layer x head for head_output), the
    metric the logit difference correct - wrong at `position` (`interpret.logit_difference`;
    defaults: the clean run's top guess there, and the corrupted run's top guess other
    than that one; guesses among the tokenizer's ids, `_vocab_limit`). should_stop: asked
    between cells (`interpret.Cancelled` when it says so)."""
    model, limit = loaded.model, _vocab_limit(loaded)
    if correct is None or wrong is None:
        logits_clean, _ = run_with_cache(model, clean, names=["logits"])
        logits_corrupted, _ = run_with_cache(model, corrupted, names=["logits"])
        if correct is None:
            correct = int(np.argmax(mask_padding(logits_clean[0, position], limit)))
        if wrong is None:  # the corrupted run's top guess other than `correct`
            ranked = np.argsort(-mask_padding(logits_corrupted[0, position], limit),
                                kind="stable")[:2]
            wrong = int(ranked[0] if ranked[0] != correct else ranked[1])
    sweep = interpret.patching_sweep(model, clean[None, :], corrupted[None, :],
                                     interpret.logit_difference(correct, wrong, position),
                                     target=target,
                                     per_position=target != "attention.head_output",
                                     should_stop=should_stop)
    same = sweep.clean == sweep.corrupted
    return dict(values=rounded(sweep.values), axes=list(sweep.axes),
                normalised=None if same else rounded(sweep.normalised()),
                clean_metric=one(sweep.clean, 6), corrupted_metric=one(sweep.corrupted, 6),
                target=sweep.target, correct=int(correct), wrong=int(wrong),
                correct_text=loaded.texts(correct), wrong_text=loaded.texts(wrong),
                position=position, clean_tokens=_tokens(loaded, clean),
                corrupted_tokens=_tokens(loaded, corrupted))
