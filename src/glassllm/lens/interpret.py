"""Interpretation: plain functions over a model and its traced values, each checked against
itself (parts that must sum to the whole, a last layer that must equal the model).

- `logit_lens`: each layer's residual stream read through the final norm and the unembedding
  (nostalgebraist 2020, "interpreting GPT: the logit lens").
- `logit_attribution`: direct logit attribution, the final residual split into embeddings,
  every head, every MLP (and biases), projected on a token's unembedding with the final norm's
  scale frozen (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits";
  TransformerLens' `ActivationCache.decompose_resid` / `logit_attrs`). The parts must sum to
  the model's logit: `AttributionError` when they miss by more than the float32 rounding
  of that logit (`logit_rounding_bound`).
- `token_surprise`: per-token loss (nats and bits), rank of the true token, top-k alternatives;
  its mean must equal the model's cross-entropy.
- `ablate`, `patch`, `patching_sweep`: interventions (zero / mean ablation of heads and MLPs,
  activation patching; Meng et al. 2022, Wang et al. 2022; TransformerLens' `patching.py`).
- `detect_heads`: previous-token, duplicate-token and induction scores per head, as
  TransformerLens' `head_detector` ("mul" and "abs" measures).

Sequences are one row of token ids, (T,) or (1, T), unless a docstring says a batch works.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

import numpy as np

from .. import functional as F
from ..checks import check_int, is_int
from ..generate import mask_padding
from ..model import GlassLM
from ..nn import RMSNorm
from ..tensor import Tensor, no_grad
from .trace import Edit, run_with_cache

LN2 = math.log(2.0)


class Cancelled(Exception):
    """A long analysis (`patching_sweep`) stopped between two of its steps because its
    `should_stop` said so: there is no partial result."""


class AttributionError(AssertionError):
    """A decomposition whose parts do not add up to what the model computed."""


def _one_row(model: GlassLM, ids) -> np.ndarray:
    ids = model.check_ids(ids)
    if ids.shape[0] != 1:
        raise ValueError(f"expected one sequence, (T,) or (1, T), got shape {ids.shape}")
    return ids


def _log_softmax(z: np.ndarray) -> np.ndarray:
    """The library's log-softmax over the last axis, in float64 (`F.log_softmax_rows`)."""
    return F.log_softmax_rows(z.astype(np.float64))


def unembed(model: GlassLM, residual: np.ndarray) -> np.ndarray:
    """The model's own final norm and output head applied to any residual (..., C) ->
    logits (..., V), float32 (what `GlassLM.forward` does after its last block: the head's
    bias and the final soft-cap included)."""
    x = Tensor(np.asarray(residual, dtype=np.float32)).to(model.device)
    with no_grad():
        return model.logits(model.final_norm(x)).numpy()


def unembedding_matrix(model: GlassLM) -> np.ndarray:
    """W_U (C, V): the tied embedding transposed, or lm_head.weight."""
    if model.cfg.tie_embeddings:
        return model.token_embedding.weight.numpy().T
    return model.lm_head.weight.numpy()


# --------------------------------------------------------------------------- logit lens
@dataclasses.dataclass
class LogitLens:
    """Per layer (row 0 = embeddings, row i = after block i-1) and position.

    top_ids, top_probs: (L+1, T, k) the k likeliest next tokens and their probabilities.
    target_prob, target_rank: (L+1, T-1) probability and rank (0 = top) of the token that
    actually comes next. layers: the row labels. max_last_layer_diff: |row L - the model's
    softmax|, the self-check (asserted below 1e-4).
    """
    layers: list[str]
    tokens: np.ndarray
    top_ids: np.ndarray
    top_probs: np.ndarray
    target_prob: np.ndarray
    target_rank: np.ndarray
    max_last_layer_diff: float


def _require_finite(logits, what: str) -> None:
    """A forward that produced NaN or inf (float32 overflow, a damaged weight) leaves nothing
    to analyse or to check the analysis against: say so, instead of a self-check comparing
    NaN with NaN."""
    if not np.isfinite(logits).all():
        raise AttributionError(f"{what}: the model's logits are not finite (NaN or inf in its "
                               f"float32 forward)")


