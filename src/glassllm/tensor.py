"""Tensor: a NumPy array that remembers how it was made, and reverse-mode autograd.

The shape of this file follows micrograd (Karpathy, `micrograd/engine.py`): every op computes
its result and records a closure that maps the gradient of the result to the gradients of its
inputs; `backward()` sorts the graph topologically and runs those closures in reverse
(`backward_pass`, micrograd's loop as it reads).

Differences from micrograd, all for speed or memory:
- values are whole NumPy arrays, not scalars; broadcasting is undone in the backward pass
  (`unbroadcast`);
- only leaf tensors (created by the user, `requires_grad=True`) keep `.grad`, as in PyTorch;
  gradients of intermediate results live in a dictionary during `backward()` and are dropped;
- the graph is freed while `backward()` walks it, so saved activations are released as early as
  possible (PyTorch's default `retain_graph=False`);
- the sort is iterative, so a graph of any depth works without hitting Python's recursion limit;
- the engine registers a second form of the pass (`glassllm.engine.backward`) that adds into
  gradient buffers in place where it may, picked through `glassllm.kernels` as every op's
  fast form is (GLASSLLM_KERNELS=reference runs `backward_pass`).

The heavy lifting in a transformer is not done here but in the fused ops of
`glassllm.functional`, which build one graph node per op with a hand-written backward.
Values live on a device (`glassllm.devices`): NumPy arrays on "cpu", CuPy's on "cuda",
`array_api_strict`'s on "strict". Every op takes its array functions from its input's namespace
(`xp = namespace(x)`: `numpy` itself for an ndarray), so the lines below are the formulas on
any device. This module imports NumPy, `glassllm.kernels` and `glassllm.devices` alone.
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import Callable, Sequence

import numpy as np

from . import devices, kernels  # kernels: the one matrix product (autocast plugs in there)
from .devices import namespace

class _GradMode(threading.local):
    """Whether ops record a graph, per thread as in PyTorch: `no_grad()` in one thread (an
    evaluation) leaves another thread's training alone. The class attribute is the default
    every new thread sees."""
    enabled = True


_grad_mode = _GradMode()


@contextlib.contextmanager
def no_grad():
    """Context manager: ops inside record no graph (for evaluation and generation).

    Results are plain tensors with ``requires_grad=False``; nothing is kept for a backward pass.
    The state is the calling thread's only.
    """
    previous = _grad_mode.enabled
    _grad_mode.enabled = False
    try:
        yield
    finally:
        _grad_mode.enabled = previous


def is_grad_enabled() -> bool:
    """True unless inside `no_grad()` (in this thread)."""
    return _grad_mode.enabled


def unbroadcast(grad: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum `grad` down to `shape`: the adjoint of NumPy broadcasting.

    Broadcasting prepends axes and stretches axes of length 1; the gradient of a stretched
    value is the sum over the copies it was stretched into.
    """
    if grad.shape == shape:
        return grad
    xp = namespace(grad)
    extra = grad.ndim - len(shape)
    if extra:
        grad = xp.sum(grad, axis=tuple(range(extra)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if stretched:
        grad = xp.sum(grad, axis=stretched, keepdims=True)
    return xp.reshape(grad, shape)


def _as_array(value) -> np.ndarray:
    """Python numbers and lists become float32 (the library's working dtype); arrays keep theirs."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    if hasattr(value, "__array_namespace__"):  # an array of another device: kept there
        return value
    if value is None:  # np.asarray(None, float32) would be a silent NaN
        raise TypeError("Tensor(None): data must be a number, a list of numbers or an array")
    return np.asarray(value, dtype=np.float32)


BackwardFn = Callable[[np.ndarray], Sequence["np.ndarray | None"]]



def topological_order(root: "Tensor", follow=lambda parent: True) -> list["Tensor"]:
    """Every tensor reachable from root through `_parents` (those for which follow(parent) is
    true), parents before children, root last. Iterative depth-first search: a deep graph
    (hundreds of layers) hits no recursion limit."""
    order, visited = [], set()
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        for parent in node._parents:
            if id(parent) not in visited and follow(parent):
                stack.append((parent, False))
    return order

class Tensor:
    """An n-dimensional array with reverse-mode automatic differentiation.

    Args:
        data: array-like. Python floats, ints and (nested) lists become float32; a NumPy array
            keeps its dtype (float64 arrays give float64 tensors, used by gradient checks).
        requires_grad: if True this is a leaf whose gradient `backward()` accumulates in `.grad`.

    Raises:
        TypeError: data is None.
        ValueError: requires_grad=True with integer or bool data (its gradient would be
            truncated to integers).

    Attributes:
        data (np.ndarray): the value.
        grad (np.ndarray | None): d(output)/d(self), same shape and dtype as `data`; only for
            leaves with `requires_grad=True`. Accumulates (`+=`) across `backward()` calls until
            reset to None (`AdamW.zero_grad()` does that).
    """

    __slots__ = ("data", "grad", "requires_grad", "_parents", "_backward", "_fresh_grads",
                 "__weakref__")
    __array_priority__ = 1000  # make `ndarray + Tensor` call Tensor.__radd__

    def __init__(self, data, requires_grad: bool = False):
        self.data = _as_array(data)
        self.grad: np.ndarray | None = None
        self.requires_grad = bool(requires_grad)
        if self.requires_grad and _is_integer(self.data):
            # a gradient stored in an integer array would be truncated (0.5 -> 0)
            raise ValueError(f"requires_grad=True needs a floating-point tensor, got dtype "
                             f"{self.data.dtype} (convert with .astype(np.float32) first)")
        self._parents: tuple[Tensor, ...] = ()
        self._backward: BackwardFn | None = None
        self._fresh_grads = False

    # ----------------------------------------------------------------- graph construction
    @staticmethod
    def from_op(data: np.ndarray, parents: Sequence["Tensor"], backward: BackwardFn,
                fresh_grads: bool = False) -> "Tensor":
        """Wrap the result of an op: a graph node if any parent needs a gradient.

        `backward(grad_out)` must return one gradient (or None) per parent, each with that
        parent's shape. Ops in `glassllm.functional` use this to add fused nodes.
        fresh_grads=True promises that backward returns newly allocated arrays, distinct from
        each other, that nothing else refers to (not grad_out, not a saved array that lives
        on). The reference pass (`backward_pass`) ignores it; the engine's pass
        (`glassllm.engine.backward`) then adds into those arrays in place and hands them to
        leaves as `.grad` without a copy. The fused ops of `glassllm.functional` promise it;
        the small ops here (views, broadcasts, `-g`) do not.
        """
        out = Tensor(data)
        if _grad_mode.enabled and any(p.requires_grad for p in parents):
            out.requires_grad = True
            out._parents = tuple(parents)
            out._backward = backward
            out._fresh_grads = fresh_grads
        return out

    @property
    def is_leaf(self) -> bool:
        return self._backward is None

    def backward(self, grad=None) -> None:
        """Accumulate d(self)/d(leaf) into `.grad` of every leaf that requires grad.

        Runs `backward_pass` (micrograd's loop), or the engine's form of it that reuses
        gradient buffers, as `glassllm.kernels` picks; both give the same gradients, bit for
        bit. The graph is freed as the pass walks it.

        Args:
            grad: d(loss)/d(self); defaults to 1 for a single-element tensor, broadcast to
                self's shape otherwise.

        Raises:
            RuntimeError: if self does not require grad, if `grad` is omitted for a tensor with
                more than one element, or if this graph was already consumed by a backward call.
            ValueError: `grad` of a shape that does not broadcast to self's.
        """
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad")
        if grad is None:
            if self.data.size != 1:
                raise RuntimeError(f"backward() needs an explicit grad for shape {self.shape}")
            grad = namespace(self.data).ones_like(self.data)
        xp = namespace(self.data)
        if xp is np:
            grad = np.asarray(grad, dtype=self.data.dtype)
        else:
            grad = xp.astype(devices.to_device(grad, devices.device_of(self.data)), self.dtype)
        if grad.shape != self.shape:
            try:
                grad = xp.broadcast_to(grad, self.shape)
            except ValueError:  # NumPy's message names "remapped shapes", not the tensor
                raise ValueError(f"backward(): grad of shape {grad.shape} does not broadcast "
                                 f"to the tensor's shape {self.shape}") from None
        kernels.pick(backward_pass, on=self.data)(self, grad)

    def _topological_order(self) -> list["Tensor"]:
        order = topological_order(self, follow=lambda parent: parent.requires_grad)
        if any(node._backward is _consumed for node in order):
            raise RuntimeError("backward() through a graph that was already consumed; "
                               "recompute the forward pass")
        return order

    def _accumulate(self, g: np.ndarray) -> None:
        """A leaf's `.grad += g`; the first gradient is copied, since g may be an array the
        graph (or the caller) still refers to."""
        if self.grad is None:
            xp = namespace(self.data)
            self.grad = (np.array(g, dtype=self.data.dtype) if xp is np
                         else xp.asarray(g, dtype=self.data.dtype, copy=True))
        else:
            self.grad += g

    def _release(self) -> None:
        """Drop this node's link to its inputs once its backward has run: the activations its
        backward closure saved are freed (unless the caller holds them), and a second backward
        through it raises instead of silently reusing a half-walked graph."""
        self._parents = ()
        self._backward = _consumed

    # ----------------------------------------------------------------- conveniences
    @property
    def shape(self) -> tuple:
        return self.data.shape

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> int:
        return self.data.size

    def __len__(self) -> int:
        return len(self.data)

    def item(self) -> float:
        """The value of a one-element tensor as a Python number (from any device)."""
        if isinstance(self.data, np.ndarray):
            return self.data.item()
        return devices.to_host(self.data).item()

    @property
    def device(self) -> str:
        """Where the value lives: "cpu", "cuda:N" or "strict" (`glassllm.devices`)."""
        return devices.device_of(self.data)

    def numpy(self) -> np.ndarray:
        """The value as a host NumPy array: on "cpu" the array itself (shared, not a copy, as
        torch's `.numpy()`), on any other device a copy brought to the host."""
        return devices.to_host(self.data)

    def to(self, device: str) -> "Tensor":
        """This tensor's value on `device` ("cpu", "cuda", "cuda:N", "strict"): self when it is
        there already, else a new leaf holding a copy (requires_grad kept, no grad, no graph).

        Raises:
            ValueError: an unknown device name, or "cuda" without CuPy or a GPU
                (`glassllm.devices.DeviceUnavailable`).
        """
        device = devices.parse(device)
        if device == self.device:
            return self
        return Tensor(devices.to_device(self.data, device), requires_grad=self.requires_grad)

    def detach(self) -> "Tensor":
        return Tensor(self.data)

    def __repr__(self) -> str:
        flag = ", requires_grad=True" if self.requires_grad else ""
        where = "" if isinstance(self.data, np.ndarray) else f", device={self.device!r}"
        text = np.array2string(devices.to_host(self.data), precision=4, threshold=8)
        return f"Tensor({text}{where}{flag})"

    # ----------------------------------------------------------------- elementwise arithmetic
    def __add__(self, other):
        if not isinstance(other, Tensor):
            a = self  # `other` may be a broadcasting ndarray: undo it in the gradient too
            other = _operand(other, a.data)
            return Tensor.from_op(a.data + other, (a,), lambda g: (unbroadcast(g, a.shape),))
        a, b = self, _same_device(self, other)
        return Tensor.from_op(a.data + b.data, (a, b),
                              lambda g: (unbroadcast(g, a.shape), unbroadcast(g, b.shape)))

    __radd__ = __add__

    def __neg__(self):
        return Tensor.from_op(-self.data, (self,), lambda g: (-g,))

    def __sub__(self, other):
        return self + (-other)

    def __rsub__(self, other):
        return (-self) + other

    def __mul__(self, other):
        a = self
        if not isinstance(other, Tensor):
            other = _operand(other, a.data)
            return Tensor.from_op(a.data * other, (a,),
                                  lambda g: (unbroadcast(g * other, a.shape),))
        b = _same_device(a, other)
        return Tensor.from_op(a.data * b.data, (a, b),
                              lambda g: (unbroadcast(g * b.data, a.shape),
                                         unbroadcast(g * a.data, b.shape)))

    __rmul__ = __mul__

    def __truediv__(self, other):
        a = self
        if not isinstance(other, Tensor):
            other = _operand(other, a.data)
            return Tensor.from_op(a.data / other, (a,),
                                  lambda g: (unbroadcast(g / other, a.shape),))
        b = _same_device(a, other)
        out = a.data / b.data
        return Tensor.from_op(out, (a, b),
                              lambda g: (unbroadcast(g / b.data, a.shape),
                                         unbroadcast(-g * out / b.data, b.shape)))

    def __rtruediv__(self, other):
        b = self
        out = other / b.data
        return Tensor.from_op(out, (b,), lambda g: (unbroadcast(-g * out / b.data, b.shape),))

    def __pow__(self, exponent):
        if isinstance(exponent, Tensor):  # x ** y = exp(y log x), for x > 0
            return (exponent * self.log()).exp()
        a = self
        out = a.data ** exponent
        return Tensor.from_op(out, (a,), lambda g: (
            unbroadcast(g * exponent * a.data ** (exponent - 1), a.shape),))

    def __rpow__(self, base):
        out = base ** self.data
        log_base = math.log(base) if isinstance(base, (int, float)) else namespace(base).log(base)
        a = self
        return Tensor.from_op(out, (a,),
                              lambda g: (unbroadcast(g * out * log_base, a.shape),))

    def exp(self):
        out = namespace(self.data).exp(self.data)
        return Tensor.from_op(out, (self,), lambda g: (g * out,))

    def log(self):
        a = self
        return Tensor.from_op(namespace(a.data).log(a.data), (a,), lambda g: (g / a.data,))

    # ----------------------------------------------------------------- linear algebra
    def __matmul__(self, other):
        """Matrix product with np.matmul's shapes (batched, broadcast, 1-D operands).

        A product of float32 operands goes through `glassllm.kernels.matmul`: inside
        `glassllm.amp.autocast`, tensor-core rounding (low-precision inputs and output,
        float32 accumulation), forward and backward, the backward in the forward's precision,
        as PyTorch autocasts every matmul. float64 operands (gradient checks) are never rounded.
        """
        other = other if isinstance(other, Tensor) else Tensor(other).to(self.device)
        a, b = self, _same_device(self, other)
        xp = namespace(a.data)
        mm = kernels.matmul if a.data.dtype == b.data.dtype == xp.float32 else xp.matmul

        def backward(g):
            ad, bd = a.data, b.data
            # Treat 1-D operands as matrices, as np.matmul does, then undo it. b first: for
            # vector @ vector, g is 0-d and gets its trailing axis before the -2 one.
            if bd.ndim == 1:
                bd, g = bd[:, None], xp.expand_dims(g, axis=-1)
            if ad.ndim == 1:
                ad, g = ad[None, :], xp.expand_dims(g, axis=-2)
            # Now ad (..., m, k), bd (..., k, n), g (..., m, n). The gradient of an operand
            # shared by a batch is a sum over the batch; as torch.matmul does, the batch is
            # folded into the contraction so that sum is one GEMM (under autocast: one
            # float32 accumulation, rounded once, not a sum of rounded products).
            if bd.ndim == 2 and ad.ndim > 2:  # (..., m, k) @ (k, n): fold the rows
                ga = mm(g, bd.T)
                gb = mm(xp.reshape(ad, (-1, ad.shape[-1])).T, xp.reshape(g, (-1, g.shape[-1])))
            elif ad.ndim == 2 and bd.ndim > 2:  # (m, k) @ (..., k, n): fold the columns
                ga = mm(xp.reshape(xp.moveaxis(g, -2, 0), (g.shape[-2], -1)),
                        xp.reshape(xp.matrix_transpose(bd), (-1, bd.shape[-2])))
                gb = mm(ad.T, g)
            else:  # both batched (or both matrices): broadcast batch axes are summed
                ga = _sum_to(mm(g, xp.matrix_transpose(bd)), ad.shape, mm)
                gb = _sum_to(mm(xp.matrix_transpose(ad), g), bd.shape, mm)
            return xp.reshape(ga, a.shape), xp.reshape(gb, b.shape)

        out = xp.asarray(mm(a.data, b.data))  # vector @ vector: a 0-d array, not a scalar
        return Tensor.from_op(out, (a, b), kernels.keep_context(backward))

    def __rmatmul__(self, other):
        return Tensor(other).to(self.device) @ self

    # ----------------------------------------------------------------- reductions
    def sum(self, axis=None, keepdims: bool = False):
        a = self
        xp = namespace(a.data)

        def backward(g):
            if axis is not None and not keepdims:  # the summed axes back, of length 1
                axes = {i % a.ndim for i in (axis if isinstance(axis, tuple) else (axis,))}
                g = xp.reshape(g, tuple(1 if i in axes else n for i, n in enumerate(a.shape)))
            return (xp.broadcast_to(g, a.shape),)

        return Tensor.from_op(xp.sum(a.data, axis=axis, keepdims=keepdims), (a,), backward)

    def mean(self, axis=None, keepdims: bool = False):
        axes = range(self.ndim) if axis is None else np.atleast_1d(axis)
        count = int(np.prod([self.shape[i] for i in axes]))
        if count == 0:  # NumPy would warn and give NaN; a NaN loss is worse than an error
            raise ValueError(f"mean over zero elements (shape {self.shape}, axis {axis}) is "
                             f"undefined")
        return self.sum(axis=axis, keepdims=keepdims) * (1.0 / count)

    # ----------------------------------------------------------------- shape
    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        a = self
        xp = namespace(a.data)
        return Tensor.from_op(xp.reshape(a.data, shape), (a,),
                              lambda g: (xp.reshape(g, a.shape),))

    def transpose(self, *axes):
        """Permute axes (NumPy semantics): no argument reverses them, as `.T` does."""
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        axes = tuple(int(i) for i in axes) or tuple(reversed(range(self.ndim)))
        inverse = tuple(int(i) for i in np.argsort(axes))
        xp = namespace(self.data)
        return Tensor.from_op(xp.permute_dims(self.data, axes), (self,),
                              lambda g: (xp.permute_dims(g, inverse),))

    @property
    def T(self):
        return self.transpose()

    def __getitem__(self, index):
        if isinstance(index, Tensor):
            index = index.data
        a = self

        def backward(g):
            full = namespace(a.data).zeros_like(a.data)
            devices.scatter_add(full, index, g)  # repeated indices must add up, not overwrite
            return (full,)

        return Tensor.from_op(a.data[index], (a,), backward)


def _sum_to(grad: np.ndarray, shape: tuple, mm) -> np.ndarray:
    """unbroadcast for a matmul gradient: under autocast the batch sum of low-precision
    products is rounded to the low dtype once more (torch sums the expanded operand's
    gradient in that dtype, accumulating in float32)."""
    summed = unbroadcast(grad, shape)
    if summed.shape != grad.shape and mm is kernels.matmul:
        summed = kernels.round_product(summed)
    return summed


def _same_device(a: Tensor, b: Tensor) -> Tensor:
    """b, when it lives on a's device (an op never moves a tensor behind the user's back, as
    torch refuses "Expected all tensors to be on the same device").

    Raises:
        ValueError: one line naming both devices.
    """
    if isinstance(a.data, np.ndarray) and isinstance(b.data, np.ndarray):
        return b  # the common case, checked without asking for names
    if a.device != b.device:
        raise ValueError(f"operands on different devices: {a.device!r} and {b.device!r}; "
                         f"move one with .to({a.device!r}) or .to({b.device!r})")
    return b


def _operand(other, like):
    """A plain operand of an op on `like`: a host NumPy array moves to like's device (a
    number, or anything on the CPU, stays as it is)."""
    if isinstance(like, np.ndarray) or not isinstance(other, np.ndarray):
        return other
    return devices.to_device(other, devices.device_of(like))


def _is_integer(array) -> bool:
    """Whether an array (any device) holds integers or booleans."""
    if isinstance(array, np.ndarray):
        return array.dtype.kind in "biu"
    xp = namespace(array)
    return xp.isdtype(array.dtype, ("integral", "bool"))


def _consumed(_g):  # marker placed on nodes whose backward already ran
    raise RuntimeError("graph already consumed")


def backward_pass(root: Tensor, grad: np.ndarray) -> None:
    """The backward pass, as micrograd's `Value.backward` (Karpathy, micrograd/engine.py): sort
    the graph topologically, then run each node's local backward from the root down, summing
    the gradients that meet at a node (the chain rule's sum over paths). micrograd's

        topo = build_topo(self); self.grad = 1
        for v in reversed(topo): v._backward()     # each adds into its inputs' .grad

    is the loop below, with each node's gradient held in `grads` until its turn.

    Only leaves keep `.grad` (as in PyTorch); the gradients of intermediate results live in a
    dictionary while the pass runs. Every sum is a new array (`+`, never `+=`): a gradient an
    op returns may be a view of its input gradient or of a saved array. The reference form of
    the pass; `glassllm.engine.backward` registers a form that reuses gradient buffers, picked
    by `Tensor.backward` through `glassllm.kernels` and tested equal bit for bit
    (tests/test_backward.py).

    Args:
        root: the tensor `backward()` was called on (requires grad).
        grad: d(loss)/d(root), root's shape and dtype; only read (a broadcast view is fine).

    Raises:
        RuntimeError: a node of the graph was already consumed by an earlier backward pass
            (checked before any gradient is added).
    """
    order = root._topological_order()  # parents before children, root last
    grads: dict[int, np.ndarray] = {id(root): grad}  # id(node) -> d(root)/d(node) so far
    while order:
        # pop, not iterate: once processed a node is dropped (unless the caller holds it), and
        # with it the activations its backward saved (PyTorch's default, retain_graph=False)
        node = order.pop()
        g = grads.pop(id(node), None)  # None: no path from root reached it with a gradient
        if node.is_leaf:
            if g is not None:
                node._accumulate(g)
            continue
        for parent, pg in zip(node._parents, node._backward(g) if g is not None else ()):
            if pg is not None and parent.requires_grad:
                key = id(parent)
                grads[key] = grads[key] + pg if key in grads else pg
        node._release()
        del node
