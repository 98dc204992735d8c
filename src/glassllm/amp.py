"""Mixed precision on the CPU: `autocast` (tensor-core rounding emulated) and `GradScaler`.

NumPy has no fast float16/bfloat16 GEMM, so glassllm *emulates* what a GPU tensor core does
inside `torch.autocast`: the two inputs of a matrix product are rounded to the low-precision
dtype, the products are accumulated in float32, and the result is rounded to the low-precision
dtype again (stored back in a float32 array). The values therefore carry exactly the rounding
and the range of the low dtype -- in float16 anything above 65504 becomes inf, as on a GPU --
while the arithmetic stays NumPy float32. `_autocast_product` below is the single place where
this rounding happens. The core does not import this module: when `glassllm` is imported,
autocast installs itself into `glassllm.kernels.matmul`, the library's one matrix product,
which every product goes through: those of `glassllm.functional`'s ops (and the engine's fast
forms) and `Tensor @ Tensor` of `glassllm.tensor` (any batch shape, 1-D operands too), so a
user's own layer written with `@` is autocast as in PyTorch.

Precision table (inside `autocast(dtype)`; outside it everything is float32):

    op                                    forward                    backward
    ------------------------------------  -------------------------  --------------------------
    Tensor @ Tensor (float32 operands)    low in, f32 acc, low out   low in, f32 acc, low out
    linear, unembed (x @ W, x @ E^T)      low in, f32 acc, low out   low in, f32 acc, low out
    attention scores q k^T, probs @ v     low in, f32 acc, low out   low in, f32 acc, low out
    attention softmax, causal mask        float32                    float32
    rms_norm, layer_norm                  float32                    float32
    silu, swiglu, gelu, rope, residual +  float32                    float32
    embedding lookup                      float32 (weight's dtype)   float32
    cross_entropy (log-sum-exp, mean)     float32                    float32
    master weights, gradients, AdamW      float32                    float32
    GradScaler scale/unscale, grad norm   float32 (norm in float64)  --

Notes: linear's bias is added in float32 to the rounded product. `Tensor @ Tensor` with a
float64 operand (gradient checks) is not autocast, as torch's autocast leaves float64 alone.

"low" is float16 (IEEE binary16: 5 exponent bits, max 65504, 11-bit significand) or
bfloat16 (8 exponent bits like float32, max ~3.4e38, 8-bit significand; from `ml_dtypes`).
Rounding is round-to-nearest-even: ml_dtypes' cast for bfloat16; for float16 a float32
arithmetic trick bit-identical to NumPy's float16 cast and ~3x faster (`_round_float16`).

Backward follows the forward: as in PyTorch, the backward of an op that ran under autocast
runs in the precision the forward used, even though `loss.backward()` is called after the
`with autocast(...)` block has closed. The ops and `Tensor.__matmul__` record the autocast
dtype when they run (`keep_autocast`, installed as `glassllm.kernels.keep_context`) and their
backward closures restore it. So in
float16 the backward matrix products can overflow too; that is what `GradScaler` is for.

The autocast state is per thread (`threading.local`), as torch's: `autocast` in one thread
does not change the products another thread computes, and a new thread starts in float32.
glassllm's own worker threads (`glassllm.engine.parallel`) run only elementwise passes; every matrix
product runs on the thread that entered autocast, and `parallel.for_slices` carries the
caller's state into its workers all the same, so a product there would round alike.

Sources: Micikevicius et al. 2018, "Mixed Precision Training" (arXiv 1710.03740), for loss
scaling; PyTorch's `torch.autocast` / `torch.amp.GradScaler` (torch/amp/grad_scaler.py), whose
semantics and defaults `GradScaler` reproduces.
"""
from __future__ import annotations

import contextlib
import math
import threading

import numpy as np

from . import devices, kernels


