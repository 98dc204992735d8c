"""The backward pass in its two forms: the reference, micrograd's loop (`tensor.backward_pass`),
and the engine's, which reuses gradient buffers (`engine.backward.backward_pass`). Both run on
the same graph (built twice, the same way) and must give the same gradients bit for bit; the
engine's must hand no leaf a gradient that another array shares; both free the graph as they go.
"""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from glassllm import Config, GlassLM, Tensor, amp, kernels, tensor
from glassllm import functional as F
from glassllm.engine import backward as engine_backward

PASSES = {"reference": tensor.backward_pass, "engine": engine_backward.backward_pass}


@pytest.fixture(params=sorted(PASSES))
def backward_pass(request):
    """root.backward(grad) run by each form of the pass in turn (the kernels mode that picks it;
    the ops' own forms were picked when their forwards ran)."""
    def call(root: Tensor, grad=None):
        with kernels.use(request.param):
            root.backward(grad)
    return call


def both_passes(build):
    """Leaf gradients from each form of the pass over a fresh graph: build() -> (root, leaves,
    grad or None), the graph built the same way each time. Returns {mode: [leaf.grad ...]}."""
    out = {}
    for mode in PASSES:
        root, leaves, grad = build()
        with kernels.use(mode):
            root.backward(grad)
        out[mode] = [leaf.grad for leaf in leaves]
    return out


def assert_bitwise_equal(grads):
    ref, eng = grads["reference"], grads["engine"]
    assert len(ref) == len(eng)
    for i, (a, b) in enumerate(zip(ref, eng)):
        assert (a is None) == (b is None), f"leaf {i}"
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape, f"leaf {i}"
            np.testing.assert_array_equal(b, a, err_msg=f"leaf {i}", strict=True)


# --------------------------------------------------------------------------- the switch
def test_tensor_backward_picks_the_pass_by_kernels_mode():
    with kernels.use("engine"):
        assert kernels.pick(tensor.backward_pass) is engine_backward.backward_pass
    with kernels.use("reference"):
        assert kernels.pick(tensor.backward_pass) is tensor.backward_pass
    for mode in ("engine", "reference"):
        x = Tensor(np.zeros(3), requires_grad=True)
        one, two = np.ones(3), np.full(3, 2.0)
        with kernels.use(mode):
            fused([x, x], (one, two)).backward()
        np.testing.assert_array_equal(x.grad, [3.0, 3.0, 3.0])
        assert (x.grad is one) == (mode == "engine")  # only the engine's pass adopts


# --------------------------------------------------------------------------- a model's loss
MODELS = {
    "llama_tied": dict(family="llama", n_heads=4, n_kv_heads=2, tie_embeddings=True),
    "llama_untied": dict(family="llama", n_heads=4, n_kv_heads=1, tie_embeddings=False),
    "gpt2": dict(family="gpt2", n_heads=4),
}


def model_loss_grads(overrides, dtype=np.float32, low=None):
    cfg = Config(vocab_size=13, d_model=16, n_layers=2, max_len=12, **overrides)
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 13, (3, 12)), rng.integers(0, 13, (3, 12))

    def build():
        model = GlassLM(cfg, seed=3)
        for p in model.parameters():
            p.data = p.data.astype(dtype)
        with kernels.use("engine"), (amp.autocast(low) if low else _nothing()):
            loss = model.loss(x, y)  # the same engine ops both times: only the pass differs
        return loss, model.parameters(), None
    return both_passes(build)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_loss_gradients_equal_bit_for_bit(name):
    grads = model_loss_grads(MODELS[name])
    assert all(g is not None and np.abs(g).max() > 0 for g in grads["engine"])
    assert_bitwise_equal(grads)


def test_model_loss_gradients_equal_in_float64_and_under_autocast():
    assert_bitwise_equal(model_loss_grads(MODELS["llama_tied"], dtype=np.float64))
    assert_bitwise_equal(model_loss_grads(MODELS["gpt2"], low="bfloat16"))


