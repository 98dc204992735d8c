"""glassllm.optim against its documented contract, sentence by sentence, and against torch.optim.AdamW.

Each test is headed by the sentence of ../shared/spec/001_*.txt it checks.
"""
from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

from glassllm import Tensor
from glassllm.optim import AdamW, clip_grad_norm, lr_schedule


# Spec 001, the AdamW / clipping / schedule example, verbatim.
def test_spec_example_adamw_clip_schedule():
    import numpy as np
    from glassllm import Tensor
    from glassllm.optim import AdamW, clip_grad_norm, lr_schedule

    parameter = Tensor([0.0, 0.0], requires_grad=True)
    optimizer = AdamW([parameter], lr=0.1, weight_decay=0.0)
    optimizer.zero_grad()
    ((parameter - 3.0) ** 2).sum().backward()
    before = clip_grad_norm([parameter], max_norm=1.0)
    assert before > 1.0
    assert np.linalg.norm(parameter.grad) <= 1.0
    optimizer.step()
    assert np.all(parameter.data > 0.0)
    assert lr_schedule(0, 10, 1.0, warmup=2) == 0.5
    assert lr_schedule(20, 10, 1.0, warmup=2) == 0.1


# "Imports: ... from glassllm.optim import AdamW, clip_grad_norm, lr_schedule. These functions
# are not root exports."
def test_not_root_exports():
    import types

    import glassllm
    for name in ("AdamW", "clip_grad_norm", "lr_schedule", "get_batch", "evaluate", "train"):
        assert name not in glassllm.__all__
        # `glassllm.train` exists once the submodule is imported -- as the module, not train()
        value = getattr(glassllm, name, None)
        assert value is None or isinstance(value, types.ModuleType)


# --------------------------------------------------------------------------- AdamW reference
class ReferenceAdamW:
    """AdamW written from Loshchilov & Hutter 2019 (Algorithm 2), with the lr-scaled decay of
    common implementations, per-parameter step counts, and skipping of absent gradients."""

    def __init__(self, arrays, lr, betas, eps, weight_decay):
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        self.m = [np.zeros_like(a) for a in arrays]
        self.v = [np.zeros_like(a) for a in arrays]
        self.n = [0] * len(arrays)

    def step(self, arrays, grads, lr=None):
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        out = []
        for i, (p, g) in enumerate(zip(arrays, grads)):
            if g is None:
                out.append(p)
                continue
            self.n[i] += 1
            t = self.n[i]
            self.m[i] = b1 * self.m[i] + (1 - b1) * g
            self.v[i] = b2 * self.v[i] + (1 - b2) * g ** 2
            m_hat = self.m[i] / (1 - b1 ** t)
            v_hat = self.v[i] / (1 - b2 ** t)
            decay = self.wd if p.ndim >= 2 else 0.0
            out.append(p - lr * decay * p - lr * m_hat / (np.sqrt(v_hat) + self.eps))
        return out


def random_grads(shapes, step, missing=()):
    rng = np.random.default_rng(100 + step)
    return [None if i in missing else rng.standard_normal(s) for i, s in enumerate(shapes)]


SHAPES = [(3, 4), (4,), (2, 3, 2), (5, 2)]


