"""The compiled forms (`glassllm.engine.compiled`, numba loops in `engine.numba_kernels`)
equal the references of `glassllm.functional` / `glassllm.optim`, forward and backward, on odd
shapes (T = 1, 7, 33; C = 3, 17), float32 and float64, under fp16/bf16 autocast; numba is
loaded lazily, falls back to NumPy with one warning line, and keeps `import glassllm` fast.

Bounds: max |compiled - reference| <= tol * max |reference| (for a gradient, at least
tol * max |dy|, the scale of the terms it is the difference of) with tol 2e-6 in float32 (about
16 float32 ulps of the largest value: the row sums are added in float64 or in vector lanes,
exp is a polynomial within 3 ulps, GELU is written through one sigmoid where the reference
calls tanh) and 1e-13 in float64 (a few hundred ulps; float64 uses libm's exp). AdamW does the
reference's operations in its order: the same bits. The rotary embedding too.
"""
from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from glassllm import amp, kernels, optim
from glassllm import functional as F
from glassllm.engine import compiled, jit, ops, parallel
from glassllm.model import Config, GlassLM

pytestmark = pytest.mark.skipif(jit.kernels() is None, reason="numba does not load here")

SRC = Path(__file__).resolve().parents[1] / "src"
TOL = {np.dtype(np.float32): 2e-6, np.dtype(np.float64): 1e-13}


