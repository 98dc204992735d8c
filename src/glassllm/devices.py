"""Devices: where a tensor's array lives, and the array namespace that computes on it.

The glass is written once, against the Python array API standard (data-apis.org/array-api):
each op asks its input for its namespace (`namespace(x)`) and calls `xp.exp`, `xp.sum`,
`xp.matmul`, ... there. Three devices:

- ``"cpu"``: NumPy itself (not a wrapper: `namespace` answers `numpy` for an ndarray in one
  type check), and the engine's fast forms (`glassllm.engine`, numba and BLAS) as before;
- ``"cuda"`` / ``"cuda:N"``: CuPy, NumPy's API on an NVIDIA GPU (through `array_api_compat`'s
  CuPy namespace): matrix products on cuBLAS, the reference forms of the ops as CuPy code;
- ``"strict"``: `array_api_strict` on the CPU, the standard and nothing else, for tests. Its
  arrays live on the namespace's "device1", so a call outside the standard, an implicit
  conversion to NumPy (`np.asarray(x)`) or an array of another device mixed in fails at once:
  on this CPU-only machine it finds what would break on a GPU.

The engine runs on NumPy arrays only; on another device every op runs its reference form
(`glassllm.kernels.pick(..., on=array)`). Files, token batches and random draws stay on the
host: `to_device` moves an array there, `to_host` brings one back (explicitly; the strict
device refuses the implicit way). The default device of new models is "cpu", or what the
environment variable GLASSLLM_DEVICE names (tests run the suite again with "strict").

This module imports NumPy alone; CuPy, `array_api_compat` and `array_api_strict` are imported
on first use, so `import glassllm` needs none of them.
"""
from __future__ import annotations

import math
import os

import numpy as np

ENV_VAR = "GLASSLLM_DEVICE"
_STRICT_DEVICE = "device1"  # array_api_strict's second device: not the host, see above


class DeviceUnavailable(ValueError):
    """The device named cannot be used here: CuPy is not installed, or no GPU answers. A
    ValueError, as a misspelt device name is: one line wherever it is reported."""


def parse(device) -> str:
    """The canonical name of a device: "cpu", "strict", or "cuda:N" ("cuda" is "cuda:0").
    None: the default device (`default_device`).

    Raises:
        ValueError: any other name (one line, listing the valid ones).
    """
    if device is None:
        return default_device()
    name = str(device).strip().lower()
    if name in ("cpu", "strict"):
        return name
    if name == "cuda":
        return "cuda:0"
    if name.startswith("cuda:") and name[5:].isdigit():
        return f"cuda:{int(name[5:])}"
    raise ValueError(f"device: expected 'cpu', 'cuda', 'cuda:N' or 'strict', got {device!r}")


def default_device() -> str:
    """The device new models start on: GLASSLLM_DEVICE if set (checked as `parse` does),
    else "cpu"."""
    value = os.environ.get(ENV_VAR, "").strip()
    if not value:
        return "cpu"
    try:
        return parse(value)
    except ValueError as error:
        raise ValueError(f"{ENV_VAR}: {error}") from None


def namespace(array):
    """The array namespace that computes on `array`: `numpy` for an ndarray (or NumPy
    scalar), else the array's own standard namespace (`array_api_compat.array_namespace`)."""
    if type(array) is np.ndarray or isinstance(array, (np.ndarray, np.generic)):
        return np
    import array_api_compat
    return array_api_compat.array_namespace(array)


def namespace_for(device: str):
    """The namespace of a device name: numpy, array_api_strict, or CuPy's standard namespace.

    Raises:
        DeviceUnavailable: "cuda" without CuPy installed or without a usable GPU (one line).
    """
    device = parse(device)
    if device == "cpu":
        return np
    if device == "strict":
        import array_api_strict
        return array_api_strict
    return _cupy_namespace()


def _cupy_namespace():
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except ImportError:
        raise DeviceUnavailable("device cuda: CuPy is not installed (pip install "
                                "'glassllm[cuda]', for CUDA 12)") from None
    except Exception as error:  # CuPy's CUDARuntimeError: no driver, no GPU
        detail = str(error).splitlines()[0] if str(error) else "no detail"
        raise DeviceUnavailable(f"device cuda: no usable GPU ({type(error).__name__}: "
                                f"{detail})") from None
    if count == 0:
        raise DeviceUnavailable("device cuda: CuPy found no GPU")
    import array_api_compat.cupy
    return array_api_compat.cupy


