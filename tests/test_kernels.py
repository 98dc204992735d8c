"""glassllm.kernels: every fast form the engine registers equals its reference, forward and
backward; GLASSLLM_KERNELS=reference routes every op to its reference; the core runs without
the engine and autocast.

Equality is bitwise where the fast form does the reference's operations in the same order
(linear, unembed, the embedding's forward, silu, swiglu, rope, the softmax's forward, the
cross-entropy's loss, AdamW's moments). Elsewhere it is a stated tolerance, measured as
max |fast - reference| <= tol * max |reference| (TOL below: a few dozen float32 ulps, a few
hundred float64 ulps; under autocast a few units of the low dtype's rounding, since the engine
scales q before the rounded q k^T product and the reference divides the rounded scores).
The shapes are odd on purpose: T not a multiple of the attention block (64), grouped-query
heads, widths that are no power of two, a KV cache offset.

These are the engine's NumPy forms (`glassllm.engine.ops`): every test here runs with the
numba kernels off, as on a machine where numba cannot load (the `numpy_forms` fixture); the
compiled forms that replace them where numba loads are held to the references in
tests/test_numba_kernels.py.
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

from glassllm import amp, generate, kernels, optim
from glassllm import functional as F
from glassllm.engine import attention, blas, compiled, cpu, decode, jit, ops, parallel
from glassllm.lens.trace import run_with_cache
from glassllm.model import Config, GlassLM, KVCache
from glassllm.tensor import Tensor, no_grad

SRC = Path(__file__).resolve().parents[1] / "src"
TOL = {np.dtype(np.float32): 2e-5, np.dtype(np.float64): 1e-13,
       "float16": 2.0 ** -7, "bfloat16": 2.0 ** -4}


def rand(rng, *shape, dtype=np.float32, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def assert_close(fast, ref, tol, what):
    fast, ref = np.asarray(fast), np.asarray(ref)
    assert fast.shape == ref.shape and fast.dtype == ref.dtype, what
    if tol == 0:
        np.testing.assert_array_equal(fast, ref, err_msg=what)
        return
    scale = max(float(np.max(np.abs(ref[np.isfinite(ref)]), initial=0.0)), 1e-30)
    np.testing.assert_array_equal(np.isfinite(fast), np.isfinite(ref), err_msg=what)
    worst = float(np.max(np.abs(fast - ref)[np.isfinite(ref)], initial=0.0))
    assert worst <= tol * scale, f"{what}: max diff {worst:.3g} > {tol:.3g} * {scale:.3g}"


@pytest.fixture(autouse=True)
def numpy_forms(monkeypatch):
    """The engine's compiled forms fall back to their NumPy forms: as if numba did not load."""
    monkeypatch.setattr(jit, "_loaded", True)
    monkeypatch.setattr(jit, "_module", None)


# --------------------------------------------------------------------------- the op pairs
def attention_args(rng, dtype, B, Tq, H, K, D, q_start=0):
    Tk = q_start + Tq
    return (rand(rng, B, Tq, H, D, dtype=dtype), rand(rng, B, Tk, K, D, dtype=dtype),
            rand(rng, B, Tk, K, D, dtype=dtype), q_start)


def softmax_input(rng, dtype):
    x = rand(rng, 3, 70, 37, dtype=dtype, scale=3.0)
    x[0, :, 30:] = -np.inf  # masked entries, as the attention's
    return (x,)


def rope_input(rng, dtype):
    cos, sin = F.rope_tables(90, 6, dtype=dtype)
    return rand(rng, 2, 70, 3, 6, dtype=dtype), cos[20:], sin[20:]  # positions 20..89


def extremes(rng, dtype, *shape):
    x = rand(rng, *shape, dtype=dtype, scale=3.0)
    x.reshape(-1)[:4] = [-120.0, -30.0, 30.0, 120.0]  # exp(-x) overflows float32 at -88
    return x


