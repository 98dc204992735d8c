"""Taps: where the model shows (and lets a trace edit) the values it computes.

The model passes each named value through `tap(name, value)` and forms attention through
`attend(layer, q, k, v, q_start)`. With no hook they are the identity and
`functional.causal_attention`: a thread-local lookup and a compare, so the plain forward pays
nothing measurable (bench/trace_overhead.py). The names are frozen and documented in
`glassllm.lens.trace.NAMES`.

A hook (`Hook`; `glassllm.lens.trace.Trace` is one) is BOUND TO ONE MODEL IN ONE THREAD:
`install(hook)` makes it see the forwards of `hook.model` run in the thread that installed it,
and nothing else -- a forward of another model, or of the same model in another thread, runs
untouched meanwhile. `GlassLM.forward` opens `watch(model, ids, start, kv_cache)` around its
body, which turns the hook on for the duration of that forward when it is bound to that model.
Grad mode (`tensor.no_grad`) and autocast (`amp`) are per thread for the same reason.
"""
from __future__ import annotations

import contextlib
import threading

from . import functional as F


class Hook:
    """What a forward of `model` calls while this hook is installed (the defaults change
    nothing). Subclass and override; `install(hook)` to bind it."""

    def __init__(self, model):
        self.model = model

    def begin(self, ids, start: int, kv_cache) -> None:
        """A forward of `self.model` starts: ids (B, T) int array at positions start..start+T
        (start > 0 when it continues `kv_cache`, a KVCache, else None)."""

    def tap(self, name: str, value):
        """The named value (a Tensor); what is returned replaces it in the forward."""
        return value

    def attend(self, layer: int, q, k, v, q_start: int, **options):
        """The attention of block `layer`: q (B, Tq, H, D), k and v (B, Tk, K, D) ->
        (B, Tq, H, D), as `functional.causal_attention` (options: its scale, softcap,
        window)."""
        return F.causal_attention(q, k, v, q_start=q_start, **options)


class _State(threading.local):
    installed: Hook | None = None  # the hook installed in this thread
    active: Hook | None = None     # the same, while a forward of its model runs in this thread


_state = _State()


def tap(name: str, value):
    """`value`, or what the active hook makes of it (see `Hook.tap`)."""
    hook = _state.active
    return value if hook is None else hook.tap(name, value)


def attend(layer: int, q, k, v, q_start: int, **options):
    """Causal attention of block `layer` (see `Hook.attend`); the fused op when no hook."""
    hook = _state.active
    if hook is None:
        return F.causal_attention(q, k, v, q_start=q_start, **options)
    return hook.attend(layer, q, k, v, q_start, **options)


@contextlib.contextmanager
def watch(model, ids, start: int, kv_cache):
    """Around one forward of `model`: the taps reach the hook installed in this thread if it is
    bound to `model` (after its `begin(ids, start, kv_cache)`), else no hook at all."""
    hook = hook_for(model)
    if hook is not None:
        hook.begin(ids, start, kv_cache)
    outer, _state.active = _state.active, hook
    try:
        yield
    finally:
        _state.active = outer


def hook_for(model) -> Hook | None:
    """The hook installed in this thread for `model`, or None."""
    hook = _state.installed
    return hook if hook is not None and hook.model is model else None


def install(hook: Hook) -> None:
    """Bind `hook` to the forwards of `hook.model` in this thread.

    Raises:
        RuntimeError: a hook is already installed in this thread (hooks do not nest).
    """
    if _state.installed is not None:
        raise RuntimeError("a glassllm trace is already active in this thread (traces do not "
                           "nest)")
    _state.installed = hook


def uninstall(hook: Hook) -> None:
    """Undo `install(hook)` (nothing if `hook` is not the one installed in this thread)."""
    if _state.installed is hook:
        _state.installed = None