# The precisions a training step can run in (`--precision`), each with its autocast dtype, and
# why a step may be skipped (non-finite loss or gradient; GradScaler's skip).
PRECISIONS = {"fp32": None, "fp16": "float16", "bf16": "bfloat16"}
SKIP_REASONS = ("", "nonfinite_loss", "nonfinite_grad")


class _AutocastState(threading.local):
    """The autocast dtype of the current thread (np.dtype of float16/bfloat16 inside
    autocast, None in float32). A class attribute is the default every new thread sees."""
    dtype = None


_state = _AutocastState()

_FLOAT16 = np.dtype(np.float16)
_NAMES = {"float16": "float16", "fp16": "float16", "half": "float16",
          "bfloat16": "bfloat16", "bf16": "bfloat16"}


def _low_dtype(name: str) -> np.dtype:
    """np.dtype of "float16" or "bfloat16". ml_dtypes is imported here, on the first use of
    bfloat16, not with glassllm: loading its extension takes 0.3-0.9 s of CPU (it registers
    a dozen dtypes and their casts with NumPy), more than the rest of `import glassllm`."""
    if name == "float16":
        return _FLOAT16
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


def resolve_dtype(dtype) -> np.dtype:
    """The low-precision NumPy dtype named by `dtype`.

    Accepts "float16"/"fp16"/"half", "bfloat16"/"bf16", np.float16 or ml_dtypes.bfloat16.

    Raises:
        ValueError: any other dtype (float32 is not a low precision: just leave autocast off).
    """
    if isinstance(dtype, str):
        key = dtype.lower()
        if key in _NAMES:
            return _low_dtype(_NAMES[key])
        raise ValueError(f"autocast: dtype must be float16 or bfloat16, got {dtype!r}")
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"autocast: dtype must be float16 or bfloat16, got {dtype!r}") from None
    if resolved != _FLOAT16 and resolved != _low_dtype("bfloat16"):
        raise ValueError(f"autocast: dtype must be float16 or bfloat16, got {resolved}")
    return resolved


def matmul_dtype():
    """The NumPy dtype matmul inputs/outputs are rounded to in this thread, or None outside
    autocast."""
    return _state.dtype


def set_matmul_dtype(low) -> None:
    """Set this thread's autocast dtype (a resolved low dtype, or None), without the context
    manager: for code that carries a caller's state into another thread (`parallel`)."""
    _state.dtype = low


def round_to(x: np.ndarray, low) -> np.ndarray:
    """x (float32) rounded to the dtype `low` (round-to-nearest-even), returned as float32.

    Values beyond the low dtype's range become +-inf (float16: anything that rounds above
    65504); NaN stays NaN; float16 subnormals round on its 2**-24 grid. Shape is unchanged.
    Bit-identical to `x.astype(low).astype(np.float32)` (tested on millions of bit patterns).
    On another device than the CPU, `_round_on_device`.
    """
    if not isinstance(x, np.ndarray):
        return _round_on_device(x, low)
    if low == _FLOAT16:
        return _round_float16(x)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf is the point here
        return x.astype(low).astype(np.float32)


_F16_MIN_NORMAL = np.float32(2.0 ** -14)
_F16_MAX = np.float32(65504.0)
_F16_QUANTUM_SHIFT = np.float32(1.5 * 2.0 ** 13)


