"""glassllm.amp: autocast's tensor-core rounding and GradScaler (against torch.amp.GradScaler)."""
import ml_dtypes
import numpy as np
import pytest

from glassllm import Config, GlassLM, Tensor, amp, devices
from glassllm import functional as F
from glassllm.optim import AdamW

BF16 = np.dtype(ml_dtypes.bfloat16)


# --------------------------------------------------------------------------- autocast
def test_matmul_outside_autocast_is_the_plain_float32_product():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 7), dtype=np.float32)
    b = rng.standard_normal((7, 3), dtype=np.float32)
    out = amp.matmul(a, b)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, a @ b)
    assert amp.matmul_dtype() is None


def test_fp16_rounds_inputs_and_output_and_overflows_to_inf():
    # 1 + 2**-12 is below float16's half-ulp at 1 (2**-11), so it rounds to 1.0 on the way in
    a = np.array([[1.0 + 2.0 ** -12, 2.0]], dtype=np.float32)
    b = np.array([[3.0], [0.5]], dtype=np.float32)
    with amp.autocast("float16"):
        out = amp.matmul(a, b)
        assert amp.matmul_dtype() == np.float16
    assert out.dtype == np.float32
    assert out[0, 0] == 4.0  # (1 * 3 + 2 * 0.5); float32 gives 4.000732...
    assert (a @ b)[0, 0] != 4.0
    # 300 * 300 = 90000 > 65504: inf in float16, as on a GPU, finite in bfloat16 and float32
    big = np.array([[300.0]], dtype=np.float32)
    with amp.autocast("float16"):
        assert np.isposinf(amp.matmul(big, big)[0, 0])
        assert np.isneginf(amp.matmul(-big, big)[0, 0])
    with amp.autocast("bfloat16"):
        bf = amp.matmul(big, big)[0, 0]
    # bfloat16 keeps 8 significant bits: 90000 = 175.78 * 512 rounds to 176 * 512
    assert bf == 90112.0
    assert amp.matmul(big, big)[0, 0] == 90000.0


def test_float32_accumulation_inside_autocast():
    # 2048 + 1 + 1 + ... : in float16 accumulation each +1 would be lost (ulp at 2048 is 2);
    # with float32 accumulation the sum is exact, then rounded once to float16.
    n = 64
    a = np.ones((1, n + 1), dtype=np.float32)
    b = np.ones((n + 1, 1), dtype=np.float32)
    b[0, 0] = 2048.0
    with amp.autocast("float16"):
        out = amp.matmul(a, b)[0, 0]
    assert out == np.float32(np.float16(2048.0 + n))


def test_autocast_matches_independent_float64_reference():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 6, 8), dtype=np.float32)
    b = rng.standard_normal((4, 8, 5), dtype=np.float32)
    for name, low in (("float16", np.float16), ("bfloat16", BF16)):
        ref = (a.astype(low).astype(np.float64) @ b.astype(low).astype(np.float64))
        ref = ref.astype(np.float32).astype(low).astype(np.float32)
        with amp.autocast(name):
            out = amp.matmul(a, b)
        # float32 vs float64 accumulation can differ by 1 float32 ulp, which may flip a
        # rounding tie in the low dtype at most once in a while: allow one low-dtype ulp
        ulp = 2.0 ** -10 if low is np.float16 else 2.0 ** -7
        np.testing.assert_allclose(out, ref, rtol=ulp, atol=0)
        assert np.mean(out == ref) > 0.95
        assert not np.array_equal(out, a @ b)


def test_autocast_nests_restores_and_rejects_unknown_dtypes():
    with amp.autocast("bf16"):
        assert amp.matmul_dtype() == BF16
        with amp.autocast("fp16"):
            assert amp.matmul_dtype() == np.float16
        assert amp.matmul_dtype() == BF16
        with amp.autocast(None):
            assert amp.matmul_dtype() is None
    assert amp.matmul_dtype() is None
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        with amp.autocast("float32"):
            pass
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        with amp.autocast(np.float64):
            pass
    with pytest.raises(RuntimeError):
        with amp.autocast("float16"):
            raise RuntimeError("boom")
    assert amp.matmul_dtype() is None


def test_keep_autocast_is_free_in_float32_and_replays_the_forward_dtype():
    def fn(g):
        return amp.matmul_dtype()

    assert amp.keep_autocast(fn) is fn
    with amp.autocast("float16"):
        wrapped = amp.keep_autocast(fn)
    assert wrapped(None) == np.float16  # called after the block closed
    assert amp.matmul_dtype() is None


