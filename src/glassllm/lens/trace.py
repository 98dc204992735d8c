"""Named values, forward and backward: look at (and edit) what a GlassLM computes.

    logits, cache = run_with_cache(model, ids)                       # every named value
    cache["blocks.0.attention.pattern"]                               # (B, n_heads, T, T)
    _, cache = run_with_cache(model, ids, targets, grads=True)        # + d loss / d value
    cache.grads["blocks.1.residual_out"]
    _, cache = run_with_cache(model, ids, names=["blocks.*.residual_out"],
                              stop_at="blocks.1.residual_out")    # skip the rest

    with Trace(model, names=["logits"]) as tr:                        # the same, by hand
        model(ids)
    tr.cache["logits"]

    steer = lambda value, name: value + vector                        # (C,) broadcast over B, T
    logits = run_with_hooks(model, ids, hooks=[("blocks.1.residual_out", steer)])
    with Trace(model, names=[], hooks=[("blocks.1.residual_out", steer)]):
        steered = generate(model, prompt, 20, Sampling(temperature=0))   # every step steered
    run_with_hooks(model, ids, hooks=[("blocks.*.hook_attn_out", fn)])  # TransformerLens names
    to_str_tokens(tokenizer, "Once upon a time")                      # ["<s>", " Once", ...]

The names are frozen in `NAMES` (one table, below; `tests/test_trace.py` fails if one changes)
and are the same for every architecture where the concept exists. The model passes each named value
through `glassllm.taps.tap`; a `Trace` is a `taps.Hook` bound to ONE model in the thread that
opens it (a forward of another model, or of the same model in another thread, runs untouched
inside its `with` block), and nothing here costs anything when unused. Under a trace,
`generate(model, ...)` records every step: the cache holds what one forward of the whole
sequence gives (`Trace`). The design follows TransformerLens' `run_with_cache` /
`ActivationCache` (one name per intermediate), with the lessons of its users: the names are one
tested table, a cache can be filtered (exact names or `fnmatch` patterns, baukit-style `stop_at`
to skip the rest of the forward), and its size is estimated before anything is kept
(`estimate_bytes`, `max_bytes`).

Values are the model's own float arrays, not copies (cheap; never write into them). Scores and
pattern are not handed out by the attention op (`functional.causal_attention`: its engine
form works in query blocks and never holds the T x T square): when one of them is asked for,
the trace computes them from the traced q and k (`attention_scores`), and
`tests/test_trace.py` checks they equal the probabilities inside the op. When a gradient of
scores/pattern, or an edit of them, is asked for, the attention of that layer is computed
explicitly as pattern @ v so both are on the autograd graph (equal to the fused op's output to
float32 rounding, tested).

Edits (`Edit`) replace part of a named value as the forward passes it (ablation, activation
patching; see `glassllm.lens.interpret`): the replaced elements are constants (zero gradient), the
others flow on unchanged. Hooks (`hooks=[(name, fn)]`, TransformerLens' `run_with_hooks`) run
any function on a named value, `fn(value, name)` returning the replacement (or None), and
backward hooks the same on its gradient. Names may be TransformerLens hook names
(`TRANSFORMER_LENS_NAMES`, from `transformer_lens_names`; docs/names-transformerlens.md).
"""
from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import math
from collections.abc import Iterable, Mapping

import numpy as np

from .. import functional as F
from .. import taps
from ..devices import device_of, host_dtype, namespace, to_device, to_host
from ..model import FAMILIES, Config, GlassLM
from ..tensor import Tensor, no_grad
# the table of TransformerLens' hook names, importable from here beside NAMES
from .transformer_lens_names import TRANSFORMER_LENS_NAMES  # noqa: F401
from .transformer_lens_names import is_transformer_lens_name, to_glassllm


# When a row of the table exists, by the model's switches (`glassllm.config.Config`)
WHEN = {
    "always": lambda cfg: True,
    "learned positions": lambda cfg: cfg.positions == "learned",
    "qk_norm": lambda cfg: cfg.qk_norm is not None,
    "post-norms": lambda cfg: cfg.norm_position != "pre",   # "sandwich" or "post"
    "gated MLP": lambda cfg: cfg.mlp in ("swiglu", "geglu"),
    "final_softcap": lambda cfg: cfg.final_softcap is not None,
}


@dataclasses.dataclass(frozen=True)
class Name:
    """One row of the names table: `template` ("{layer}" stands for 0..n_layers-1), the
    `shape` in letters (B batch, T positions, C d_model, H n_heads, K n_kv_heads, D head_dim,
    F d_ff, V vocab_size), `when` the model has it (a key of WHEN), and what it is."""
    template: str
    shape: str
    when: str
    doc: str

    def applies(self, cfg: Config) -> bool:
        """True when a model with `cfg` has this value."""
        return WHEN[self.when](cfg)

    @property
    def families(self) -> tuple[str, ...]:
        """The family presets (`glassllm.config.FAMILIES`) whose models have this value."""
        return tuple(f for f in FAMILIES if self.applies(Config.preset(f)))