def run_both(lrs, missing_at=None, dtype=np.float64, **opts):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    params = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    opt = AdamW(params, **opts)
    full = dict(lr=0.003, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    full.update(opts)
    ref = ReferenceAdamW(arrays, **full)
    for step, lr in enumerate(lrs):
        grads = random_grads(SHAPES, step, (missing_at or {}).get(step, ()))
        for p, g in zip(params, grads):
            p.grad = None if g is None else g.astype(dtype)
        opt.step(lr)
        arrays = ref.step(arrays, grads, lr)
    return opt, params, arrays


class WholeArrayAdamW:
    """AdamW exactly as glassllm computed it before the update was cut into slices (commit
    6b0f30e's parent): the same operations in the same order, each over the whole array."""

    def __init__(self, arrays, lr=0.003, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        self.m = [np.zeros_like(a) for a in arrays]
        self.v = [np.zeros_like(a) for a in arrays]
        self.n = [0] * len(arrays)

    def step(self, arrays, grads, lr=None):
        lr = self.lr if lr is None else lr
        beta1, beta2 = self.betas
        for i, (p, g) in enumerate(zip(arrays, grads)):
            if g is None:
                continue
            self.n[i] += 1
            if self.wd and p.ndim >= 2:
                p *= 1.0 - lr * self.wd
            m, v = self.m[i], self.v[i]
            m *= beta1
            m += (1.0 - beta1) * g
            v *= beta2
            v += (1.0 - beta2) * (g * g)
            c1, c2 = 1.0 - beta1 ** self.n[i], 1.0 - beta2 ** self.n[i]
            denom = np.sqrt(v)
            denom /= math.sqrt(c2)
            denom += self.eps
            p -= (lr / c1) * (m / denom)


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


# README, Performance: "AdamW's results are bitwise unchanged" by the sliced update.
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sliced_adamw_is_bit_identical_to_the_whole_array_update(dtype, threads, monkeypatch):
    """Parameters from far below one slice to several slices (SLICE_ELEMENTS = 2**18, and
    above MIN_PARALLEL_ELEMENTS so the thread pool runs them), matrices (decayed) and vectors
    (not), a parameter without a gradient at some steps, an lr override: every weight and
    both moments equal the whole-array update bit for bit after each of 6 steps. About the
    engine's sliced form, so it runs in engine mode (test_kernels holds the reference form
    equal to it to rounding)."""
    from glassllm.engine import jit  # the NumPy form (numba's is the reference's bits:
    monkeypatch.setattr(jit, "_loaded", True)  # tests/test_numba_kernels.py)
    monkeypatch.setattr(jit, "_module", None)
    from glassllm import kernels
    from glassllm.engine import parallel
    shapes = [(700, 1001), (3, 5), (300_001,), (64,), (2, 300, 500)]
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
    params = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    assert max(a.size for a in arrays) > 2 * parallel.SLICE_ELEMENTS
    opts = dict(lr=2e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt, ref = AdamW(params, **opts), WholeArrayAdamW(arrays, **opts)
    saved = parallel.get_num_threads()
    parallel.set_num_threads(threads)
    try:
        for step, lr in enumerate([None, 0.01, None, 1e-4, None, 0.5]):
            grads = [None if (i == 4 and step in (1, 2)) else
                     (rng.standard_normal(s) * 10.0 ** (step - 3)).astype(dtype)
                     for i, s in enumerate(shapes)]
            for p, g in zip(params, grads):
                p.grad = None if g is None else g.copy()
            with kernels.use("engine"):
                opt.step(lr)
            ref.step(arrays, grads, lr)
            for i, (p, want) in enumerate(zip(params, arrays)):
                assert np.array_equal(bits(p.data), bits(want)), (step, i, "weights")
                assert np.array_equal(bits(opt.m[i]), bits(ref.m[i])), (step, i, "m")
                assert np.array_equal(bits(opt.v[i]), bits(ref.v[i])), (step, i, "v")
    finally:
        parallel.set_num_threads(saved)
    assert opt.steps == ref.n == [6, 6, 6, 6, 4]


# "AdamW(params: list[Tensor], lr: float = 0.003, betas=(0.9,0.95), eps: float = 1e-8,
# weight_decay: float = 0.1)"
def test_adamw_signature_defaults():
    sig = inspect.signature(AdamW)
    defaults = {k: v.default for k, v in sig.parameters.items()}
    assert defaults == {"params": inspect.Parameter.empty, "lr": 0.003, "betas": (0.9, 0.95),
                        "eps": 1e-8, "weight_decay": 0.1}
    opt, params, expected = run_both([None] * 4)  # the defaults are what gets used
    for p, e in zip(params, expected):
        np.testing.assert_allclose(p.data, e, rtol=1e-12, atol=1e-14)


# "Participating parameters update moving averages of the gradient and its square, correct
# bias with their own update count and receive an adaptive step."
def test_adamw_matches_reference_over_several_steps():
    opts = dict(lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.3)
    opt, params, expected = run_both([None] * 6, **opts)
    for p, e in zip(params, expected):
        np.testing.assert_allclose(p.data, e, rtol=1e-12, atol=1e-14)


# "... stores parameters, m/v moments, global t and per-parameter update counts."
# "Parameters without gradients are skipped, including decay and bias correction."
def test_adamw_state_and_skipping_of_parameters_without_grads():
    # param 2 (3-D, so it would be decayed) has no gradient in steps 0 and 1
    missing = {0: (2,), 1: (2,), 3: (0,)}
    opt, params, expected = run_both([None] * 5, missing_at=missing)
    for p, e in zip(params, expected):
        np.testing.assert_allclose(p.data, e, rtol=1e-12, atol=1e-14)
    assert opt.t == 5
    assert opt.steps == [4, 5, 3, 5]
    assert [p is q for p, q in zip(opt.params, params)] == [True] * 4
    assert [m.shape for m in opt.m] == [v.shape for v in opt.v] == SHAPES


def test_skipped_parameter_is_not_touched_at_all():
    rng = np.random.default_rng(0)
    w = Tensor(rng.standard_normal((3, 3)), requires_grad=True)
    b = Tensor(rng.standard_normal(3), requires_grad=True)
    before = w.data.copy()
    opt = AdamW([w, b], lr=0.1, weight_decay=0.5)
    for _ in range(3):
        b.grad = rng.standard_normal(3)
        opt.step()
    np.testing.assert_array_equal(w.data, before)  # no decay without a gradient
    np.testing.assert_array_equal(opt.m[0], 0.0)
    np.testing.assert_array_equal(opt.v[0], 0.0)
    assert opt.steps == [0, 3] and opt.t == 3
    # its first update is a first update: bias correction with its own count 1, so
    # |step| = lr * |g| / (|g| + eps) ~ lr, after the decay factor (1 - lr * wd)
    w.grad = np.full((3, 3), 2.0)
    b.grad = None
    opt.step()
    np.testing.assert_allclose(w.data, before * (1 - 0.1 * 0.5) - 0.1 * 2.0 / (2.0 + 1e-8),
                               rtol=1e-12)


# "zero_grad() -> None sets every parameter's grad=None."
def test_zero_grad_sets_none():
    params = [Tensor(np.ones(2), requires_grad=True) for _ in range(3)]
    params[0].grad, params[1].grad = np.ones(2), np.zeros(2)
    opt = AdamW(params)
    assert opt.zero_grad() is None
    assert [p.grad for p in params] == [None, None, None]


# "step(lr: float | None = None) -> None uses an override for that update only, preserving the
# base lr."
def test_step_lr_override_for_that_update_only():
    opt, params, expected = run_both([0.5, None, 0.02, None], lr=0.001)
    assert opt.lr == 0.001
    for p, e in zip(params, expected):
        np.testing.assert_allclose(p.data, e, rtol=1e-12, atol=1e-14)
    p = Tensor(np.array([1.0]), requires_grad=True)
    opt = AdamW([p], lr=0.1, weight_decay=0.0)
    p.grad = np.array([1.0])
    assert opt.step(0.5) is None
    np.testing.assert_allclose(p.data, [0.5], rtol=1e-7)  # first Adam step has size ~lr
    p.grad = np.array([1.0])
    opt.step()
    np.testing.assert_allclose(p.data, [0.4], rtol=1e-6)


# "Decoupled weight decay applies only to ndim>=2 arrays, such as projection and embedding
# matrices. RMSNorm gamma vectors receive no decay."
def test_decay_only_for_matrices():
    arrays = [np.full((2, 3), 2.0), np.full((2, 2, 2), 2.0), np.full(4, 2.0), np.array(2.0)]
    params = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    opt = AdamW(params, lr=0.1, weight_decay=0.5)
    for p in params:
        p.grad = np.zeros_like(p.data)  # zero gradient: the adaptive step is exactly 0
    opt.step()
    np.testing.assert_allclose(params[0].data, 2.0 * (1 - 0.05), rtol=1e-15)
    np.testing.assert_allclose(params[1].data, 2.0 * (1 - 0.05), rtol=1e-15)
    np.testing.assert_array_equal(params[2].data, arrays[2])
    np.testing.assert_array_equal(params[3].data, arrays[3])


# "Optimizer state has no save/load API."
def test_no_state_save_load_api():
    assert not hasattr(AdamW, "state_dict") and not hasattr(AdamW, "load_state_dict")


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-6)])
def test_adamw_matches_torch_adamw(dtype, tol, torch):
    """torch.optim.AdamW with decay only on ndim >= 2 (param groups), changing lr per step."""
    lr, betas, eps, wd = 0.02, (0.9, 0.95), 1e-8, 0.1
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    params = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    ours = AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=wd)
    tp = [torch.tensor(a, requires_grad=True) for a in arrays]
    theirs = torch.optim.AdamW(
        [{"params": [t for t in tp if t.ndim >= 2], "weight_decay": wd},
         {"params": [t for t in tp if t.ndim < 2], "weight_decay": 0.0}],
        lr=lr, betas=betas, eps=eps)
    for step, step_lr in enumerate([0.02, 0.01, 0.005, 0.02, 0.001, 0.0125]):
        grads = random_grads(SHAPES, step)
        for p, t, g in zip(params, tp, grads):
            p.grad = g.astype(dtype)
            t.grad = torch.tensor(g.astype(dtype))
        for group in theirs.param_groups:
            group["lr"] = step_lr
        theirs.step()
        ours.step(step_lr)
        for p, t in zip(params, tp):
            np.testing.assert_allclose(p.data, t.detach().numpy(), rtol=tol, atol=tol)
            assert p.dtype == dtype


