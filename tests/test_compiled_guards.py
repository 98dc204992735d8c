"""The compiled kernels' guards and the engine's environment variables (GLASSLLM_NUMBA,
GLASSLLM_THREADS, numba's cache): each case is an input that once gave a silent wrong answer
or an unclear error."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from glassllm import functional as F
from glassllm.engine import compiled, jit

SRC = Path(__file__).resolve().parents[1] / "src"
needs_numba = pytest.mark.skipif(jit.kernels() is None, reason="numba cannot load here")


@pytest.mark.parametrize("value", ["off", "false", "yes", "2"])
def test_a_mistyped_glassllm_numba_is_an_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("GLASSLLM_NUMBA", value)
    with pytest.raises(ValueError, match=r"^GLASSLLM_NUMBA: expected 0 .* got '"):
        jit.enabled_by_environment()


@pytest.mark.parametrize("value, on", [("0", False), ("1", True), (" 1 ", True), ("", True)])
def test_glassllm_numba_reads_0_and_1(monkeypatch, value, on):
    monkeypatch.setenv("GLASSLLM_NUMBA", value)
    assert jit.enabled_by_environment() is on


@needs_numba
@pytest.mark.parametrize("bad", [3, 7, -4])
def test_a_target_outside_the_vocabulary_raises_instead_of_reading_past_the_row(bad):
    # the compiled loop has no bounds checks: it once returned a loss read from other memory
    logits = np.zeros((2, 3), np.float32)
    with pytest.raises(IndexError):
        F.cross_entropy_forward(logits, np.array([0, bad]))
    with pytest.raises(IndexError, match="target .* out of bounds for 3 classes"):
        compiled.cross_entropy_forward(logits, np.array([0, bad]))


@needs_numba
def test_a_negative_target_counts_from_the_end_in_forward_and_backward_as_the_reference():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 5)).astype(np.float32)
    targets = np.array([1, -1, -5])
    ref_loss, ref_saved = F.cross_entropy_forward(logits, targets)
    loss, saved = compiled.cross_entropy_forward(logits.copy(), targets)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    (ref_dz,) = F.cross_entropy_backward(np.float32(1), ref_saved)
    (dz,) = compiled.cross_entropy_backward(np.float32(1), saved)
    np.testing.assert_allclose(dz, ref_dz, atol=1e-7)


@needs_numba
def test_zero_width_rows_pass_through_the_compiled_forms():
    x = np.zeros((4, 0), np.float32)
    y, _ = compiled.gelu_forward(x)
    assert y.shape == (4, 0)
    y, _ = compiled.rms_norm_forward(x, np.zeros(0, np.float32), 1e-5)
    assert y.shape == (4, 0)


def test_import_glassllm_leaves_ml_dtypes_unloaded_and_takes_under_a_second():
    # ml_dtypes' extension alone took 0.9 s of CPU (2.4 s wall at load 5): imported with
    # glassllm, a user's `import glassllm` took 1.6-2.5 s. It now loads at the first bfloat16.
    code = ("import sys, time\nstart = time.process_time()\nimport glassllm\n"
            "print(f'{time.process_time() - start:.3f}', 'ml_dtypes' in sys.modules)\n"
            "from glassllm import amp\nprint(amp.resolve_dtype('bf16'), 'ml_dtypes' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert result.returncode == 0, result.stderr
    (seconds, loaded), (bf16, loaded_after) = (line.split() for line in result.stdout.splitlines())
    assert (loaded, bf16, loaded_after) == ("False", "bfloat16", "True")
    assert float(seconds) < 1.0, f"import glassllm took {seconds} s of CPU"


@needs_numba
def test_without_a_writable_numba_cache_the_kernels_still_run_compiled():
    # A read-only install run with a read-only home (simulated: numba finds no cache locator)
    # once fell back to NumPy with "numba cannot load"; numba loads, it only cannot cache.
    code = """
import warnings
import numpy as np
from numba.core import caching
caching.CacheImpl._locator_classes = []
from glassllm.engine import compiled, jit
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    kernels = jit.kernels()
print(kernels is not None, jit.disk_cache(), len(caught))
print(caught[0].message)
x = np.arange(6, dtype=np.float32).reshape(2, 3)
y, _ = compiled.gelu_forward(x)
print(np.allclose(y, compiled.ops.gelu_forward(x)[0], atol=1e-6))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "PYTHONPATH": str(SRC),
                                              "GLASSLLM_NUMBA": "1"})
    assert result.returncode == 0, result.stderr
    first, message, equal = result.stdout.splitlines()
    assert first.split() == ["True", "False", "1"]
    assert message.startswith("glassllm: numba has no writable cache directory")
    assert equal == "True"