# THE table of names, in the order the forward meets them. Frozen: renaming one breaks every
# user's analysis code (TransformerLens' v3 did exactly that); tests/test_trace.py pins it.
# A parallel block (GPT-NeoX, Phi) computes attention and MLP both from residual_in:
# mlp.input is then mlp_norm(residual_in) (Phi: attention.input itself), and residual_mid is
# residual_in + attention.output, a partial sum that no sublayer reads.
NAMES: tuple[Name, ...] = (
    Name("token_embedding", "B T C", "always",
         "token embedding rows (times sqrt(d_model) with embed_scale, Gemma): the first term "
         "of the residual"),
    Name("position_embedding", "T C", "learned positions",
         "learned position rows, added to the tokens"),
    Name("blocks.{layer}.residual_in", "B T C", "always", "residual stream entering the block"),
    Name("blocks.{layer}.attention.input", "B T C", "always",
         "attention_norm(residual_in): what attention reads (residual_in itself with "
         "norm_position 'post')"),
    Name("blocks.{layer}.attention.q_normed", "B T H D", "qk_norm",
         "q_norm(query(input)), before RoPE: per head ('head': Qwen3, Gemma 3) or over the "
         "whole projection ('proj': OLMo 2), shown per head"),
    Name("blocks.{layer}.attention.k_normed", "B T K D", "qk_norm",
         "k_norm(key(input)), before RoPE, as q_normed"),
    Name("blocks.{layer}.attention.q", "B T H D", "always",
         "queries (after RoPE, over the first rotary_dim channels, unless learned positions)"),
    Name("blocks.{layer}.attention.k", "B T K D", "always", "keys (after RoPE, as q)"),
    Name("blocks.{layer}.attention.v", "B T K D", "always", "values"),
    Name("blocks.{layer}.attention.scores", "B H T T", "always",
         "q.k / sqrt(head_dim) (x attn_scale if set), c tanh(./c) with attn_softcap; -inf "
         "where a key is hidden: in the query's future, or outside a sliding layer's window"),
    Name("blocks.{layer}.attention.pattern", "B H T T", "always",
         "softmax(scores): row i is where position i attends (rows sum to 1)"),
    Name("blocks.{layer}.attention.head_output", "B T H D", "always",
         "each head's pattern @ v, before the output projection"),
    Name("blocks.{layer}.attention.output", "B T C", "always",
         "the output projection of head_output (+ its bias if any): attention's contribution "
         "to the residual, unless post-norms"),
    Name("blocks.{layer}.attention.output_normed", "B T C", "post-norms",
         "attention_post_norm(attention.output): the contribution to the residual with "
         "norm_position 'sandwich' (Gemma 2/3) or 'post' (OLMo 2)"),
    Name("blocks.{layer}.residual_mid", "B T C", "always",
         "residual_in + attention's contribution"),
    Name("blocks.{layer}.mlp.input", "B T C", "always",
         "mlp_norm(residual_mid): what the MLP reads (residual_mid itself with norm_position "
         "'post'; from residual_in in a parallel block)"),
    Name("blocks.{layer}.mlp.hidden_pre", "B T F", "always",
         "the activation's input: gate(x) (SwiGLU, GeGLU) or up(x) (GELU)"),
    Name("blocks.{layer}.mlp.up", "B T F", "gated MLP", "up(x), the gated MLP's linear branch"),
    Name("blocks.{layer}.mlp.hidden_post", "B T F", "always",
         "silu(gate) * up, gelu_tanh(gate) * up, or gelu(up): what mlp.down reads"),
    Name("blocks.{layer}.mlp.output", "B T C", "always",
         "down(hidden_post): the MLP's contribution to the residual, unless post-norms"),
    Name("blocks.{layer}.mlp.output_normed", "B T C", "post-norms",
         "mlp_post_norm(mlp.output): the contribution with post-norms"),
    Name("blocks.{layer}.residual_out", "B T C", "always",
         "residual_mid + the MLP's contribution"),
    Name("final_norm", "B T C", "always",
         "final_norm(last residual_out): what the unembedding reads"),
    Name("logits_pre_softcap", "B T V", "final_softcap",
         "the unembedding's output before the final soft-cap (Gemma 2); logit attribution "
         "is of these"),
    Name("logits", "B T V", "always",
         "next-token logits (c tanh(logits_pre_softcap / c) with final_softcap)"),
)

DEFAULT_MAX_BYTES = 2 ** 30  # refuse to keep more than 1 GiB unless told otherwise