# --------------------------------------------------------------------------- clip_grad_norm
def grads_tensors(*arrays):
    out = []
    for a in arrays:
        t = Tensor(np.zeros(np.shape(a), np.float32), requires_grad=True)
        t.grad = None if a is None else np.array(a, dtype=np.float32)
        out.append(t)
    return out


# "clip_grad_norm(params: list[Tensor], max_norm: float) -> float returns global L2 norm
# before clipping." "Above the limit, all present gradients are multiplied by
# max_norm/(norm+1e-6); None is ignored."
def test_clip_returns_pre_clip_norm_and_scales_by_the_multiplier():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)) * 5, rng.standard_normal(7) * 5
    params = grads_tensors(a, None, b)
    norm = clip_grad_norm(params, max_norm=2.0)
    expected = math.sqrt(np.sum(a.astype(np.float32).astype(np.float64) ** 2)
                         + np.sum(b.astype(np.float32).astype(np.float64) ** 2))
    assert isinstance(norm, float)
    np.testing.assert_allclose(norm, expected, rtol=1e-12)
    scale = 2.0 / (expected + 1e-6)
    np.testing.assert_allclose(params[0].grad, a * scale, rtol=1e-6)
    np.testing.assert_allclose(params[2].grad, b * scale, rtol=1e-6)
    assert params[1].grad is None
    after = math.sqrt(sum(np.sum(p.grad.astype(np.float64) ** 2) for p in params[::2]))
    assert after <= 2.0
    assert clip_grad_norm(params, 2.0) == pytest.approx(after, rel=1e-9)