def rand(rng, *shape, dtype=np.float32, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def assert_close(got, want, tol, what, floor=0.0):
    """|got - want| <= tol * max(max |want|, floor): floor is a gradient's natural scale,
    max |dy| (a softmax's gradient is a difference of terms of that size, its rounding too)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, what
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want), err_msg=what)
    if tol == 0:
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    finite = np.isfinite(want)
    scale = max(float(np.max(np.abs(want[finite]), initial=0.0)), floor, 1e-30)
    worst = float(np.max(np.abs(got - want)[finite], initial=0.0))
    assert worst <= tol * scale, f"{what}: max diff {worst:.3g} > {tol:.3g} * {scale:.3g}"


def with_extremes(x):
    """x with values whose exp(-x) overflows float32 (sigmoid -> 0) and saturates it."""
    x.reshape(-1)[:4] = [-120.0, -30.0, 30.0, 120.0][: x.size]
    return x


def inputs(name, rng, dtype, T, C):
    B = 2
    if name == "rms_norm":
        return rand(rng, B, T, C, dtype=dtype, scale=3.0), rand(rng, C, dtype=dtype), 1e-5
    if name == "layer_norm":
        return (rand(rng, B, T, C, dtype=dtype, scale=3.0), rand(rng, C, dtype=dtype),
                rand(rng, C, dtype=dtype), 1e-5)
    if name == "swiglu":
        return with_extremes(rand(rng, B, T, C, dtype=dtype, scale=3.0)), rand(rng, B, T, C,
                                                                                dtype=dtype)
    if name == "gelu":
        return (with_extremes(rand(rng, B, T, C, dtype=dtype, scale=3.0)),)
    if name == "rope":  # C heads of head_dim 8, positions 5 .. 5+T-1
        cos, sin = F.rope_tables(T + 5, 8, dtype=dtype)
        return rand(rng, B, T, C, 8, dtype=dtype), cos[5:], sin[5:]
    if name == "softmax":  # T x C scores, the last key masked for the first query
        x = rand(rng, B, T, C, dtype=dtype, scale=3.0)
        x[:, 0, -1] = -np.inf
        return (x,)
    if name.startswith("cross_entropy"):
        return (rand(rng, B * T, C, dtype=dtype, scale=3.0), rng.integers(0, C, B * T),
                name.endswith("overwrite"))
    raise KeyError(name)


NAMES = ["rms_norm", "layer_norm", "swiglu", "gelu", "rope", "softmax", "cross_entropy",
         "cross_entropy_overwrite"]


def pair(name):
    base = name.replace("_overwrite", "")
    reference = (getattr(F, f"{base}_forward"), getattr(F, f"{base}_backward"))
    return reference, (getattr(compiled, f"{base}_forward"), getattr(compiled, f"{base}_backward"))


def run(forward, backward, args, dy):
    y, saved = forward(*copy.deepcopy(args))
    y = np.array(y)  # the loss is 0-d; the forms may reuse buffers
    return y, [g for g in backward(dy.copy(), saved) if g is not None]


def compare(name, dtype, T, C, tol=None):
    rng = np.random.default_rng(T * 100 + C)
    args = inputs(name, rng, dtype, T, C)
    (ref_f, ref_b), (fast_f, fast_b) = pair(name)
    y_ref, _ = ref_f(*copy.deepcopy(args))
    dy = np.asarray(rand(rng, *np.shape(y_ref), dtype=np.asarray(y_ref).dtype))
    y, grads = run(ref_f, ref_b, args, dy)
    y_fast, grads_fast = run(fast_f, fast_b, args, dy)
    tol = TOL[np.dtype(dtype)] if tol is None else tol
    assert_close(y_fast, y, 0 if name == "rope" else tol, f"{name} forward")
    assert len(grads_fast) == len(grads)
    for i, (a, b) in enumerate(zip(grads_fast, grads)):
        assert_close(a, b, 0 if name == "rope" else tol, f"{name} gradient {i}",
                     floor=float(np.max(np.abs(dy))))


@pytest.mark.parametrize("name", ["rms_norm", "layer_norm"])
def test_a_row_whose_mean_square_overflows_float32_normalises_as_the_reference(name):
    """Weights of 1e30 (a diverged run): mean(x^2) is inf in float32, so the reference's rstd
    is 0 and its output finite; the kernel sums in float64 but must round the mean square to
    float32 as the reference holds it (it once gave rstd 1e-30 and then NaN downstream)."""
    x = np.full((2, 16), 1e30, dtype=np.float32)
    x[1] = np.linspace(-1, 1, 16, dtype=np.float32)  # an ordinary row beside it
    w = np.ones(16, np.float32)
    args = (x, w, 1e-5) if name == "rms_norm" else (x, w, np.zeros(16, np.float32), 1e-5)
    (ref_f, _), (fast_f, _) = pair(name)
    want, _ = ref_f(*copy.deepcopy(args))
    got, _ = fast_f(*copy.deepcopy(args))
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("T", [1, 7, 33])
@pytest.mark.parametrize("C", [3, 17])
@pytest.mark.parametrize("name", NAMES)
def test_compiled_form_equals_reference(name, C, T, dtype):
    compare(name, dtype, T, C)


@pytest.fixture
def small_slices(monkeypatch):
    """The pool cuts even these small arrays into many slices, on two threads."""
    monkeypatch.setattr(parallel, "SLICE_ELEMENTS", 64)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 128)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 128)  # (the compiled forms' rule)
    saved = parallel.get_num_threads()
    parallel.set_num_threads(2)
    yield
    parallel.set_num_threads(saved)


@pytest.mark.parametrize("name", NAMES)
def test_compiled_form_equals_reference_on_many_slices_and_two_threads(name, small_slices):
    compare(name, np.float32, 33, 17)


@pytest.mark.parametrize("C", [511, 512, 513, 2048, 5000])
@pytest.mark.parametrize("name", ["cross_entropy", "cross_entropy_overwrite"])
def test_compiled_cross_entropy_equals_reference_on_short_and_long_rows(name, C):
    """Rows up to SUM_BLOCK classes keep their exps and a row scale (the normalizing pass in
    the backward), longer ones the online normalizer's probabilities (scale 1): both equal
    the reference, one block and several (ONLINE_BLOCK 2048)."""
    compare(name, np.float32, 3, C)


@pytest.mark.parametrize("C", [17, 600])
def test_compiled_cross_entropy_saves_the_probabilities_up_to_a_row_scale(C):
    rng = np.random.default_rng(C)
    z, t = rand(rng, 9, C, scale=3.0), rng.integers(0, C, 9)
    exps, checked, row_scale = compiled.cross_entropy_forward(z.copy(), t)[1]
    np.testing.assert_allclose(exps * row_scale[:, None], F.softmax_rows(z), rtol=2e-6,
                               atol=1e-9)
    assert (row_scale == 1.0).all() == (C > 512)


def test_compiled_cross_entropy_backward_after_numba_is_switched_off(monkeypatch):
    """The forward's (exps, targets, row scale) still give the reference gradient when the
    backward finds no kernels (the NumPy form after the normalizing pass)."""
    rng = np.random.default_rng(5)
    z, t = rand(rng, 6, 11, scale=3.0), rng.integers(0, 11, 6)
    _, saved = compiled.cross_entropy_forward(z.copy(), t)
    monkeypatch.setattr(jit, "kernels", lambda: None)
    (dz,) = compiled.cross_entropy_backward(np.float32(2), saved)
    (want,) = F.cross_entropy_backward(np.float32(2), F.cross_entropy_forward(z, t)[1])
    assert_close(dz, want, 2e-6, "gradient", floor=1.0)


def test_compiled_forms_are_the_registered_fast_forms():
    fast = kernels.registered()
    for name in NAMES:
        (ref_f, ref_b), (fast_f, fast_b) = pair(name)
        assert fast[ref_f] is fast_f and fast[ref_b] is fast_b
    assert fast[optim.adamw_update] is compiled.adamw_update
    with kernels.use("reference"):
        assert kernels.pick(F.swiglu_forward) is F.swiglu_forward


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_compiled_adamw_is_the_reference_update_bit_for_bit(dtype, weight_decay, small_slices):
    rng = np.random.default_rng(4)
    shape = (33, 17)
    p_ref = rand(rng, *shape, dtype=dtype)
    p_fast, m_ref, v_ref = p_ref.copy(), np.zeros(shape, dtype), np.zeros(shape, dtype)
    m_fast, v_fast = m_ref.copy(), v_ref.copy()
    settings = dict(lr=0.01, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=weight_decay)
    for step in range(1, 5):
        g = rand(rng, *shape, dtype=dtype, scale=10.0 ** (step - 3))
        optim.adamw_update(p_ref, g, m_ref, v_ref, step=step, **settings)
        compiled.adamw_update(p_fast, g, m_fast, v_fast, step=step, **settings)
        for got, want in ((p_fast, p_ref), (m_fast, m_ref), (v_fast, v_ref)):
            np.testing.assert_array_equal(got, want)


def loss_and_grads(model, ids):
    for p in model.parameters():
        p.grad = None
    loss = model.loss(ids[:, :-1], ids[:, 1:])
    loss.backward()
    return float(loss.item()), [p.grad.copy() for p in model.parameters()]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("low", ["float16", "bfloat16"])
def test_a_model_step_under_autocast_matches_the_reference_forms(family, low):
    """Autocast rounds the products' inputs and outputs; the elementwise kernels run in
    float32 between them. Engine and reference steps then agree to a few roundings of the low
    dtype (bounds as tests/test_kernels.py's: 2^-7 float16, 2^-4 bfloat16 of the largest
    gradient of the model)."""
    cfg = Config(family=family, vocab_size=37, d_model=24, n_layers=2, n_heads=4,
                 n_kv_heads=2 if family == "llama" else 4, max_len=16, d_ff=40)
    model = GlassLM(cfg, seed=0)
    ids = np.random.default_rng(0).integers(0, 37, (2, 8))
    with amp.autocast(low):
        loss, grads = loss_and_grads(model, ids)
        with kernels.use("reference"):
            loss_ref, grads_ref = loss_and_grads(model, ids)
    tol = {"float16": 2.0 ** -7, "bfloat16": 2.0 ** -4}[low]
    assert abs(loss - loss_ref) <= tol * abs(loss_ref)
    largest = max(float(np.max(np.abs(g))) for g in grads_ref)
    for i, (a, b) in enumerate(zip(grads, grads_ref)):
        assert_close(a, b, tol, f"{family} {low} gradient {i}", floor=largest)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_training_steps_with_every_output_buffer_reused_equal_the_reference(family, monkeypatch):
    """engine.buffers hands a forward's output to a later call once nothing references it:
    with every array pooled (no 1 MiB floor), four AdamW steps, each reusing the buffers of
    the step before, give the reference's losses and weights (a buffer handed out while the
    autograd still held it would corrupt a saved activation and show here)."""
    from glassllm.engine import buffers
    monkeypatch.setattr(buffers, "MIN_BYTES", 0)
    buffers.clear()
    cfg = Config(family=family, vocab_size=37, d_model=24, n_layers=2, n_heads=4,
                 n_kv_heads=2 if family == "llama" else 4, max_len=16, d_ff=40)
    ids = np.random.default_rng(0).integers(0, 37, (3, 4, 9))
    runs = {}
    for mode in ("engine", "reference"):
        model = GlassLM(cfg, seed=0)
        opt = optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        with kernels.use(mode):
            for step in range(4):
                loss = model.loss(ids[step % 3, :, :-1], ids[step % 3, :, 1:])
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(float(loss.item()))
        runs[mode] = losses, [p.data.copy() for p in model.parameters()]
    assert buffers.pooled_bytes() > 0  # the engine's steps did take pooled buffers
    buffers.clear()
    (losses, weights), (losses_ref, weights_ref) = runs["engine"], runs["reference"]
    np.testing.assert_allclose(losses, losses_ref, rtol=1e-5)
    for i, (a, b) in enumerate(zip(weights, weights_ref)):
        # AdamW's step is about +-lr wherever a gradient is ~0 (a bias), whatever its rounding:
        # weights agree to a small part of lr (1e-2), not relative to a weight of ~1e-5
        assert_close(a, b, 1e-3, f"{family} weight {i}", floor=1.0)


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(SRC), **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environment,
                          capture_output=True, text=True, timeout=300)


def test_without_numba_the_numpy_forms_run_with_one_warning_line():
    """numba made unimportable (sys.modules entry None, as a failed install): the first op
    prints one warning line, every later op is silent, and the results are the NumPy forms'."""
    result = run_python("""
        import sys
        sys.modules["numba"] = None
        import numpy as np
        from glassllm.engine import compiled, ops
        x = np.random.default_rng(0).standard_normal((7, 17)).astype(np.float32)
        for _ in range(3):
            got, _ = compiled.swiglu_forward(x, x)
            ce, _ = compiled.cross_entropy_forward(x.copy(), np.arange(7))
        print(np.array_equal(got, ops.swiglu_forward(x, x)[0]),
              np.array_equal(ce, ops.cross_entropy_forward(x.copy(), np.arange(7))[0]))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "numba cannot load" in lines[0], result.stderr


def test_import_glassllm_is_fast_and_leaves_numba_unloaded():
    """numba is not imported, and the whole `import glassllm` takes under a second of CPU
    time (the process's own: wall time on the loaded 2-core CI machine is 2-3x more) beyond
    its NumPy and ml_dtypes, imported first (ml_dtypes' extension alone took 0.8 s of CPU at
    load average 7 here: not ours to shorten)."""
    result = run_python("""
        import sys, time
        import numpy, ml_dtypes
        start = time.process_time()
        import glassllm
        seconds = time.process_time() - start
        print(f"{seconds:.3f}", "numba" in sys.modules)
    """)
    assert result.returncode == 0, result.stderr
    seconds, numba_loaded = result.stdout.split()
    assert numba_loaded == "False"
    assert float(seconds) < 1.0, f"import glassllm took {seconds} s"


def test_compiled_code_is_cached_on_disk():
    """A second process loads the kernels from numba's cache: no compilation."""
    code = """
        import numpy as np
        from glassllm.engine import compiled, jit
        x = np.ones((3, 17), np.float32)
        compiled.swiglu_forward(x, x)
        k = jit.kernels().swiglu_forward
        print(len(k.stats.cache_hits) > 0 or len(k.stats.cache_misses) > 0,
              sum(k.stats.cache_hits.values()))
    """
    run_python(code)  # fills the cache if this machine has none yet
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[1]) >= 1, result.stdout


# --------------------------------------------------------------------------- decoding
def perturbed_llama(tie: bool, transposed: bool = False) -> GlassLM:
    cfg = Config(vocab_size=61, d_model=48, n_layers=3, n_heads=6, n_kv_heads=2, max_len=40,
                 tie_embeddings=tie)
    model = GlassLM(cfg, seed=1)
    rng = np.random.default_rng(0)
    for p in model.parameters():
        p.data += (0.05 * rng.standard_normal(p.data.shape)).astype(np.float32)
        if transposed and p.data.ndim == 2 and p is not model.token_embedding.weight:
            p.data = np.ascontiguousarray(p.data.T).T  # stored (out, in), as llama2.c's
    return model


@pytest.mark.parametrize("tie,transposed", [(True, False), (False, False), (True, True),
                                            (False, True)])
def test_compiled_decoding_step_equals_the_reference_next_token_logits(tie, transposed):
    """39 tokens through the compiled whole-token step against the reference forward with a
    KV cache: logits and cache within float32 rounding (sums in another order than BLAS's)."""
    from glassllm import generate
    from glassllm.engine import fast_decode
    from glassllm.model import KVCache
    model = perturbed_llama(tie, transposed)
    assert fast_decode.supports(model, KVCache(model.cfg))
    fast, ref = KVCache(model.cfg), KVCache(model.cfg)
    for token in np.random.default_rng(3).integers(0, 61, 39):
        got = kernels.registered()[generate.next_token_logits](model, fast, int(token))
        with kernels.use("reference"):
            want = generate.next_token_logits(model, ref, int(token))
        assert_close(got, want, 4e-6, f"logits at {ref.length}")
    assert fast.length == ref.length == 39
    assert_close(fast.k, ref.k, 4e-6, "keys")
    assert_close(fast.v, ref.v, 4e-6, "values")


def test_compiled_decoding_step_sees_new_weights_and_leaves_other_models_to_numpy():
    from glassllm import generate
    from glassllm.engine import fast_decode
    from glassllm.model import KVCache
    model = perturbed_llama(True)
    first = fast_decode.next_token_logits(model, KVCache(model.cfg), 5)
    model.blocks[0].mlp.down.weight.data = model.blocks[0].mlp.down.weight.data * 2  # new array
    second = fast_decode.next_token_logits(model, KVCache(model.cfg), 5)
    with kernels.use("reference"):
        want = generate.next_token_logits(model, KVCache(model.cfg), 5)
    assert not np.allclose(first, second)
    assert_close(second, want, 4e-6, "after a new weight array")
    gpt2 = GlassLM(Config(family="gpt2", vocab_size=30, d_model=16, n_layers=1, n_heads=2,
                          max_len=8), seed=0)
    assert not fast_decode.supports(gpt2, KVCache(gpt2.cfg))
    big = GlassLM(Config(vocab_size=30, d_model=fast_decode.MAX_D_MODEL + 32, n_layers=1,
                         n_heads=4, max_len=8), seed=0)
    assert not fast_decode.supports(big, KVCache(big.cfg))