def logit_lens(model: GlassLM, ids, k: int = 5) -> LogitLens:
    """The logit lens on one sequence: residual_in of block 0, then each residual_out,
    through the final norm and unembedding. Raises AttributionError if the last row differs
    from the model's own probabilities by more than 1e-4."""
    k = check_int(k, "logit_lens: k", low=1)
    ids = _one_row(model, ids)
    L = model.cfg.n_layers
    names = ["blocks.0.residual_in"] + [f"blocks.{i}.residual_out" for i in range(L)]
    logits, cache = run_with_cache(model, ids, names=names)
    _require_finite(logits, "logit lens")
    resid = np.stack([cache[n][0] for n in names])  # (L+1, T, C)
    logp = _log_softmax(unembed(model, resid))  # (L+1, T, V)
    probs = np.exp(logp)
    diff = float(np.abs(probs[-1] - np.exp(_log_softmax(logits[0]))).max())
    if not diff <= 1e-4:  # NaN fails too
        raise AttributionError(f"logit lens: last layer differs from the model by {diff:.2e}")
    k = min(k, probs.shape[-1])
    top = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    nxt = ids[0, 1:]
    target_logp = logp[:, np.arange(len(nxt)), nxt]  # (L+1, T-1)
    rank = (logp[:, :-1] > target_logp[..., None]).sum(-1)
    return LogitLens(["embeddings"] + [f"block {i}" for i in range(L)], ids[0], top,
                     np.take_along_axis(probs, top, -1), np.exp(target_logp), rank, diff)


# --------------------------------------------------------------------------- attribution
@dataclasses.dataclass
class Attribution:
    """Direct logit attribution at one position.

    labels: one per part ("embeddings", "L0H3", "L0 attention bias", "L0 MLP", "final_norm
    bias", "lm_head bias"); values: float64 (n_parts,) contributions in logit units (nats of
    unnormalised log probability). total: the model's logit (or logit difference).
    residual_error: max |sum of the parts' residual vectors - the final residual|, the second
    self-check. of: what is attributed: "logit", or "logit before the final soft-cap" for a
    model with final_softcap (Gemma 2): c*tanh(z/c) is not a sum, z is.
    """
    labels: list[str]
    values: np.ndarray
    total: float
    position: int
    token: int
    against: int | None
    residual_error: float
    of: str = "logit"

    def top(self, n: int = 10) -> list[tuple[str, float]]:
        """The n parts of largest |value|, largest first."""
        order = np.argsort(-np.abs(self.values), kind="stable")[:n]
        return [(self.labels[i], float(self.values[i])) for i in order]

    def heads(self) -> np.ndarray:
        """The per-head values as (n_layers, n_heads)."""
        rows = {}
        for label, value in zip(self.labels, self.values):
            if label.startswith("L") and "H" in label and " " not in label:
                layer, head = label[1:].split("H")
                rows[int(layer), int(head)] = value
        n_layers = 1 + max(layer for layer, _ in rows)
        n_heads = 1 + max(head for _, head in rows)
        out = np.zeros((n_layers, n_heads))
        for (layer, head), value in rows.items():
            out[layer, head] = value
        return out


def residual_parts(model: GlassLM, cache, position: int) -> tuple[list[str], np.ndarray]:
    """The final residual at `position` (row 0 of the cache's batch) as a sum of parts:
    labels and (n_parts, C) float64 vectors. Each head's part is its head_output slice through
    its rows of the output projection (W_O[h*D:(h+1)*D]). With post-norms (Gemma 2/3, OLMo 2)
    attention's contribution is attention_post_norm(attention.output): its scale at this
    position is frozen, so each head's (and the bias') part goes through the norm's gain
    alone, and the parts still sum to attention.output_normed. The cache needs the names of
    `attribution_names`."""
    cfg = model.cfg
    D = cfg.head_dim
    labels, parts = ["embeddings"], []
    emb = cache["token_embedding"][0, position].astype(np.float64)
    if cfg.positions == "learned":
        emb = emb + cache["position_embedding"][position]
    parts.append(emb)
    for i, block in enumerate(model.blocks):
        heads = cache[f"blocks.{i}.attention.head_output"][0, position].astype(np.float64)
        w_o = block.attention.output.weight.numpy().astype(np.float64)
        own = [heads[h] @ w_o[h * D:(h + 1) * D] for h in range(cfg.n_heads)]
        own_labels = [f"L{i}H{h}" for h in range(cfg.n_heads)]
        if block.attention.output.bias is not None:
            own_labels.append(f"L{i} attention bias")
            own.append(block.attention.output.bias.numpy().astype(np.float64))
        if cfg.norm_position != "pre":
            total = cache[f"blocks.{i}.attention.output"][0, position].astype(np.float64)
            own, const = _frozen_norm(block.attention_post_norm, total, np.stack(own))
            if const is not None:
                own_labels.append(f"L{i} attention_post_norm bias")
                own = np.concatenate([own, const[None]])
        labels += own_labels
        parts += list(own)
        labels.append(f"L{i} MLP")
        mlp = "mlp.output" if cfg.norm_position == "pre" else "mlp.output_normed"
        parts.append(cache[f"blocks.{i}.{mlp}"][0, position].astype(np.float64))
    return labels, np.stack(parts)