def test_clip_below_or_at_the_limit_changes_nothing():
    params = grads_tensors([3.0, 4.0])
    assert clip_grad_norm(params, 5.0) == 5.0  # at the limit: not "above"
    np.testing.assert_array_equal(params[0].grad, [3.0, 4.0])
    assert clip_grad_norm(params, 10.0) == 5.0
    np.testing.assert_array_equal(params[0].grad, [3.0, 4.0])


# "Float64 square accumulation avoids overflow for large float32 gradients."
def test_clip_accumulates_in_float64():
    params = grads_tensors(np.full(4, 1e30), np.full(2, -1e20))
    with np.errstate(over="ignore"):  # float32 squares would overflow
        assert np.isinf(np.sum(params[0].grad ** 2, dtype=np.float32))
    norm = clip_grad_norm(params, 1.0)
    np.testing.assert_allclose(norm, 2e30, rtol=1e-6)
    for p in params:
        assert p.grad.dtype == np.float32 and np.all(np.isfinite(p.grad))
    np.testing.assert_allclose(params[0].grad, 0.5, rtol=1e-6)
    total = math.sqrt(sum(np.sum(p.grad.astype(np.float64) ** 2) for p in params))
    np.testing.assert_allclose(total, 1.0, rtol=1e-5)


# "No gradients gives 0."
def test_clip_without_gradients_gives_zero():
    assert clip_grad_norm(grads_tensors(None, None), 1.0) == 0.0
    assert clip_grad_norm([], 1.0) == 0.0