def _round_float16(x: np.ndarray) -> np.ndarray:
    # NumPy's float32 -> float16 -> float32 casts cost ~4x more than this float32 arithmetic.
    # Adding c = 1.5 * 2**13 * 2**e (2**e: x's binade) and subtracting it again makes float32's
    # own round-to-nearest-even drop all but float16's 11 significant bits: ulp(c) is exactly
    # float16's spacing in that binade. Below float16's smallest normal the spacing is fixed
    # (2**-24), so the binade is clamped up to 2**-14 there.
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0:  # vector @ vector gives a scalar; the in-place passes need an array
        return _round_float16(x.reshape(1)).reshape(())
    with np.errstate(over="ignore", invalid="ignore"):
        c = (x.view(np.uint32) & np.uint32(0x7F800000)).view(np.float32)  # 2**e (0 if tiny)
        np.maximum(c, _F16_MIN_NORMAL, out=c)
        c *= _F16_QUANTUM_SHIFT
        out = x + c
        out -= c
        np.copysign(out, x, out=out)  # (x + c) - c turns -0.0 into +0.0
        over = ~(np.abs(out) <= _F16_MAX)  # beyond float16's range, or NaN (inf input: inf-inf)
        if over.any():
            out[over] = x[over] * np.float32(np.inf)  # +-inf, NaN stays NaN
    return out


def _round_on_device(x, low):
    """round_to for an array of another device: on CuPy by its own float16 cast, bfloat16
    (which CuPy lacks) by rounding float32's bits to their top 16, to nearest even (NaN kept);
    elsewhere (the array API has neither bfloat16 nor bit views) through the host, by
    `round_to`, explicitly."""
    if type(x).__module__.startswith("cupy"):
        import cupy
        if low == _FLOAT16:
            return x.astype(cupy.float16).astype(cupy.float32)
        bits = x.view(cupy.uint32)
        rounded = (bits + cupy.uint32(0x7FFF) + ((bits >> 16) & cupy.uint32(1))) \
            & cupy.uint32(0xFFFF0000)
        return cupy.where(cupy.isnan(x), x, rounded.view(cupy.float32))
    return devices.to_device(round_to(devices.to_host(x), low), devices.device_of(x))


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """a @ b (np.matmul shapes and broadcasting), float32 in and out: `glassllm.kernels.matmul`,
    the library's one product, into which autocast is installed (`_autocast_product`).

    Outside autocast: the plain float32 product. Inside `autocast(low)`: the tensor-core
    emulation of the module doc -- round(a) @ round(b) accumulated in float32, then the result
    rounded to `low` (so float16 outputs above 65504 are inf). `out`, if given, receives the
    product (as np.matmul's out=) and is returned.
    """
    return kernels.matmul(a, b, out)


def _autocast_product(gemm, a, b, out):
    """`matmul` under this thread's autocast state, the product itself by `gemm` (NumPy's
    np.matmul, or the engine's BLAS backend `glassllm.engine.blas.matmul`)."""
    low = _state.dtype
    if low is None:
        return gemm(a, b, out=out)
    with np.errstate(invalid="ignore"):  # inf * 0 after an overflow: NaN is the honest result
        product = round_to(gemm(round_to(a, low), round_to(b, low)), low)
    if out is None:
        return product
    out[...] = product
    return out


def _round_product(x: np.ndarray) -> np.ndarray:
    """x rounded as a product's output is in this thread (x itself outside autocast)."""
    low = _state.dtype
    return x if low is None else round_to(x, low)


def _as_dtype_of(value: np.float32, array):
    """value in array's dtype: a NumPy scalar on the CPU, a Python float elsewhere (the
    standard rounds it to the array's dtype, as NumPy's NEP 50 does)."""
    return value.astype(array.dtype) if isinstance(array, np.ndarray) else float(value)


def _sum64(array) -> float:
    """The sum of an array's elements accumulated in float64, as a Python float."""
    if isinstance(array, np.ndarray):
        return float(array.sum(dtype=np.float64))
    xp = devices.namespace(array)
    return float(xp.sum(xp.astype(array, xp.float64)))


@contextlib.contextmanager
def autocast(dtype):
    """Context manager: matrix products inside run in `dtype` ("float16" or "bfloat16").

    Everything else stays float32 (see the precision table in the module doc); parameters
    are not cast (they remain float32 master weights). Nesting restores the outer state on
    exit. `autocast(None)` is a no-op context (float32), handy for `precision="fp32"`. The
    state is the calling thread's only (as torch.autocast): other threads are unaffected.

    Raises:
        ValueError: an unknown dtype (see `resolve_dtype`).
    """
    low = None if dtype is None else resolve_dtype(dtype)
    state = _state
    previous = state.dtype
    state.dtype = low
    try:
        yield
    finally:
        state.dtype = previous