def names_for(cfg: Config) -> list[str]:
    """Every name a model with `cfg` exposes, in forward order (layers expanded)."""
    rows = [n for n in NAMES if n.applies(cfg)]
    per_layer = [n.template for n in rows if "{layer}" in n.template]
    first = next(i for i, n in enumerate(rows) if "{layer}" in n.template)
    head = [n.template for n in rows[:first]]
    tail = [n.template for n in rows[first + len(per_layer):]]
    return head + [t.format(layer=i) for i in range(cfg.n_layers) for t in per_layer] + tail


def _template_of(name: str) -> Name:
    parts = name.split(".")
    if parts[0] == "blocks" and len(parts) > 2:
        name = ".".join(["blocks", "{layer}", *parts[2:]])
    for row in NAMES:
        if row.template == name:
            return row
    raise KeyError(name)


def value_shape(cfg: Config, name: str, B: int, T: int) -> tuple[int, ...]:
    """Shape of the value `name` for a (B, T) batch, without running anything."""
    sizes = dict(B=B, T=T, C=cfg.d_model, H=cfg.n_heads, K=cfg.n_kv_heads, D=cfg.head_dim,
                 F=cfg.d_ff, V=cfg.vocab_size)
    return tuple(sizes[letter] for letter in _template_of(name).shape.split())


def estimate_bytes(cfg: Config, names: Iterable[str], B: int, T: int,
                   grads: Iterable[str] = (), itemsize: int = 4) -> int:
    """Bytes a cache of `names` (and gradients of `grads`) holds for a (B, T) batch of float32
    (itemsize 4) values; the scores/pattern of a layer count once each at B*H*T*T."""
    total = sum(math.prod(value_shape(cfg, n, B, T)) for n in names)
    total += sum(math.prod(value_shape(cfg, n, B, T)) for n in grads)
    return total * itemsize


def select_names(cfg: Config, names=None) -> list[str]:
    """The names of `names_for(cfg)` picked by `names`: None (all), or an iterable of exact
    names and `fnmatch` patterns ("blocks.*.attention.pattern", "*.residual_out"), or
    TransformerLens hook names ("blocks.0.hook_resid_post", "blocks.*.attn.hook_z"; mapped by
    `TRANSFORMER_LENS_NAMES`).

    Raises:
        ValueError: an exact name the model does not have, or a pattern matching nothing (the
            message names the nearest known names: a misspelt name never silently traces
            nothing).
    """
    every = names_for(cfg)
    if names is None:
        return every
    if isinstance(names, str):
        names = [names]
    chosen = set()
    for wanted in names:
        if not isinstance(wanted, str):
            raise ValueError(f"trace names must be strings, got {wanted!r}")
        if is_transformer_lens_name(wanted):
            wanted = to_glassllm(wanted, cfg.family, cfg.positions == "rope")
        hits = fnmatch.filter(every, wanted) if any(c in wanted for c in "*?[") else \
            [wanted] if wanted in every else []
        if not hits:
            near = difflib.get_close_matches(wanted, every, n=3, cutoff=0.5)
            raise ValueError(f"trace: {wanted!r} matches no value of this {cfg.family} model "
                             f"({cfg.n_layers} layers)" +
                             (f"; did you mean {', '.join(near)}?" if near else
                              "; see glassllm.lens.trace.NAMES"))
        chosen.update(hits)
    return [n for n in every if n in chosen]


@dataclasses.dataclass(frozen=True)
class Edit:
    """Replace `value[index]` of the named value by `replacement` as the forward passes it.

    name: an exact name or an `fnmatch` pattern ("blocks.*.mlp.output": every value it matches).

    index: a NumPy index into the value (e.g. `(slice(None), slice(None), head)` for one head
    of `head_output` (B, T, H, D), `(slice(None), position)` for one position); `...` for all.
    replacement: an array broadcastable to `value[index]` (a scalar 0.0 is zero-ablation, a mean
    is mean-ablation, another run's `cache[name][index]` is activation patching).
    Gradients: the replaced elements are constants (zero gradient), the rest flows through.
    """
    name: str
    index: object
    replacement: object

    def apply(self, x: Tensor) -> Tensor:
        xp, index = namespace(x.data), _full_index(self.index, x.data)
        new = xp.asarray(x.data, copy=True)
        new[index] = _on_device_of(self.replacement, x.data)

        def backward(g):
            g = xp.asarray(g, copy=True)
            g[index] = 0
            return (g,)

        return Tensor.from_op(new, (x,), backward)


class TraceTooLarge(MemoryError):
    """The requested cache would exceed `max_bytes` (raised before anything is kept)."""


class _StopForward(Exception):
    """Raised by `tap` at `stop_at`; `Trace.__exit__` swallows it."""