def test_model_loss_gradients_equal_in_reference_ops():
    """The graph of the reference ops (their own backward closures) through either pass."""
    cfg = Config(vocab_size=13, d_model=16, n_layers=2, max_len=12, family="llama", n_heads=2)
    ids = np.arange(24).reshape(2, 12) % 13

    def build():
        model = GlassLM(cfg, seed=1)
        with kernels.use("reference"):
            loss = model.loss(ids, np.roll(ids, 1))
        return loss, model.parameters(), None
    assert_bitwise_equal(both_passes(build))


# --------------------------------------------------------------------------- small graphs
rng = np.random.default_rng(0)
A = rng.standard_normal((4, 6)).astype(np.float32)
W = rng.standard_normal((6, 5)).astype(np.float32)
B = rng.standard_normal(5).astype(np.float32)
G = rng.standard_normal(5).astype(np.float32)  # d(loss)/d(root), broadcast to the root


def leaves(*arrays):
    return [Tensor(a.copy(), requires_grad=True) for a in arrays]


def shared_subexpression():
    x, w = leaves(A, W)
    h = F.linear(x, w)                  # used three times below
    root = (F.silu(h) * h + h).sum()
    return root, [x, w], None


def tensor_used_twice_by_fused_ops():
    x, w = leaves(A, W)
    root = (F.linear(x, w) * 2.0 + F.linear(x, w)).sum()  # w and x reached by two fused ops
    return root, [x, w], None


def residual_stream():
    x, w1, w2 = leaves(A, W @ W.T, W @ W.T)
    h = x + F.linear(F.rms_norm(x, Tensor(np.ones(6, np.float32))), w1)  # pass-through + fresh
    h = h + F.linear(F.silu(h), w2)
    return F.linear(h, Tensor(W)).sum(), [x, w1, w2], None


def broadcasting():
    x, w, b = leaves(A, W, B)
    scale = Tensor(np.array([[2.0]], np.float32), requires_grad=True)
    root = (F.linear(x, w) + b) * scale                    # b and scale broadcast
    return root, [x, w, b, scale], G


def views():
    x, w = leaves(A, W)
    part = x[1:3]                         # a slice's gradient: scattered into zeros
    moved = x.T.reshape(6, 4).T           # transpose/reshape gradients are views of g
    root = (F.linear(part, w).sum() + (F.silu(moved) * x).sum() + F.linear(x[::2], w).sum())
    return root, [x, w], None


def float64_with_a_float32_operand():
    x, w = (Tensor(a.astype(np.float64), requires_grad=True) for a in (A, W))
    root = (F.linear(x, w) * W[0].astype(np.float32) + F.linear(x, w)).sum()
    return root, [x, w], None


def leaf_root():
    x, = leaves(A)
    return x, [x], np.full(A.shape, 0.5, np.float32)


def dead_branch():
    x, w = leaves(A, W)
    frozen = Tensor(W)                    # no gradient wanted: its branch is skipped
    root = (F.linear(x, w) + F.linear(x, frozen)).sum()
    return root, [x, w, frozen], None


GRAPHS = [shared_subexpression, tensor_used_twice_by_fused_ops, residual_stream, broadcasting,
          views, float64_with_a_float32_operand, leaf_root, dead_branch]


@pytest.mark.parametrize("build", GRAPHS, ids=lambda f: f.__name__)
def test_small_graphs_equal_bit_for_bit(build):
    grads = both_passes(build)
    assert_bitwise_equal(grads)
    assert any(g is not None and np.abs(g).max() > 0 for g in grads["engine"])


def test_accumulation_across_backward_calls_equal_bit_for_bit():
    def build():
        x, w = leaves(A, W)
        x.grad = np.full(A.shape, 0.25, np.float32)   # a gradient from an earlier call
        return F.linear(x, w).sum(), [x, w], None
    out = {}
    for name, run in PASSES.items():
        root, (x, w), _ = build()
        run(root, np.ones((), np.float32))
        run(F.silu(F.linear(x, w)).sum(), np.ones((), np.float32))  # a second graph adds in
        out[name] = [x.grad, w.grad]
    assert_bitwise_equal(out)


# --------------------------------------------------------------------------- ownership
def fused(parents, grads):
    """A fused node promising fresh gradients, whose backward returns `grads` as given."""
    return Tensor.from_op(np.zeros(()), parents, lambda g: grads, fresh_grads=True)


