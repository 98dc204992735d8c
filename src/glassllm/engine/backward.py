"""The backward pass with gradient buffers reused: the engine's form of `tensor.backward_pass`.

The reference pass (micrograd's loop, `glassllm.tensor.backward_pass`) sums the gradients that
meet at a node into a new array each time and copies a leaf's first gradient into `.grad`,
since any gradient may be a view of another buffer. In a transformer most gradients come from
the fused ops of `glassllm.functional`, which promise fresh arrays (`Tensor.from_op(...,
fresh_grads=True)`: newly allocated, distinct, referred to by nothing else). This form tracks
which gradient arrays only the pass itself refers to ("owned": an op's fresh gradient, or a
sum made here) and then

- adds into an owned array in place (`total += g`) instead of allocating `total + g`;
- when an op's fresh gradient meets one that is not owned (a residual add's pass-through),
  adds the other into the fresh one;
- hands an owned gradient to a leaf as its `.grad` without a copy.

That saves one allocation and one pass over memory per sum and per parameter (the residual
stream's gradient is summed at every block). The values are those of the reference, bit for
bit: `a += b` rounds as `a + b` does, and IEEE addition is commutative, so adding the older
gradient into the newer gives the same sum; the order of the sums is the reference's.
tests/test_backward.py holds the two equal on a model's loss and on small graphs.
"""
from __future__ import annotations

import numpy as np

from .. import tensor
from ..tensor import Tensor


def backward_pass(root: Tensor, grad: np.ndarray) -> None:
    """`tensor.backward_pass` with gradient buffers reused (module docstring): the same
    arguments, results and errors.

    Args:
        root: the tensor `backward()` was called on (requires grad).
        grad: d(loss)/d(root), root's shape and dtype; only read (the caller's array).

    Raises:
        RuntimeError: a node of the graph was already consumed by an earlier backward pass.
    """
    order = root._topological_order()
    grads: dict[int, np.ndarray] = {id(root): grad}
    owned: dict[int, bool] = {}  # id(node) -> grads[id] is referred to by this pass alone
    while order:
        node = order.pop()  # pop: a processed node and its saved activations are freed
        g, g_owned = grads.pop(id(node), None), owned.pop(id(node), False)
        if node.is_leaf:
            if g is not None:
                _accumulate(node, g, g_owned)
            continue
        for parent, pg in zip(node._parents, node._backward(g) if g is not None else ()):
            if pg is not None and parent.requires_grad:
                _add(grads, owned, id(parent), pg, node._fresh_grads)
        node._release()
        del node


def _add(grads: dict, owned: dict, key: int, g: np.ndarray, fresh: bool) -> None:
    """grads[key] += g (the chain rule's sum), in place where one side is owned; `fresh`: g is
    an op's fresh gradient (owned from now on)."""
    if key not in grads:
        grads[key], owned[key] = g, fresh
    elif owned[key] and _can_add_into(grads[key], g):
        grads[key] += g
    elif fresh and _can_add_into(g, grads[key]):
        g += grads[key]  # the new one is ours: add the other into it
        grads[key], owned[key] = g, True
    else:  # neither is ours: never `+=` into an array that may be a view of another buffer
        grads[key], owned[key] = grads[key] + g, True


def _can_add_into(total: np.ndarray, g: np.ndarray) -> bool:
    """Whether `total += g` gives the array `total + g` would (same shape and dtype), so the
    in-place sum is the reference's bit for bit."""
    return (total.flags.writeable and total.shape == g.shape
            and np.result_type(total, g) == total.dtype)


def _accumulate(leaf: Tensor, g: np.ndarray, g_owned: bool) -> None:
    """The leaf's `.grad += g`; an owned gradient of the leaf's shape and dtype becomes its
    first `.grad` as is (nothing else refers to it), any other is copied as the reference
    does."""
    if g_owned and leaf.grad is None and g.dtype == leaf.data.dtype and g.shape == leaf.shape:
        leaf.grad = g
    else:
        leaf._accumulate(g)


FAST_FORMS = [(tensor.backward_pass, backward_pass)]