def test_backward_matmuls_run_in_the_forward_precision():
    # y = x @ w with x = 300, w = 1; dL/dy = 300 -> dL/dw = x * 300 = 90000 overflows float16.
    x = Tensor(np.array([[300.0]], dtype=np.float32))
    w = Tensor(np.array([[1.0]], dtype=np.float32), requires_grad=True)
    with amp.autocast("float16"):
        y = F.linear(x, w)
    (y * 300.0).sum().backward()  # outside the with block, as a training loop does
    assert np.isposinf(w.grad[0, 0])
    w.grad = None
    (F.linear(x, w) * 300.0).sum().backward()
    assert w.grad[0, 0] == 90000.0


def test_model_under_autocast_keeps_float32_weights_loss_and_is_close_to_fp32():
    cfg = Config(vocab_size=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_len=16)
    model = GlassLM(cfg, seed=0)
    ids = np.random.default_rng(0).integers(0, 32, size=(2, 16))
    targets = np.roll(ids, -1, axis=1)
    ref = model(ids).numpy()
    ref_loss = model.loss(ids, targets)
    for name, tol in (("float16", 5e-3), ("bfloat16", 4e-2)):
        with amp.autocast(name):
            logits = model(ids).numpy()
            loss = model.loss(ids, targets)
        assert logits.dtype == np.float32 and loss.numpy().dtype == np.float32
        assert not np.array_equal(logits, ref)  # the rounding is really applied
        np.testing.assert_allclose(logits, ref, atol=tol * np.abs(ref).max())
        assert abs(loss.item() - ref_loss.item()) < tol * ref_loss.item()
        # the unembedding's output (logits) carries the low dtype's rounding exactly
        low = amp.resolve_dtype(name)
        np.testing.assert_array_equal(logits, logits.astype(low).astype(np.float32))
    assert all(devices.host_dtype(p.data) == np.float32 for p in model.parameters())


# --------------------------------------------------------------------------- Tensor @ Tensor
MATMUL_SHAPES = [((5, 7), (7, 3)), ((2, 3, 4, 5), (5, 6)), ((2, 1, 4, 5), (3, 5, 6)),
                 ((4, 5), (3, 5, 6)), ((3, 8, 64), (64, 16)), ((5, 3, 1, 4, 9), (3, 6, 9, 2)),
                 ((7,), (7, 3)), ((4, 7), (7,)), ((7,), (7,)), ((2, 4, 7), (7,)),
                 ((64,), (2, 64, 5))]


def _operands(shape_a, shape_b, seed=0, scale=4.0):
    rng = np.random.default_rng(seed)
    return (scale * rng.standard_normal(shape_a)).astype(np.float32), \
        (scale * rng.standard_normal(shape_b)).astype(np.float32)


def test_tensor_matmul_is_autocast_and_overflows_above_65504():
    # 256 * 256 = 65536 > 65504 (float16's largest finite value): inf, as on a GPU; 255 * 256
    # = 65280 is representable. The same products outside autocast stay finite.
    for shape_a, shape_b in ([(1, 1), (1, 1)], [(1,), (1,)], [(2, 1, 1), (1, 1)]):
        big = Tensor(np.full(shape_a, 256.0, dtype=np.float32))
        w = Tensor(np.full(shape_b, 256.0, dtype=np.float32))
        with amp.autocast("float16"):
            assert np.isposinf((big @ w).numpy()).all()
            assert np.isneginf((-big @ w).numpy()).all()
            assert ((big @ (w * np.float32(255 / 256))).numpy() == 65280.0).all()
        assert ((big @ w).numpy() == 65536.0).all()
        with amp.autocast("bfloat16"):
            assert ((big @ w).numpy() == 65536.0).all()  # bfloat16 has float32's range
    # 120000 (the example) in a (2, 2) product
    x = Tensor(np.array([[300.0, 100.0], [1.0, 1.0]], dtype=np.float32))
    with amp.autocast("float16"):
        assert np.isposinf((x @ x.T).numpy()[0, 0])