# name -> (reference forward, inputs(rng, dtype), forward exact?, backward exact?)
PAIRS = {
    "linear": (F.linear_forward, lambda g, d: (rand(g, 3, 70, 37, dtype=d),
                                                 rand(g, 37, 29, dtype=d), rand(g, 29, dtype=d)),
               True, True),
    "linear_no_bias": (F.linear_forward, lambda g, d: (rand(g, 5, 37, dtype=d),
                                                         rand(g, 37, 29, dtype=d)), True, True),
    "unembed": (F.unembed_forward, lambda g, d: (rand(g, 3, 70, 37, dtype=d),
                                                   rand(g, 41, 37, dtype=d)), True, True),
    "embedding": (F.embedding_forward, lambda g, d: (g.integers(0, 11, (3, 70)),
                                                       rand(g, 11, 37, dtype=d)), True, False),
    "rms_norm": (F.rms_norm_forward, lambda g, d: (rand(g, 3, 70, 37, dtype=d, scale=3.0),
                                                     rand(g, 37, dtype=d), 1e-5), False, False),
    "layer_norm": (F.layer_norm_forward, lambda g, d: (rand(g, 3, 70, 37, dtype=d, scale=3.0),
                                                         rand(g, 37, dtype=d), rand(g, 37, dtype=d),
                                                         1e-5), False, False),
    "silu": (F.silu_forward, lambda g, d: (extremes(g, d, 3, 70, 37),), True, True),
    "swiglu": (F.swiglu_forward, lambda g, d: (extremes(g, d, 3, 70, 37),
                                                 rand(g, 3, 70, 37, dtype=d)), True, True),
    "gelu": (F.gelu_forward, lambda g, d: (extremes(g, d, 3, 70, 37),), False, False),
    "rope": (F.rope_forward, rope_input, True, True),
    "softmax": (F.softmax_forward, softmax_input, True, False),
    "attention_gqa_T70": (F.causal_attention_forward,
                          lambda g, d: attention_args(g, d, 2, 70, 6, 2, 8), False, False),
    "attention_mqa_q_start_30_T100": (F.causal_attention_forward,
                                      lambda g, d: attention_args(g, d, 2, 100, 4, 1, 6, 30),
                                      False, False),
    "attention_mha_T130": (F.causal_attention_forward,
                           lambda g, d: attention_args(g, d, 1, 130, 3, 3, 10), False, False),
    "attention_decode_one": (F.causal_attention_forward,
                             lambda g, d: attention_args(g, d, 1, 1, 4, 2, 8, 69), False, False),
    "cross_entropy": (F.cross_entropy_forward,
                      lambda g, d: (rand(g, 70, 41, dtype=d, scale=3.0), g.integers(0, 41, 70)),
                      True, False),
    "cross_entropy_overwrite": (F.cross_entropy_forward,
                                lambda g, d: (rand(g, 70, 41, dtype=d, scale=3.0),
                                              g.integers(0, 41, 70), True), True, False),
}


def backward_of(forward):
    """The reference backward registered with `forward` (functional's naming)."""
    return getattr(F, forward.__name__.replace("_forward", "_backward"))


def run_pair(forward, backward, inputs, dy):
    """y and the input gradients of one pair, on copies (forms may write into their inputs)."""
    y, saved = forward(*copy.deepcopy(inputs))
    return y, [g for g in backward(dy.copy(), saved) if g is not None]


def compare_pair(name, dtype, tol_key=None):
    forward, make, forward_exact, backward_exact = PAIRS[name]
    rng = np.random.default_rng(0)
    inputs = make(rng, dtype)
    fast = kernels.registered()
    backward = backward_of(forward)
    y_ref, _ = forward(*copy.deepcopy(inputs))
    dy = rand(rng, *np.shape(y_ref), dtype=y_ref.dtype)
    y, grads = run_pair(forward, backward, inputs, dy)
    y_fast, grads_fast = run_pair(fast[forward], fast[backward], inputs, dy)
    tol = TOL[tol_key or np.dtype(dtype)]
    assert_close(y_fast, y, 0 if forward_exact and tol_key is None else tol, f"{name} forward")
    assert len(grads_fast) == len(grads)
    for i, (a, b) in enumerate(zip(grads_fast, grads)):
        assert_close(a, b, 0 if backward_exact and tol_key is None else tol,
                     f"{name} gradient {i}")