class Cache(Mapping):
    """Named values of one forward: `cache[name]` -> np.ndarray, in `names_for` order.

    Attributes:
        grads: dict name -> d loss / d value (same shape), filled by the backward pass.
        loss: mean cross-entropy in nats, when `run_with_cache` had targets (else None).
        cfg: the model's Config.
        tokens: the (B, T) ids recorded (every step's, for a generation).
        start: the position of tokens[:, 0] (0 unless the trace began after a KV cache was
            filled).
    """

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.values: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        self.loss: float | None = None
        self.tokens: np.ndarray | None = None
        self.start = 0

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.values[name]
        except KeyError:
            raise KeyError(f"{name!r} is not in this cache (traced: "
                           f"{len(self.values)} names; see Cache.keys())") from None

    def __iter__(self):
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def stack(self, template: str) -> np.ndarray:
        """`template` with "{layer}" for every layer, stacked on a new first axis:
        stack("blocks.{layer}.attention.pattern") -> (n_layers, B, H, T, T)."""
        return np.stack([self[template.format(layer=i)] for i in range(self.cfg.n_layers)])

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.values.values()) + \
            sum(a.nbytes for a in self.grads.values())


class Trace(taps.Hook):
    """Context manager: while open, the forwards of `model` in this thread record their
    named values (and apply `edits`).

    Bound to one model in one thread (`glassllm.taps`): inside the `with` block, a forward of
    another model, or of `model` in another thread, is neither recorded nor edited.

    One sequence per trace. A forward from position 0 starts the record afresh (a second one
    replaces the first's values: the last micro-batch of a gradient-accumulation step is what
    health sees). A forward that continues the KV cache of the recorded one -- generation
    (`glassllm.generate.generate`, `Generator`), or `model(ids, cache=kv)` step by step --
    appends its values along T, the earlier rows of scores/pattern widened with -inf/0 for the
    keys that were then in the future: the cache then holds what ONE forward of the whole
    sequence (`cache.tokens`) gives, every step recorded. Edits apply to each forward's own
    value (a decoding step's value has one position).

    Args:
        model: the GlassLM to trace.
        names: None (all), or exact names / fnmatch patterns (`select_names`).
        grads: False, True (gradients of every traced value), or names/patterns: gradients of
            those (they are traced too). Filled when the caller runs `backward()` inside the
            block (`run_with_cache` does it with targets). For one forward: a forward
            continuing the recorded one's KV cache is refused with grads.
        stop_at: one exact name (no pattern): record it, then skip the rest of the forward
            (the `with` block ends there; the model call raises an internal exception that
            `__exit__` swallows).
        edits: `Edit`s applied as the forward passes their names (an Edit whose name is a
            pattern applies to every value it matches: "blocks.*.mlp.output").
        max_bytes: refuse (TraceTooLarge, before keeping anything of that forward) a cache
            estimated larger, the steps of a generation counted together; None for no limit.
        hooks: (name_or_pattern, fn) pairs: `fn(value, name)` gets each matching value as the
            forward passes it (after the edits), a read-only float32 array, and returns the
            array that replaces it (same shape) or None to leave it. Applied in the order
            given, to every forward of a generation (each step's own value). The replacement
            passes the gradient through unchanged (d new / d value taken as the identity:
            exact for an added vector -- steering -- and a straight-through estimate for any
            other function; an `Edit`'s replaced elements get zero gradient instead).
        backward_hooks: (name_or_pattern, fn) pairs: `fn(grad, name)` gets d loss / d value
            (read-only, the value's shape) when a backward pass reaches the value, and returns
            the gradient passed on towards the inputs (or None to leave it); `cache.grads`
            keeps what arrived, before the hook. Names: as `names` (TransformerLens hook names
            too).

    Raises:
        ValueError: unknown names (see `select_names`), stop_at unknown or a pattern, stop_at
            together with grads or backward hooks, grads or backward hooks with a forward
            continuing the record's KV cache, a hook that is not a (name, callable) pair or
            returns an array of another shape (naming the hook's name).
        RuntimeError: a trace is already open in this thread (they do not nest).
        TraceTooLarge: at a forward, if `estimate_bytes` of the record exceeds max_bytes.
    """

    def __init__(self, model: GlassLM, names=None, grads=False, stop_at: str | None = None,
                 edits: Iterable[Edit] = (), max_bytes: int | None = DEFAULT_MAX_BYTES,
                 hooks: Iterable = (), backward_hooks: Iterable = ()):
        super().__init__(model)
        cfg = model.cfg
        self.hooks = hooks_by_name(cfg, hooks, "hooks")
        self.backward_hooks = hooks_by_name(cfg, backward_hooks, "backward_hooks")
        if isinstance(stop_at, str) and is_transformer_lens_name(stop_at):
            stop_at = to_glassllm(stop_at, cfg.family, cfg.positions == "rope")
        if grads is False:
            grad_names = []
        elif grads is True:  # the gradient of every traced value
            grad_names = select_names(cfg, names)
        else:
            grad_names = select_names(cfg, grads)
        self.names = select_names(cfg, names)
        self.names += [n for n in grad_names if n not in self.names]
        self._wanted = set(self.names)
        self._grad_names = set(grad_names)
        if stop_at is not None:
            # one exact name: a pattern would name several places to stop, or none that
            # the forward meets (it compares names, so the forward would run to the end)
            if not isinstance(stop_at, str) or any(c in stop_at for c in "*?["):
                raise ValueError(f"trace: stop_at takes one exact name, not {stop_at!r}")
            select_names(cfg, [stop_at])  # raises for an unknown name
            if grad_names or self.backward_hooks:
                raise ValueError("trace: stop_at skips the loss, so it cannot have grads or "
                                 "backward hooks")
        self.stop_at = stop_at
        if stop_at is not None and stop_at not in self._wanted:
            self.names.append(stop_at)
            self._wanted.add(stop_at)
        self.edits = {}
        for edit in edits:  # a pattern edits every value it matches
            for name in select_names(cfg, [edit.name]):
                self.edits.setdefault(name, []).append(edit)
        self.max_bytes = max_bytes
        self.cache = Cache(cfg)
        self._kv = None         # the KVCache of the recorded forward (None: none used)
        self._end = 0           # the position after the recorded forward's last token
        self._appending = False  # the running forward continues the record

    # ------------------------------------------------------------------ context
    def __enter__(self) -> "Trace":
        taps.install(self)
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        taps.uninstall(self)
        return kind is _StopForward

    def estimate(self, B: int, T: int) -> int:
        """Bytes this trace keeps for a (B, T) batch (values + gradients)."""
        return estimate_bytes(self.model.cfg, self.names, B, T, self._grad_names)

    # ------------------------------------------------------------------ called by the model
    def begin(self, ids: np.ndarray, start: int, kv_cache) -> None:
        """A forward of the model starts (ids (B, T) at positions start..start+T): record it
        afresh, or after the recorded one when it continues that one's KV cache."""
        recorded = self.cache.tokens
        self._appending = (kv_cache is not None and kv_cache is self._kv
                           and start == self._end and recorded is not None)
        if self._appending and (self._grad_names or self.backward_hooks):
            raise ValueError("trace: gradients are kept for one forward; this forward continues "
                             "the recorded one's KV cache (generation): trace it with "
                             "grads=False and no backward_hooks")
        tokens = np.concatenate([recorded, ids], axis=1) if self._appending else ids
        self._check_size(*tokens.shape)
        self.cache.tokens = tokens
        if not self._appending:
            self.cache.start = start
        self._kv, self._end = kv_cache, start + ids.shape[1]

    def tap(self, name: str, x: Tensor) -> Tensor:
        """The model passes each named value here (only during a forward of this trace's model
        in its thread); the returned tensor (edited, or wrapped to catch its gradient)
        replaces it."""
        for edit in self.edits.get(name, ()):
            x = edit.apply(x)
        for fn in self.hooks.get(name, ()):
            x = _replace(fn, name, x)
        if x.requires_grad and name in self.backward_hooks:
            x = _replace_grad(self.backward_hooks[name], name, x)
        if name in self._wanted:
            old = self.cache.values.get(name) if self._appending else None
            value = to_host(x.data)  # the cache is NumPy on every device
            self.cache.values[name] = value if old is None else _join(name, old, value)
            if name in self._grad_names and x.requires_grad:
                x = self._catch_grad(name, x)
        if name == self.stop_at:
            raise _StopForward
        return x

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, q_start: int,
               **options) -> Tensor:
        """The attention of block `layer` (B, T, H, D), with its scores/pattern traced when
        asked for: computed apart from the fused op, or, for their gradients or edits, made
        the path the output takes. options: the op's scale, softcap, window."""
        s_name = f"blocks.{layer}.attention.scores"
        p_name = f"blocks.{layer}.attention.pattern"
        involved = {s_name, p_name}
        changed = set(self.edits) | set(self.hooks) | set(self.backward_hooks)
        if not involved & (self._wanted | changed | {self.stop_at}):
            return F.causal_attention(q, k, v, q_start=q_start, **options)
        on_graph = bool(involved & (self._grad_names | changed))
        if not on_graph:
            with no_grad():
                scores = Tensor(attention_scores(q.data, k.data, q_start, **options))
                self.tap(s_name, scores)
                self.tap(p_name, Tensor(softmax_rows(scores.data)))
            return F.causal_attention(q, k, v, q_start=q_start, **options)
        scores = self.tap(s_name, scores_op(q, k, q_start, **options))
        pattern = self.tap(p_name, softmax_op(scores))
        return mix_op(pattern, v)

    # ------------------------------------------------------------------ internals
    def _check_size(self, B: int, T: int) -> None:
        need = self.estimate(B, T)
        if self.max_bytes is not None and need > self.max_bytes:
            raise TraceTooLarge(
                f"trace: this cache would hold {need:,} bytes ({need / 2**20:,.1f} MiB) for a "
                f"({B}, {T}) batch, over max_bytes={self.max_bytes:,}; trace fewer names "
                f"(names=[...]), a shorter input, or raise max_bytes")

    def _catch_grad(self, name: str, x: Tensor) -> Tensor:
        grads = self.cache.grads

        def backward(g):
            host = to_host(g)  # as the values: NumPy on every device
            grads[name] = grads[name] + host if name in grads else np.array(host, copy=True)
            return (g,)

        return Tensor.from_op(x.data, (x,), backward)