FLOAT32_UNIT_ROUNDOFF = float(np.finfo(np.float32).eps) / 2  # u = 2^-24


def logit_rounding_bound(final: np.ndarray, rstd: float, weight: np.ndarray,
                         bias: np.ndarray | None, columns: list[np.ndarray],
                         residual_error: float = 0.0) -> float:
    """How far the model's float32 logit (or logit difference) may be from the exact value
    of its own float32 final residual, to first order in u = 2^-24 (float32's unit roundoff).

    final: (C,) the last residual_out; rstd: the final norm's 1/rms (1/std for LayerNorm);
    weight, bias: (C,) the norm's (bias None for RMSNorm); columns: the (C,) unembedding
    columns of the logits involved (one, or two for a difference); residual_error: max |sum
    of the parts - final| (the parts' own float32 rounding), carried through the norm.

    The bound (Higham 2002, "Accuracy and Stability of Numerical Algorithms", ch. 3: a sum or
    dot product of n terms is off by at most n*u times the sum of the terms' magnitudes):
    the norm's output n_i carries at most (C + 8) u a_i, with a_i = rstd |w_i| (|x_i| +
    mean|x|) + |b_i| (the mean and the sum of squares are sums of C terms; sqrt, reciprocal
    and the products a few roundings more; mean|x| only where LayerNorm centres), and the
    unembedding's dot product adds C u sum_i |n_i| |W_U[i, t]| <= C u sum_i a_i |W_U[i, t]|.
    Per logit: (2C + 8) u sum_i a_i |W_U[i, t]|; a difference adds both logits' bounds.
    """
    C = final.shape[0]
    x = np.abs(final) + (np.abs(final).mean() if bias is not None else 0.0)
    a = rstd * np.abs(weight) * x + (np.abs(bias) if bias is not None else 0.0)
    magnitude = sum(float(a @ np.abs(col)) for col in columns)
    # the parts miss final by residual_error per element (twice that once centred)
    carried = 2 * residual_error * rstd * sum(float(np.abs(weight) @ np.abs(col))
                                              for col in columns)
    return (2 * C + 8) * FLOAT32_UNIT_ROUNDOFF * magnitude + carried


def _frozen_norm(norm, total: np.ndarray, parts: np.ndarray):
    """A norm as the linear map it is with its per-position scale frozen at `total`'s (the
    vector the parts sum to): (parts through it (n, C), the bias term (C,) or None). RMSNorm:
    part * rstd * gain; LayerNorm: each part centred, then the same, + b once."""
    rstd, gain, bias, centre = norm_scale(norm, total)
    if centre:
        parts = parts - parts.mean(axis=-1, keepdims=True)
    return parts * rstd * gain, bias


def norm_scale(norm, total: np.ndarray):
    """(rstd, gain (C,), bias (C,) or None, centres) of a glassllm norm at the vector `total`
    (C,), float64: RMSNorm 1/sqrt(mean(x^2) + eps) with gain w, or (1 + w) with Gemma's
    offset; LayerNorm 1/sqrt(var(x) + eps) after centring, gain w, its bias if any."""
    w = norm.weight.numpy().astype(np.float64)
    if isinstance(norm, RMSNorm):
        return (1.0 / math.sqrt((total ** 2).mean() + norm.eps),
                1.0 + w if norm.offset else w, None, False)
    centred = total - total.mean()
    bias = getattr(norm, "bias", None)
    return (1.0 / math.sqrt((centred ** 2).mean() + norm.eps), w,
            None if bias is None else bias.numpy().astype(np.float64), True)