@pytest.mark.parametrize("shapes", [s for s in MATMUL_SHAPES if len(s[1]) == 2], ids=str)
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_tensor_matmul_rounds_as_the_fused_ops_forward_and_backward(shapes, name):
    """x @ W is bit-identical to the fused `linear(x, W)` under autocast -- inputs rounded to
    the low dtype, float32 accumulation, output rounded; the weight's gradient one folded
    GEMM -- forward and backward, the backward in the forward's precision although it runs
    after the with block."""
    a_np, b_np = _operands(*shapes)
    g = _operands(np.matmul(a_np, b_np).shape, (1,), seed=1)[0]
    a, b = Tensor(a_np, requires_grad=True), Tensor(b_np, requires_grad=True)
    fa, fb = Tensor(a_np, requires_grad=True), Tensor(b_np, requires_grad=True)
    with amp.autocast(name):
        out, fused = a @ b, F.linear(fa, fb)
        np.testing.assert_array_equal(out.data, amp.matmul(a_np, b_np))
    out.backward(g)
    fused.backward(g)
    low = amp.resolve_dtype(name)
    np.testing.assert_array_equal(out.data, fused.data)
    np.testing.assert_array_equal(out.data, amp.round_to(out.data, low))  # low dtype values
    assert not np.array_equal(out.data, np.matmul(a_np, b_np))  # the rounding is applied
    for mine, theirs in ((a.grad, fa.grad), (b.grad, fb.grad)):
        np.testing.assert_array_equal(mine, theirs)
        np.testing.assert_array_equal(mine, amp.round_to(mine, low))
    plain = Tensor(a_np, requires_grad=True)
    (plain @ Tensor(b_np)).backward(g)
    assert not np.array_equal(plain.grad, a.grad)  # float32 gradients differ: rounding seen


def test_tensor_matmul_backward_runs_in_the_forward_precision():
    # d(x @ w)/dw with x = 300 and upstream gradient 300: 90000 overflows float16
    x = Tensor(np.array([[300.0]], dtype=np.float32))
    w = Tensor(np.array([[1.0]], dtype=np.float32), requires_grad=True)
    with amp.autocast("float16"):
        y = x @ w
    (y * 300.0).sum().backward()  # after the block, as a training loop does
    assert np.isposinf(w.grad[0, 0])
    w.grad = None
    (x @ w * 300.0).sum().backward()  # a float32 forward has a float32 backward
    assert w.grad[0, 0] == 90000.0


def test_tensor_matmul_of_float64_operands_is_never_rounded():
    a, b = _operands((3, 5), (5, 2))
    a64, b64 = Tensor(a.astype(np.float64)), Tensor(b.astype(np.float64))
    with amp.autocast("float16"):
        out = a64 @ b64
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out.data, a.astype(np.float64) @ b.astype(np.float64))


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_tensor_matmul_matches_torch_cpu_autocast(shapes, name):
    torch = pytest.importorskip("torch")
    a_np, b_np = _operands(*shapes)
    g_np = _operands(np.matmul(a_np, b_np).shape or (1,), (1,), seed=1)[0]
    a, b = Tensor(a_np, requires_grad=True), Tensor(b_np, requires_grad=True)
    with amp.autocast(name):
        out = a @ b
    out.backward(g_np.reshape(out.shape))
    ta = torch.tensor(a_np, requires_grad=True)
    tb = torch.tensor(b_np, requires_grad=True)
    with torch.autocast("cpu", dtype=getattr(torch, name)):
        tout = ta @ tb
    assert tout.dtype == getattr(torch, name)
    tout.backward(torch.tensor(g_np.reshape(out.shape)).to(tout.dtype))
    ulp = 2.0 ** -10 if name == "float16" else 2.0 ** -7  # one low-dtype ulp, relative
    for mine, theirs in ((out.data, tout.detach().float().numpy()),
                         (a.grad, ta.grad.numpy()), (b.grad, tb.grad.numpy())):
        assert mine.shape == theirs.shape
        # Bit-identical on this machine for every shape here (the gradient of a shared
        # operand included: both fold the batch into one GEMM); float32 accumulation in
        # another BLAS's order could flip a rounding tie now and then, so allow one ulp.
        np.testing.assert_allclose(mine, theirs, rtol=ulp, atol=0)
        assert np.mean(mine == theirs) > 0.95


def test_autocast_state_is_per_thread():
    import threading
    seen = {}
    a = np.full((1, 1), 256.0, dtype=np.float32)

    def other_thread():
        seen["dtype"] = amp.matmul_dtype()
        seen["product"] = (Tensor(a) @ Tensor(a)).numpy()[0, 0]
        with amp.autocast("bfloat16"):
            seen["inner"] = amp.matmul_dtype()
            started.set()
            resume.wait(10)

    started, resume = threading.Event(), threading.Event()
    with amp.autocast("float16"):
        worker = threading.Thread(target=other_thread)
        worker.start()
        started.wait(10)
        # the other thread's autocast("bfloat16") does not reach this one
        assert amp.matmul_dtype() == np.float16
        assert np.isposinf((Tensor(a) @ Tensor(a)).numpy()[0, 0])
        resume.set()
        worker.join(10)
    assert seen == {"dtype": None, "product": 65536.0, "inner": BF16}
    assert amp.matmul_dtype() is None