def keep_autocast(backward):
    """Wrap an op's backward closure so it runs in the autocast dtype active *now*.

    Called by the ops at forward time (through `glassllm.kernels.keep_context`). Outside
    autocast it returns `backward` itself (zero cost in float32); inside, a closure that sets
    the recorded dtype while `backward` runs and restores the caller's state afterwards, as
    PyTorch runs an autocast op's backward in the forward's dtype.
    """
    low = _state.dtype
    if low is None:
        return backward

    def backward_in_forward_precision(grad):
        state = _state
        previous = state.dtype
        state.dtype = low
        try:
            return backward(grad)
        finally:
            state.dtype = previous

    return backward_in_forward_precision


# autocast plugs itself into the library's one matrix product (the core never imports amp)
kernels.install_autocast(_autocast_product, keep_autocast, _round_product)


# --------------------------------------------------------------------------- GradScaler
_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


class GradScaler:
    """Dynamic loss scaling with the semantics and defaults of `torch.amp.GradScaler`.

    Usage, one iteration (the order matters, as in torch.amp's recipe):

        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)          # grads are now true gradients; found_inf recorded
        clip_grad_norm(params, 1.0)         # clip the *unscaled* gradients
        scaler.step(optimizer, lr)          # optimizer.step(lr) unless a grad was inf/NaN
        scaler.update()                     # every iteration, skipped ones too

    update(): if any unscaled gradient of this iteration was inf/NaN, scale *= backoff_factor
    and the count of clean steps resets to 0; otherwise the count grows, and when it reaches
    growth_interval, scale *= growth_factor (only if the result is finite) and the count
    resets. The scale is kept as a float32 value, as PyTorch keeps it in a float32 tensor.

    Args:
        init_scale: starting scale (2**16). growth_factor (2.0), backoff_factor (0.5),
            growth_interval (2000 clean steps): as above. enabled: if False every method is a
            pass-through (scale returns the loss, step calls optimizer.step, get_scale is 1.0).

    The optimizer only needs `.params` (a list of Tensors with `.grad`) and `.step(...)`, as
    `glassllm.optim.AdamW`. Source: torch/amp/grad_scaler.py; Micikevicius et al. 2018.
    """

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True):
        if growth_factor <= 1.0:
            raise ValueError(f"GradScaler: growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"GradScaler: backoff_factor must be in (0, 1), got {backoff_factor}")
        if int(growth_interval) <= 0:
            raise ValueError(f"GradScaler: growth_interval must be positive, got {growth_interval}")
        self._enabled = bool(enabled)
        self._scale = float(np.float32(init_scale))
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0
        self._states: dict[int, dict] = {}  # id(optimizer) -> {"stage", "found_inf"}

    def is_enabled(self) -> bool:
        return self._enabled

    def _state(self, optimizer) -> dict:
        return self._states.setdefault(id(optimizer), {"stage": _READY, "found_inf": None})

    def scale(self, loss):
        """loss * scale: a Tensor (still differentiable), or the loss itself when disabled."""
        if not self._enabled:
            return loss
        return loss * self._scale

    def unscale_(self, optimizer) -> None:
        """Divide every gradient of `optimizer.params` by the scale, in place, and record
        whether any of them is inf/NaN. At most once per optimizer between update() calls.

        The reciprocal is computed in float64 and rounded to float32, as PyTorch does.

        Raises:
            RuntimeError: called twice for the same optimizer before update(), or after step().
        """
        if not self._enabled:
            return
        state = self._state(optimizer)
        if state["stage"] == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer "
                               "since the last update().")
        if state["stage"] == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = np.float32(1.0 / self._scale)
        found_inf = False
        for p in optimizer.params:
            if p.grad is None:
                continue
            with np.errstate(invalid="ignore", over="ignore"):
                p.grad *= _as_dtype_of(inv_scale, p.grad)
                # a sum is inf/NaN iff an element is inf/NaN (finite float32 sums stay finite
                # in float64), and is faster than np.isfinite(...).all()
                if not found_inf and not math.isfinite(_sum64(p.grad)):
                    found_inf = True
        state["found_inf"] = found_inf
        state["stage"] = _UNSCALED

    def found_inf(self, optimizer) -> bool:
        """Whether unscale_ found an inf/NaN gradient for `optimizer` in this iteration."""
        return bool(self._states.get(id(optimizer), {}).get("found_inf"))

    def skip(self, optimizer) -> None:
        """Record a skipped iteration without a backward pass (e.g. the loss itself was inf/NaN):
        the next update() backs off as for an overflow. glassllm's addition; PyTorch users get the
        same effect by running backward on the NaN loss."""
        if not self._enabled:
            return
        state = self._state(optimizer)
        state["found_inf"] = True
        state["stage"] = _STEPPED

    def step(self, optimizer, *args, **kwargs):
        """optimizer.step(*args, **kwargs) unless an unscaled gradient is inf/NaN (then the step
        is skipped and None returned). Calls unscale_ first if it was not called.

        Raises:
            RuntimeError: step() called twice for the same optimizer before update().
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        state = self._state(optimizer)
        if state["stage"] == _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] == _READY:
            self.unscale_(optimizer)
        result = None if state["found_inf"] else optimizer.step(*args, **kwargs)
        state["stage"] = _STEPPED
        return result

    def update(self, new_scale: float | None = None) -> None:
        """Adjust the scale from this iteration's inf checks (see the class doc), or set it to
        `new_scale`; then forget the per-optimizer state for the next iteration.

        Raises:
            RuntimeError: no inf check was recorded (neither unscale_/step nor skip was called).
        """
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = float(np.float32(new_scale))
        else:
            checks = [s["found_inf"] for s in self._states.values() if s["found_inf"] is not None]
            if not checks:
                raise RuntimeError("GradScaler.update(): no inf checks were recorded prior to "
                                   "update(); call unscale_(), step() or skip() first.")
            if any(checks):
                self._scale = float(np.float32(self._scale * self._backoff_factor))
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    with np.errstate(over="ignore"):  # a float32 overflow means: do not grow
                        grown = float(np.float32(self._scale * self._growth_factor))
                    if math.isfinite(grown):
                        self._scale = grown
                    self._growth_tracker = 0
        self._states = {}

    def get_scale(self) -> float:
        """The current scale (1.0 when disabled)."""
        return self._scale if self._enabled else 1.0

    def get_growth_tracker(self) -> int:
        """Consecutive clean steps since the last growth or backoff."""
        return self._growth_tracker

    def state_dict(self) -> dict:
        """{"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}:
        PyTorch's keys; {} when disabled. Take it after update()."""
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state: dict) -> None:
        """Restore a state_dict() (also one saved by torch.amp.GradScaler).

        Raises:
            RuntimeError: the dict is empty (saved from a disabled scaler) while this one is
                enabled, or lacks a key.
        """
        if not self._enabled:
            return
        if not state:
            raise RuntimeError("GradScaler.load_state_dict: the state is empty; it was saved "
                               "from a disabled GradScaler")
        try:
            self._scale = float(np.float32(state["scale"]))
            self._growth_factor = float(state["growth_factor"])
            self._backoff_factor = float(state["backoff_factor"])
            self._growth_interval = int(state["growth_interval"])
            self._growth_tracker = int(state["_growth_tracker"])
        except KeyError as err:
            raise RuntimeError(f"GradScaler.load_state_dict: missing key {err}") from None
