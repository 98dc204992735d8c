"""glassllm.engine.blas: both backends give np.matmul's products, MKL only where it can read the
operands in place, the same bits for a row whatever slice, batch or alignment computes it, and
clear errors when MKL is asked for and cannot be had."""
from __future__ import annotations

import platform
import subprocess
import sys

import numpy as np
import pytest
from conftest import in_ci, require_mkl, skip_or_fail

from glassllm.engine import blas


def mkl_installed() -> bool:
    from importlib import metadata
    try:
        metadata.distribution("mkl")
        return True
    except metadata.PackageNotFoundError:
        return False


@pytest.fixture
def restore_backend():
    saved = blas._requested, blas._use
    yield
    blas._requested, blas._use = saved


@pytest.fixture
def mkl(restore_backend):
    """The loaded MKL (the test fails on CI, skips elsewhere, without the mkl package)."""
    require_mkl()
    return blas._mkl


BACKENDS = ["numpy", "mkl"]


@pytest.fixture(params=BACKENDS)
def backend(request, restore_backend):
    if request.param == "mkl":
        require_mkl()
    blas.set_backend(request.param)
    return request.param


def numpy_cuts_keep_bits() -> bool:
    """Whether NumPy's BLAS on this CPU gives a product's rows the same bits when the product
    is cut in two (OpenBLAS on Intel's AVX-512 kernels did; on AMD Zen it does not)."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2048, 128), np.float32), rng.standard_normal((128, 384),
                                                                            np.float32)
    whole = a @ b
    return np.array_equal(np.concatenate([a[:1024] @ b, a[1024:] @ b]), whole)


def rand(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


def operand_layouts(rng, rows, cols):
    """The same rows x cols values in the layouts the fused ops hand to a product."""
    x = rand(rng, rows, cols)
    wide = np.zeros((rows, cols + 5), np.float32)
    wide[:, 2:2 + cols] = x
    tall = np.zeros((2 * rows, cols), np.float32)
    tall[::2] = x
    return {
        "contiguous": x,
        "transposed": np.ascontiguousarray(x.T).T,           # Fortran order: BLAS's trans
        "column slice": wide[:, 2:2 + cols],                 # ld > cols
        "transposed slice": np.ascontiguousarray(wide.T)[2:2 + cols].T,
        "every other row": tall[::2],                        # ld = 2 * cols
        "unaligned": np.frombuffer(np.concatenate([[0], x.ravel()]).astype(np.float32).data,
                                   np.float32, offset=4).reshape(rows, cols),
        "reversed rows": x[::-1].copy()[::-1],               # negative stride: NumPy's
    }


@pytest.mark.parametrize("rows,depth,cols", [(8, 2, 2), (33, 17, 9), (130, 70, 33)])
def test_every_operand_layout_gives_numpys_product(backend, rows, depth, cols):
    rng = np.random.default_rng(0)
    lefts = operand_layouts(rng, rows, depth)
    rights = operand_layouts(rng, depth, cols)
    reference = lefts["contiguous"].astype(np.float64) @ rights["contiguous"].astype(np.float64)
    for left_name, a in lefts.items():
        for right_name, b in rights.items():
            got = blas.matmul(a, b)
            assert got.shape == (rows, cols) and got.dtype == np.float32
            np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-4 * np.sqrt(depth),
                                       err_msg=f"{left_name} @ {right_name}")


def test_mkl_takes_every_layout_blas_can_read_and_leaves_the_rest_to_numpy(mkl):
    rng = np.random.default_rng(1)
    lefts, rights = operand_layouts(rng, 40, 24), operand_layouts(rng, 24, 16)
    for name, a in lefts.items():
        took = blas._mkl_product(mkl, a, rights["contiguous"], None) is not None
        assert took == (name != "reversed rows"), name
    for name, b in rights.items():
        took = blas._mkl_product(mkl, lefts["contiguous"], b, None) is not None
        assert took == (name != "reversed rows"), name
    a, b = lefts["contiguous"], rights["contiguous"]
    for left, right in [(a[:7], b), (a, b[:, :1]), (a[:, :1], b[:1]),  # small: NumPy's
                        (a.astype(np.float64), b), (a, b.astype(np.float16)),
                        (a[:, ::2], b[::2]),  # a stride BLAS cannot express
                        (a[0], b), (a, b[:, 0])]:  # vectors
        assert blas._mkl_product(mkl, left, right, None) is None
        np.testing.assert_allclose(blas.matmul(left, right), np.matmul(left, right), rtol=1e-5)


def test_out_is_written_in_place_or_left_to_numpy(backend):
    rng = np.random.default_rng(2)
    a, b = rand(rng, 32, 16), rand(rng, 16, 12)
    big = np.full((40, 20), 7.0, np.float32)
    view = big[4:36, 3:15]  # rows ld = 20 apart
    assert blas.matmul(a, b, out=view) is view
    np.testing.assert_allclose(view, a @ b, rtol=1e-5, atol=1e-5)
    assert (big[:4] == 7).all() and (big[:, :3] == 7).all() and (big[:, 15:] == 7).all()
    column_major = np.empty((12, 32), np.float32).T  # not row-major: NumPy fills it
    assert blas.matmul(a, b, out=column_major) is column_major
    np.testing.assert_allclose(column_major, a @ b, rtol=1e-5, atol=1e-5)
    square = rand(rng, 16, 16)
    inplace = square.copy()  # out overlapping an operand: NumPy's buffered path
    blas.matmul(inplace, square, out=inplace)
    np.testing.assert_allclose(inplace, square @ square, rtol=1e-5, atol=1e-4)


def test_batches_broadcast_and_strided_views_as_numpy(backend):
    rng = np.random.default_rng(3)
    B, T, H, D = 3, 20, 2, 8
    k = rand(rng, B, T, H, D)
    kh = k.transpose(0, 2, 1, 3)          # (B, H, T, D), rows H*D apart: attention's K
    q = rand(rng, B, H, 2 * T, D)
    cases = [
        (q, kh.swapaxes(-1, -2)),          # scores: batch axes that do not fold into one
        (q[:, :, 8:30], kh[:, :, :12].swapaxes(-1, -2)),
        (q[1], kh[1].swapaxes(-1, -2)),    # one batch row: folds into one strided batch
        (rand(rng, 4, 1, 16, 8), rand(rng, 3, 8, 5)),  # broadcast batch axes (stride 0)
        (rand(rng, 2, 3, 16, 8), rand(rng, 8, 5)),     # (..., m, k) @ (k, n)
        (rand(rng, 16, 8), rand(rng, 2, 3, 8, 5)),     # (m, k) @ (..., k, n)
    ]
    for a, b in cases:
        expected = np.matmul(a.astype(np.float64), b.astype(np.float64))
        got = blas.matmul(a, b)
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
        out = np.empty(expected.shape, np.float32)
        assert blas.matmul(a, b, out=out) is out
        np.testing.assert_array_equal(out, got)
    with pytest.raises(ValueError):  # NumPy's own shape errors
        blas.matmul(rand(rng, 16, 8), rand(rng, 7, 5))


def test_a_row_comes_out_the_same_bits_whatever_computes_it(backend):
    """What splitting products over threads relies on: row slices, batches of any size and
    unaligned copies give exactly the whole product's rows. MKL (strict CNR) on any shape;
    OpenBLAS on the model's shapes only: on odd ones its edge kernels sum some rows in another
    order (130 x 70 x 33 cut after row 65: one element 1 ulp apart)."""
    if backend == "numpy" and not numpy_cuts_keep_bits():
        pytest.skip("this CPU's OpenBLAS kernels sum a cut row in another order (AMD Zen's "
                    "small-matrix paths): the bits are claimed for MKL only")
    rng = np.random.default_rng(4)
    shapes = [(2048, 128, 384), (1024, 352, 128), (512, 1024, 384)]
    for m, k, n in shapes + ([(130, 70, 33), (77, 19, 50)] if backend == "mkl" else []):
        a, b = rand(rng, m, k), rand(rng, k, n)
        whole = blas.matmul(a, b)
        for cuts in ([m // 2], [m // 3, 2 * m // 3], [blas.MIN_ROWS, m - blas.MIN_ROWS]):
            sliced = np.empty_like(whole)
            for start, stop in zip([0, *cuts], [*cuts, m]):
                blas.matmul(a[start:stop], b, out=sliced[start:stop])
            np.testing.assert_array_equal(sliced, whole, err_msg=f"{(m, k, n)} cut at {cuts}")
        shifted = np.empty(a.size + 3, np.float32)[3:].reshape(a.shape)  # 12-byte offset
        shifted[...] = a
        np.testing.assert_array_equal(blas.matmul(shifted, b), whole)
        np.testing.assert_array_equal(blas.matmul(a, np.asfortranarray(b)), whole)
    q = rand(rng, 8, 2, 128, 32)
    k = rand(rng, 8, 64, 2, 32).transpose(0, 2, 3, 1)  # (B, H, D, T), attention's K^T
    whole = blas.matmul(q, k)
    for part in (slice(0, 4), slice(4, 8), slice(3, 4), slice(1, 8)):
        np.testing.assert_array_equal(blas.matmul(q[part], k[part]), whole[part])
        np.testing.assert_array_equal(blas.matmul(q[part, :, 64:], k[part]),
                                      whole[part, :, 64:])


def test_numpy_backend_never_loads_mkl_and_mkl_says_why_not():
    code = ("import numpy as np; from glassllm import blas; "
            "blas.matmul(np.ones((64, 64), np.float32), np.ones((64, 64), np.float32)); "
            "print(blas.backend(), blas._mkl is None, '|', blas.describe())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**_env(), "GLASSLLM_BLAS": "numpy"}, check=True).stdout
    assert out.split("|")[0].split() == ["numpy", "True"]
    assert "NumPy's BLAS (GLASSLLM_BLAS=numpy)" in out
    bad = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**_env(), "GLASSLLM_BLAS": "openblas"})
    assert bad.returncode != 0
    assert "GLASSLLM_BLAS / set_backend: expected one of ('auto', 'mkl', 'numpy'), " \
           "got 'openblas'" in bad.stderr


def _env():
    import os
    return {k: v for k, v in os.environ.items() if k != "GLASSLLM_BLAS"}


def test_asking_for_mkl_without_it_is_a_clear_error(monkeypatch, restore_backend):
    monkeypatch.setattr(blas, "_mkl", None)
    monkeypatch.setattr(blas, "_mkl_problem", None)
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(blas.BlasError, match=r"GLASSLLM_BLAS=mkl, but MKL cannot be used: the "
                                             r"'mkl' package is not installed \(pip install "):
        blas.set_backend("mkl")
    # a refused switch changes nothing: products stay on the backend they were on
    np.testing.assert_array_equal(
        blas.matmul(np.ones((16, 4), np.float32), np.ones((4, 4), np.float32)),
        np.full((16, 4), 4.0, np.float32))
    monkeypatch.setattr(blas, "_requested", "mkl")  # as GLASSLLM_BLAS=mkl at import: every
    monkeypatch.setattr(blas, "_use", blas._UNRESOLVED)  # product says why it cannot run
    with pytest.raises(blas.BlasError, match="cannot be used"):
        blas.matmul(np.ones((16, 4), np.float32), np.ones((4, 4), np.float32))
    blas.set_backend("auto")  # auto falls back to NumPy and says why
    assert blas.backend() == "numpy"
    assert "MKL not used: the 'mkl' package is not installed" in blas.describe()
    with pytest.raises(ValueError, match="expected one of"):
        blas.set_backend("fast")


def test_a_library_that_does_not_load_is_named(monkeypatch, tmp_path, restore_backend):
    broken = tmp_path / "libmkl_rt.so.3"
    broken.write_bytes(b"not a shared object")
    monkeypatch.setattr(blas, "_mkl", None)
    monkeypatch.setattr(blas, "_mkl_problem", None)
    monkeypatch.setattr(blas, "_find_mkl_rt", lambda: (str(broken), "0"))
    with pytest.raises(blas.BlasError, match=f"cannot load {broken}"):
        blas.set_backend("mkl")


def test_a_parameter_mkl_rejects_raises_instead_of_leaving_garbage(mkl):
    a = np.ones((8, 8), np.float32)
    c = np.full((8, 8), 5.0, np.float32)
    # lda = 2 < k = 8: invalid; MKL's xerbla reports parameter 9 of cblas_sgemm
    mkl.gemm(blas._ROW_MAJOR, blas._NO_TRANS, blas._NO_TRANS, 8, 8, 8, 1.0, a.ctypes.data, 2,
             a.ctypes.data, 8, 0.0, c.ctypes.data, 8)
    with pytest.raises(blas.BlasError, match="MKL rejected parameter 9 of cblas_sgemm"):
        mkl.check()
    mkl.check()  # reported once


def test_mkl_is_in_strict_reproducible_mode(mkl):
    assert mkl.branch in ("AVX-512", "AVX2")
    setting = mkl.lib.MKL_CBWR_Get(-1)  # MKL_CBWR_ALL: branch and flags
    assert setting & blas._CBWR_STRICT and setting & 0xFFFF == dict(blas._CBWR_BRANCHES)[mkl.branch]
    assert "strict CNR" in blas.describe() and "sequential" in blas.describe()


def test_ci_has_both_backends():
    """The test extra installs mkl where its wheels exist, so CI tests the MKL backend; the
    NumPy one runs in every test under GLASSLLM_BLAS=numpy (.ci/run's second pass)."""
    if in_ci() and platform.machine() == "x86_64" and sys.platform == "linux":
        assert mkl_installed(), "pip install -e '.[test]' should have installed mkl"
    from conftest import REPO
    ci = (REPO / ".ci" / "run").read_text()
    assert "GLASSLLM_BLAS=numpy python -m pytest" in ci and "tests/test_blas.py" in ci