def attribution_names(model: GlassLM) -> list[str]:
    """The names `logit_attribution` (and `residual_parts`) read from a cache."""
    cfg = model.cfg
    L = cfg.n_layers
    names = ["token_embedding"] + (["position_embedding"] if cfg.positions == "learned" else [])
    names += ["blocks.*.attention.head_output"]
    if cfg.norm_position == "pre":
        names += ["blocks.*.mlp.output"]
    else:
        names += ["blocks.*.attention.output", "blocks.*.mlp.output_normed"]
    names += [f"blocks.{L - 1}.residual_out", "logits"]
    if cfg.final_softcap is not None:
        names.append("logits_pre_softcap")
    return names


def logit_attribution(model: GlassLM, ids, position: int = -1, token: int | None = None,
                      against: int | None = None, cache=None,
                      vocab_limit: int | None = None) -> Attribution:
    """Direct logit attribution of `token`'s logit (minus `against`'s, if given) at
    `position` of one sequence. token defaults to the model's top prediction there, among the
    ids below `vocab_limit` (the tokenizer's vocab_size for a padded vocabulary: as
    `glassllm.generate.mask_padding`, an id no token has is never the guess; None: any id).
    cache: a `run_with_cache` Cache of these ids holding `attribution_names(model)`; None runs
    the model.

    With the final norm's per-position scale (1/rms, or 1/std after centring) frozen, the
    norm is linear, so logit = sum over parts of norm_part(part) . W_U[:, token], plus the
    norm's bias term (LayerNorm with bias) and the head's bias (Phi). LayerNorm's centring
    applies to each part. With a final soft-cap (Gemma 2) the attributed quantity is the
    logit before the cap (`logits_pre_softcap`; `Attribution.of` says so): the cap is not
    linear, the unembedding is.

    The self-check: the float64 sum of the parts must equal the model's float32 logit (or
    difference) within `logit_rounding_bound` -- the float32 rounding the model's own final
    norm and unembedding may carry (a few units in the last place of every term of the
    unembedding's dot product, summed over the C terms), plus what the parts' residual vectors
    miss the final residual by, carried through the frozen norm. A logit difference of two
    nearly equal logits (a byte piece against `<unk>`) is checked as tightly as float32 allows,
    never below it.

    Raises:
        AttributionError: the parts miss the model's logit by more than that bound, or their
            vectors miss the final residual by more than 1e-4 relative.
        ValueError: bad ids, position or token.
    """
    ids = _one_row(model, ids)
    cfg = model.cfg
    T = ids.shape[1]
    if not -T <= position < T:
        raise ValueError(f"position {position} outside a sequence of {T} tokens")
    position %= T
    L = cfg.n_layers
    if cache is None:  # one run can serve many positions: pass a cache holding these names
        _, cache = run_with_cache(model, ids, names=attribution_names(model))
    capped = cfg.final_softcap is not None
    z = cache["logits_pre_softcap" if capped else "logits"][0, position].astype(np.float64)
    _require_finite(z, "logit attribution")
    if token is None:
        token = int(np.argmax(mask_padding(z, vocab_limit)))
    for t in (token, against):
        if t is not None and not 0 <= t < cfg.vocab_size:
            raise ValueError(f"token {t} outside [0, {cfg.vocab_size})")
    w_u = unembedding_matrix(model).astype(np.float64)
    direction = w_u[:, token] - (w_u[:, against] if against is not None else 0.0)
    total = z[token] - (z[against] if against is not None else 0.0)

    labels, parts = residual_parts(model, cache, position)
    final = cache[f"blocks.{L - 1}.residual_out"][0, position].astype(np.float64)
    scale = np.abs(final).max()
    residual_error = float(np.abs(parts.sum(0) - final).max())
    if not residual_error <= 1e-4 * scale:  # written so that NaN fails too
        raise AttributionError(f"residual parts miss the final residual by {residual_error:.2e}")
    normed, bias = _frozen_norm(model.final_norm, final, parts)
    values = normed @ direction
    if bias is not None:
        labels.append("final_norm bias")
        values = np.append(values, bias @ direction)
    head_bias = getattr(getattr(model, "lm_head", None), "bias", None)
    if head_bias is not None:  # Phi's head has a bias: one more part, outside the residual
        b = head_bias.numpy().astype(np.float64)
        labels.append("lm_head bias")
        values = np.append(values, b[token] - (b[against] if against is not None else 0.0))
    rstd, gain, bias, centres = norm_scale(model.final_norm, final)
    if centres and bias is None:  # the bound counts the centring where a bias is given
        bias = np.zeros_like(gain)
    columns = [w_u[:, t] for t in (token, against) if t is not None]
    tolerance = logit_rounding_bound(final, rstd, gain, bias, columns, residual_error)
    error = abs(values.sum() - total)
    if not error <= tolerance:  # NaN fails too
        raise AttributionError(f"attribution parts sum to {values.sum():.6f}, the model's "
                               f"logit is {total:.6f} (|diff| {error:.2e}, over the float32 "
                               f"rounding bound {tolerance:.2e})")
    return Attribution(labels, values, float(total), position, token, against,
                       residual_error, "logit before the final soft-cap" if capped else "logit")