def _join(name: str, old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """The values of `name` in two consecutive forwards of one sequence, joined along T. The
    earlier rows of scores/pattern (B, H, Tq, Tk) are first widened to the new Tk with what
    one forward holds for a key in a query's future: a -inf score, a 0 probability."""
    letters = _template_of(name).shape.split()
    if letters[-2:] == ["T", "T"]:
        widths = [(0, 0)] * (old.ndim - 1) + [(0, new.shape[-1] - old.shape[-1])]
        old = np.pad(old, widths, constant_values=-np.inf if name.endswith("scores") else 0)
    return np.concatenate([old, new], axis=letters.index("T"))


def hooks_by_name(cfg: Config, hooks: Iterable, what: str = "hooks") -> dict[str, list]:
    """(name_or_pattern, fn) pairs (or a {name_or_pattern: fn} dict, or None: no hooks) ->
    {name: [fn, ...]} over the names each pattern matches, in the order given
    (`select_names`: exact names, fnmatch patterns, TransformerLens names).

    Raises:
        ValueError: an item that is not a (str, callable) pair; an unknown name.
    """
    if hooks is None:
        hooks = ()
    elif isinstance(hooks, dict):  # {name: fn}
        hooks = list(hooks.items())
    elif isinstance(hooks, tuple) and len(hooks) == 2 and isinstance(hooks[0], str):
        hooks = [hooks]  # one pair given bare
    by_name: dict[str, list] = {}
    for item in hooks:
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and
                isinstance(item[0], str) and callable(item[1])):
            raise ValueError(f"trace: {what} must be (name_or_pattern, fn) pairs with fn "
                             f"callable, got {item!r}"[:200])
        for name in select_names(cfg, [item[0]]):
            by_name.setdefault(name, []).append(item[1])
    return by_name


