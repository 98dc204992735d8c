"""Text generation: sampling settings, a pure sampler, and a Generator holding the sequence.

The model only scores; generating is a loop kept outside it (as llama2.c's `generate`): ask for the logits of the
next position, draw a token, append it, repeat. Three pieces, as llama2.c splits them:

- `Sampling`: the settings (temperature, top-k, top-p), validated once.
- `sample_next(logits, sampling, rng)`: the sampler, a pure function of the last position's
  logits; `sampling_distribution` exposes the exact distribution it draws from.
- `Generator`: the sequence so far plus the KV cache, so each new token costs one position of
  compute instead of a forward over the whole sequence (`next_token_logits`, whose engine
  form is llama2.c-style decoding, `glassllm.engine.decode`).

`generate(...)` wraps these for the common "n new tokens" case.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import functional as F
from . import devices, kernels, taps
from .checks import check_int, check_real, is_int
from .model import GlassLM, KVCache
from .tensor import no_grad


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How the next token is drawn from the logits (llama2.c's `Sampler`).

    Fields:
        temperature: logits are divided by it before the softmax. 1 samples the model's own
            distribution; < 1 sharpens it, > 1 flattens it; 0 is greedy (always the argmax;
            ties go to the lowest id, as np.argmax). A temperature so small that the division
            overflows (e.g. 1e-310) acts as greedy too -- the limit of the softmax as the
            temperature goes to 0 -- so the distribution is never NaN.
        top_k: keep only the k most probable tokens (None: no limit).
        top_p: nucleus sampling (Holtzman et al. 2019): keep the smallest set of most probable
            tokens whose cumulative probability reaches top_p (None: no limit).

    Raises:
        ValueError: temperature < 0 (or not finite), top_k < 1, top_p outside (0, 1].
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        check_real(self.temperature, "Sampling: temperature", low=0)
        if self.top_k is not None:
            check_int(self.top_k, "Sampling: top_k (or None)", low=1)
        if self.top_p is not None:
            check_real(self.top_p, "Sampling: top_p (or None)", high=1, positive=True)


def sampling_distribution(logits, sampling: Sampling) -> np.ndarray:
    """The distribution `sample_next` draws from, after temperature, top-k and top-p.

    Algorithm (as llama2.c's `sample_topp` and transformers' top-k/top-p warpers): probabilities = softmax(logits / temperature) in float64; sort
    the ids from most to least probable (ties: lower id first); keep the first
    min(top_k, r) of them, where r is the smallest rank whose cumulative probability reaches
    top_p -- both cut-offs are measured on the same full distribution, so applying top-k
    "then" top-p is the same as taking the smaller set. (Hugging Face instead recomputes top-p
    on the renormalised top-k distribution, which can keep fewer tokens.) The kept
    probabilities are renormalised to sum to 1; the rest are 0. Temperature 0 gives a one-hot
    at the argmax, and so does a temperature too small to divide by (logits / temperature
    overflows to inf: softmax's limit, instead of the NaN of inf - inf).

    Args:
        logits: (V,) float scores of the next token (float32 from the model; -inf allowed for
            tokens that must never be drawn).
        sampling: the settings.

    Returns:
        (V,) float64 probabilities, summing to 1.

    Raises:
        ValueError: logits not 1-D or empty, NaN, +inf, or all -inf.
    """
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 1 or logits.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D array (V,), got shape {logits.shape}")
    if np.isnan(logits).any() or np.isposinf(logits).any() or np.isneginf(logits).all():
        raise ValueError("logits hold NaN or +inf, or are all -inf: cannot sample "
                         "(has the model diverged?)")
    probs = np.zeros_like(logits)
    if sampling.temperature == 0:
        probs[int(np.argmax(logits))] = 1.0
        return probs
    with np.errstate(over="ignore"):
        scaled = logits / sampling.temperature
    top = scaled.max()
    if not np.isfinite(top):  # overflow (temperature ~1e-310): inf - inf would be NaN
        probs[int(np.argmax(logits))] = 1.0
        return probs
    full = F.softmax_rows(scaled)  # its max-subtraction: exp never overflows
    order = np.argsort(-full, kind="stable")  # most probable first, ties by lower id
    kept = logits.size
    if sampling.top_k is not None:
        kept = min(kept, sampling.top_k)
    if sampling.top_p is not None:
        cumulative = np.cumsum(full[order])
        reached = np.flatnonzero(cumulative >= sampling.top_p)
        if reached.size:  # rounding can leave the total a hair under 1: then keep all
            kept = min(kept, int(reached[0]) + 1)
    keep = order[:kept]
    probs[keep] = full[keep] / full[keep].sum()
    return probs


def sample_next(logits, sampling: Sampling, rng: np.random.Generator | None = None) -> int:
    """Draw one token id from `logits` under `sampling` (the "Sampler" of llama2.c).

    Greedy (temperature 0) takes the argmax and ignores `rng`. Otherwise one uniform number
    u = rng.random() is drawn and the id is found by inverse CDF: the first kept id (in id
    order) whose cumulative probability exceeds u. Exactly one draw per call, so a seeded rng
    gives a reproducible sequence.

    Args:
        logits: (V,) scores of the next token.
        sampling: the settings.
        rng: a numpy Generator; required unless temperature is 0.

    Returns:
        the token id (Python int).

    Raises:
        ValueError: see `sampling_distribution`; no rng with temperature > 0.
        TypeError: rng is not a np.random.Generator (an int seed belongs in `generate`, or
            in np.random.default_rng(seed): reseeding at every call would repeat one draw).
    """
    probs = sampling_distribution(logits, sampling)
    if sampling.temperature == 0:
        return int(np.argmax(probs))
    if rng is None:
        raise ValueError("sample_next: an rng (np.random.Generator) is needed when "
                         "temperature > 0")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"sample_next: rng must be a np.random.Generator, got "
                        f"{type(rng).__name__} (use np.random.default_rng(seed))")
    cdf = np.cumsum(probs)
    u = rng.random() * cdf[-1]
    token = min(int(np.searchsorted(cdf, u, side="right")), probs.size - 1)
    # Exact arithmetic never lands on a zero-probability id; rounding (u a hair from cdf[-1])
    # could, past the last kept id, so step back to the nearest kept one.
    while probs[token] == 0:
        token -= 1
    return token


def next_token_logits(model: GlassLM, cache: KVCache, token: int) -> np.ndarray:
    """Logits (V,) float32 of the token after `token`, which sits at position cache.length;
    the cache advances by one. The reference: the model's own forward of that one position
    against the KV cache. The engine registers llama2.c's decoding step as its fast form
    (`glassllm.engine.decode.step`: the same formulas without the per-op overhead, the same
    bits as the engine's forward).

    Raises:
        ValueError: the cache is full, or `token` is not a valid id (`GlassLM.check_ids`).
    """
    with no_grad():
        logits = model(np.array([[token]], dtype=np.int64), cache=cache)
    return _host_row(logits.data[0, -1, :])


class Generator:
    """A growing token sequence and the KV cache that makes extending it cheap (llama2.c's `RunState`, transformers' past_key_values).

    The prompt is scored in one forward pass (prefill), which fills the cache; after that each
    new token is one forward of a single position. `next_token` does the three steps: score,
    draw, append. `push(id)` appends a token chosen by the caller (it is scored lazily, on
    the next `next_token`). `tokens` is the whole sequence, prompt included, so a generation
    can be resumed later with `Generator(model, old.tokens)`.

    Past the context window: once the sequence would exceed `cfg.max_len`, the cache cannot
    grow; the Generator then does what nanoGPT's `generate` does -- it crops the sequence to
    its last max_len tokens and runs a full forward on them, without cache, for every further
    token. Positions restart at 0 in each cropped window, exactly as a plain forward of that
    window would see them. This costs O(max_len) work per token from then on, and the tokens
    are the same as a no-cache loop that forwards `tokens[-max_len:]` at each step.

    Unconditional generation: an empty prompt starts from `start_id`, the sequence then being
    [start_id] (as transformers' `generate()` without input_ids starts from bos_token_id, and
    llama2.c from BOS). The model has no tokenizer, so there is no default: pass
    `glassllm.tokenizers.start_id(tokenizer)` -- the tokenizer's `bos_id`, or its `eot_id` when
    it has none (GPT-2, the byte tokenizer: nanoGPT and transformers start GPT-2 from
    <|endoftext|>). `start_id` is only used for an empty prompt; a tokenizer that wants BOS
    before every prompt (Llama) puts it in the prompt ids itself.

    A tokenizer smaller than the model's vocabulary (a vocabulary padded to a round size, as
    nanoGPT's 50304 for GPT-2's 50257 ids, or the byte tokenizer given to a bigger model):
    `vocab_limit=tokenizer.vocab_size` makes `next_token` draw only ids below it (the others'
    logits count as -inf), so every token drawn can be decoded. `next_logits` stays the
    model's own.

    Args:
        model: a GlassLM (only read; its weights are not changed).
        prompt_ids: 1-D int ids (or (1, T)); any length (longer than max_len is cropped as
            above; empty needs `start_id`).
        start_id: the id an empty prompt starts from (None: an empty prompt is refused).
        vocab_limit: draw only ids in [0, vocab_limit) (None: the model's vocab_size).

    Raises:
        ValueError: empty prompt without start_id, not integers, not 1-D, or ids (start_id
            included) outside [0, vocab_size); vocab_limit not an integer in [1, vocab_size].
    """

    def __init__(self, model: GlassLM, prompt_ids, start_id: int | None = None,
                 vocab_limit: int | None = None):
        self.model = model
        self.cfg = model.cfg
        self.vocab_limit = self.cfg.vocab_size if vocab_limit is None else check_int(
            vocab_limit, "vocab_limit (at most the model's vocab_size, or None)", 1,
            self.cfg.vocab_size)
        ids = _check_prompt(model, prompt_ids, start_id)
        self.tokens: list[int] = [int(t) for t in ids]
        self._cache = KVCache(self.cfg, batch_size=1, device=model.device)
        self._fed = 0  # tokens[:_fed] are in the cache (meaningless once cropping starts)
        self._logits: np.ndarray | None = None  # next-token logits for tokens as they are

    def next_logits(self) -> np.ndarray:
        """(V,) float32 logits for the token after `tokens` (computed once, then reused)."""
        if self._logits is None:
            self._logits = self._score()
        return self._logits

    def next_token(self, sampling: Sampling = Sampling(),
                   rng: np.random.Generator | None = None) -> int:
        """Score the sequence, draw the next token with `sample_next` (among the ids below
        `vocab_limit`), append it, return it."""
        token = sample_next(mask_padding(self.next_logits(), self.vocab_limit), sampling, rng)
        self._append(token)
        return token

    def push(self, token_id: int) -> None:
        """Append `token_id` as if it had been drawn (forced decoding, or a resumed prompt).

        Raises:
            ValueError: not an integer in [0, vocab_size).
        """
        self._append(check_int(token_id, "push: token id", 0, self.cfg.vocab_size - 1))

    def _append(self, token: int) -> None:
        self.tokens.append(token)
        self._logits = None

    def _score(self) -> np.ndarray:
        max_len = self.cfg.max_len
        traced = taps.hook_for(self.model) is not None  # a trace records every step
        with no_grad():
            if len(self.tokens) <= max_len:
                # Fits: feed only what the cache has not seen (the whole prompt at first,
                # then one token per step, or several after push()es).
                fresh = np.asarray(self.tokens[self._fed:], dtype=np.int64)[None, :]
                if fresh.shape[1] == 1 and self._cache.length and not traced:
                    # one token against the cache: the engine's decoding step, if registered
                    # (not under a trace of this model: the trace takes the forward's taps)
                    self._fed = len(self.tokens)
                    step = kernels.pick(next_token_logits, on=self._cache.k)
                    return step(self.model, self._cache, int(fresh[0, 0]))
                logits = self.model(fresh, cache=self._cache)
                self._fed = len(self.tokens)
            else:
                if traced:
                    raise RuntimeError(
                        f"generate under a trace: the sequence ({len(self.tokens)} tokens) "
                        f"outgrew max_len={max_len}; past it each token re-forwards a sliding "
                        f"window from position 0, which one trace cannot record as one "
                        f"sequence (trace at most max_len tokens: prompt + new - 1)")
                # nanoGPT's crop: the window slides, so cached keys (computed at older
                # positions) no longer apply; re-forward the last max_len tokens.
                window = np.asarray(self.tokens[-max_len:], dtype=np.int64)[None, :]
                logits = self.model(window)
        return _host_row(logits.data[0, -1, :])


def _host_row(logits) -> np.ndarray:
    """The last position's logits (V,) as a new host NumPy array: sampling runs on the host,
    with NumPy's Generator, so one seed draws the same tokens on every device."""
    return logits.copy() if isinstance(logits, np.ndarray) else devices.to_host(logits)


def mask_padding(logits: np.ndarray, vocab_limit: int | None) -> np.ndarray:
    """logits (..., V) with the ids at and above `vocab_limit` set to -inf: the ids of a
    padded vocabulary that no token has (nanoGPT's 50304 rows for GPT-2's 50257 ids), never
    drawn nor picked as a guess. The same array when nothing is masked, else a copy.
    vocab_limit None: nothing masked."""
    if vocab_limit is None or vocab_limit >= logits.shape[-1]:
        return logits
    logits = logits.copy()
    logits[..., vocab_limit:] = -np.inf  # ids the tokenizer cannot decode
    return logits


def generate(model: GlassLM, prompt_ids, max_new_tokens: int, sampling: Sampling = Sampling(),
             rng: np.random.Generator | int | None = None,
             stop_id: int | None = None, start_id: int | None = None,
             vocab_limit: int | None = None) -> list[int]:
    """Extend `prompt_ids` by up to `max_new_tokens` tokens; return the new tokens only.

    Unconditional sampling: `generate(model, [], n, start_id=start_id(tokenizer))` (from
    `glassllm.tokenizers`) starts from the tokenizer's BOS, or end-of-text if it has none;
    the start id is not part of the result. See `Generator`.

    Args:
        model: a GlassLM.
        prompt_ids: 1-D int ids; empty only with `start_id` (see `Generator`).
        max_new_tokens: how many tokens to draw (>= 0).
        sampling: temperature / top_k / top_p (default: temperature 1, no cut-off).
        rng: numpy Generator for the draws, or an int seed (becomes
            np.random.default_rng(seed): the same seed gives the same tokens); None makes a
            fresh unseeded one (not reproducible). Unused when greedy.
        stop_id: if given (e.g. the tokenizer's eot_id), stop right after drawing it; it is
            the last element of the result.
        start_id: the id an empty prompt starts from (None: an empty prompt is refused).
        vocab_limit: draw only ids below it, e.g. the tokenizer's vocab_size when it is
            smaller than the model's (see `Generator`); None: any id of the model.

    Returns:
        list of max_new_tokens ints (fewer if stop_id was drawn).

    Raises:
        ValueError: bad prompt ids (or empty without start_id), max_new_tokens < 0, a
            negative seed, a bad vocab_limit.
        TypeError: rng is neither a np.random.Generator, an int nor None.
    """
    if is_int(rng):
        rng = np.random.default_rng(check_int(rng, "generate: an int rng (a seed)", low=0))
    elif rng is not None and not isinstance(rng, np.random.Generator):
        raise TypeError(f"generate: rng must be a np.random.Generator, an int seed or None, "
                        f"got {type(rng).__name__}")
    check_int(max_new_tokens, "max_new_tokens", low=0)
    generator = Generator(model, prompt_ids, start_id, vocab_limit)
    if rng is None and sampling.temperature > 0:
        rng = np.random.default_rng()
    new: list[int] = []
    for _ in range(max_new_tokens):
        token = generator.next_token(sampling, rng)
        new.append(token)
        if token == stop_id:
            break
    return new


def _check_prompt(model: GlassLM, prompt_ids, start_id: int | None = None) -> np.ndarray:
    ids = np.asarray(prompt_ids)
    if ids.ndim == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.ndim != 1:
        raise ValueError(f"prompt_ids must be 1-D (T,) or (1, T), got shape {ids.shape}")
    if ids.size == 0:
        if start_id is None:
            raise ValueError("prompt_ids is empty: an unconditional sample needs start_id, "
                             "the id to start from (glassllm.tokenizers.start_id(tokenizer): "
                             "its bos_id, or eot_id when it has none)")
        ids = np.array([check_int(start_id, "start_id (a token id)")], dtype=np.int64)
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"prompt_ids must be integer token ids, got dtype {ids.dtype}")
    bad = np.flatnonzero((ids < 0) | (ids >= model.cfg.vocab_size))
    if bad.size:
        raise ValueError(f"prompt_ids: token id {int(ids[bad[0]])} at position {int(bad[0])} "
                         f"is outside [0, {model.cfg.vocab_size})")
    return ids