@needs_numba
def test_a_truncated_numba_cache_file_is_compiled_again_with_one_warning_line(tmp_path):
    # numba unpickles its cache files unguarded: one truncated .nbi or .nbc once made every
    # op raise UnpicklingError. The kernels cache into tmp_path here; one process fills it,
    # its files are broken, a second process loads them.
    code = """
import warnings
import numpy as np
from glassllm.engine import compiled
x = np.arange(6, dtype=np.float32).reshape(2, 3)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    y = compiled.gelu_forward(x)[0]
print(np.allclose(y, compiled.ops.gelu_forward(x)[0], atol=1e-6), len(caught))
print(caught[0].message if caught else "")
"""
    environment = {**os.environ, "PYTHONPATH": str(SRC), "GLASSLLM_NUMBA": "1",
                   "NUMBA_CACHE_DIR": str(tmp_path)}

    def run():
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=300, env=environment)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    assert run()[0] == "True 0"
    files = sorted(tmp_path.rglob("numba_kernels.gelu_forward-*"))
    assert {f.suffix for f in files} == {".nbi", ".nbc"}
    for f in files:
        f.write_bytes(f.read_bytes()[:10])
    first, message = run()
    assert first == "True 1"
    assert message.startswith("glassllm: numba's cache in ") and "gelu_forward" in message
    assert run()[0] == "True 0"  # written afresh


def test_numba_disable_jit_runs_the_numpy_forms_not_python_loops(monkeypatch):
    # with NUMBA_DISABLE_JIT=1 the kernels ran as interpreted loops: a d_model 64 step took
    # 0.71 s against NumPy's 0.03 s
    monkeypatch.setenv("NUMBA_DISABLE_JIT", "1")
    monkeypatch.delenv("GLASSLLM_NUMBA", raising=False)
    jit.reset()
    try:
        with pytest.warns(RuntimeWarning, match="NUMBA_DISABLE_JIT is set; running the NumPy"):
            assert jit.kernels() is None
    finally:
        monkeypatch.delenv("NUMBA_DISABLE_JIT")
        jit.reset()


@pytest.mark.parametrize("value", ["99999999999", "1025", "0", "-3", "2.5"])
def test_glassllm_threads_out_of_range_is_an_error_naming_the_variable(monkeypatch, value):
    # GLASSLLM_THREADS=99999999999 once hung the first op, starting pool threads
    from glassllm.engine import cpu
    monkeypatch.setenv("GLASSLLM_THREADS", value)
    with pytest.raises(ValueError, match=r"^GLASSLLM_THREADS: expected an integer from 1 to "
                                         r"1024, got '"):
        cpu.default_threads_from_environment()


@needs_numba
def test_fewer_targets_than_rows_is_an_error_not_a_read_past_the_targets():
    with pytest.raises(ValueError, match=r"targets of shape \(2,\) for 4 rows"):
        compiled.cross_entropy_forward(np.zeros((4, 3), np.float32), np.array([0, 1]))


def _mismatched_ops():
    from glassllm.tensor import Tensor
    x = Tensor(np.ones((2, 5), np.float32))
    return {
        "rms_norm": lambda: F.rms_norm(x, Tensor(np.ones(4, np.float32))),
        "layer_norm": lambda: F.layer_norm(x, Tensor(np.ones(5, np.float32)),
                                           Tensor(np.ones(3, np.float32))),
        "swiglu": lambda: F.swiglu(x, Tensor(np.ones((2, 4), np.float32))),
        "rope": lambda: F.rope(Tensor(np.ones((1, 3, 1, 4), np.float32)), *F.rope_tables(2, 4)),
    }


@pytest.mark.parametrize("op", sorted(_mismatched_ops()))
def test_mismatched_shapes_raise_in_engine_mode_as_in_the_reference(op):
    # the compiled loops have no bounds checks: a weight of 4 for rows of 5, or RoPE tables
    # for 2 positions of 3, once returned numbers read from past the arrays
    from glassllm import kernels
    for mode in ("reference", "engine"):
        with kernels.use(mode), pytest.raises(ValueError, match="could not be broadcast"):
            _mismatched_ops()[op]()


def test_a_broadcast_the_reference_allows_gives_its_numbers_in_engine_mode():
    from glassllm import kernels
    from glassllm.tensor import Tensor
    gate = Tensor(np.linspace(-2, 2, 10, dtype=np.float32).reshape(2, 5))
    up = Tensor(np.arange(5, dtype=np.float32)[None])                 # (1, 5): broadcast
    with kernels.use("reference"):
        expected = F.swiglu(gate, up).data
    with kernels.use("engine"):
        np.testing.assert_allclose(F.swiglu(gate, up).data, expected, rtol=1e-6)