def _full_index(index, like):
    """A NumPy index as the array API standard takes it: on another device than the CPU, a
    tuple naming fewer axes than `like` has gets the trailing `...` NumPy implies."""
    if isinstance(like, np.ndarray) or index is Ellipsis:
        return index
    parts = index if isinstance(index, tuple) else (index,)
    return parts if Ellipsis in parts or len(parts) >= like.ndim else (*parts, Ellipsis)


def _on_device_of(value, like):
    """A hook's or an edit's host value (array or scalar) on the device of `like`."""
    if isinstance(like, np.ndarray) or isinstance(value, (int, float)):
        return value
    return to_device(np.asarray(to_host(value), dtype=host_dtype(like)), device_of(like))


def _read_only(a: np.ndarray) -> np.ndarray:
    """A view of `a` that refuses writes: a hook returns its replacement, it never writes
    into the forward's own arrays (the autograd graph keeps them for the backward pass)."""
    view = a.view()
    view.flags.writeable = False
    return view


def _checked(result, like: np.ndarray, name: str, what: str) -> np.ndarray | None:
    """A hook's result as a fresh array of `like`'s dtype and shape, or None.

    Raises:
        ValueError: not an array of real numbers (complex, strings, objects, a glassllm
            Tensor: no silent cast), or another shape; the hook's name in the message.
    """
    if result is None:
        return None
    found = np.asarray(result) if not isinstance(result, Tensor) else None
    if found is None or found.dtype.kind not in "biuf":
        kind = f"a {type(result).__name__}" if found is None or found.ndim == 0 else \
            f"an array of dtype {found.dtype}"
        raise ValueError(f"trace: the {what} on {name!r} returned {kind}; it must return a "
                         f"NumPy array of real numbers (a Tensor's .data) or None")
    # a copy: the result may be the read-only view itself, or another view of the forward's
    out = np.array(found, dtype=like.dtype, copy=True)
    if out.shape != like.shape:
        raise ValueError(f"trace: the {what} on {name!r} returned shape {out.shape}; the "
                         f"{what.split()[0]} it replaces has shape {like.shape}")
    return out


