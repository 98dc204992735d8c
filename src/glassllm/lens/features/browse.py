"""Looking at a dictionary's features: what makes each one fire, what it writes, and what
changes when it is turned up or off.

    windows = corpus_windows(tokenizer, "stories.txt", seq_len=64, max_tokens=32768)
    scan = scan_features(model, sae, windows)           # one pass over the corpus
    scan.top_contexts(7)                                # where feature 7 fires most, shaded
    scan.histogram(7), scan.density                     # how often, how strongly
    logits = feature_logits(model, sae)                 # (d_sae, V): W_dec[i] through W_U
    top_logits(logits[7], 10, vocab_limit)              # the tokens it promotes / suppresses
    prompt_features(model, sae, ids, k=5)               # the features active at each token
    hooks = steering_hooks(sae, 7, alpha=4.0)           # add 4 W_dec[7] at the hook
    generate_with_hooks(model, prompt_ids, 20, hooks)   # a generation steered by it

What is shown follows the field's feature dashboards (Bricken et al. 2023, "Towards
Monosemanticity", its feature browser; Neuronpedia's feature pages; SAELens' `sae_vis`): top
activating contexts with the activation per token, the activation histogram, density, and the
logit weights W_dec[i] @ W_U.

The logit weights go through the final norm as direct logit attribution takes it
(`glassllm.lens.interpret.norm_scale`): its gain applied (1 + w with Gemma's offset) and, for a
LayerNorm, the direction centred; its bias left out (it is not part of any direction) and its
1/rms left out too -- one positive number for every token of a position, it changes no ranking,
and a direction has no rms of its own. The logit lens (`interpret.logit_lens`) applies the whole
norm to whole residuals; for a lone direction that whole norm would add the bias and divide by
the direction's own rms, which no residual has.

A dictionary here is anything with the attributes of `glassllm.lens.features.SAE`: `hook_name`,
`d_in`, `d_sae`, `W_dec` (d_sae, d_in) as a Tensor or array, and `encode(x (..., d_in)) ->
(..., d_sae)`; a transcoder has `out_name` too, the value its decoder writes (its features are
read at `hook_name` and write at `out_name`).
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from ...generate import Sampling, generate, mask_padding
from ...model import GlassLM
from ..interpret import Cancelled, norm_scale, unembedding_matrix
from ..trace import Trace, run_with_cache, value_shape


def array(p) -> np.ndarray:
    """A parameter as a NumPy array (a glassllm Tensor's `.data`, or the array itself)."""
    return np.asarray(getattr(p, "data", p))


def out_name(sae) -> str:
    """The value a dictionary's decoder writes: a transcoder's `out_name`, an SAE's own
    `hook_name`."""
    return getattr(sae, "out_name", None) or sae.hook_name


def check_fits(model: GlassLM, sae) -> None:
    """Raise ValueError (one line) when `sae` cannot be looked at on `model`: a name it reads
    (or, for a transcoder, writes) is not a value of this model, not one row per token (a
    per-head value such as attention.q, (B, T, H, d): the views show tokens), or not of the
    dictionary's width (`train.check_names`). A TransformerLens hook name (SAELens'
    dictionaries) is first renamed to glassllm's name of the same value."""
    from .train import check_names
    check_names(model, sae, rows_per_token=1)


# --------------------------------------------------------------------------- activations
def feature_activations(model: GlassLM, sae, ids) -> np.ndarray:
    """The dictionary's feature activations on a batch: ids (B, T) or (T,) -> (B, T, d_sae)
    float32; the forward stops at the value the dictionary reads."""
    _, cache = run_with_cache(model, ids, names=[sae.hook_name], stop_at=sae.hook_name,
                              max_bytes=None)
    return np.asarray(sae.encode(cache[sae.hook_name]), dtype=np.float32)


@dataclasses.dataclass
class FeatureScan:
    """Every non-zero activation of every feature over a corpus of windows (a sparse
    (N, T, d_sae) array, kept as coordinates: a dictionary's few active features per token
    cost a few numbers each, where the dense array would be N*T*d_sae).

    ids: (N, T) int64, the windows scanned. rows, cols, features: int32 (nnz,) coordinates;
    values: float32 (nnz,) the activations there (all > 0). d_sae: the number of features.
    ignored: tokens of `ids` whose activations were left out (none is kept for them).
    """
    ids: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    features: np.ndarray
    values: np.ndarray
    d_sae: int
    ignored: int = 0  # tokens whose activations were not kept (`scan_features`' ignore)

    @property
    def tokens(self) -> int:
        """Tokens scanned whose activations count (N * T less the ignored ones)."""
        return int(self.ids.size) - self.ignored

    @property
    def density(self) -> np.ndarray:
        """(d_sae,) float64: the fraction of tokens on which each feature is active (> 0)."""
        return np.bincount(self.features, minlength=self.d_sae) / max(self.tokens, 1)

    @property
    def max_activation(self) -> np.ndarray:
        """(d_sae,) float32: each feature's largest activation over the corpus (0: never)."""
        out = np.zeros(self.d_sae, np.float32)
        np.maximum.at(out, self.features, self.values)
        return out

    def dense(self, feature: int) -> np.ndarray:
        """One feature's activation at every token of the corpus: (N, T) float32."""
        out = np.zeros(self.ids.shape, np.float32)
        pick = self.features == feature
        out[self.rows[pick], self.cols[pick]] = self.values[pick]
        return out

    def top_contexts(self, feature: int, n: int = 10, before: int = 8,
                     after: int = 3) -> list[dict]:
        """Where `feature` fires most: the n tokens of largest activation (ties: the first in
        the corpus), each as a dict with `row`, `position`, `value`, and the window around it
        -- `ids` and `activations` of tokens position-before .. position+after (cut at the
        window's edges) and `at`, the index of the maximum in that window."""
        acts = self.dense(feature)
        flat = acts.ravel()
        order = np.argsort(-flat, kind="stable")[:n]
        out = []
        for i in order[flat[order] > 0]:
            r, c = divmod(int(i), acts.shape[1])
            lo, hi = max(0, c - before), min(acts.shape[1], c + after + 1)
            out.append(dict(row=r, position=c, value=float(flat[i]), at=c - lo,
                            ids=self.ids[r, lo:hi].tolist(),
                            activations=acts[r, lo:hi].tolist()))
        return out

    def histogram(self, feature: int, bins: int = 20) -> tuple[np.ndarray, np.ndarray]:
        """(counts (bins,) int64, edges (bins+1,) float64) of the feature's non-zero
        activations, in equal bins from 0 to its maximum (no bins of zeros: a feature is
        off on most tokens, and the density says how often)."""
        v = self.values[self.features == feature].astype(np.float64)
        top = float(v.max()) if v.size else 1.0
        return np.histogram(v, bins=bins, range=(0.0, top))

    def token_means(self, token_id: int) -> np.ndarray:
        """(d_sae,) float64: each feature's mean activation over the corpus tokens that are
        `token_id` (zeros where the corpus never holds it)."""
        is_token = self.ids[self.rows, self.cols] == token_id
        count = int((self.ids == token_id).sum())
        sums = np.bincount(self.features[is_token], weights=self.values[is_token],
                           minlength=self.d_sae)
        return sums / max(count, 1)


def scan_features(model: GlassLM, sae, windows, batch: int = 8, should_stop=None,
                  ignore: tuple[int, ...] = ()) -> FeatureScan:
    """Run the model and the dictionary over every window: windows (N, T) int ids ->
    `FeatureScan`. batch: windows per forward. should_stop: asked between batches
    (`Cancelled` when it says so). ignore: token ids whose activations are not kept (pass the
    BOS id: the residual at a sequence's first token is an outlier of large norm that lights
    many features at their maximum, and would fill every feature's top contexts; the density
    then counts over the other tokens only).

    Raises:
        ValueError: a dictionary that does not fit the model (`check_fits`), windows not 2-D.
    """
    check_fits(model, sae)
    windows = model.check_ids(windows)
    parts = []
    for start in range(0, len(windows), batch):
        if should_stop is not None and should_stop():
            raise Cancelled("the scan was stopped")
        acts = feature_activations(model, sae, windows[start:start + batch])
        keep = ~np.isin(windows[start:start + batch], ignore)[..., None]  # (b, T, 1)
        r, c, f = np.nonzero((acts > 0) & keep)
        parts.append((r + start, c, f, acts[r, c, f]))
    cat = [np.concatenate([p[j] for p in parts]) if parts else np.zeros(0) for j in range(4)]
    return FeatureScan(windows.astype(np.int64), cat[0].astype(np.int32),
                       cat[1].astype(np.int32), cat[2].astype(np.int32),
                       cat[3].astype(np.float32), int(sae.d_sae),
                       int(np.isin(windows, ignore).sum()))


def corpus_windows(tokenizer, path, seq_len: int = 64, max_tokens: int = 32768,
                   bos: bool = True) -> np.ndarray:
    """A corpus as windows (N, seq_len) int64 of at most `max_tokens` tokens in all, from its
    start: a UTF-8 text file encoded with `tokenizer` (each window begins with the
    tokenizer's BOS, where it has one and `bos`, as a prompt does), or a token file of
    `glassllm prepare` (train.bin; a prepare directory: its val.bin) cut in windows as is.

    Raises:
        ValueError: the file is neither, or holds fewer than seq_len tokens; max_tokens below
            seq_len.
        FileNotFoundError: no such file.
    """
    from ...formats.token_file import TokenFile
    path = os.fspath(path)
    if seq_len < 1:
        raise ValueError(f"seq_len must be at least 1, got {seq_len}")
    if max_tokens < seq_len:  # not the corpus' fault: said before it is read
        raise ValueError(f"max_tokens {max_tokens} is fewer than one window of {seq_len} "
                         f"tokens (seq_len)")
    if os.path.isdir(path):
        path = os.path.join(path, "val.bin")
    if path.endswith(".bin"):
        ids = np.asarray(TokenFile(path).tokens[:max_tokens], dtype=np.int64)
        start = None
    else:
        with open(path, "rb") as f:  # read() of a size past the file's: an OverflowError
            size = min(max_tokens * 16, os.fstat(f.fileno()).st_size)
            text = f.read(size).decode("utf-8", errors="replace")
        ids = np.asarray(tokenizer.encode(text), dtype=np.int64)
        # a window of one token (a model of max_len 1) has no room for the BOS besides it
        start = getattr(tokenizer, "bos_id", None) if bos and seq_len > 1 else None
    limit = getattr(tokenizer, "vocab_size", None)
    if limit is not None and len(ids) and int(ids.max()) >= limit:  # another tokenizer's file
        raise ValueError(f"{path}: token id {int(ids.max())} is outside the tokenizer's "
                         f"{limit} ids (a token file of another tokenizer?)")
    width = seq_len - (start is not None)
    n = min(len(ids) // width, max_tokens // seq_len)
    if n < 1:
        raise ValueError(f"{path}: {len(ids)} tokens, fewer than one window of {seq_len}")
    out = ids[:n * width].reshape(n, width)
    if start is not None:
        out = np.concatenate([np.full((n, 1), start, np.int64), out], axis=1)
    return out


# --------------------------------------------------------------------------- logit weights
def decoder_residual(model: GlassLM, sae) -> np.ndarray | None:
    """The decoder's rows as directions in the residual stream: (d_sae, d_model) float64.
    W_dec itself for a value of width d_model (a residual, attention or MLP output); through
    mlp.down for an MLP's hidden value (mlp.hidden_post: the MLP's own output projection,
    bias left out). None for any other value (q, k, patterns: not a residual direction)."""
    w = array(sae.W_dec).astype(np.float64)
    name = out_name(sae)
    if name.startswith("blocks.") and name.endswith("mlp.hidden_post"):  # first: d_ff may be C
        # Linear keeps its weight input-major (nn.Linear): down is (F, C), read on the host
        down = model.blocks[int(name.split(".")[1])].mlp.down.weight.numpy()
        return w @ down.astype(np.float64)
    if w.shape[1] == model.cfg.d_model and not name.endswith(("hidden_pre", "mlp.up")):
        return w
    return None


def feature_logits(model: GlassLM, sae) -> np.ndarray | None:
    """The logit weights W_dec @ diag(g) @ W_U of every feature: (d_sae, V) float64, with the
    final norm's gain g (and LayerNorm's centring) as the module docstring says; None when
    the decoder does not write a residual direction (`decoder_residual`)."""
    w = decoder_residual(model, sae)
    if w is None:
        return None
    _, gain, _, centre = norm_scale(model.final_norm, np.ones(model.cfg.d_model))
    if centre:
        w = w - w.mean(axis=1, keepdims=True)
    return (w * gain) @ unembedding_matrix(model).astype(np.float64)


def top_logits(row: np.ndarray, k: int = 10, vocab_limit: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """(promoted ids (k,), suppressed ids (k,)) of one feature's logit weights (V,): the
    largest first, the most negative first; ties by id. Ids at or past `vocab_limit` (a padded
    vocabulary's ids that no token has, `glassllm.generate.mask_padding`) are never listed."""
    row = np.asarray(row, dtype=np.float64)
    high = mask_padding(row, vocab_limit)
    low = -mask_padding(-row, vocab_limit)
    k = min(k, row.shape[-1] if vocab_limit is None else min(vocab_limit, row.shape[-1]))
    return np.argsort(-high, kind="stable")[:k], np.argsort(low, kind="stable")[:k]


# --------------------------------------------------------------------------- a prompt
def prompt_features(model: GlassLM, sae, ids, k: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """The features active at each token of one prompt, strongest first: ids (T,) ->
    (features (T, k) int64, activations (T, k) float32); a slot past a token's active
    features holds feature -1 and activation 0."""
    check_fits(model, sae)
    acts = feature_activations(model, sae, np.asarray(ids).reshape(1, -1))[0]  # (T, d_sae)
    k = min(k, acts.shape[1])
    order = np.argsort(-acts, axis=1, kind="stable")[:, :k]
    values = np.take_along_axis(acts, order, 1)
    return np.where(values > 0, order, -1), np.where(values > 0, values, 0).astype(np.float32)


# --------------------------------------------------------------------------- interventions
def steering_hooks(sae, feature: int, alpha: float) -> list:
    """Hooks (for `run_with_hooks`, `Trace`) that add alpha * W_dec[feature] to the value the
    decoder writes, at every position (Templeton et al. 2024, "feature steering")."""
    vector = alpha * array(sae.W_dec)[feature].astype(np.float32)  # (d_in,)

    def steer(value, name):
        return value + vector
    return [(out_name(sae), steer)]


def ablation_hooks(sae, feature: int) -> list:
    """Hooks that take one feature out: the value minus f_i(x) * W_dec[i], its part of the
    reconstruction, where f_i(x) is the feature's activation on the value read (the rest,
    the dictionary's error included, flows on). A transcoder's feature is read at hook_name
    and taken out of out_name: two hooks, the first keeping the activations for the second."""
    direction = array(sae.W_dec)[feature].astype(np.float32)  # (d_out,)
    held = {}

    def read(value, name):
        held["f"] = np.asarray(sae.encode(value))[..., feature:feature + 1]  # (..., 1)
        return None

    def remove(value, name):
        if out_name(sae) == sae.hook_name:
            read(value, name)
        return value - held["f"].astype(np.float32) * direction
    if out_name(sae) == sae.hook_name:
        return [(sae.hook_name, remove)]
    return [(sae.hook_name, read), (out_name(sae), remove)]


def generate_with_hooks(model: GlassLM, prompt_ids, max_new_tokens: int, hooks,
                        sampling: Sampling = Sampling(temperature=0.0), seed: int = 0,
                        vocab_limit: int | None = None) -> list[int]:
    """`glassllm.generate.generate` with `hooks` on every step's forward (steering or
    ablation, above): the new token ids."""
    with Trace(model, names=[], hooks=hooks, max_bytes=None):
        return generate(model, prompt_ids, max_new_tokens, sampling, rng=seed,
                        vocab_limit=vocab_limit)


# --------------------------------------------------------------------------- what is shown
MAX_SHOWN = 64  # features of a prompt section given in full (their activation at every token)

def _round(a, digits: int = 4) -> list:
    return np.round(np.asarray(a, dtype=np.float64), digits).tolist()


def token_rows(ids, values, texts) -> list:
    """[[text, value, id], ...] of parallel id/value rows (texts: id -> display text)."""
    return [[texts(i), round(float(v), 4), int(i)] for i, v in zip(ids, values)]


def feature_view(scan: FeatureScan | None, logits: np.ndarray | None, feature: int, texts,
                 k: int = 10, contexts: int = 10, bins: int = 20,
                 vocab_limit: int | None = None) -> dict:
    """Everything a feature's page shows, JSON-ready: `feature`, `density` and `max` over the
    corpus, `histogram` {counts, edges}, `contexts` (the top ones: `texts`, `activations`,
    `at`, `value`, `row`, `position`), `promoted` and `suppressed` ([text, logit weight, id],
    k each; padding ids never listed). scan None: no corpus (density, histogram and contexts
    None); logits None: no logit weights (`feature_logits`). texts: id -> display text
    (`glassllm.lens.report.TokenTexts`)."""
    out = dict(feature=int(feature), density=None, max=None, histogram=None, contexts=None,
               promoted=None, suppressed=None)
    if scan is not None:
        counts, edges = scan.histogram(feature, bins)
        out.update(density=float(scan.density[feature]),
                   max=round(float(scan.max_activation[feature]), 5),
                   histogram=dict(counts=counts.tolist(), edges=_round(edges)),
                   contexts=[dict(c, texts=[texts(i) for i in c["ids"]],
                                  activations=_round(c["activations"]),
                                  value=round(c["value"], 5))
                             for c in scan.top_contexts(feature, contexts)])
    if logits is not None:
        up, down = top_logits(logits[feature], k, vocab_limit)
        out.update(promoted=token_rows(up, logits[feature, up], texts),
                   suppressed=token_rows(down, logits[feature, down], texts))
    return out


def dictionary_facts(sae, scan: FeatureScan | None = None, dense_above: float = 0.1) -> dict:
    """A dictionary's description, JSON-ready: kind, hook_name (and out_name), d_in, d_sae, k;
    over a corpus: tokens scanned, `dead` (features never active there), `dense` (active on
    more than `dense_above` of its tokens), the mean number active per token (L0)."""
    facts = dict(kind=getattr(sae, "kind", None), hook_name=sae.hook_name,
                 out_name=getattr(sae, "out_name", None), d_in=int(sae.d_in),
                 d_sae=int(sae.d_sae), k=getattr(sae, "k", None))
    if scan is not None:
        density = scan.density
        facts.update(tokens=scan.tokens, dead=int((density == 0).sum()),
                     dense=int((density > dense_above).sum()), dense_above=dense_above,
                     l0=round(float(scan.values.size / max(scan.tokens, 1)), 3))
    return facts


def search_by_token(scan: FeatureScan | None, logits: np.ndarray | None, token_id: int,
                    k: int = 10) -> dict:
    """Features that go with one token: `firing`, the k of largest mean activation on that
    token in the corpus ([feature, mean activation]); `promoting`, the k whose logit weight
    for it is largest ([feature, weight]). Either None without a corpus / logit weights."""
    out = dict(firing=None, promoting=None)
    if scan is not None:
        means = scan.token_means(token_id)
        order = np.argsort(-means, kind="stable")[:k]
        out["firing"] = [[int(f), round(float(means[f]), 4)] for f in order if means[f] > 0]
    if logits is not None:
        column = logits[:, token_id]
        order = np.argsort(-column, kind="stable")[:k]
        out["promoting"] = [[int(f), round(float(column[f]), 4)] for f in order]
    return out


def prompt_section(model: GlassLM, sae, ids, texts, k: int = 5, features: int = 12,
                   vocab_limit: int | None = None, ignore: tuple[int, ...] = ()) -> dict:
    """What `glassllm inspect --features DIR` shows, JSON-ready: the dictionary's `facts`, per
    token the k strongest active features (`per_token`: [[feature, activation], ...]), and
    `features`: the `features` largest anywhere on the prompt (`listed`), strongest first, then
    the other features of `per_token` (at most MAX_SHOWN in all), each with its activation at
    every token, `at` its peak's position, its promoted / suppressed tokens (`feature_view`
    without a corpus).
    ignore: token ids left out of that ranking (the BOS, as `scan_features`)."""
    check_fits(model, sae)
    ids = np.asarray(ids).reshape(-1)
    acts = feature_activations(model, sae, ids[None, :])[0]  # (T, d_sae)
    feats, values = prompt_features(model, sae, ids, k)
    counted = ~np.isin(ids, ignore)
    peak = acts[counted].max(axis=0) if counted.any() else np.zeros(acts.shape[1], np.float32)
    order = [int(f) for f in np.argsort(-peak, kind="stable") if peak[f] > 0]
    in_rows = set(feats[feats >= 0].tolist())
    chosen = order[:features] + [f for f in order[features:] if f in in_rows]
    logits = feature_logits(model, sae)
    shown = []
    for rank, f in enumerate(chosen[:MAX_SHOWN]):
        view = feature_view(None, logits, f, texts, k=8, vocab_limit=vocab_limit)
        shown.append(dict(feature=f, activations=_round(acts[:, f]), max=round(float(peak[f]), 4),
                          at=int(np.argmax(np.where(counted, acts[:, f], -np.inf))),
                          listed=rank < features, promoted=view["promoted"],
                          suppressed=view["suppressed"]))
    per_token = [[[int(f), round(float(v), 4)] for f, v in zip(fr, vr) if f >= 0]
                 for fr, vr in zip(feats, values)]
    return dict(facts=dictionary_facts(sae), per_token=per_token, features=shown)