def test_engine_adopts_and_adds_into_fresh_gradients_the_reference_copies():
    for name, run in PASSES.items():
        x = Tensor(np.zeros(3), requires_grad=True)
        one, two = np.ones(3), np.full(3, 2.0)
        run(fused([x, x], (one, two)), np.ones(()))
        np.testing.assert_array_equal(x.grad, [3.0, 3.0, 3.0])
        # the engine adds the second gradient into the first and adopts it; the reference
        # makes a new sum and copies it
        assert (x.grad is one) == (name == "engine")
        assert x.grad is not two


def test_a_gradient_not_promised_fresh_is_copied_by_both():
    for run in PASSES.values():
        x = Tensor(np.zeros(3), requires_grad=True)
        given = np.ones(3)
        run(Tensor.from_op(np.zeros(()), (x,), lambda g: (given,)), np.ones(()))
        assert x.grad is not given and not np.shares_memory(x.grad, given)
        x.grad += 1.0  # a later in-place update of the gradient leaves the op's array alone
        np.testing.assert_array_equal(given, [1.0, 1.0, 1.0])


def test_pass_through_gradient_is_never_shared_between_leaves(backward_pass):
    a, b = leaves(A, A)
    backward_pass(F.silu(a + b).sum())    # add hands silu's fresh dx to both, not owned
    assert not np.shares_memory(a.grad, b.grad)
    before = b.grad.copy()
    a.grad *= 3.0  # what clipping does: a later op mutates one leaf's gradient in place
    np.testing.assert_array_equal(b.grad, before)


def test_the_callers_grad_is_never_adopted_or_written(backward_pass):
    for build in (leaf_root, residual_stream):
        root, grads_of, _ = build()
        given = np.ones(root.shape, np.float32)
        backward_pass(root, given)
        np.testing.assert_array_equal(given, np.ones(root.shape, np.float32))
        assert all(not np.shares_memory(leaf.grad, given) for leaf in grads_of)


def test_model_gradients_share_no_memory_with_each_other_or_the_weights(backward_pass):
    model = GlassLM(Config(vocab_size=20, d_model=16, n_layers=2, n_heads=2, max_len=8,
                           tie_embeddings=True), seed=0)
    ids = np.arange(16).reshape(2, 8) % 20
    backward_pass(model.loss(ids, ids))
    params = model.parameters()
    for i, p in enumerate(params):
        assert p.grad.flags.writeable and p.grad.flags.owndata
        for q in params:
            assert not np.shares_memory(p.grad, q.data)
        for q in params[i + 1:]:
            assert not np.shares_memory(p.grad, q.grad)


# --------------------------------------------------------------------------- the graph's life
def test_the_pass_frees_intermediate_results_as_it_goes(backward_pass):
    x = Tensor(np.ones((4, 8), np.float32), requires_grad=True)
    w = Tensor(np.full((8, 8), 0.1, np.float32), requires_grad=True)
    dead_by_then = []

    def probe(g):  # the backward of a node below `hidden`: runs after hidden's own
        gc.collect()
        dead_by_then.append(ref() is None)
        return (g,)
    base = Tensor.from_op(x.data.copy(), (x,), probe)
    hidden = F.silu(F.linear(base, w))
    ref = weakref.ref(hidden)
    out = F.linear(hidden, w).sum()
    del hidden
    gc.collect()
    assert ref() is not None  # the graph still needs it
    backward_pass(out)
    assert dead_by_then == [True]  # released while the pass was still running
    assert x.grad is not None and w.grad is not None


def test_consumed_graph_raises_and_adds_nothing(backward_pass):
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    loss = F.silu(x).sum() + (x * x).sum()
    backward_pass(loss)
    first = x.grad.copy()
    with pytest.raises(RuntimeError, match="consumed"):
        backward_pass(loss)
    np.testing.assert_array_equal(x.grad, first)
    assert x.is_leaf and x._backward is None  # leaves are never marked consumed


def test_deep_chain_equal_bit_for_bit():
    def build():
        x, = leaves(np.array([0.5], np.float32))
        y = x
        for _ in range(3_000):  # no recursion: the sort and the pass are loops
            y = F.silu(y) * 1e-4 + y
        return y.sum(), [x], None
    grads = both_passes(build)
    assert_bitwise_equal(grads)
    assert 1.0 < grads["engine"][0][0] < 2.0