def _replace(fn, name: str, x: Tensor) -> Tensor:
    """The forward hook `fn` on value x: its replacement, gradient passed straight through.
    Hooks see host NumPy arrays on every device (a copy from another device)."""
    value = to_host(x.data)
    new = _checked(fn(_read_only(value), name), value, name, "value hook")
    if new is None:
        return x
    return Tensor.from_op(_on_device_of(new, x.data), (x,), lambda g: (g,))


def _replace_grad(fns: list, name: str, x: Tensor) -> Tensor:
    """x as it is, whose gradient on the way back passes through the backward hooks `fns`."""

    def backward(g):
        host = to_host(g)  # hooks see NumPy, as the value hooks
        for fn in fns:
            new = _checked(fn(_read_only(host), name), host, name, "gradient hook")
            host = host if new is None else new
        return (host if isinstance(g, np.ndarray) else _on_device_of(host, g),)

    return Tensor.from_op(x.data, (x,), backward)


def run_with_hooks(model: GlassLM, ids, hooks: Iterable = (), backward_hooks: Iterable = (),
                   targets=None) -> np.ndarray:
    """Run the model once with `hooks` on its named values; return the logits (B, T, V),
    float32, as `model(ids).data` (TransformerLens' `run_with_hooks`).

    hooks: (name_or_pattern, fn) pairs; `fn(value, name)` returns the replacement array or
    None (see `Trace`). Names: exact, fnmatch patterns, or TransformerLens hook names
    ("blocks.0.hook_resid_post"; `TRANSFORMER_LENS_NAMES`).
    backward_hooks: the same for gradients, `fn(grad, name)`; they need `targets` (B, T), the
    loss (mean next-token cross-entropy) whose backward pass reaches them.
    ids: (B, T) or (T,) token ids. Nothing is recorded (use `Trace(..., hooks=...)` or
    `run_with_cache` to keep values too). Without backward hooks the forward runs under
    `no_grad`; with them, the parameters' `.grad` accumulate as after any backward pass.

    Raises:
        ValueError: backward hooks without targets, and `Trace`'s and `GlassLM.check_ids`'
            errors.
    """
    tr = Trace(model, names=[], hooks=hooks, backward_hooks=backward_hooks, max_bytes=None)
    if tr.backward_hooks and targets is None:
        raise ValueError("run_with_hooks: backward hooks need targets (the loss whose "
                         "gradients they see)")
    ids = model.check_ids(ids)
    with tr:
        if not tr.backward_hooks:
            with no_grad():
                return to_host(model.forward(ids).data)
        out = model.forward(ids)
        F.cross_entropy(out, model.check_ids(targets, what="targets")).backward()
        return to_host(out.data)


def run_with_cache(model: GlassLM, ids, targets=None, names=None, grads=False,
                   stop_at: str | None = None, edits: Iterable[Edit] = (),
                   max_bytes: int | None = DEFAULT_MAX_BYTES):
    """Run the model once and return (logits, Cache).

    ids: (B, T) or (T,) token ids. targets: same shape; when given, `cache.loss` is the mean
    next-token cross-entropy (nats) and, with `grads`, `cache.grads[name]` holds d loss / d
    value. logits: (B, T, V) float32 array, or None when `stop_at` ended the forward early.
    The other arguments are `Trace`'s. Without grads the forward runs under `no_grad`.

    Raises:
        ValueError: grads without targets, plus `Trace`'s and `GlassLM.check_ids`' errors.
        TraceTooLarge: before the forward, if the cache would exceed max_bytes.
    """
    if grads is not False and targets is None:
        raise ValueError("run_with_cache: gradients need targets (the loss they belong to)")
    tr = Trace(model, names=names, grads=grads, stop_at=stop_at, edits=edits,
               max_bytes=max_bytes)
    ids = model.check_ids(ids)
    tr._check_size(*ids.shape)  # raises TraceTooLarge before anything runs
    logits = None
    with tr:
        if grads is False:
            with no_grad():
                out = model.forward(ids)
                if targets is not None:
                    tr.cache.loss = float(F.cross_entropy(out, model.check_ids(
                        targets, what="targets")).item())
        else:
            out = model.forward(ids)
            targets = model.check_ids(targets, what="targets")
            loss = F.cross_entropy(out, targets)
            tr.cache.loss = float(loss.item())
            loss.backward()
        logits = to_host(out.data)  # host NumPy, as the cache
    return logits, tr.cache


# --------------------------------------------------------------------------- tokens as text
def padding_text(token_id: int) -> str:
    """How a padded vocabulary's id that no token has is shown (`token_text`)."""
    return f"(padding id {int(token_id)})"