@pytest.fixture
def small_slices(monkeypatch):
    """The pool cuts even these small arrays into many slices, on two threads."""
    monkeypatch.setattr(parallel, "SLICE_ELEMENTS", 512)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_ELEMENTS", 1024)
    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 1024)  # (the compiled forms' rule)
    saved = parallel.get_num_threads()
    parallel.set_num_threads(2)
    yield
    parallel.set_num_threads(saved)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", sorted(PAIRS))
def test_fast_form_equals_reference(name, dtype):
    compare_pair(name, dtype)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_fast_form_equals_reference_on_many_slices_and_two_threads(name, small_slices):
    compare_pair(name, np.float32)


@pytest.mark.parametrize("low", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["linear", "unembed", "attention_gqa_T70",
                                  "attention_mqa_q_start_30_T100"])
def test_fast_form_equals_reference_under_autocast(name, low):
    """The products are rounded alike: linear and unembed do the same products (bitwise);
    attention within a few low-dtype roundings (q scaled before or scores after)."""
    exact = not name.startswith("attention")
    with amp.autocast(low):
        if exact:
            compare_pair(name, np.float32)
        else:
            compare_pair(name, np.float32, tol_key=low)


def test_split_products_equal_the_whole_product():
    """In split mode the engine cuts linear's products over the pool's threads; each row is
    computed whole (bitwise on MKL's strict mode, to float32 rounding on OpenBLAS)."""
    rng = np.random.default_rng(1)
    x, w, b = rand(rng, 4, 70, 37), rand(rng, 37, 29), rand(rng, 29)
    dy = rand(rng, 4, 70, 29)
    y, grads = run_pair(F.linear_forward, F.linear_backward, (x, w, b), dy)
    with cpu.use_threads(2):
        assert parallel.split_matmuls()
        y_split, grads_split = run_pair(ops.linear_forward, ops.linear_backward, (x, w, b), dy)
    tol = 0 if blas.backend() == "mkl" else TOL[np.dtype(np.float32)]
    assert_close(y_split, y, tol, "forward")
    for i, (a, c) in enumerate(zip(grads_split, grads)):
        assert_close(a, c, tol, f"gradient {i}")


@pytest.mark.parametrize("shape", [(2, 3, 70), (5, 1, 1), (37,)])
def test_in_place_softmaxes_are_the_reference_softmax_bit_for_bit(shape):
    """The attention's and the decoding step's in-place softmax are `F.softmax_rows`."""
    x = rand(np.random.default_rng(2), *shape, scale=4.0)
    want = F.softmax_rows(x)
    np.testing.assert_array_equal(ops.softmax_rows_inplace(x.copy()), want)
    np.testing.assert_array_equal(compiled.softmax_rows_inplace(x.copy()), want)


def test_cross_entropy_overwrite_keeps_the_probabilities_in_the_logits():
    rng = np.random.default_rng(3)
    z, t = rand(rng, 6, 9), rng.integers(0, 9, 6)
    buffer = z.copy()
    ops.cross_entropy_forward(buffer, t, overwrite_logits=True)
    np.testing.assert_array_equal(buffer, F.softmax_rows(z))
    F.cross_entropy_forward(buffer, t, overwrite_logits=True)  # the reference never writes
    np.testing.assert_array_equal(buffer, F.softmax_rows(z))