# --------------------------------------------------------------------------- surprise
@dataclasses.dataclass
class Surprise:
    """Per predicted token of one sequence (positions 1..T-1, each predicted from the ones
    before): nats (-ln p), bits (nats / ln 2), rank of the true token (0 = the model's top
    guess), top-k alternatives (ids, probs: (T-1, k)). mean_nats equals the model's loss."""
    tokens: np.ndarray
    nats: np.ndarray
    bits: np.ndarray
    rank: np.ndarray
    top_ids: np.ndarray
    top_probs: np.ndarray
    mean_nats: float


def token_surprise(model: GlassLM, ids, k: int = 5) -> Surprise:
    """Token surprise of one sequence of at least 2 tokens. Raises AttributionError if the
    mean differs from `GlassLM.loss` by more than 1e-5 nats."""
    k = check_int(k, "token_surprise: k", low=1)
    ids = _one_row(model, ids)
    if ids.shape[1] < 2:
        raise ValueError("token_surprise needs at least 2 tokens (one to predict)")
    logits, cache = run_with_cache(model, ids[:, :-1], targets=ids[:, 1:], names=["logits"])
    _require_finite(logits, "token surprise")
    logp = _log_softmax(logits[0])
    nxt = ids[0, 1:]
    nats = -logp[np.arange(len(nxt)), nxt]
    if not abs(nats.mean() - cache.loss) <= 1e-5:
        raise AttributionError(f"token surprise mean {nats.mean()} != model loss {cache.loss}")
    rank = (logp > -nats[:, None]).sum(-1)
    k = min(k, logp.shape[-1])
    top = np.argsort(-logp, axis=-1, kind="stable")[:, :k]
    return Surprise(ids[0], nats, nats / LN2, rank, top, np.exp(np.take_along_axis(logp, top, -1)),
                    float(nats.mean()))


# --------------------------------------------------------------------------- interventions
def ablation_edits(model: GlassLM, heads: Iterable[tuple[int, int]] = (),
                   mlps: Iterable[int] = (), how: str = "zero", reference=None) -> list[Edit]:
    """Edits that ablate attention heads (layer, head) -- their head_output slice -- and whole
    MLPs (their mlp.output). how="zero" replaces by 0; how="mean" by the value's mean over the
    batch and positions of a clean run on `reference` ids (B, T) (Wang et al. 2022's mean
    ablation)."""
    if how not in ("zero", "mean"):
        raise ValueError(f"how must be 'zero' or 'mean', got {how!r}")
    heads, mlps = list(heads), list(mlps)
    cfg = model.cfg
    if not all(isinstance(h, (tuple, list)) and len(h) == 2
               and all(is_int(i) for i in h) for h in heads):
        raise ValueError(f"heads must be (layer, head) pairs of ints, e.g. [(1, 2)]; got "
                         f"{heads!r}")
    if not all(is_int(i) for i in mlps):
        raise ValueError(f"mlps must be layer numbers (ints), got {mlps!r}")
    for layer, head in heads:
        if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
            raise ValueError(f"no head ({layer}, {head}) in a model of {cfg.n_layers} layers "
                             f"x {cfg.n_heads} heads")
    for layer in mlps:
        if not 0 <= layer < cfg.n_layers:
            raise ValueError(f"no MLP {layer} in a model of {cfg.n_layers} layers")
    means = None
    if how == "mean":
        if reference is None:
            raise ValueError("mean ablation needs reference ids")
        wanted = [f"blocks.{i}.attention.head_output" for i, _ in heads] + \
                 [f"blocks.{i}.mlp.output" for i in mlps]
        _, means = run_with_cache(model, reference, names=sorted(set(wanted)))
    edits = []
    for layer, head in heads:
        name = f"blocks.{layer}.attention.head_output"
        value = 0.0 if means is None else means[name][:, :, head].mean(axis=(0, 1))
        edits.append(Edit(name, (slice(None), slice(None), head), value))
    for layer in mlps:
        name = f"blocks.{layer}.mlp.output"
        value = 0.0 if means is None else means[name].mean(axis=(0, 1))
        edits.append(Edit(name, ..., value))
    return edits