# --------------------------------------------------------------------------- lr_schedule
# "uses base_lr*(step+1)/warmup while step<warmup"
def test_schedule_warmup_is_linear():
    for step in range(5):
        assert lr_schedule(step, 100, 0.3, warmup=5) == pytest.approx(0.3 * (step + 1) / 5,
                                                                       rel=1e-15)
    assert lr_schedule(4, 100, 0.3, warmup=5) == pytest.approx(0.3)


# "warmup=0 starts at base."
def test_schedule_without_warmup_starts_at_base():
    assert lr_schedule(0, 100, 0.3, warmup=0) == 0.3  # exactly, not 0.30000000000000004
    assert lr_schedule(10, 100, 0.3, warmup=10) == 0.3  # the first step after warmup too
    assert lr_schedule(100, 100, 0.3, warmup=0) == 0.3 * 0.1


# "then cosine decay from base to minimum" (min = base_lr * min_ratio)
def test_schedule_cosine_decay():
    base, warmup, total = 2.0, 10, 110
    for step in range(warmup, total):
        progress = (step - warmup) / (total - warmup)
        expected = 0.2 + (2.0 - 0.2) * 0.5 * (1 + math.cos(math.pi * progress))
        assert lr_schedule(step, total, base, warmup) == pytest.approx(expected, rel=1e-12)
    assert lr_schedule(60, total, base, warmup) == pytest.approx((2.0 + 0.2) / 2)  # halfway
    lrs = [lr_schedule(s, total, base, warmup) for s in range(warmup, total + 5)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    assert lr_schedule(60, total, base, warmup, min_ratio=0.0) == pytest.approx(1.0)


# "Cosine progress is capped at 1; step>=total_steps yields the minimum once warmup has
# finished. Actual updates run from 0 to total_steps-1, so the last rate may remain slightly
# above minimum."
def test_schedule_progress_capped_at_minimum():
    for step in (100, 101, 1000):
        assert lr_schedule(step, 100, 1.0, warmup=10) == pytest.approx(0.1, rel=1e-15)
    assert lr_schedule(100, 100, 1.0, warmup=10, min_ratio=0.25) == pytest.approx(0.25)
    last = lr_schedule(99, 100, 1.0, warmup=10)
    assert 0.1 < last < 0.1 + 1e-3
    assert lr_schedule(12, 5, 1.0, warmup=10) == pytest.approx(0.1)  # total < warmup
    # "... once warmup has finished": a step past total_steps but still inside the warmup
    # stays on the warmup line (the docstring says so)
    assert lr_schedule(6, 5, 1.0, warmup=10) == pytest.approx(0.7)


def test_step_with_a_grad_of_the_wrong_shape_raises_and_changes_nothing():
    a = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
    b = Tensor(np.ones(4, np.float32), requires_grad=True)
    opt = AdamW([a, b], lr=0.1)
    a.grad = np.ones((2, 3), np.float32)
    b.grad = np.ones((1, 4), np.float32)  # broadcastable, so NumPy would silently accept it
    with pytest.raises(ValueError, match=r"parameter 1 has shape \(4,\) but its grad has "
                                         r"shape \(1, 4\)"):
        opt.step()
    np.testing.assert_array_equal(a.data, 1.0)  # the good parameter was not updated either
    assert opt.t == 0
    b.grad = np.ones(4, np.float32)
    opt.step()
    assert opt.t == 1 and np.all(a.data < 1.0) and np.all(b.data < 1.0)
