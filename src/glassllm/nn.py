"""Layers: small classes that own parameters and call one fused op each.

`Module` finds parameters by walking attributes in definition order (PyTorch's rule), so
`named_parameters()` gives dotted names such as `blocks.0.attention.query.weight` with no
registration boilerplate. Lists of modules are walked with their index as the name.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

import numpy as np

from . import devices
from . import functional as F
from .tensor import Tensor


class Module:
    """Base class: parameter discovery, `state_dict()` and `load_state_dict()`."""

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """Yield (dotted name, parameter) in definition order. Shared tensors appear once."""
        seen: set[int] = set()
        for name, value in self._walk(prefix):
            if id(value) not in seen:
                seen.add(id(value))
                yield name, value

    def _walk(self, prefix):
        for attr, value in vars(self).items():
            name = f"{prefix}{attr}"
            if isinstance(value, Tensor) and value.requires_grad:
                yield name, value
            elif isinstance(value, Module):
                yield from value._walk(name + ".")
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, Module):
                        yield from item._walk(f"{name}.{i}.")

    def parameters(self) -> list[Tensor]:
        return [p for _, p in self.named_parameters()]

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of every parameter array, by dotted name, as host NumPy arrays (from any
        device: files are written on the host)."""
        return {name: p.data.copy() if isinstance(p.data, np.ndarray) else p.numpy()
                for name, p in self.named_parameters()}

    def load_state_dict(self, state: dict) -> None:
        """Copy arrays into the parameters, strictly.

        Raises:
            KeyError: a parameter is missing from `state`, or `state` has a name the model lacks.
            ValueError: an array's shape differs from the parameter's.
        """
        params = dict(self.named_parameters())
        missing = [n for n in params if n not in state]
        unexpected = [n for n in state if n not in params]
        if missing:
            raise KeyError(f"load_state_dict: missing tensor(s) {missing}")
        if unexpected:
            raise KeyError(f"load_state_dict: unexpected tensor(s) {unexpected}")
        for name, p in params.items():
            value = devices.to_host(state[name])
            if value.shape != p.shape:
                raise ValueError(f"load_state_dict: tensor {name!r} has shape {value.shape}, "
                                 f"the model expects {p.shape}")
        for name, p in params.items():
            if isinstance(p.data, np.ndarray):
                p.data = np.array(state[name], dtype=p.dtype)  # a copy, in the model's dtype
            else:  # cast on the host (float16 files: the standard has no float16), then moved
                value = np.array(devices.to_host(state[name]), dtype=devices.host_dtype(p.data))
                p.data = devices.to_device(value, p.device)

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    def to(self, device: str) -> "Module":
        """Move this module to `device` ("cpu", "cuda", "cuda:N", "strict"), in place: every
        tensor it and its submodules hold (parameters, with their gradients) and every array
        they keep (RoPE tables). Returns self, as torch's `Module.to`. An optimizer's moments
        are its own: build the optimizer after the move.

        Raises:
            ValueError: an unknown device name, or "cuda" without CuPy or a GPU
                (`glassllm.devices.DeviceUnavailable`).
        """
        device = devices.parse(device)
        seen: set[int] = set()
        for module in self._modules():
            for attr, value in vars(module).items():
                if isinstance(value, Tensor) and id(value) not in seen:
                    seen.add(id(value))  # a tied tensor is moved once
                    value.data = devices.to_device(value.data, device)
                    if value.grad is not None:
                        value.grad = devices.to_device(value.grad, device)
                elif hasattr(value, "__array_namespace__") and not isinstance(value, Tensor):
                    setattr(module, attr, devices.to_device(value, device))
        return self

    @property
    def device(self) -> str:
        """The device of the first parameter ("cpu" for a module without any)."""
        first = next(iter(self.named_parameters()), None)
        return "cpu" if first is None else first[1].device

    def _modules(self) -> Iterator["Module"]:
        """This module and every submodule, depth first, in definition order."""
        yield self
        for value in vars(self).values():
            items = value if isinstance(value, (list, tuple)) else (value,)
            for item in items:
                if isinstance(item, Module):
                    yield from item._modules()


class _Mode(threading.local):
    shapes_only = False


_mode = _Mode()


@contextlib.contextmanager
def shapes_only():
    """Inside, layers built in this thread get parameters that hold no memory: zero-stride
    views of one float (`np.broadcast_to`), of the right shape. `glassllm.model.parameter_shapes`
    builds a model this way to read its parameters' names and shapes, whatever its size."""
    outer, _mode.shapes_only = _mode.shapes_only, True
    try:
        yield
    finally:
        _mode.shapes_only = outer


def building_shapes_only() -> bool:
    """True inside `shapes_only()` (in this thread)."""
    return _mode.shapes_only


def parameter(shape: tuple[int, ...], init: Callable[[tuple], np.ndarray]) -> Tensor:
    """A float32 parameter of `shape` holding init(shape); inside `shapes_only()` a read-only
    zero-stride view instead (init is not called).

    Raises:
        ValueError: (shapes only) more elements than a NumPy array can hold.
    """
    if not _mode.shapes_only:
        return Tensor(init(shape).astype(np.float32), requires_grad=True)
    try:
        return Tensor(np.broadcast_to(np.float32(0), shape), requires_grad=True)
    except ValueError:  # NumPy's "array is too big" does not say which shape
        raise ValueError(f"a parameter of shape {shape} has more elements than a NumPy array "
                         f"can hold") from None


class Linear(Module):
    """y = x @ weight + bias; weight (d_in, d_out), input-major (see `functional.linear`).

    Initialised N(0, std) as GPT-2 (std 0.02), bias zero.
    """

    def __init__(self, d_in: int, d_out: int, rng: np.random.Generator, bias: bool = False,
                 std: float = 0.02):
        self.weight = parameter((d_in, d_out), lambda shape: rng.normal(0.0, std, shape))
        self.bias = parameter((d_out,), np.zeros) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class Embedding(Module):
    """Lookup table: ids (...) -> rows of weight (V, C)."""

    def __init__(self, n: int, d: int, rng: np.random.Generator, std: float = 0.02):
        self.weight = parameter((n, d), lambda shape: rng.normal(0.0, std, shape))

    def __call__(self, ids: np.ndarray) -> Tensor:
        return F.embedding(ids, self.weight)


class RMSNorm(Module):
    """RMSNorm with a learned gain, no bias: gain w initialised to 1; with offset=True (Gemma)
    the gain is 1 + w, w initialised to 0 (see `functional.rms_norm`)."""

    def __init__(self, d: int, eps: float = 1e-5, offset: bool = False):
        self.weight = parameter((d,), np.zeros if offset else np.ones)
        self.eps = eps
        self.offset = offset

    def __call__(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight, self.eps, offset=self.offset)


class LayerNorm(Module):
    """LayerNorm with learned gain (1) and, unless bias=False, bias (0)."""

    def __init__(self, d: int, eps: float = 1e-5, bias: bool = True):
        self.weight = parameter((d,), np.ones)
        self.bias = parameter((d,), np.zeros) if bias else None
        self.eps = eps

    def __call__(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight, self.bias, self.eps)