def token_text(tokenizer, token_id: int) -> str:
    """A token as display text: its bytes decoded as UTF-8 with undecodable bytes as \\xNN;
    "<id>" without a tokenizer; "(padding id N)" for an id at or past the tokenizer's
    vocab_size -- a row of a vocabulary padded to a round size (Pythia's 50304 for 50277
    tokens, nanoGPT's 50304 for GPT-2's 50257) that no token has, which the model still
    scores (`glassllm.generate.mask_padding` keeps generation off them)."""
    token_id = int(token_id)
    if tokenizer is None:
        return f"<{token_id}>"
    if token_id >= getattr(tokenizer, "vocab_size", token_id + 1):
        return padding_text(token_id)
    if token_id == getattr(tokenizer, "bos_id", None):
        return "<s>"
    if token_id == getattr(tokenizer, "eot_id", None):
        return "<|eot|>"
    if hasattr(tokenizer, "piece_bytes"):  # SentencePiece: the piece, its leading space kept
        raw = tokenizer.piece_bytes(token_id, prev_id=-1)
    else:
        raw = tokenizer.decode_bytes([token_id])
    return raw.decode("utf-8", errors="backslashreplace")


def to_str_tokens(tokenizer_or_lm, ids_or_text, prepend_bos: bool | None = None):
    """Each token as its text (TransformerLens' `to_str_tokens`): list[str], one per token.

    tokenizer_or_lm: a glassllm tokenizer, or an object holding one as `.tokenizer` (what
    `glassllm.load` returns). ids_or_text: token ids (T,) or (1, T) -> list[str]; (B, T) ->
    one list per row; or a text, encoded as `glassllm generate` encodes a prompt (BOS first
    where the tokenizer has one; prepend_bos=False leaves it out, True requires one). Each
    token's bytes are decoded alone (UTF-8; an incomplete character's bytes as \\xNN); BOS and
    the end-of-text token as "<s>" and "<|eot|>" (`token_text`).

    Raises:
        ValueError: no tokenizer; ids that are not integers in [0, vocab_size) or not 1-D/2-D;
            prepend_bos=True for a tokenizer without BOS.
    """
    def is_tokenizer(obj) -> bool:
        return hasattr(obj, "encode") and hasattr(obj, "vocab_size")

    tokenizer = tokenizer_or_lm if is_tokenizer(tokenizer_or_lm) else \
        getattr(tokenizer_or_lm, "tokenizer", None)
    if not is_tokenizer(tokenizer):
        raise ValueError(f"to_str_tokens needs a tokenizer (or an object with .tokenizer), got "
                         f"{type(tokenizer_or_lm).__name__}")
    if isinstance(ids_or_text, str):
        bos = getattr(tokenizer, "bos_id", None)
        if prepend_bos and bos is None:
            raise ValueError(f"to_str_tokens: prepend_bos=True but this "
                             f"{type(tokenizer).__name__} has no BOS token")
        ids = [int(i) for i in tokenizer.encode(ids_or_text)]
        if bos is not None and prepend_bos is not False:
            ids = [int(bos)] + ids
        return [token_text(tokenizer, i) for i in ids]
    ids = np.asarray(ids_or_text)
    if ids.size == 0 and ids.dtype.kind == "f":
        ids = ids.astype(np.int64)  # [] is float64 to NumPy: no tokens, no text
    if ids.ndim == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dtype.kind not in "iu" or ids.ndim not in (1, 2) or ids.size and not (
            0 <= ids.min() and ids.max() < tokenizer.vocab_size):
        raise ValueError(f"to_str_tokens: ids must be integers in [0, {tokenizer.vocab_size}), "
                         f"shape (T,) or (B, T); got dtype {ids.dtype}, shape {ids.shape}")
    if ids.ndim == 2:
        return [[token_text(tokenizer, i) for i in row] for row in ids]
    return [token_text(tokenizer, i) for i in ids]


# --------------------------------------------------------------------------- explicit attention
# What causal_attention computes, with the T x T square materialised: functional's reference
# pieces (scores = q k^T / sqrt(D) with the causal mask, pattern = softmax(scores), y =
# pattern @ v; query head h reads KV head h // (H / K)), used when a trace asks for
# scores/pattern. The names below are the ones `Trace.attend` calls.
def attention_scores(q: np.ndarray, k: np.ndarray, q_start: int = 0, **options) -> np.ndarray:
    """q (B, Tq, H, D), k (B, Tk, K, D) -> scores (B, H, Tq, Tk) (`F.attention_scores_forward`;
    options: scale, softcap, window)."""
    return F.attention_scores_forward(q, k, q_start, **options)[0]


softmax_rows = F.softmax_rows  # the library's softmax, over the last axis
scores_op = F.attention_scores  # autograd ops: (B, Tq, H, D), (B, Tk, K, D) -> (B, H, Tq, Tk)
softmax_op = F.softmax
mix_op = F.attention_mix  # (B, H, Tq, Tk), (B, Tk, K, D) -> (B, Tq, H, D)