def device_of(array) -> str:
    """The device name of an array: "cpu" (NumPy), "strict", or "cuda:N"."""
    if isinstance(array, (np.ndarray, np.generic)):
        return "cpu"
    module = type(array).__module__
    if module.startswith("array_api_strict"):
        return "strict"
    if module.startswith("cupy"):
        return f"cuda:{array.device.id}"
    raise TypeError(f"not an array of a known device: {type(array).__name__}")


def to_device(array, device: str):
    """`array` (any device, or anything NumPy reads) on `device`; the same object when it is
    there already. The copy keeps the dtype (NumPy's float64 stays float64)."""
    device = parse(device)
    if device == "cpu":
        return to_host(array)
    if not isinstance(array, (np.ndarray, np.generic)):
        if device_of(array) == device and (device != "strict" or _on_strict_device(array)):
            return array
        array = to_host(array)
    array = np.asarray(array)
    if device == "strict":
        import array_api_strict as xp
        return xp.asarray(array, device=xp.Device(_STRICT_DEVICE))
    xp = namespace_for(device)
    import cupy
    with cupy.cuda.Device(int(device.split(":")[1])):
        return xp.asarray(array)


def _on_strict_device(array) -> bool:
    import array_api_strict as xp
    return array.device == xp.Device(_STRICT_DEVICE)


def zeros(shape: tuple, device: str, dtype: str = "float32"):
    """A new array of zeros of `shape` and `dtype` (a name: "float32", ...) on `device`."""
    device = parse(device)
    if device == "cpu":
        return np.zeros(shape, dtype=dtype)
    xp = namespace_for(device)
    if device == "strict":
        return xp.zeros(shape, dtype=getattr(xp, dtype), device=xp.Device(_STRICT_DEVICE))
    import cupy
    with cupy.cuda.Device(int(device.split(":")[1])):
        return xp.zeros(shape, dtype=getattr(xp, dtype))


def host_dtype(array) -> np.dtype:
    """The NumPy dtype of an array of any device (its values' dtype once on the host)."""
    if isinstance(array.dtype, np.dtype):  # NumPy's and CuPy's arrays
        return array.dtype
    return np.dtype(str(array.dtype).rsplit(".", 1)[-1])   # array_api_strict.float32


def to_host(array) -> np.ndarray:
    """A NumPy array holding `array`'s values: the array itself when it is one already, else
    an explicit copy from its device (what the strict device allows; `np.asarray` of a strict
    or CuPy array is refused)."""
    if isinstance(array, np.ndarray):
        return array
    if isinstance(array, np.generic) or not hasattr(array, "__array_namespace__"):
        return np.asarray(array)
    module = type(array).__module__
    if module.startswith("cupy"):
        return array.get()
    if module.startswith("array_api_strict"):
        import array_api_strict as xp
        return np.asarray(array.to_device(xp.__array_namespace_info__().default_device()))
    return np.from_dlpack(array)


def scatter_add(target, index, values) -> None:
    """target[index] += values, in place, where a repeated index adds up (NumPy's
    `np.add.at`): on NumPy `np.add.at`, on CuPy `cupyx.scatter_add`. Elsewhere (the array
    API has no scatter) a basic index (ints, slices: no element twice) adds in place, and an
    integer array indexes axis 0: the sum is the product of a one-hot matrix [N, rows] with
    values [N, ...] (memory N x rows)."""
    xp = namespace(target)
    if xp is np:
        np.add.at(target, index, values)
    elif type(target).__module__.startswith("cupy"):
        import cupyx
        cupyx.scatter_add(target, index, values)
    elif all(isinstance(i, (int, slice, type(None), type(Ellipsis)))
             for i in (index if isinstance(index, tuple) else (index,))):
        target[index] = target[index] + values
    else:
        rows = xp.arange(target.shape[0], device=target.device)
        onehot = xp.astype(index[:, None] == rows[None, :], values.dtype)   # [N, rows]
        target[...] = target + xp.matmul(xp.matrix_transpose(onehot), values)


# erf, elementwise, in float64 through the standard library's (NumPy has none): exact to
# float64 rounding, about 50 ns an element.
_erf = np.frompyfunc(math.erf, 1, 1)


def erf(x):
    """The error function of a float64 array, elementwise, on x's device. The array API has
    no erf: NumPy's arrays go through the standard library's `math.erf` (exact to float64
    rounding), CuPy's through `cupyx.scipy.special.erf`, others through the host and back
    (an explicit copy each way)."""
    if isinstance(x, np.ndarray):
        return _erf(x).astype(np.float64)
    if type(x).__module__.startswith("cupy"):
        import cupyx.scipy.special
        return cupyx.scipy.special.erf(x)
    return to_device(_erf(to_host(x)).astype(np.float64), device_of(x))
