"""Shared helpers of the core tests: a float64 central-difference gradient check and torch access.

Fixtures (not autouse, so other test files are unaffected):
    gradcheck: `gradcheck(fn, *arrays)` checks glassllm's backward of `fn` against central
        finite differences in float64.
    torch: the torch module, or the test is skipped when torch is not installed.
    shared_data: `shared_data("gpt2", "merges.txt")`, the path of a file of the workspace's
        data directory (see `shared_data_path`).

The data the tests read (real corpora, the GPT-2 tokenizer files, llama2.c's model) is found
in, in this order (`data_dirs`): the folder GLASSLLM_DATA names; the workspace's data directory,
`../shared/data` beside the checkout (`<repository>/../shared/data`); the checkout's `data/`,
where README.md's "Get the data" downloads it (there llama2.c's two files lie directly in
`data/`, not in `llama2c/`: README_NAMES). GLASSLLM_SHARED_DATA names the one directory to
read instead of all three. Every test that reads data goes through `shared_data_path`, which
skips the test naming every path it looked at when a file is missing, and fails it instead
when CI=true: on CI no data-dependent test may skip silently.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

# The engine's default on an idle machine is the CLI's choice: every core, matrix products
# split by rows (glassllm.engine.cpu.apply_default_threads). On OpenBLAS a product split by rows
# rounds differently from the whole one, so the tests that hold a fast form bitwise equal to its
# reference would pass under load (one thread chosen) and fail on an idle machine. The tests run
# on one thread unless told otherwise; the default itself is tested in subprocesses without
# this variable (tests/test_fast_default.py) and with threads pinned where a test needs them.
os.environ.setdefault("GLASSLLM_THREADS", "1")
SHARED_DATA_ENV = "GLASSLLM_SHARED_DATA"
DATA_ENV = "GLASSLLM_DATA"  # a data/ folder as README.md's "Get the data" fills it, anywhere
# The workspace's names of the files README.md's "Get the data" saves under other names:
# name -> (the path returned, the file that must exist), relative to data/. llama2.c's model
# and tokenizer lie directly in data/; the workspace keeps them in llama2c/ beside run.c.
README_NAMES = {"llama2c/stories260K.bin": ("stories260K.bin", "stories260K.bin"),
                "llama2c/tok512.bin": ("tok512.bin", "tok512.bin"),
                "llama2c": (".", "stories260K.bin")}


def shared_data_dir() -> Path:
    """The workspace's data directory: $GLASSLLM_SHARED_DATA if set, else
    <repository>/../shared/data."""
    override = os.environ.get(SHARED_DATA_ENV)
    return Path(override) if override else REPO.parent / "shared" / "data"


def data_dirs() -> list[Path]:
    """Where `shared_data_path` looks, in order: $GLASSLLM_SHARED_DATA alone if set; else
    $GLASSLLM_DATA (if set), <repository>/../shared/data and <repository>/data."""
    if os.environ.get(SHARED_DATA_ENV):
        return [shared_data_dir()]
    chosen = [Path(os.environ[DATA_ENV])] if os.environ.get(DATA_ENV) else []
    return list(dict.fromkeys([*chosen, shared_data_dir(), REPO / "data"]))


def in_ci() -> bool:
    """CI=true (as GitHub Actions, GitLab and `.ci/run`'s callers set it)."""
    return os.environ.get("CI") == "true"


def skip_or_fail(reason: str) -> None:
    """Skip the test with `reason`; on CI (CI=true) fail it instead."""
    if in_ci():
        pytest.fail(f"{reason}; CI=true requires it", pytrace=False)
    pytest.skip(reason)


def require_mkl() -> None:
    """Switch glassllm.engine.blas to MKL for this test (the caller restores the backend). Without
    the mkl package: skip, or fail on CI. With it, on a CPU where MKL has no strict
    reproducible mode (an AMD CPU: MKL's CNR branches are Intel's): skip on CI too, since no
    install step can change the processor."""
    from importlib import metadata

    from glassllm.engine import blas
    try:
        metadata.distribution("mkl")
    except metadata.PackageNotFoundError:
        skip_or_fail("the optional 'mkl' package is not installed (pip install -e '.[mkl]')")
    try:
        blas.set_backend("mkl")
    except blas.BlasError as error:
        if "strict reproducible mode" not in str(error):
            raise
        pytest.skip(f"MKL cannot be used on this CPU: {error}")


def shared_data_path(*parts: str) -> Path:
    """The path of a file or directory of the data (`parts` as the workspace names it, e.g.
    "llama2c", "stories260K.bin"), in the first of `data_dirs` that has it, under the
    workspace's name or README.md's (README_NAMES).

    Missing: the test is skipped, naming every path looked at and how to provide the data;
    with CI=true it fails (pytest's Failed) instead.
    """
    name = "/".join(parts)
    names = [(name, name)] + ([README_NAMES[name]] if name in README_NAMES else [])
    looked = []
    for folder in data_dirs():
        for returned, checked in names:
            if (folder / checked).exists():
                return folder / returned
            looked.append(str(folder / checked))
    skip_or_fail(f"{name} is missing: looked at {', '.join(looked)} (the workspace data, "
                 f"../shared/data beside the checkout, see its README.md; or the checkout's "
                 f"data/ of README.md's \"Get the data\"; or set {DATA_ENV} to such a data/ "
                 f"folder)")

from glassllm import Tensor


def numerical_gradients(fn, arrays, probe, h=1e-6):
    """d sum(fn(*arrays) * probe) / d arrays by central differences (float64 arrays).

    A random `probe` turns a vector-valued fn into a scalar whose gradient is the
    vector-Jacobian product that backward(probe) computes, so every output element counts.
    """
    grads = []
    for array in arrays:
        grad = np.zeros_like(array)
        flat, gflat = array.reshape(-1), grad.reshape(-1)  # views: edits reach `array`
        for i in range(flat.size):
            saved = flat[i]
            flat[i] = saved + h
            plus = float(np.sum(fn(*[Tensor(a) for a in arrays]).data * probe))
            flat[i] = saved - h
            minus = float(np.sum(fn(*[Tensor(a) for a in arrays]).data * probe))
            flat[i] = saved
            gflat[i] = (plus - minus) / (2 * h)
        grads.append(grad)
    return grads


def analytic_gradients(fn, arrays, probe):
    """(output array, [grad of each input]) from glassllm's backward with grad=probe."""
    leaves = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    out = fn(*leaves)
    out.backward(probe)
    return out.data, [leaf.grad for leaf in leaves]


def check_gradients(fn, *arrays, seed=0, rtol=1e-5, atol=1e-7):
    """Assert glassllm's gradients of fn equal central differences; return the max abs diff.

    All arrays must be float64 (finite differences in float32 are too coarse to check
    anything). fn takes Tensors and returns a Tensor.
    """
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    out = fn(*[Tensor(a) for a in arrays])
    assert out.dtype == np.float64, f"op changed float64 to {out.dtype}"
    probe = np.random.default_rng(seed).standard_normal(out.shape)
    _, analytic = analytic_gradients(fn, arrays, probe)
    numeric = numerical_gradients(fn, arrays, probe)
    worst = 0.0
    for i, (a, n) in enumerate(zip(analytic, numeric)):
        assert a is not None, f"input {i} got no gradient"
        assert a.shape == arrays[i].shape and a.dtype == np.float64
        np.testing.assert_allclose(a, n, rtol=rtol, atol=atol, err_msg=f"input {i}")
        worst = max(worst, float(np.max(np.abs(a - n), initial=0.0)))
    return worst


def check_against_torch(torch, glass_fn, torch_fn, *arrays, seed=0, rtol=1e-10, atol=1e-10):
    """Assert forward values and input gradients of glassllm and torch agree (float64)."""
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    out = glass_fn(*[Tensor(a) for a in arrays])
    probe = np.random.default_rng(seed).standard_normal(out.shape)
    glass_out, glass_grads = analytic_gradients(glass_fn, arrays, probe)
    leaves = [torch.tensor(a, requires_grad=True) for a in arrays]
    torch_out = torch_fn(*leaves)
    torch_out.backward(torch.tensor(probe))
    np.testing.assert_allclose(glass_out, torch_out.detach().numpy(), rtol=rtol, atol=atol,
                               err_msg="forward")
    for i, (g, leaf) in enumerate(zip(glass_grads, leaves)):
        np.testing.assert_allclose(g, leaf.grad.numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i}")


@pytest.fixture
def gradcheck():
    return check_gradients


@pytest.fixture
def torch_check(torch):
    def check(glass_fn, torch_fn, *arrays, **kw):
        return check_against_torch(torch, glass_fn, torch_fn, *arrays, **kw)
    return check


@pytest.fixture(scope="session")
def shared_data():
    return shared_data_path


@pytest.fixture
def torch():
    return pytest.importorskip("torch")