# --------------------------------------------------------------------------- optimizer
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_sliced_adamw_equals_the_reference_update(dtype, weight_decay, small_slices):
    """Moments bit for bit (the same operations); weights to rounding: the engine folds the
    bias corrections into the step (m_hat and v_hat never formed)."""
    rng = np.random.default_rng(4)
    shape = (300, 7)
    p_ref = rand(rng, *shape, dtype=dtype)
    p_fast, m_ref, v_ref = p_ref.copy(), np.zeros(shape, dtype), np.zeros(shape, dtype)
    m_fast, v_fast = m_ref.copy(), v_ref.copy()
    settings = dict(lr=0.01, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=weight_decay)
    fast = kernels.registered()[optim.adamw_update]
    for step in range(1, 5):
        g = rand(rng, *shape, dtype=dtype, scale=10.0 ** (step - 3))
        optim.adamw_update(p_ref, g, m_ref, v_ref, step=step, **settings)
        fast(p_fast, g, m_fast, v_fast, step=step, **settings)
        np.testing.assert_array_equal(m_fast, m_ref)
        np.testing.assert_array_equal(v_fast, v_ref)
        assert_close(p_fast, p_ref, TOL[np.dtype(dtype)], f"weights after step {step}")
    assert not np.array_equal(p_fast, p_ref)  # the forms really differ (else: a test of one)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_sliced_sum_of_squares_equals_the_float64_sum(dtype, small_slices):
    g = rand(np.random.default_rng(5), 301, 77, dtype=dtype, scale=1e3)
    fast = kernels.registered()[optim.sum_of_squares](g)
    ref = optim.sum_of_squares(g)
    assert abs(fast - ref) <= 1e-13 * ref
    assert abs(ref - float(np.sum(g.astype(np.float64) ** 2))) <= 1e-13 * ref


# --------------------------------------------------------------------------- decoding
def perturbed_llama(**overrides) -> GlassLM:
    cfg = dict(vocab_size=40, d_model=24, n_layers=2, n_heads=6, n_kv_heads=2, max_len=80)
    model = GlassLM(Config(**{**cfg, **overrides}), seed=0)
    rng = np.random.default_rng(1)
    for p in model.parameters():
        p.data = (p.data + rng.normal(0.0, 0.3, p.shape)).astype(np.float32)
    return model


def test_decoding_step_equals_the_reference_next_token_logits():
    """The engine's llama2.c-style step against the reference: the model's forward of one
    position, in reference mode (the same bits as the engine's forward: tests/test_decode.py)."""
    model = perturbed_llama()
    ids = np.random.default_rng(2).integers(0, 40, 70)  # past one 64-query block
    slow, fast = KVCache(model.cfg), KVCache(model.cfg)
    engine_step = kernels.registered()[generate.next_token_logits]
    with no_grad(), kernels.use("reference"):
        model(ids[None, :3], cache=slow)
        model(ids[None, :3], cache=fast)
        for token in ids[3:]:
            want = generate.next_token_logits(model, slow, int(token))
            got = engine_step(model, fast, int(token))
            assert_close(got, want, TOL[np.dtype(np.float32)], f"token at {slow.length}")
    assert_close(fast.k, slow.k, TOL[np.dtype(np.float32)], "cached keys")


def test_decoding_step_falls_back_to_the_reference_where_it_does_not_apply():
    model = GlassLM(Config(vocab_size=20, d_model=16, n_layers=1, n_heads=2, max_len=8,
                           family="gpt2"))
    a, b = KVCache(model.cfg), KVCache(model.cfg)
    engine_step = kernels.registered()[generate.next_token_logits]
    np.testing.assert_array_equal(engine_step(model, a, 3), generate.next_token_logits(model, b, 3))
    assert a.length == b.length == 1


# --------------------------------------------------------------------------- the switch
def workload():
    """Every op the library has, each through its public entry point: a training step of both
    families (forward, loss, backward, clipping, AdamW), decoding, a traced explicit attention
    (the softmax op) and SiLU (which no model calls)."""
    for family in ("llama", "gpt2"):
        cfg = Config(vocab_size=23, d_model=16, n_layers=1, n_heads=4, max_len=12,
                     n_kv_heads=2 if family == "llama" else None, family=family)
        model = GlassLM(cfg, seed=0)
        ids = np.random.default_rng(0).integers(0, 23, (2, 9))
        model.loss(ids, np.roll(ids, -1, axis=1)).backward()
        optim.clip_grad_norm(model.parameters(), 1.0)
        optim.AdamW(model.parameters()).step()
        generate.generate(model, [1, 2, 3], 3, generate.Sampling(temperature=0))
        run_with_cache(model, ids, np.roll(ids, -1, axis=1), grads=["blocks.0.attention.pattern"])
    x = Tensor(np.ones((2, 3), np.float32), requires_grad=True)
    F.silu(x).sum().backward()


