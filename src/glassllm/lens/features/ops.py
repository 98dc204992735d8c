"""The activations of a sparse dictionary, each a forward and a backward over NumPy arrays side by
side, and the autograd op that joins them (the pattern of `glassllm.functional`).

    y, saved = relu_forward(z)                 # plain arrays in, plain arrays out
    dz, = relu_backward(dy, saved)             # gradients of the inputs
    relu(z: Tensor) -> Tensor                  # one graph node

Shapes: N rows (tokens, any leading axes), S the dictionary's width (d_sae). These are reference
forms: each is a few NumPy lines written as the paper reads; there is no fast form.

- `relu`: the standard SAE's activation (Bricken et al. 2023, "Towards Monosemanticity").
- `topk_relu`: keep the k largest pre-activations of each row, then ReLU (Gao et al. 2024,
  "Scaling and evaluating sparse autoencoders", eq. 3; `TopK` then ReLU as OpenAI's
  sparse_autoencoder and SAELens do, so a row with fewer than k positive entries keeps fewer).
- `jumprelu` and `step`: z H(z - theta) and H(z - theta), whose threshold theta gets the
  straight-through pseudo-derivative of a rectangle kernel of width `bandwidth` (Rajamanoharan
  et al. 2024, "Jumping Ahead: Improving Reconstruction Fidelity with JumpReLU Sparse
  Autoencoders", eqs. 11-12).
"""
from __future__ import annotations

import numpy as np

from ...tensor import Tensor


def _op(y, parents, backward) -> Tensor:
    return Tensor.from_op(y, parents, backward)


# --------------------------------------------------------------------------- relu
def relu_forward(z):
    """y = max(z, 0): z (..., S) -> y (..., S)."""
    return np.maximum(z, 0), (z > 0,)


def relu_backward(dy, saved):
    """dz = dy where z > 0, else 0 (the subgradient 0 at z = 0, as torch)."""
    (on,) = saved
    return (dy * on,)


def relu(z: Tensor) -> Tensor:
    """ReLU: z (..., S) -> (..., S)."""
    y, saved = relu_forward(z.data)
    return _op(y, (z,), lambda dy: relu_backward(dy, saved))


# --------------------------------------------------------------------------- topk
def topk_mask(z, k: int):
    """True at the k largest entries of each row of z (..., S) (ties broken by
    `np.argpartition`'s order): a bool array of z's shape."""
    keep = np.argpartition(z, -k, axis=-1)[..., -k:]       # (..., k) indices, unordered
    mask = np.zeros(z.shape, dtype=bool)
    np.put_along_axis(mask, keep, True, axis=-1)
    return mask


def topk_relu_forward(z, k: int):
    """y = ReLU(TopK_k(z)): the k largest entries of each row kept, the rest 0, then ReLU.
    z (..., S) -> y (..., S), at most k non-zero per row (Gao et al. 2024, eq. 3)."""
    on = topk_mask(z, k) & (z > 0)
    return np.where(on, z, 0).astype(z.dtype, copy=False), (on,)


def topk_relu_backward(dy, saved):
    """dz = dy on the kept, positive entries; 0 elsewhere (the selection is piecewise constant,
    so it carries no gradient)."""
    (on,) = saved
    return (dy * on,)


def topk_relu(z: Tensor, k: int) -> Tensor:
    """ReLU of the k largest entries of each row: z (..., S) -> (..., S)."""
    if not 1 <= k <= z.shape[-1]:
        raise ValueError(f"topk: k={k} must lie in 1..{z.shape[-1]} (the dictionary's width)")
    y, saved = topk_relu_forward(z.data, k)
    return _op(y, (z,), lambda dy: topk_relu_backward(dy, saved))


# --------------------------------------------------------------------------- jumprelu
def rectangle(u):
    """The rectangle kernel K(u) = 1 for -1/2 < u < 1/2, else 0 (Rajamanoharan et al. 2024, §3)."""
    return ((u > -0.5) & (u < 0.5)).astype(u.dtype)


def jumprelu_forward(z, theta, bandwidth: float):
    """y = ReLU(z) H(z - theta): z (..., S), theta (S,) -> y (..., S). The ReLU matters only for
    a negative threshold, and is there because SAELens' JumpReLU encodes so."""
    on = (z > theta) & (z > 0)
    return np.where(on, z, 0).astype(z.dtype, copy=False), (z, theta, on, bandwidth)


def jumprelu_backward(dy, saved):
    """dz = dy H(z - theta) (the jump itself passes nothing to z, eq. 11); the threshold's
    pseudo-derivative dtheta = -(theta / eps) K((z - theta) / eps) dy, summed over rows (eq. 11:
    straight-through, the step's derivative replaced by a kernel density estimate)."""
    z, theta, on, eps = saved
    dz = dy * on
    dtheta = -(theta / eps) * rectangle((z - theta) / eps) * dy
    return dz, dtheta.reshape(-1, theta.shape[-1]).sum(axis=0)


def jumprelu(z: Tensor, theta: Tensor, bandwidth: float) -> Tensor:
    """JumpReLU: z (..., S), threshold theta (S,) -> (..., S); theta's gradient is the
    pseudo-derivative of `jumprelu_backward`."""
    y, saved = jumprelu_forward(z.data, theta.data, bandwidth)
    return _op(y, (z, theta), lambda dy: jumprelu_backward(dy, saved))


def step_forward(z, theta, bandwidth: float):
    """y = H(z - theta), the count of active units of the L0 penalty: z (..., S), theta (S,) ->
    y (..., S) of 0 and 1."""
    return (z > theta).astype(z.dtype), (z, theta, bandwidth)


def step_backward(dy, saved):
    """dz = 0 (no gradient reaches the encoder through the step); dtheta = -(1 / eps)
    K((z - theta) / eps) dy summed over rows (Rajamanoharan et al. 2024, eq. 12)."""
    z, theta, eps = saved
    dtheta = -(1.0 / eps) * rectangle((z - theta) / eps) * dy
    return None, dtheta.reshape(-1, theta.shape[-1]).sum(axis=0)


def step(z: Tensor, theta: Tensor, bandwidth: float) -> Tensor:
    """Heaviside H(z - theta): z (..., S), theta (S,) -> (..., S); see `step_backward`."""
    y, saved = step_forward(z.data, theta.data, bandwidth)
    return _op(y, (z, theta), lambda dy: step_backward(dy, saved))