def ablate(model: GlassLM, ids, targets=None, heads=(), mlps=(), how: str = "zero",
           reference=None):
    """Run ids (B, T) with heads/MLPs ablated (see `ablation_edits`; mean ablation uses `ids`
    as reference unless given). Returns (logits (B, T, V), mean loss in nats or None)."""
    if how == "mean" and reference is None:
        reference = ids
    edits = ablation_edits(model, heads, mlps, how, reference)
    logits, cache = run_with_cache(model, ids, targets, names=["logits"], edits=edits)
    return logits, cache.loss


def patch(model: GlassLM, ids, source, name: str, index=...) -> np.ndarray:
    """Activation patching: run `ids` with `name[index]` taken from `source` (a Cache of
    another run, same shape, holding `name`). Returns logits (B, T, V)."""
    edit = Edit(name, index, np.asarray(source[name])[index])
    logits, _ = run_with_cache(model, ids, names=["logits"], edits=[edit])
    return logits


def logit_difference(correct: int, wrong: int, position: int = -1) -> Callable:
    """A patching metric: logits[0, position, correct] - logits[0, position, wrong]."""
    def metric(logits: np.ndarray) -> float:
        return float(logits[0, position, correct]) - float(logits[0, position, wrong])
    return metric


@dataclasses.dataclass
class Sweep:
    """values: metric after patching each cell; axes: the names of values' axes; clean and
    corrupted: the metric of the unpatched runs; target: the traced name pattern."""
    values: np.ndarray
    axes: tuple[str, ...]
    clean: float
    corrupted: float
    target: str

    def normalised(self) -> np.ndarray:
        """(values - corrupted) / (clean - corrupted): 1 = patching restores the clean run."""
        return (self.values - self.corrupted) / (self.clean - self.corrupted)


SWEEP_TARGETS = ("residual_in", "residual_mid", "residual_out", "attention.output",
                 "mlp.output", "attention.head_output")


def patching_sweep(model: GlassLM, clean_ids, corrupted_ids, metric: Callable,
                   target: str = "residual_in", per_position: bool = True,
                   should_stop: Callable[[], bool] | None = None) -> Sweep:
    """Patch the clean run's `blocks.{layer}.<target>` into the corrupted run, one cell at a
    time, and record metric(logits) per cell.

    target: one of SWEEP_TARGETS. Cells: layer x position (n_layers, T); for
    "attention.head_output" layer x position x head (n_layers, T, n_heads), or layer x head
    (n_layers, n_heads) with per_position=False; other targets with per_position=False give
    (n_layers,). clean_ids, corrupted_ids: (B, T) of the same shape. Costs one forward per cell.
    should_stop: asked before each cell; when it returns True the sweep ends by raising
    `Cancelled` (a caller whose reader went away: `glassllm serve`).

    Raises:
        ValueError: an unknown target, or ids of different shapes.
        Cancelled: should_stop() returned True.
    """
    if target not in SWEEP_TARGETS:
        raise ValueError(f"target must be one of {SWEEP_TARGETS}, got {target!r}")
    clean_ids, corrupted_ids = model.check_ids(clean_ids), model.check_ids(corrupted_ids)
    if clean_ids.shape != corrupted_ids.shape:
        raise ValueError(f"clean {clean_ids.shape} and corrupted {corrupted_ids.shape} differ")
    cfg = model.cfg
    pattern = f"blocks.*.{target}"
    clean_logits, clean = run_with_cache(model, clean_ids, names=[pattern])
    corrupted_logits, _ = run_with_cache(model, corrupted_ids, names=["logits"])
    T = clean_ids.shape[1]
    heads = target == "attention.head_output"
    shape = (cfg.n_layers,) + ((T,) if per_position else ()) + ((cfg.n_heads,) if heads else ())
    values = np.zeros(shape)
    for cell in np.ndindex(*shape):
        if should_stop is not None and should_stop():
            raise Cancelled(f"patching sweep stopped after {np.ravel_multi_index(cell, shape)} "
                            f"of {values.size} cells")
        layer = cell[0]
        rest = list(cell[1:])
        index = [slice(None), rest.pop(0) if per_position else slice(None)]
        if heads:
            index.append(rest.pop(0))
        logits = patch(model, corrupted_ids, clean, f"blocks.{layer}.{target}", tuple(index))
        values[cell] = metric(logits)
    axes = ("layer",) + (("position",) if per_position else ()) + (("head",) if heads else ())
    return Sweep(values, axes, metric(clean_logits), metric(corrupted_logits), pattern)


