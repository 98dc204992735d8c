"""The switch between the reference forms of the ops and the engine's fast forms.

Every op of glassllm has a reference form, written as its formula reads (`glassllm.functional`,
`glassllm.optim`, `glassllm.generate`): the definition a learner reads and the tests check
against. Most also have a fast form in `glassllm.engine` (sliced over threads, in place, blocked
attention), tested equal to the reference in `tests/test_kernels.py`. This module is where the
two meet:

    kernels.register(reference, fast)    # the engine, when `glassllm` is imported (once per op)
    kernels.pick(reference)              # the op, each time it runs: the form to use now
    with kernels.use("reference"): ...   # tests: run the references (or "engine") inside
    kernels.mode()                       # "engine" or "reference"

The mode starts as the environment variable GLASSLLM_KERNELS says, read once, at the first op:
"engine" (the default) picks the fast form wherever one is registered, "reference" picks the
reference everywhere. `set_mode` changes the process's mode; `use` changes it for the thread
that runs the block only (per thread, as grad mode, autocast and the taps are: two threads'
blocks cannot leave each other's mode behind). A forward/backward pair is registered as a
pair (two tuples): the `saved` values the forward hands its backward are the pair's own
format, so the two are swapped together, and an op picks both when its forward runs.

The one matrix product of the library is here too, `matmul(a, b, out=None)`, in two layers
that plug in from outside, so that the core (`tensor`, `functional`) imports neither the
engine nor autocast:

- the GEMM: `np.matmul`, until the engine registers its BLAS backend (`register_gemm`); it
  computes the same product, so it stays in reference mode too ("matrix products stay on
  BLAS");
- autocast (`glassllm.amp`), which installs itself (`install_autocast`): the rounding of a
  product's inputs and output to float16/bfloat16, `keep_context` (an op's backward runs in
  the precision its forward ran in) and `round_product`.

This module imports NumPy and the standard library only.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Callable

import numpy as np

ENV_VAR = "GLASSLLM_KERNELS"
MODES = ("engine", "reference")


def _check_mode(name) -> str:
    if name not in MODES:
        raise ValueError(f"{ENV_VAR}: expected 'engine' or 'reference', got {name!r}")
    return name


# The process's mode, from GLASSLLM_KERNELS at the first op (checked then, not at import: a
# mistyped value is then one error line from the command that ran the op, not a traceback
# from `import glassllm`); set_mode replaces it.
_mode: str | None = None
_fast: dict[Callable, Callable] = {}  # reference -> the engine's fast form


class _ThreadMode(threading.local):
    name: str | None = None  # this thread's mode inside `use`; None: the process's


_thread = _ThreadMode()


def mode() -> str:
    """The mode ops run in now, in this thread: "engine" (fast forms where registered) or
    "reference"."""
    return _thread.name or _mode or _mode_from_environment()


def _mode_from_environment() -> str:
    global _mode
    _mode = _check_mode(os.environ.get(ENV_VAR, "engine").strip().lower() or "engine")
    return _mode


def set_mode(name: str) -> None:
    """Run the ops of every thread in `name` mode from now on ("engine" or "reference"), as
    GLASSLLM_KERNELS (a thread inside a `use` block keeps that block's mode).

    Raises:
        ValueError: another name.
    """
    global _mode
    _mode = _check_mode(name)


@contextlib.contextmanager
def use(name: str):
    """Context manager: the ops this thread runs inside the block run in `name` mode; other
    threads keep theirs, and this thread's previous mode is back on exit. An op picks its forms
    when its forward runs, so a backward called after the block runs the pair its forward ran.

    Raises:
        ValueError: a name other than "engine" or "reference".
    """
    previous, _thread.name = _thread.name, _check_mode(name)
    try:
        yield
    finally:
        _thread.name = previous


def register(reference, fast, *, replaces: bool = False) -> None:
    """Make `fast` the engine form of `reference` (functions, or equal-length tuples of them:
    a forward/backward pair is registered together). Each op has at most one fast form: a
    second registration for an op is an error unless it says `replaces=True` (then it
    replaces the first), so which form runs never depends on the order of registration.

    Raises:
        TypeError: a tuple against a single function, tuples of different lengths, or
            something that is not callable.
        ValueError: `reference` already has a fast form and `replaces` is False (one line,
            naming the op and the form it has).
    """
    references = tuple(reference) if isinstance(reference, tuple) else (reference,)
    fasts = tuple(fast) if isinstance(fast, tuple) else (fast,)
    if len(references) != len(fasts) or isinstance(reference, tuple) != isinstance(fast, tuple):
        raise TypeError(f"kernels.register: {len(references)} reference form(s) against "
                        f"{len(fasts)} fast form(s)")
    for ref, f in zip(references, fasts):
        if not (callable(ref) and callable(f)):
            raise TypeError(f"kernels.register: {ref!r} and {f!r} must both be functions")
        if not replaces and ref in _fast:
            raise ValueError(f"kernels.register: {_name(ref)} already has a fast form "
                             f"({_name(_fast[ref])}); pass replaces=True to replace it")
    _fast.update(zip(references, fasts))


def _name(fn) -> str:
    """module.qualname of a function, for error lines."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def pick(reference: Callable, on=None) -> Callable:
    """The form of `reference` to run now: its registered engine form in engine mode, else
    `reference` itself (reference mode, or nothing registered). on: an array the op runs on;
    one that is not NumPy's (another device, `glassllm.devices`) gets the reference, since
    the engine's forms are NumPy and numba code."""
    if (_thread.name or _mode or _mode_from_environment()) == "reference":
        return reference
    if on is not None and not isinstance(on, np.ndarray):
        return reference
    return _fast.get(reference, reference)


def registered() -> dict:
    """{reference: fast form}: a copy of what the engine registered (for tests and docs)."""
    return dict(_fast)


# --------------------------------------------------------------------------- matrix products
_gemm = np.matmul
_autocast_matmul = None  # autocast's product: (gemm, a, b, out) -> a @ b rounded, or None


def register_gemm(fn: Callable) -> Callable:
    """Compute every matrix product with fn(a, b, out=None) (np.matmul's contract): the
    engine's BLAS backend. Returns the GEMM it replaces (a profiler can wrap it and put it
    back)."""
    global _gemm
    previous, _gemm = _gemm, fn
    return previous


def gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """a @ b through the registered GEMM alone, without autocast's rounding."""
    return _gemm(a, b, out=out)


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """a @ b with np.matmul's shapes, broadcasting and `out=`: the one matrix product of the
    library (every op's and `Tensor @ Tensor`'s). The GEMM computes it; inside
    `glassllm.amp.autocast` its inputs and output are rounded to the low dtype first.
    Returns the product (`out` if given). Raises np.matmul's errors. Arrays of another device
    (`glassllm.devices`) are multiplied by their own namespace's matmul (cuBLAS on CUDA)."""
    gemm = _gemm if isinstance(a, np.ndarray) else _namespace_matmul
    if _autocast_matmul is None:
        return gemm(a, b, out=out)
    return _autocast_matmul(gemm, a, b, out)


def _namespace_matmul(a, b, out=None):
    """a @ b by the arrays' own namespace (`out` filled in place if given): the GEMM of a
    device other than the CPU's."""
    y = a.__array_namespace__().matmul(a, b)
    if out is None:
        return y
    out[...] = y
    return out


def keep_context(backward: Callable) -> Callable:
    """The backward closure an op records: one that runs in the autocast precision active now,
    whenever it is called (installed by `glassllm.amp`; `backward` itself without autocast)."""
    return backward if _autocast_keep is None else _autocast_keep(backward)


def round_product(x: np.ndarray) -> np.ndarray:
    """x rounded as a matrix product's output is under the current autocast (x itself outside
    autocast): for a sum of products, as the batch sum of a broadcast operand's gradient."""
    return x if _autocast_round is None else _autocast_round(x)


_autocast_keep = _autocast_round = None


def install_autocast(matmul: Callable, keep: Callable, round_output: Callable) -> None:
    """Plug autocast in (`glassllm.amp` calls this when it is imported).

    matmul(gemm, a, b, out) -> the product under the current autocast state; keep(backward)
    -> what `keep_context` returns; round_output(x) -> what `round_product` returns.
    """
    global _autocast_matmul, _autocast_keep, _autocast_round
    _autocast_matmul, _autocast_keep, _autocast_round = matmul, keep, round_output