def test_parallel_workers_carry_the_callers_autocast_state(monkeypatch):
    """glassllm.engine.parallel runs elementwise passes in pool threads; whatever a work function
    computes there sees the caller's autocast dtype, and the pool threads are left clean."""
    from glassllm.engine import parallel
    monkeypatch.setattr(parallel, "_num_threads", 2)
    monkeypatch.setattr(parallel, "_pool", None)
    seen = []

    def work(rows):
        seen.append((threading_name(), amp.matmul_dtype()))

    import threading

    def threading_name():
        return threading.current_thread().name

    n_rows = 8 * parallel.SLICE_ELEMENTS // 1024
    with amp.autocast("float16"):
        parallel.for_slices(work, n_rows, 1024)
    assert len({name for name, _ in seen}) == 2  # the caller and a pool thread both ran
    assert {dtype for _, dtype in seen} == {np.dtype(np.float16)}
    seen.clear()
    parallel.for_slices(work, n_rows, 1024)
    assert len({name for name, _ in seen}) == 2 and {dtype for _, dtype in seen} == {None}
    for worker in parallel._pool:
        worker.stop()


# --------------------------------------------------------------------------- GradScaler
# clean (0) / overflowing (1) iterations, with growth_interval=3
PATTERN = [0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0]
# (scale after update(), step skipped) written out by hand from PyTorch's rules:
# 3 clean steps -> x2; an overflow -> x0.5 and the clean count restarts.
EXPECTED = [(65536.0, False), (65536.0, False), (131072.0, False), (65536.0, True),
            (65536.0, False), (65536.0, False), (131072.0, False), (131072.0, False),
            (65536.0, True), (32768.0, True), (32768.0, False), (32768.0, False),
            (65536.0, False)]


def _drive_glassllm(pattern, **kwargs):
    p = Tensor(np.zeros(3, dtype=np.float32), requires_grad=True)
    opt = AdamW([p], lr=0.1, weight_decay=0.0)
    scaler = amp.GradScaler(**kwargs)
    out = []
    for overflow in pattern:
        opt.zero_grad()
        scaler.scale((p * np.float32(1.0)).sum()).backward()
        if overflow:
            p.grad[1] = np.inf
        before = p.numpy().copy()
        scaler.step(opt)
        scaler.update()
        out.append((scaler.get_scale(), bool(np.array_equal(before, p.data))))
    return out, scaler


def _drive_torch(pattern, **kwargs):
    torch = pytest.importorskip("torch")
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([p], lr=0.1, weight_decay=0.0)
    scaler = torch.amp.GradScaler("cpu", **kwargs)
    out = []
    for overflow in pattern:
        opt.zero_grad()
        scaler.scale((p * 1.0).sum()).backward()
        if overflow:
            with torch.no_grad():
                p.grad[1] = float("inf")
        before = p.detach().clone()
        scaler.step(opt)
        scaler.update()
        out.append((scaler.get_scale(), bool(torch.equal(before, p.detach()))))
    return out, scaler


def test_scale_trajectory_matches_the_written_out_list():
    out, scaler = _drive_glassllm(PATTERN, growth_interval=3)
    assert out == EXPECTED
    assert scaler.state_dict() == {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                                   "growth_interval": 3, "_growth_tracker": 0}


@pytest.mark.parametrize("kwargs", [dict(growth_interval=3),
                                    dict(init_scale=1024.0, growth_factor=4.0,
                                         backoff_factor=0.25, growth_interval=2),
                                    dict()])
def test_scale_trajectory_matches_torch_grad_scaler(kwargs):
    pattern = PATTERN + [1, 0, 0, 0, 0, 0, 1, 0]
    ours, our_scaler = _drive_glassllm(pattern, **kwargs)
    theirs, their_scaler = _drive_torch(pattern, **kwargs)
    assert ours == theirs
    assert our_scaler.state_dict() == their_scaler.state_dict()


def test_defaults_are_pytorchs():
    scaler = amp.GradScaler()
    assert scaler.get_scale() == 2.0 ** 16
    assert scaler.state_dict() == {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                                   "growth_interval": 2000, "_growth_tracker": 0}
    torch = pytest.importorskip("torch")
    their = torch.amp.GradScaler("cpu")
    their.scale(torch.ones(()))  # materialise torch's lazy scale
    assert their.state_dict() == scaler.state_dict()


