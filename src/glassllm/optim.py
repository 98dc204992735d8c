"""AdamW, global-norm gradient clipping and the warmup + cosine learning-rate schedule.

Sources: Adam (Kingma & Ba 2015), AdamW's decoupled weight decay (Loshchilov & Hutter 2019),
the cosine shape of SGDR (Loshchilov & Hutter 2017) used once, without warm restarts, and
global-norm clipping (Pascanu, Mikolov & Bengio 2013). The public API and its
contract are in docs/training.md ("The pieces of the loop").

`adamw_update` and `sum_of_squares` are the reference forms, written as the papers do; the
engine registers sliced, in-place forms of both (`glassllm.engine.optimizer`), run unless
GLASSLLM_KERNELS=reference (`glassllm.kernels`).
"""
from __future__ import annotations

import math

import numpy as np

from . import kernels
from .devices import device_of, namespace
from .tensor import Tensor


def adamw_update(p, g, m, v, *, lr: float, beta1: float, beta2: float, eps: float,
                 weight_decay: float, step: int) -> None:
    """One AdamW update of one parameter, in place on p (the weights) and m, v (its moments).

    Adam (Kingma & Ba 2015, Algorithm 1) with the decoupled weight decay of AdamW (Loshchilov &
    Hutter 2019, Algorithm 2), `step` = t the parameter's own update count (1 at the first):

        p <- p (1 - lr wd)                       decay the weights, not the gradient
        m <- beta1 m + (1 - beta1) g             moving average of the gradient
        v <- beta2 v + (1 - beta2) g^2           ... and of its square
        m_hat = m / (1 - beta1^t)                bias corrections (m and v start at 0)
        v_hat = v / (1 - beta2^t)
        p <- p - lr m_hat / (sqrt(v_hat) + eps)

    p, g, m, v: arrays of one shape and dtype; weight_decay 0 decays nothing. The decay is
    scaled by lr, as torch.optim.AdamW does; the paper scales it by the schedule multiplier
    eta_t alone, which is the same decay once wd is read as lr * wd at the base rate.
    """
    if weight_decay:
        p *= 1.0 - lr * weight_decay
    m[...] = beta1 * m + (1.0 - beta1) * g
    v[...] = beta2 * v + (1.0 - beta2) * (g * g)
    m_hat = m / (1.0 - beta1 ** step)
    v_hat = v / (1.0 - beta2 ** step)
    p -= lr * m_hat / (namespace(p).sqrt(v_hat) + eps)