@pytest.fixture
def restore_registry():
    saved = kernels.registered()
    yield
    for reference, fast in saved.items():
        kernels.register(reference, fast, replaces=True)


def test_engine_mode_runs_every_registered_fast_form(restore_registry):
    calls = {}

    def counted(reference, fast):
        def run(*args, **kwargs):
            calls[reference.__qualname__] = calls.get(reference.__qualname__, 0) + 1
            return fast(*args, **kwargs)
        return run

    for reference, fast in kernels.registered().items():
        kernels.register(reference, counted(reference, fast), replaces=True)
    with kernels.use("engine"):
        workload()
    never = sorted(r.__qualname__ for r in kernels.registered() if r.__qualname__ not in calls)
    assert not never, f"registered but never run by the workload: {never}"
    assert len(calls) >= 25


def test_reference_mode_runs_no_fast_form(restore_registry):
    def refuse(reference):
        def run(*args, **kwargs):
            raise AssertionError(f"engine form of {reference.__qualname__} ran in reference mode")
        return run

    for reference in kernels.registered():
        kernels.register(reference, refuse(reference), replaces=True)
    with kernels.use("reference"):
        workload()
        assert all(kernels.pick(r) is r for r in kernels.registered())
    with kernels.use("engine"), pytest.raises(AssertionError, match="engine form"):
        workload()  # the stubs are really in place


def test_use_restores_the_mode_and_refuses_unknown_names():
    before = kernels.mode()
    with pytest.raises(RuntimeError):
        with kernels.use("reference"):
            assert kernels.mode() == "reference"
            raise RuntimeError
    assert kernels.mode() == before
    with pytest.raises(ValueError, match="GLASSLLM_KERNELS.*'engine' or 'reference'.*'fast'"):
        kernels.use("fast").__enter__()
    assert kernels.mode() == before


def test_use_is_per_thread_and_two_threads_blocks_leave_no_mode_behind():
    """Thread A enters reference, B enters engine, A leaves, B leaves: with one process-wide
    mode, B's exit restored A's "reference" for good (every later op of every thread slow)."""
    import threading
    before, seen = kernels.mode(), {}
    registered_gelu = kernels.registered()[F.gelu_forward]
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def a():
        with kernels.use("reference"):
            a_in.set()
            b_in.wait(10)
            seen["a"] = kernels.mode(), kernels.pick(F.gelu_forward) is F.gelu_forward
        a_out.set()

    def b():
        a_in.wait(10)
        with kernels.use("engine"):
            b_in.set()
            a_out.wait(10)
            seen["b"] = kernels.mode(), kernels.pick(F.gelu_forward) is registered_gelu

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {"a": ("reference", True), "b": ("engine", True)}
    assert kernels.mode() == before
    with kernels.use("reference"):  # a thread started inside a block runs the process's mode
        t = threading.Thread(target=lambda: seen.update(c=kernels.mode()))
        t.start()
        t.join(20)
    assert seen["c"] == before


def test_pick_returns_the_reference_when_nothing_is_registered():
    def lonely():
        pass

    with kernels.use("engine"):
        assert kernels.pick(lonely) is lonely
    with pytest.raises(TypeError, match="2 reference form"):
        kernels.register((F.gelu_forward, F.gelu_backward), ops.gelu_forward)


