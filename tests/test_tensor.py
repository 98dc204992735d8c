"""Tensor and autograd: every op against float64 central differences and torch autograd.

Each case is (glassllm function, torch function, input arrays); the same case runs through
the finite-difference check (`gradcheck` in conftest.py) and the torch comparison.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassllm import Tensor, no_grad
from glassllm.tensor import unbroadcast

rng = np.random.default_rng(0)


def r(*shape):
    return rng.standard_normal(shape)


def pos(*shape):  # positive values, for log / pow / division
    return rng.uniform(0.5, 2.0, shape)


M = np.array([[1.0, 0.5, -0.25], [2.0, -1.0, 0.75]])  # an ndarray operand (no grad)

# name -> (glassllm fn, torch fn, inputs). Both fns take their own tensor type.
CASES = {
    # elementwise arithmetic, tensor with tensor, broadcasting both ways
    "add": (lambda a, b: a + b, lambda a, b: a + b, [r(2, 3), r(2, 3)]),
    "add_broadcast": (lambda a, b: a + b, lambda a, b: a + b, [r(2, 1, 3), r(4, 1)]),
    "sub_broadcast": (lambda a, b: a - b, lambda a, b: a - b, [r(3,), r(2, 3)]),
    "mul_broadcast": (lambda a, b: a * b, lambda a, b: a * b, [r(2, 1, 3), r(1, 4, 1)]),
    "div_broadcast": (lambda a, b: a / b, lambda a, b: a / b, [r(2, 3), pos(3)]),
    "neg": (lambda a: -a, lambda a: -a, [r(2, 3)]),
    # python scalars on either side
    "scalar_add": (lambda a: 2.5 + a + 1.5, lambda a: 2.5 + a + 1.5, [r(2, 3)]),
    "scalar_sub": (lambda a: (3.0 - a) - 0.5, lambda a: (3.0 - a) - 0.5, [r(2, 3)]),
    "scalar_mul": (lambda a: 2.0 * a * -3.0, lambda a: 2.0 * a * -3.0, [r(2, 3)]),
    "scalar_div": (lambda a: a / 4.0, lambda a: a / 4.0, [r(2, 3)]),
    "scalar_rdiv": (lambda a: 3.0 / a, lambda a: 3.0 / a, [pos(2, 3)]),
    # ndarray operands on either side, broadcasting against the tensor
    "array_add": (lambda a: a + M + M, lambda a: a + 2 * _t(a, M), [r(3,)]),
    "array_radd": (lambda a: M + a, lambda a: _t(a, M) + a, [r(3,)]),
    "array_sub": (lambda a: M - a, lambda a: _t(a, M) - a, [r(1, 3)]),
    "array_mul": (lambda a: a * M, lambda a: a * _t(a, M), [r(3,)]),
    "array_rmul": (lambda a: M * a, lambda a: _t(a, M) * a, [r(2, 1)]),
    "array_div": (lambda a: a / (M + 3), lambda a: a / (_t(a, M) + 3), [r(3,)]),
    "array_rdiv": (lambda a: M / a, lambda a: _t(a, M) / a, [pos(3,)]),
    # powers
    "pow_int": (lambda a: a ** 3, lambda a: a ** 3, [r(2, 3)]),
    "pow_frac": (lambda a: a ** 2.5, lambda a: a ** 2.5, [pos(2, 3)]),
    "pow_negative": (lambda a: a ** -1.5, lambda a: a ** -1.5, [pos(4)]),
    "pow_array": (lambda a: a ** np.array([1.0, 2.0, 3.0]),
                  lambda a: a ** _t(a, np.array([1.0, 2.0, 3.0])), [pos(2, 3)]),
    "pow_array_broadcast": (lambda a: a ** (M + 2), lambda a: a ** (_t(a, M) + 2), [pos(3)]),
    "pow_tensor": (lambda a, b: a ** b, lambda a, b: a ** b, [pos(2, 3), r(3)]),
    "rpow": (lambda a: 2.0 ** a, lambda a: 2.0 ** a, [r(2, 3)]),
    "rpow_array": (lambda a: (M + 3) ** a, lambda a: (_t(a, M) + 3) ** a, [r(3)]),
    # exp, log
    "exp": (lambda a: a.exp(), lambda a: a.exp(), [r(2, 3)]),
    "log": (lambda a: a.log(), lambda a: a.log(), [pos(2, 3)]),
    # matmul: 2-D, 1-D on either side, vector-vector, batched with broadcasting
    "matmul": (lambda a, b: a @ b, lambda a, b: a @ b, [r(2, 3), r(3, 4)]),
    "matmul_vec_mat": (lambda a, b: a @ b, lambda a, b: a @ b, [r(3), r(3, 4)]),
    "matmul_mat_vec": (lambda a, b: a @ b, lambda a, b: a @ b, [r(2, 3), r(3)]),
    "matmul_vec_vec": (lambda a, b: a @ b, lambda a, b: a @ b, [r(3), r(3)]),
    "matmul_batched": (lambda a, b: a @ b, lambda a, b: a @ b, [r(2, 3, 4), r(2, 4, 2)]),
    "matmul_batch_broadcast": (lambda a, b: a @ b, lambda a, b: a @ b,
                               [r(2, 1, 3, 4), r(3, 4, 2)]),
    # a shared 2-D operand: its gradient is one GEMM over the folded batch (as torch)
    "matmul_batched_mat": (lambda a, b: a @ b, lambda a, b: a @ b, [r(2, 3, 3, 4), r(4, 2)]),
    "matmul_mat_batched": (lambda a, b: a @ b, lambda a, b: a @ b, [r(3, 4), r(2, 3, 4, 2)]),
    "matmul_batched_vec": (lambda a, b: a @ b, lambda a, b: a @ b, [r(2, 3, 4), r(4)]),
    "matmul_vec_batched": (lambda a, b: a @ b, lambda a, b: a @ b, [r(3), r(2, 3, 4)]),
    "matmul_array": (lambda a: a @ M.T, lambda a: a @ _t(a, M.T), [r(2, 3)]),
    "rmatmul_array": (lambda a: M @ a, lambda a: _t(a, M) @ a, [r(3, 2)]),
    # reductions
    "sum_all": (lambda a: a.sum(), lambda a: a.sum(), [r(2, 3, 4)]),
    "sum_axis": (lambda a: a.sum(axis=1), lambda a: a.sum(dim=1), [r(2, 3, 4)]),
    "sum_negative_axis": (lambda a: a.sum(axis=-1), lambda a: a.sum(dim=-1), [r(2, 3, 4)]),
    "sum_axes_keepdims": (lambda a: a.sum(axis=(0, 2), keepdims=True),
                          lambda a: a.sum(dim=(0, 2), keepdim=True), [r(2, 3, 4)]),
    "sum_axes": (lambda a: a.sum(axis=(0, -1)), lambda a: a.sum(dim=(0, -1)), [r(2, 3, 4)]),
    "mean_all": (lambda a: a.mean(), lambda a: a.mean(), [r(2, 3, 4)]),
    "mean_axis_keepdims": (lambda a: a.mean(axis=1, keepdims=True),
                           lambda a: a.mean(dim=1, keepdim=True), [r(2, 3, 4)]),
    "mean_axes": (lambda a: a.mean(axis=(0, -1)), lambda a: a.mean(dim=(0, -1)), [r(2, 3, 4)]),
    # shape
    "reshape_tuple": (lambda a: a.reshape((4, 6)) * 1.0, lambda a: a.reshape(4, 6), [r(2, 3, 4)]),
    "reshape_args": (lambda a: a.reshape(3, -1), lambda a: a.reshape(3, -1), [r(2, 3, 4)]),
    "transpose_axes": (lambda a: a.transpose(1, 2, 0), lambda a: a.permute(1, 2, 0),
                       [r(2, 3, 4)]),
    "transpose_tuple": (lambda a: a.transpose((2, 0, 1)), lambda a: a.permute(2, 0, 1),
                        [r(2, 3, 4)]),
    "transpose_reverse": (lambda a: a.transpose(), lambda a: a.permute(2, 1, 0), [r(2, 3, 4)]),
    "T": (lambda a: a.T, lambda a: a.T, [r(2, 3)]),
    # indexing
    "getitem_int": (lambda a: a[1], lambda a: a[1], [r(3, 4)]),
    "getitem_slice": (lambda a: a[:, 1:3], lambda a: a[:, 1:3], [r(3, 4)]),
    "getitem_step": (lambda a: a[::2, ::-1], lambda a: a[::2].flip(1), [r(3, 4)]),
    "getitem_ellipsis": (lambda a: a[..., 0], lambda a: a[..., 0], [r(2, 3, 4)]),
    "getitem_fancy_repeats": (lambda a: a[[0, 2, 0, 0]], lambda a: a[[0, 2, 0, 0]], [r(3, 4)]),
    "getitem_fancy_pairs": (lambda a: a[np.array([0, 1, 1]), np.array([2, 2, 2])],
                            lambda a: a[[0, 1, 1], [2, 2, 2]], [r(3, 4)]),
    "getitem_tensor_index": (lambda a: a[Tensor(np.array([1, 1, 0]))], lambda a: a[[1, 1, 0]],
                             [r(3, 4)]),
    "getitem_mask": (lambda a: a[np.array([True, False, True])],
                     lambda a: a[[True, False, True]], [r(3, 4)]),
    # a small composite: softmax by hand reuses a node on two paths
    "softmax_composite": (lambda a: a.exp() / a.exp().sum(axis=-1, keepdims=True),
                          lambda a: a.exp() / a.exp().sum(dim=-1, keepdim=True), [r(2, 5)]),
    "reuse": (lambda a: a * a + a, lambda a: a * a + a, [r(4)]),
}


def _t(like, array):
    """An ndarray as a torch tensor (no grad), for the torch side of the array-operand cases."""
    import torch
    return torch.tensor(array, dtype=like.dtype)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_gradients_match_central_differences(name, gradcheck):
    fn, _, inputs = CASES[name]
    gradcheck(fn, *inputs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_torch_forward_and_backward(name, torch_check):
    fn, torch_fn, inputs = CASES[name]
    torch_check(fn, torch_fn, *inputs)


def test_gradcheck_catches_a_wrong_backward(gradcheck):
    # The checker itself must be able to fail: a node with a deliberately wrong backward.
    def wrong(a):
        return Tensor.from_op(a.data ** 2, (a,), lambda g: (g * a.data,))  # should be 2*a
    with pytest.raises(AssertionError):
        gradcheck(wrong, r(3))


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3),
       st.lists(st.booleans(), min_size=3, max_size=3), st.integers(0, 2))
def test_broadcast_gradients_sum_over_stretched_axes(shape, ones, dropped):
    # b is a's shape with some axes set to 1 and leading axes dropped.
    b_shape = tuple(1 if one else n for n, one in zip(shape, ones))[min(dropped, len(shape)):]
    a = Tensor(np.ones(shape), requires_grad=True)
    b = Tensor(np.ones(b_shape), requires_grad=True)
    (a * b * 2.0).backward(np.ones(np.broadcast_shapes(tuple(shape), b_shape)))
    assert b.grad.shape == b_shape
    copies = np.prod(shape) / max(np.prod(b_shape), 1)
    np.testing.assert_array_equal(b.grad, np.full(b_shape, 2.0 * copies))
    np.testing.assert_array_equal(a.grad, np.full(shape, 2.0))


def test_unbroadcast_sums_prepended_and_stretched_axes():
    g = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(unbroadcast(g, (3, 1)), g.sum(axis=(0, 2))[:, None])
    np.testing.assert_array_equal(unbroadcast(g, ()), g.sum())
    assert unbroadcast(g, g.shape) is g


# --------------------------------------------------------------------------- autograd rules
def test_gradients_accumulate_across_backward_calls():
    x = Tensor(np.array([1.0, -2.0, 3.0]), requires_grad=True)
    (x * x).sum().backward()
    np.testing.assert_array_equal(x.grad, 2 * x.data)
    (x * 3.0).sum().backward()  # a second, fresh graph adds into .grad
    np.testing.assert_array_equal(x.grad, 2 * x.data + 3.0)
    x.grad = None
    (x * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad, np.full(3, 3.0))


def test_leaf_used_twice_and_only_leaves_keep_grad():
    x = Tensor(np.array([2.0, 3.0]), requires_grad=True)
    y = x * x
    z = (y + x).sum()
    z.backward()
    np.testing.assert_array_equal(x.grad, 2 * x.data + 1)
    assert y.grad is None and z.grad is None
    c = Tensor(np.array([1.0, 1.0]))  # no requires_grad: no gradient
    (x * c).sum().backward()
    assert c.grad is None


def test_no_grad_records_nothing():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    with no_grad():
        y = (x * 2.0 + x).exp().sum()
    assert not y.requires_grad and y.is_leaf and y._parents == ()
    with pytest.raises(RuntimeError):
        y.backward()
    assert x.grad is None
    z = (x * 2.0).sum()  # recording resumes after the block
    assert z.requires_grad
    with pytest.raises(ValueError):  # and resumes after an exception in the block, too
        with no_grad():
            raise ValueError
    assert (x * 2.0).requires_grad


def test_ten_thousand_deep_chain_backward():
    x = Tensor(np.array([1.0]), requires_grad=True)
    y = x
    for _ in range(10_000):
        y = y * 1.0001 + 0.0
    y.sum().backward()  # a recursive topological sort would overflow the stack here
    np.testing.assert_allclose(x.grad, [1.0001 ** 10_000], rtol=1e-9)


def test_backward_twice_through_consumed_graph_raises():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    loss = (x * x).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="consumed"):
        loss.backward()
    np.testing.assert_array_equal(x.grad, [2.0, 4.0])  # the failed call added nothing


def test_backward_needs_grad_for_non_scalar_and_requires_grad():
    x = Tensor(np.ones((2, 2)), requires_grad=True)
    with pytest.raises(RuntimeError):
        (x * 2.0).backward()
    with pytest.raises(RuntimeError):
        Tensor(np.ones(1)).backward()
    (x * 2.0).backward(np.full((2, 2), 0.5))
    np.testing.assert_array_equal(x.grad, np.ones((2, 2)))


def test_backward_with_a_grad_of_the_wrong_shape_names_both_and_keeps_the_graph():
    """A grad that does not broadcast is one line naming both shapes (NumPy's said "remapped
    shapes"), raised before the pass: the graph is not consumed, a right grad still works."""
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    y = x * 2.0
    with pytest.raises(ValueError, match=r"^backward\(\): grad of shape \(4, 4\) does not "
                                         r"broadcast to the tensor's shape \(2, 3\)$"):
        y.backward(np.ones((4, 4)))
    assert x.grad is None
    y.backward(np.ones(3))  # broadcast over the rows, as documented
    np.testing.assert_array_equal(x.grad, np.full((2, 3), 2.0))


# --------------------------------------------------------------------------- dtypes, accessors
def test_dtype_rules():
    assert Tensor(1.5).dtype == np.float32
    assert Tensor(3).dtype == np.float32
    assert Tensor([1, 2, 3]).dtype == np.float32
    assert Tensor([[1.0, 2.0]]).dtype == np.float32
    for dtype in (np.float64, np.float16, np.int64, np.float32):
        assert Tensor(np.zeros(2, dtype=dtype)).dtype == dtype
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = (2.0 * x + 1.0) / 3.0 - 0.5  # python scalars keep float32
    assert y.dtype == np.float32 and (x ** 2).dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32
    assert (Tensor(np.ones(2)) * 2.0).dtype == np.float64


def test_accessors():
    a = np.arange(6.0).reshape(2, 3)
    t = Tensor(a, requires_grad=True)
    assert t.shape == (2, 3) and t.ndim == 2 and t.size == 6 and len(t) == 2
    assert t.numpy() is a and t.data is a and t.grad is None and t.requires_grad
    assert Tensor(np.array([[4.5]])).item() == 4.5
    assert not Tensor(a).requires_grad
    assert t.detach().data is a and not t.detach().requires_grad


@pytest.mark.parametrize("data", [np.array([1, 2, 3]), np.array([True, False]),
                                  np.arange(4, dtype=np.uint8), np.int64(3)])
def test_requires_grad_on_integer_or_bool_data_is_refused(data):
    with pytest.raises(ValueError, match="floating-point"):
        Tensor(data, requires_grad=True)
    assert not Tensor(data).requires_grad  # without gradients, integers are fine (ids)


def test_requires_grad_on_float_data_gives_exact_fractional_grads():
    x = Tensor(np.array([1, 2, 3]).astype(np.float32), requires_grad=True)
    (x * 0.5).sum().backward()
    np.testing.assert_array_equal(x.grad, [0.5, 0.5, 0.5])
    assert Tensor([1, 2, 3], requires_grad=True).data.dtype == np.float32  # lists: float32


def test_tensor_of_none_is_a_type_error_not_nan():
    with pytest.raises(TypeError, match="None"):
        Tensor(None)


@pytest.mark.parametrize("shape,axis", [((0,), None), ((0, 3), 0), ((2, 0), None),
                                        ((2, 0), (0, 1))])
def test_mean_over_zero_elements_is_a_value_error(shape, axis):
    with pytest.raises(ValueError, match="zero elements"):
        Tensor(np.zeros(shape, np.float32), requires_grad=True).mean(axis=axis)


def test_mean_over_a_non_empty_axis_of_an_empty_tensor_is_fine():
    x = Tensor(np.zeros((0, 3), np.float32), requires_grad=True)
    assert x.mean(axis=1).shape == (0,)  # NumPy agrees: no element is averaged over nothing