class AdamW:
    """Adam with decoupled weight decay.

    Args:
        params: the tensors to update (e.g. `model.parameters()`).
        lr: base learning rate. betas: (beta1, beta2) for the moment averages; beta2=0.95
            and lr=3e-3 are this project's defaults, not another framework's.
        eps: added to sqrt(v_hat) in the denominator.
        weight_decay: decoupled decay, applied only to parameters with ndim >= 2 (projection
            and embedding matrices); norm gains and biases are not decayed.

    State: `m`, `v` (one float array per parameter, zeros until first used), `t` (global step
    count) and `steps` (per-parameter update counts used for bias correction). No save/load.
    Betas, eps, dtypes and lr are not validated (supply floating parameters and
    mathematically valid controls). Gradient shapes are: `step` raises ValueError, before
    changing anything, when a gradient's shape differs from its parameter's (NumPy would
    broadcast a (1, n) gradient into an (n,) parameter silently).
    """

    def __init__(self, params: list[Tensor], lr: float = 0.003, betas=(0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.1):
        self.params = list(params)
        self.lr = lr
        self.betas = betas
        self.eps = eps
        self.weight_decay = weight_decay
        # the moments live where the parameters do (build the optimizer after `model.to`)
        self.m = [namespace(p.data).zeros_like(p.data) for p in self.params]
        self.v = [namespace(p.data).zeros_like(p.data) for p in self.params]
        self.steps = [0] * len(self.params)
        self.t = 0

    def zero_grad(self) -> None:
        """Set every parameter's `.grad` to None (not zeros: absent means 'not updated')."""
        for p in self.params:
            p.grad = None

    def step(self, lr: float | None = None) -> None:
        """One update of every parameter that has a gradient.

        lr overrides the base rate for this update only. Parameters whose grad is None are
        skipped entirely: no decay, no moment update, their count does not advance.

        Raises:
            ValueError: a grad whose shape differs from its parameter's, or a parameter moved
                to another device after the optimizer was built (checked for all parameters
                before any is updated, so nothing changes).
        """
        for i, p in enumerate(self.params):  # before any change, so a bad step changes nothing
            if p.grad is not None and p.grad.shape != p.data.shape:
                raise ValueError(f"AdamW.step: parameter {i} has shape {p.data.shape} but its "
                                 f"grad has shape {p.grad.shape}")
            if p.grad is not None and device_of(self.m[i]) != device_of(p.data):
                # built before model.to(device): the array library's own error names no cause
                raise ValueError(f"AdamW.step: parameter {i} is on {device_of(p.data)} but the "
                                 f"optimizer's moments are on {device_of(self.m[i])}; build the "
                                 f"optimizer after model.to(device)")
        lr = self.lr if lr is None else lr
        beta1, beta2 = self.betas
        update = kernels.pick(adamw_update, on=self.params[0].data if self.params else None)
        self.t += 1
        for i, p in enumerate(self.params):
            g = p.grad
            if g is None:
                continue
            self.steps[i] += 1
            # decoupled decay for matrices only (projections, embeddings), not gains/biases
            decay = self.weight_decay if p.data.ndim >= 2 else 0.0
            update(p.data, g, self.m[i], self.v[i], lr=lr, beta1=beta1, beta2=beta2,
                   eps=self.eps, weight_decay=decay, step=self.steps[i])


def sum_of_squares(g: np.ndarray) -> float:
    """sum(g**2) accumulated in float64, so that large float32 gradients cannot overflow."""
    xp = namespace(g)
    if xp is np:  # squares straight into float64, without a float64 copy of g first
        return float(np.sum(np.square(g, dtype=np.float64)))
    return float(xp.sum(xp.square(xp.astype(g, xp.float64))))


def global_grad_norm(params: list[Tensor]) -> float:
    """The global L2 norm of all present gradients, as `clip_grad_norm` measures it: squares
    summed in float64 (`sum_of_squares`, or the engine's sliced form of it), a Python float;
    0.0 if no parameter has a gradient, inf/NaN if an element is inf/NaN."""
    grads = [p.grad for p in params if p.grad is not None]
    squares = kernels.pick(sum_of_squares, on=grads[0] if grads else None)
    return math.sqrt(sum(squares(g) for g in grads))


def clip_grad_norm(params: list[Tensor], max_norm: float, norm: float | None = None) -> float:
    """Scale all gradients together so their global L2 norm is at most `max_norm`.

    Returns the norm before clipping (a Python float; 0.0 if no parameter has a gradient).
    Squares are summed in float64 so large float32 gradients cannot overflow. Above the
    limit every present gradient is multiplied by max_norm / (norm + 1e-6); None is ignored.
    max_norm must be > 0 (not validated). norm: `global_grad_norm(params)` when the caller
    has measured it already (not measured twice); None: measured here.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    if norm is None:
        norm = global_grad_norm(params)
    if norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in grads:
            g *= scale  # a Python float: rounded to g's dtype (NumPy's NEP 50, the standard)
    return norm


def lr_schedule(step: int, total_steps: int, base_lr: float, warmup: int,
                min_ratio: float = 0.1) -> float:
    """Learning rate at `step`: linear warmup, then one cosine decay to base_lr * min_ratio.

    step < warmup: base_lr * (step + 1) / warmup. Afterwards progress = (step - warmup) /
    (total_steps - warmup), capped at 1, and lr = min + (base - min) * (1 + cos(pi*progress))/2.
    warmup=0 starts at base_lr. As documented, step >= total_steps yields the minimum once
    warmup has finished: a step still inside the warmup stays on the warmup line even past
    total_steps (step 6, total_steps 5, warmup 10 gives 0.7 * base_lr). Updates run from 0 to
    total_steps - 1, so the last rate may remain slightly above the minimum.
    """
    if step < warmup:
        return base_lr * (step + 1) / warmup
    min_lr = base_lr * min_ratio
    span = total_steps - warmup
    progress = 1.0 if span <= 0 else min(1.0, (step - warmup) / span)
    weight = 0.5 * (1.0 + math.cos(math.pi * progress))  # 1 at the start, exactly 0 at the end
    # a weighted mean, so both ends are exact: base_lr at progress 0, min_lr at progress 1
    return weight * base_lr + (1.0 - weight) * min_lr