# --------------------------------------------------------------------------- head detector
HEAD_KINDS = ("previous_token", "duplicate_token", "induction")


def detection_pattern(ids, kind: str) -> np.ndarray:
    """The (T, T) 0/1 pattern an ideal head of `kind` would attend with, for tokens ids (T,),
    as TransformerLens' get_*_detection_pattern (lower triangular):
    previous_token: row i has a 1 at i-1;
    duplicate_token: at every earlier j holding the same token as i;
    induction: at j+1 for every earlier j holding the same token as i (the token that
    followed it last time: what an induction head copies)."""
    ids = np.asarray(ids).reshape(-1)
    T = len(ids)
    if kind == "previous_token":
        return np.eye(T, k=-1)
    same = (ids[:, None] == ids[None, :]) & (np.arange(T)[None, :] < np.arange(T)[:, None])
    if kind == "duplicate_token":
        return same.astype(np.float64)
    if kind == "induction":  # attend to j+1 for each earlier j holding the same token as i
        out = np.zeros((T, T))
        out[:, 1:] = same[:, :-1]
        return np.tril(out)
    raise ValueError(f"kind must be one of {HEAD_KINDS}, got {kind!r}")


def head_scores(patterns: np.ndarray, detection: np.ndarray, exclude_bos: bool = False,
                exclude_current_token: bool = False, error_measure: str = "mul") -> np.ndarray:
    """Similarity of attention patterns (..., T, T) to a detection pattern (T, T), as
    TransformerLens' compute_head_attention_similarity_score:
    "mul": sum(pattern * detection) / sum(pattern), the share of attention on the predicted
    keys (1 = all of it); "abs": 1 - T * mean|pattern - detection|, rounded to 3 decimals
    (1 = a perfect match). exclude_bos / exclude_current_token zero column 0 / the diagonal
    first."""
    p = np.array(patterns, dtype=np.float64)
    T = p.shape[-1]
    if error_measure == "mul":
        if exclude_bos:
            p[..., :, 0] = 0
        if exclude_current_token:
            p[..., np.arange(T), np.arange(T)] = 0
        return (p * detection).sum((-1, -2)) / p.sum((-1, -2))
    if error_measure == "abs":
        diff = np.abs(p - detection)
        if exclude_bos:
            diff[..., :, 0] = 0
        if exclude_current_token:
            diff[..., np.arange(T), np.arange(T)] = 0
        return 1 - np.round(diff.mean((-1, -2)) * T, 3)
    raise ValueError(f"error_measure must be 'mul' or 'abs', got {error_measure!r}")


def detect_heads(model: GlassLM, ids, kind: str, exclude_bos: bool = False,
                 exclude_current_token: bool = False, error_measure: str = "mul") -> np.ndarray:
    """Score every head for `kind` (one of HEAD_KINDS) on a sequence or a batch (B, T) of
    them: (n_layers, n_heads), averaged over the batch. An induction head on a repeated
    random sequence scores near 1 ("mul"); uniform attention scores about 1/i per row."""
    ids = model.check_ids(ids)
    if ids.shape[1] < 2:
        raise ValueError("detect_heads needs at least 2 tokens")
    _, cache = run_with_cache(model, ids, names=["blocks.*.attention.pattern"])
    patterns = cache.stack("blocks.{layer}.attention.pattern")  # (L, B, H, T, T)
    scores = np.stack([head_scores(patterns[:, b], detection_pattern(ids[b], kind),
                                   exclude_bos, exclude_current_token, error_measure)
                       for b in range(ids.shape[0])])
    return scores.mean(axis=0)