def test_state_dict_round_trip_and_exchange_with_torch():
    _, scaler = _drive_glassllm([0, 0, 1, 0], growth_interval=3)
    fresh = amp.GradScaler()
    fresh.load_state_dict(scaler.state_dict())
    assert fresh.state_dict() == scaler.state_dict() and fresh.get_growth_tracker() == 1
    torch = pytest.importorskip("torch")
    their = torch.amp.GradScaler("cpu")
    their.load_state_dict(scaler.state_dict())
    assert their.get_scale() == scaler.get_scale()
    with pytest.raises(RuntimeError, match="disabled"):
        amp.GradScaler().load_state_dict({})


def test_unscale_divides_exactly_and_may_run_once_per_step():
    p = Tensor(np.zeros(4, dtype=np.float32), requires_grad=True)
    opt = AdamW([p], lr=0.1)
    scaler = amp.GradScaler(init_scale=1024.0)
    g = np.array([1.0, -2.5, 3e-3, 0.0], dtype=np.float32)
    scaled = scaler.scale((p * g).sum())
    assert scaled.item() == 0.0 and scaled.requires_grad
    scaled.backward()
    np.testing.assert_array_equal(p.grad, g * 1024)
    scaler.unscale_(opt)
    np.testing.assert_array_equal(p.grad, g)
    assert not scaler.found_inf(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    scaler.update()
    scaler.unscale_(opt)  # a new iteration: allowed again


def test_step_unscales_itself_and_update_needs_an_inf_check():
    p = Tensor(np.ones(2, dtype=np.float32), requires_grad=True)
    opt = AdamW([p], lr=0.1, weight_decay=0.0)
    scaler = amp.GradScaler(init_scale=8.0)
    with pytest.raises(RuntimeError, match="no inf checks"):
        scaler.update()
    scaler.scale(p.sum()).backward()
    scaler.step(opt)  # unscale_ happens inside: AdamW sees grad 1, not 8
    assert opt.steps == [1]
    np.testing.assert_allclose(opt.m[0], 0.1 * np.ones(2))


def test_growth_stops_at_the_float32_range_and_disabled_is_a_pass_through():
    scaler = amp.GradScaler(init_scale=2.0 ** 127, growth_interval=1)
    p = Tensor(np.ones(1, dtype=np.float32), requires_grad=True)
    opt = AdamW([p], lr=0.0)
    p.grad = np.ones(1, dtype=np.float32)
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0 ** 127 and scaler.get_growth_tracker() == 0

    off = amp.GradScaler(enabled=False)
    loss = p.sum()
    assert off.scale(loss) is loss and off.get_scale() == 1.0 and off.state_dict() == {}
    p.grad = np.array([np.inf], dtype=np.float32)
    off.unscale_(opt)
    assert p.grad[0] == np.inf  # untouched
    off.update()  # no error, no state


def test_invalid_scaler_settings_raise():
    with pytest.raises(ValueError, match="growth_factor"):
        amp.GradScaler(growth_factor=1.0)
    with pytest.raises(ValueError, match="backoff_factor"):
        amp.GradScaler(backoff_factor=1.5)
    with pytest.raises(ValueError, match="growth_interval"):
        amp.GradScaler(growth_interval=0)


def test_fast_float16_rounding_is_bit_identical_to_numpys_cast():
    rng = np.random.default_rng(0)
    random_bits = rng.integers(0, 2 ** 32, size=200_000, dtype=np.uint64).astype(np.uint32)
    # every finite float16 value, the midpoints between neighbours (ties) and one float32 ulp
    # either side of them, the overflow boundary, subnormals, zeros, infinities
    h = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    h = np.sort(h[np.isfinite(h)])
    mid = ((h[:-1].astype(np.float64) + h[1:]) / 2).astype(np.float32)
    x = np.concatenate([random_bits.view(np.float32), h, mid,
                        np.nextafter(mid, np.float32(np.inf)),
                        np.nextafter(mid, np.float32(-np.inf)),
                        np.float32([65504, 65519.996, 65520, -65520, 1e30, np.inf, -np.inf, np.nan,
                                    0.0, -0.0, 2 ** -25, -(2 ** -25), 3 * 2 ** -26, 2 ** -24])])
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x.astype(np.float16).astype(np.float32)
    out = amp.round_to(x, np.dtype(np.float16))
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(out), nan)
    np.testing.assert_array_equal(out[~nan].view(np.uint32), ref[~nan].view(np.uint32))