def test_a_second_fast_form_for_an_op_is_an_error_unless_it_says_it_replaces(restore_registry):
    registered_gelu = kernels.registered()[F.gelu_forward]
    with pytest.raises(ValueError) as error:
        kernels.register((F.gelu_forward, F.gelu_backward), (ops.gelu_forward, ops.gelu_backward))
    assert str(error.value) == (
        "kernels.register: glassllm.functional.gelu_forward already has a fast form "
        f"({registered_gelu.__module__}.{registered_gelu.__qualname__}); "
        "pass replaces=True to replace it")
    # nothing of the refused pair was registered: the backward still pairs with the forward
    assert kernels.registered()[F.gelu_forward] is registered_gelu
    assert kernels.registered()[F.gelu_backward] is not ops.gelu_backward
    kernels.register((F.gelu_forward, F.gelu_backward), (ops.gelu_forward, ops.gelu_backward),
                     replaces=True)
    with kernels.use("engine"):
        assert kernels.pick(F.gelu_forward) is ops.gelu_forward
        assert kernels.pick(F.gelu_backward) is ops.gelu_backward

    def lonely():
        pass

    kernels.register(lonely, ops.gelu_forward)  # a first fast form needs no word
    assert kernels.registered()[lonely] is ops.gelu_forward
    del kernels._fast[lonely]


def test_the_engine_registers_blas_as_the_gemm_and_autocast_rounds_through_it():
    assert kernels.register_gemm(np.matmul) is blas.matmul  # what `import glassllm` set
    try:
        a = np.full((2, 2), 256.0, np.float32)
        with amp.autocast("float16"):
            assert np.isposinf(kernels.matmul(a, a)).all()  # 2 * 65536 > float16's max
        np.testing.assert_array_equal(kernels.matmul(a, a), a @ a)
    finally:
        kernels.register_gemm(blas.matmul)


def python(code: str, **env) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(SRC), **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ,
                          capture_output=True, text=True, timeout=120)


