"""AdamW, global-norm gradient clipping and the warmup + cosine learning-rate schedule.

Sources: Adam (Kingma & Ba 2015), AdamW's decoupled weight decay (Loshchilov & Hutter 2019),
the cosine shape of SGDR (Loshchilov & Hutter 2017) used once, without warm restarts, and
global-norm clipping (Pascanu, Mikolov & Bengio 2013). Contract: spec 001.
"""
from __future__ import annotations

import math

import numpy as np

from .tensor import Tensor


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
    Betas, shapes, dtypes and lr are not validated.
    """

    def __init__(self, params: list[Tensor], lr: float = 0.003, betas=(0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.1):
        self.params = list(params)
        self.lr = lr
        self.betas = betas
        self.eps = eps
        self.weight_decay = weight_decay
        self.m = [np.zeros_like(p.data) for p in self.params]
        self.v = [np.zeros_like(p.data) for p in self.params]
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
        """
        lr = self.lr if lr is None else lr
        beta1, beta2 = self.betas
        self.t += 1
        for i, p in enumerate(self.params):
            g = p.grad
            if g is None:
                continue
            self.steps[i] += 1
            n = self.steps[i]
            if self.weight_decay and p.data.ndim >= 2:
                p.data *= 1.0 - lr * self.weight_decay  # decoupled: not part of the gradient
            m, v = self.m[i], self.v[i]
            m *= beta1
            m += (1.0 - beta1) * g
            v *= beta2
            v += (1.0 - beta2) * (g * g)
            # Bias correction folded into the step size and eps (same math, fewer temporaries):
            # p -= lr * m_hat / (sqrt(v_hat) + eps)
            c1 = 1.0 - beta1 ** n
            c2 = 1.0 - beta2 ** n
            denom = np.sqrt(v)
            denom /= math.sqrt(c2)
            denom += self.eps
            p.data -= (lr / c1) * (m / denom)


def clip_grad_norm(params: list[Tensor], max_norm: float) -> float:
    """Scale all gradients together so their global L2 norm is at most `max_norm`.

    Returns the norm before clipping (a Python float; 0.0 if no parameter has a gradient).
    Squares are summed in float64 so large float32 gradients cannot overflow. Above the
    limit every present gradient is multiplied by max_norm / (norm + 1e-6); None is ignored.
    max_norm must be > 0 (not validated).
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    total = 0.0
    for g in grads:
        flat = g.ravel()
        total += float(np.dot(flat.astype(np.float64), flat.astype(np.float64)))
    norm = math.sqrt(total)
    if norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in grads:
            g *= np.asarray(scale, dtype=g.dtype)
    return norm


def lr_schedule(step: int, total_steps: int, base_lr: float, warmup: int,
                min_ratio: float = 0.1) -> float:
    """Learning rate at `step`: linear warmup, then one cosine decay to base_lr * min_ratio.

    step < warmup: base_lr * (step + 1) / warmup. Afterwards progress = (step - warmup) /
    (total_steps - warmup), capped at 1, and lr = min + (base - min) * (1 + cos(pi*progress))/2.
    warmup=0 starts at base_lr; step >= total_steps gives the minimum.
    """
    if step < warmup:
        return base_lr * (step + 1) / warmup
    min_lr = base_lr * min_ratio
    span = total_steps - warmup
    progress = 1.0 if span <= 0 else min(1.0, (step - warmup) / span)
    weight = 0.5 * (1.0 + math.cos(math.pi * progress))  # 1 at the start, exactly 0 at the end
    # a weighted mean, so both ends are exact: base_lr at progress 0, min_lr at progress 1
    return weight * base_lr + (1.0 - weight) * min_lr