@needs_numba
def test_adamw_with_a_gradient_of_another_shape_raises():
    p = np.ones(6, np.float32)
    with pytest.raises(ValueError):
        compiled.adamw_update(p, np.ones(3, np.float32), np.zeros(6, np.float32),
                              np.zeros(6, np.float32), lr=0.1, beta1=0.9, beta2=0.99,
                              eps=1e-8, weight_decay=0.0, step=1)


def test_glassllm_train_honours_glassllm_threads_below_an_explicit_threads(monkeypatch):
    # `glassllm train` measured the load and ignored GLASSLLM_THREADS, which pins the count
    # for every library caller
    from types import SimpleNamespace
    from glassllm import cli
    one_rank = SimpleNamespace(size=1)
    monkeypatch.setenv("GLASSLLM_THREADS", "3")
    assert cli._choose_threads(one_rank, None) == (3, "GLASSLLM_THREADS=3")
    assert cli._choose_threads(one_rank, 2) == (2, "as requested")
    monkeypatch.setenv("GLASSLLM_THREADS", "lots")
    with pytest.raises(ValueError, match="^GLASSLLM_THREADS: "):
        cli._choose_threads(one_rank, None)


def test_a_bad_glassllm_threads_fails_every_op_not_only_the_first():
    # the first op's error once consumed the default's one try: the second op ran unpinned
    code = """
import numpy as np
from glassllm.model import Config, GlassLM
model = GlassLM(Config(vocab_size=30, d_model=16, n_layers=1, n_heads=2, max_len=8), seed=0)
for attempt in range(2):
    try:
        model.loss(np.zeros((1, 4), int), np.zeros((1, 4), int))
        print("ran")
    except ValueError as error:
        print(str(error).split(":")[0])
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(SRC),
                                              "GLASSLLM_THREADS": "two",
                                              "GLASSLLM_KERNELS": "engine"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["GLASSLLM_THREADS", "GLASSLLM_THREADS"]


def test_a_cache_made_for_another_config_takes_the_reference_not_the_compiled_step():
    # the compiled step indexes the cache without bounds checks: a cache of fewer layers
    # once aborted the process ("corrupted size vs. prev_size"). In a child process.
    code = """
from glassllm import generate, kernels
from glassllm.engine import decode, fast_decode
from glassllm.model import Config, GlassLM, KVCache
small = dict(vocab_size=30, d_model=16, n_heads=2)
model = GlassLM(Config(n_layers=2, max_len=8, **small), seed=0)
print(fast_decode.supports(model, KVCache(model.cfg)))
for other in (dict(n_layers=1, max_len=8), dict(n_layers=2, max_len=4)):
    cache = KVCache(Config(**other, **small))
    print(fast_decode.supports(model, cache), decode.supports(model, cache))
cache = KVCache(Config(n_layers=1, max_len=8, **small))
try:
    with kernels.use("engine"):
        generate.next_token_logits(model, cache, 1)
        generate.next_token_logits(model, cache, 2)
except IndexError as error:
    print("IndexError")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False", "False", "False", "False", "IndexError"]


@needs_numba
@pytest.mark.parametrize("overwrite", [False, True])
def test_the_one_call_loss_gives_the_bits_of_the_rows_on_the_pool(monkeypatch, overwrite):
    """Small losses run as one call (`SERIAL_LOSS_ELEMENTS`), larger ones over the pool's rows:
    the same rows and the same total order, so the same bits, saved buffers included."""
    from glassllm.engine import cpu
    rng = np.random.default_rng(3)
    logits = (3 * rng.standard_normal((300, 700))).astype(np.float32)
    targets = rng.integers(0, 700, 300)
    one_loss, (one_exps, one_t, one_scale) = compiled.cross_entropy_forward(
        logits.copy(), targets, overwrite)
    monkeypatch.setattr(compiled, "SERIAL_LOSS_ELEMENTS", 0)
    with cpu.use_threads(2):
        loss, (exps, t, scale) = compiled.cross_entropy_forward(logits.copy(), targets, overwrite)
    assert one_loss.tobytes() == loss.tobytes()
    assert np.array_equal(one_exps, exps) and np.array_equal(one_t, t)
    assert np.array_equal(one_scale, scale)


@needs_numba
def test_a_bad_target_leaves_the_logits_a_loss_may_overwrite_as_they_were():
    logits = np.arange(12, dtype=np.float32).reshape(4, 3)
    before = logits.copy()
    with pytest.raises(IndexError, match="target 3 is out of bounds for 3 classes"):
        compiled.cross_entropy_forward(logits, np.array([0, 1, 2, 3]), True)
    assert np.array_equal(logits, before)