def test_environment_variable_chooses_the_mode_and_a_bad_value_is_one_clear_error():
    out = python("""
        import glassllm
        from glassllm import kernels
        forms = kernels.registered()
        print(kernels.mode(), len(forms), all(kernels.pick(f) is f for f in forms))
    """, GLASSLLM_KERNELS="reference")
    assert out.returncode == 0, out.stderr
    mode, count, all_references = out.stdout.split()
    assert mode == "reference" and int(count) >= 25 and all_references == "True"
    bad = python("import glassllm; glassllm.GlassLM(glassllm.Config(d_model=8, n_heads=2))([1])",
                 GLASSLLM_KERNELS="fast")
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines()[-1] == (
        "ValueError: GLASSLLM_KERNELS: expected 'engine' or 'reference', got 'fast'")
    # the command line says it in one line, naming the variable
    cli = subprocess.run([sys.executable, "-m", "glassllm.cli", "train", "--steps", "1"],
                         env={**os.environ, "PYTHONPATH": str(SRC), "GLASSLLM_KERNELS": "fast"},
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode != 0 and cli.stderr.strip().splitlines() == [
        "glassllm train: error: GLASSLLM_KERNELS: expected 'engine' or 'reference', got 'fast'"]


def test_the_glass_imports_neither_the_engine_nor_autocast_and_runs_without_them():
    """glassllm's package __init__ imports amp and the engine; here it is skipped and both are
    blocked: the glass modules import, train a step and generate on their references alone."""
    out = python(f"""
        import importlib.abc, sys, types
        import numpy as np
        blocked = []

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.startswith(("glassllm.engine", "glassllm.amp")):
                    blocked.append(name)
                    raise ImportError(name + " is blocked")

        sys.meta_path.insert(0, Block())
        package = types.ModuleType("glassllm")
        package.__path__ = [{str(SRC / "glassllm")!r}]
        sys.modules["glassllm"] = package
        from glassllm import functional, generate, kernels, model, optim, tensor  # noqa
        m = model.GlassLM(model.Config(vocab_size=11, d_model=8, n_layers=1, n_heads=2,
                                       max_len=8))
        ids = np.arange(6).reshape(1, 6) % 11
        loss = m.loss(ids, (ids + 1) % 11)
        loss.backward()
        optim.clip_grad_norm(m.parameters(), 1.0)
        optim.AdamW(m.parameters()).step()
        tokens = generate.generate(m, [1, 2], 3, generate.Sampling(temperature=0))
        print(kernels.registered() == {{}}, np.isfinite(loss.item()), len(tokens), blocked)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "3", "[]"]


# --------------------------------------------------------------------------- reused buffers
def test_a_pooled_buffer_is_handed_out_again_only_once_nothing_references_it(monkeypatch):
    from glassllm.engine import buffers
    monkeypatch.setattr(buffers, "MIN_BYTES", 64)
    buffers.clear()
    a = buffers.empty((4, 8), np.float32)
    b = buffers.empty((4, 8), np.float32)
    assert a is not b and a.shape == (4, 8) and a.dtype == np.float32 and a.flags.c_contiguous
    view = a.reshape(-1)[2:]  # a view holds its base
    del a
    c = buffers.empty((4, 8), np.float32)
    assert c is not view.base and c is not b  # both still referenced: a third buffer
    del view
    d = buffers.empty((4, 8), np.float32)
    assert d is not b and d is not c  # the first one, now free, comes back
    assert buffers.empty((4, 8), np.float64) is not d  # another dtype: its own buffers
    assert buffers.empty((2, 2), np.float32).base is None  # under MIN_BYTES: plain np.empty
    assert buffers.pooled_bytes() == 3 * 128 + 256
    freed_id = id(d)
    del d
    assert id(buffers.empty((4, 8), np.float32)) == freed_id
    buffers.clear()
    assert buffers.pooled_bytes() == 0


# --------------------------------------------------------------------------- the forms page
KERNELS_PAGE = SRC.parent / "docs" / "kernels.md"
FORMS_START = ("<!-- forms table: generated from glassllm.kernels.registered() "
               "(tests/test_kernels.py) -->")
FORMS_END = "<!-- end of the forms table -->"
# where each engine module's forms come from, as the table states it
FORM_KINDS = {
    "backward": "2: reference + NumPy (gradient buffers reused)",
    "compiled": "2: reference + compiled (numba), its NumPy form inside",
    "fast_decode": "2: reference + compiled whole step (numba), `engine.decode`'s NumPy step "
                   "inside",
    "attention": "2: reference + NumPy (query blocks)",
    "optimizer": "2: reference + NumPy (sliced)",
    "ops": "2: reference + NumPy (sliced, in place)",
}


def _short(fn) -> str:
    """`functional.rms_norm_forward`: the module path under glassllm, and the name."""
    return f"{fn.__module__.removeprefix('glassllm.')}.{fn.__name__}"


def _fast_name(fast) -> tuple[str, str]:
    """(the engine module holding `fast` under a name, that name): searched by identity, as
    forms built by a factory (the softmax pair) carry their factory's module; else the
    form's own module and name."""
    from glassllm import engine
    for module in FORM_KINDS:
        for name, value in vars(getattr(engine, module)).items():
            if value is fast:
                return module, name
    return fast.__module__.removeprefix("glassllm.engine."), fast.__qualname__


def forms_table() -> str:
    """One row per reference the engine registered: its fast form and the count of forms."""
    rows = ["| reference | engine form | forms |", "|---|---|---|"]
    for reference, fast in kernels.registered().items():
        if fast is reference:  # a pair whose forward stays the reference (the embedding's)
            rows.append(f"| `{_short(reference)}` | (the reference) | 1: reference |")
            continue
        module, name = _fast_name(fast)
        kind = FORM_KINDS.get(module, "2: reference + engine form")
        rows.append(f"| `{_short(reference)}` | `engine.{module}.{name}` | {kind} |")
    return "\n".join(rows)


def test_the_kernels_page_lists_every_op_with_its_count_of_forms():
    text = KERNELS_PAGE.read_text(encoding="utf-8")
    shown = text[text.index(FORMS_START) + len(FORMS_START):text.index(FORMS_END)].strip()
    assert shown == forms_table(), f"docs/kernels.md: replace the forms table with\n{forms_table()}"
