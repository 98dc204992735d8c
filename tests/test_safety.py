"""glassllm.training.safety: TrainStep (skip on non-finite, clip, scaler), StepCSVLog, SkipRateMonitor."""
import csv
import math
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from glassllm import Config, GlassLM, Tensor, amp, optim
from glassllm.optim import AdamW, clip_grad_norm, global_grad_norm, lr_schedule
from glassllm.training import safety
from glassllm.training.safety import (CSV_COLUMNS, SkipRateExceeded, SkipRateMonitor, StepCSVLog,
                             StepRecord, TrainStep)
from glassllm.train import get_batch, train

CFG = Config(vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, max_len=8)
DATA = np.tile(np.arange(16, dtype=np.int64), 20)


class InjectInf:
    """Wraps a model: on the chosen steps the loss stays finite but one gradient becomes inf."""

    def __init__(self, model, steps):
        self.model, self.steps, self.step = model, set(steps), 0

    def loss(self, x, y):
        loss = self.model.loss(x, y)
        if self.step in self.steps:
            p = self.model.token_embedding.weight
            # adds 0 to the loss; its backward hands p an inf gradient
            loss = loss + Tensor.from_op(np.float32(0.0), (p,),
                                         lambda g: (np.full(p.shape, np.inf, np.float32),))
        self.step += 1
        return loss


def _snapshot(model, opt):
    return ([p.data.copy() for p in model.parameters()], [m.copy() for m in opt.m],
            [v.copy() for v in opt.v], list(opt.steps), opt.t)


def _assert_same(a, b):
    for xs, ys in zip(a[:3], b[:3]):
        assert all(np.array_equal(x, y) for x, y in zip(xs, ys))
    assert a[3] == b[3] and a[4] == b[4]


def test_fp32_train_step_is_bit_identical_to_spec_001_train():
    reference = GlassLM(CFG, seed=0)
    train(reference, DATA, steps=4, batch_size=2, seq_len=8, warmup=2, log=None)
    model = GlassLM(CFG, seed=0)
    opt = AdamW(model.parameters())
    step_fn = TrainStep(model, opt)  # fp32, clip 1.0, scaler disabled
    assert not step_fn.scaler.is_enabled()
    rng = np.random.default_rng(0)
    records = []
    for step in range(4):
        x, y = get_batch(DATA, 2, 8, rng)
        records.append(step_fn(x, y, lr_schedule(step, 4, 0.003, 2), step))
    for a, b in zip(reference.parameters(), model.parameters()):
        np.testing.assert_array_equal(a.data, b.data)
    r = records[0]
    assert (r.step, r.lr, r.skipped, r.skip_reason, r.scaler_scale) == (0, 0.0015, False, "", 1.0)
    assert r.grad_l2_pre_clip > 1.0  # this batch is clipped, to 1 (up to the 1e-6 guard)
    assert r.grad_l2_post_clip == pytest.approx(1.0, abs=1e-5)


def test_no_clip_below_the_threshold_reports_equal_norms():
    model = GlassLM(CFG, seed=0)
    step_fn = TrainStep(model, AdamW(model.parameters()), clip=1e6)
    x, y = get_batch(DATA, 2, 8, np.random.default_rng(0))
    r = step_fn(x, y, 1e-3, 0)
    assert r.grad_l2_pre_clip == r.grad_l2_post_clip > 0


@pytest.mark.parametrize("precision, micro_batches", [("fp32", 1), ("fp16", 1), ("fp32", 2)])
def test_the_norms_of_a_clipped_step_equal_a_measurement(precision, micro_batches):
    """pre_clip is the norm the clip used; post_clip, derived from it (pre_clip times the
    clip's factor), equals the norm of the clipped gradients measured again, to float32
    rounding of those gradients."""
    x, y = get_batch(DATA, 4, 8, np.random.default_rng(0))
    unclipped = GlassLM(CFG, seed=0)
    r0 = TrainStep(unclipped, AdamW(unclipped.parameters()), precision, clip=None,
                   micro_batches=micro_batches)(x, y, 1e-3, 0)
    model = GlassLM(CFG, seed=0)
    r = TrainStep(model, AdamW(model.parameters()), precision, clip=0.25,
                  micro_batches=micro_batches)(x, y, 1e-3, 0)
    assert not r.skipped and r.grad_l2_pre_clip > 0.25
    assert r.grad_l2_pre_clip == r0.grad_l2_pre_clip == r0.grad_l2_post_clip
    measured = global_grad_norm(model.parameters())  # AdamW leaves the clipped gradients
    assert measured == pytest.approx(r.grad_l2_post_clip, rel=1e-6, abs=0)
    assert r.grad_l2_post_clip == pytest.approx(0.25, rel=1e-5)
    for p, q in zip(model.parameters(), unclipped.parameters()):  # the clip's factor
        np.testing.assert_allclose(p.grad, q.grad * (0.25 / (r.grad_l2_pre_clip + 1e-6)),
                                   rtol=1e-6, atol=1e-12)


def test_the_global_norm_is_measured_once_per_step(monkeypatch):
    calls, measure = [], optim.global_grad_norm

    def counted(params):
        calls.append(1)
        return measure(params)

    monkeypatch.setattr(optim, "global_grad_norm", counted)  # clip_grad_norm's own
    monkeypatch.setattr(safety, "global_grad_norm", counted)  # TrainStep's
    model = GlassLM(CFG, seed=0)
    step_fn = TrainStep(model, AdamW(model.parameters()), clip=0.25)
    rng = np.random.default_rng(0)
    for step in range(3):
        r = step_fn(*get_batch(DATA, 2, 8, rng), 1e-3, step)
        assert r.grad_l2_pre_clip > 0.25 and len(calls) == step + 1


def test_clip_with_a_known_norm_is_the_clip_that_measures_it():
    def grads_after(**kw):
        model = GlassLM(CFG, seed=0)
        model.loss(*get_batch(DATA, 2, 8, np.random.default_rng(0))).backward()
        params = model.parameters()
        known = global_grad_norm(params) if kw.pop("known", False) else None
        returned = clip_grad_norm(params, 0.5, norm=known)
        return returned, [p.grad.copy() for p in params]

    norm, measured = grads_after()
    again, known = grads_after(known=True)
    assert norm == again > 0.5
    assert all(np.array_equal(a, b) for a, b in zip(measured, known))


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2", None])
def test_micro_batches_must_be_a_positive_integer(bad):
    model = GlassLM(CFG, seed=0)
    with pytest.raises(ValueError) as info:
        TrainStep(model, AdamW(model.parameters()), micro_batches=bad)
    assert str(info.value) == f"TrainStep: micro_batches must be an integer >= 1, got {bad!r}"
    step_fn = TrainStep(model, AdamW(model.parameters()), micro_batches=np.int64(2))
    assert type(step_fn.micro_batches) is int and step_fn.micro_batches == 2


def test_fp16_overflowing_activation_skips_the_step_and_changes_nothing():
    model = GlassLM(CFG, seed=0)
    opt = AdamW(model.parameters())
    step_fn = TrainStep(model, opt, precision="fp16")
    assert step_fn.scaler.is_enabled() and step_fn.scaler.get_scale() == 65536.0
    rng = np.random.default_rng(0)
    for step in range(2):  # moments and counts become non-zero first
        x, y = get_batch(DATA, 2, 8, rng)
        assert not step_fn(x, y, 1e-3, step).skipped
    # a norm gain of 1e5 puts activations far above float16's 65504 at the next matmul
    model.blocks[0].attention_norm.weight.data[:] = 1e5
    x, y = get_batch(DATA, 2, 8, rng)
    assert math.isfinite(model.loss(x, y).item())  # fp32 copes
    with amp.autocast("float16"):
        h = model.blocks[0].attention_norm(model.token_embedding(x))
        assert np.isinf(amp.matmul(h.data, model.blocks[0].attention.query.weight.data)).any()
    before = _snapshot(model, opt)
    r = step_fn(x, y, 1e-3, 2)
    assert r.skipped and r.skip_reason == "nonfinite_loss" and not math.isfinite(r.loss)
    assert r.scaler_scale == 32768.0  # halved on the skip
    _assert_same(before, _snapshot(model, opt))


def test_injected_inf_gradient_is_skipped_bit_exactly_and_halves_the_scale():
    model = GlassLM(CFG, seed=0)
    opt = AdamW(model.parameters())
    step_fn = TrainStep(InjectInf(model, steps=[2]), opt, precision="fp16",
                        scaler=amp.GradScaler(growth_interval=2))
    rng = np.random.default_rng(0)
    records, snapshots = [], []
    for step in range(5):
        x, y = get_batch(DATA, 2, 8, rng)
        snapshots.append(_snapshot(model, opt))
        records.append(step_fn(x, y, 1e-3, step))
    assert [r.skipped for r in records] == [False, False, True, False, False]
    assert records[2].skip_reason == "nonfinite_grad" and math.isinf(records[2].grad_l2_pre_clip)
    assert math.isfinite(records[2].loss) and math.isnan(records[2].grad_l2_post_clip)
    assert [r.scaler_scale for r in records] == [65536.0, 131072.0, 65536.0, 65536.0, 131072.0]
    _assert_same(snapshots[2], snapshots[3])
    assert opt.t == 4 and opt.steps == [4] * len(opt.params)
    assert all(p.dtype == np.float32 for p in model.parameters())


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_model_error_propagates_with_weights_moments_and_scale_unchanged(precision):
    """The docstring's contract: bad ids raise the model's ValueError before the weights, the
    AdamW moments and step counts or the loss scale change; the gradients are cleared."""
    model = GlassLM(CFG, seed=0)
    opt = AdamW(model.parameters())
    step_fn = TrainStep(model, opt, precision=precision,
                        scaler=amp.GradScaler(enabled=precision == "fp16", growth_interval=1))
    rng = np.random.default_rng(0)
    for step in range(2):  # moments, counts and the scale move first
        x, y = get_batch(DATA, 2, 8, rng)
        assert not step_fn(x, y, 1e-3, step).skipped
    before, scale = _snapshot(model, opt), step_fn.scaler.get_scale()
    scaler_state = step_fn.scaler.state_dict()
    x, y = get_batch(DATA, 2, 8, rng)
    x[0, 3] = CFG.vocab_size  # an id outside the vocabulary
    with pytest.raises(ValueError, match=r"token id 16 at position \(0, 3\) is outside"):
        step_fn(x, y, 1e-3, 2)
    _assert_same(before, _snapshot(model, opt))
    assert step_fn.scaler.get_scale() == scale and step_fn.scaler.state_dict() == scaler_state
    assert all(p.grad is None for p in model.parameters())


def test_bf16_trains_without_a_scaler_and_state_dict_round_trips():
    model = GlassLM(CFG, seed=0)
    step_fn = TrainStep(model, AdamW(model.parameters()), precision="bf16")
    assert not step_fn.scaler.is_enabled()
    rng = np.random.default_rng(0)
    losses = [step_fn(*get_batch(DATA, 2, 8, rng), 3e-3, s).loss for s in range(3)]
    assert all(math.isfinite(v) for v in losses)
    assert step_fn.state_dict() == {"precision": "bf16", "scaler": {}}

    fp16 = TrainStep(model, AdamW(model.parameters()), precision="fp16",
                     scaler=amp.GradScaler(init_scale=256.0))
    fp16(*get_batch(DATA, 2, 8, rng), 3e-3, 0)
    restored = TrainStep(model, AdamW(model.parameters()), precision="fp16")
    restored.load_state_dict(fp16.state_dict())
    assert restored.scaler.get_scale() == 256.0 and restored.scaler.get_growth_tracker() == 1
    with pytest.raises(ValueError, match="precision"):
        TrainStep(model, AdamW(model.parameters()), precision="fp8")


# --------------------------------------------------------------------------- CSV log
def _read_rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_csv_has_the_exact_header_and_one_row_per_step(tmp_path):
    path = tmp_path / "steps.csv"
    model = GlassLM(CFG, seed=0)
    step_fn = TrainStep(InjectInf(model, steps=[1]), AdamW(model.parameters()), precision="fp16")
    rng = np.random.default_rng(0)
    with StepCSVLog(path) as log:
        assert _read_rows(path) == [list(CSV_COLUMNS)]  # header is on disk at once
        for step in range(3):
            record = step_fn(*get_batch(DATA, 2, 8, rng), 1e-3, step)
            log.write(record)
            assert len(_read_rows(path)) == step + 2  # flushed after every row
    text = path.read_text()
    assert text.splitlines()[0] == ("step,lr,grad_l2_pre_clip,grad_l2_post_clip,loss,skipped,"
                                    "skip_reason,scaler_scale")
    rows = list(csv.DictReader(path.open(newline="")))
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    assert [r["skipped"] for r in rows] == ["0", "1", "0"]
    assert [r["skip_reason"] for r in rows] == ["", "nonfinite_grad", ""]
    assert [float(r["scaler_scale"]) for r in rows] == [65536.0, 32768.0, 32768.0]
    assert float(rows[1]["grad_l2_pre_clip"]) == math.inf
    assert float(rows[0]["lr"]) == 1e-3 and float(rows[0]["loss"]) > 0

    with StepCSVLog(path, append=True) as log:
        log.write(StepRecord(3, 1e-3, 0.5, 0.5, 2.0, False, "", 1.0))
    assert [r[0] for r in _read_rows(path)] == ["step", "0", "1", "2", "3"]
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="header"):
        StepCSVLog(tmp_path / "other.csv", append=True)


CHILD = textwrap.dedent("""
    import sys, numpy as np
    from glassllm import Config, GlassLM
    from glassllm.optim import AdamW
    from glassllm.training.safety import StepCSVLog, TrainStep
    from glassllm.train import get_batch
    cfg = Config(vocab_size=16, d_model=16, n_layers=1, n_heads=2, max_len=8)
    model = GlassLM(cfg, seed=0)
    step_fn = TrainStep(model, AdamW(model.parameters()), precision="fp16")
    data = np.tile(np.arange(16), 20)
    rng = np.random.default_rng(0)
    try:
        with StepCSVLog(sys.argv[1]) as log:
            for step in range(10**6):
                log.write(step_fn(*get_batch(data, 2, 8, rng), 1e-3, step))
    except KeyboardInterrupt:
        sys.exit(130)
""")


def _run_until_rows(path, n_rows, timeout=120.0):
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) > n_rows:
            return proc
        if proc.poll() is not None:
            raise AssertionError(f"child exited early: {proc.communicate()[1].decode()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the CSV did not grow: rows are not flushed")


def _check_complete(path):
    rows = _read_rows(path)
    assert rows[0] == list(CSV_COLUMNS)
    assert len(rows) > 4
    for i, row in enumerate(rows[1:]):
        assert len(row) == len(CSV_COLUMNS) and int(row[0]) == i
        assert all(math.isfinite(float(row[k])) for k in (1, 2, 3, 4, 7))
    assert path.read_text().endswith("\n")  # no half-written last row


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_csv_survives_an_interrupt_mid_run(tmp_path, sig):
    path = tmp_path / "steps.csv"
    proc = _run_until_rows(path, 4)
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    assert proc.returncode == (130 if sig == signal.SIGINT else -signal.SIGKILL)
    _check_complete(path)


# --------------------------------------------------------------------------- skip-rate alert
def test_skip_rate_monitor_fires_after_window_consecutive_steps_above_the_limit():
    monitor = SkipRateMonitor(max_rate=0.5, window=10)
    for step in range(9):
        monitor.update(True, step)
    with pytest.raises(SkipRateExceeded) as err:
        monitor.update(True, 9)
    assert err.value.rate == 1.0 and err.value.step == 9
    assert "1.000" in str(err.value) and "step 9" in str(err.value)
    assert isinstance(err.value, RuntimeError)

    # exactly at the limit is not above it: alternate skip/clean forever, no alert
    monitor = SkipRateMonitor(max_rate=0.5, window=10)
    for step in range(100):
        monitor.update(step % 2 == 0, step)
    assert monitor.rate == 0.5
    with pytest.raises(ValueError):
        SkipRateMonitor(max_rate=1.0)


def test_skip_rate_alert_fires_on_forced_nonfinite_grads_and_not_on_a_clean_run():
    rng = np.random.default_rng(0)

    def run(steps_with_inf, n_steps):
        model = GlassLM(CFG, seed=0)
        step_fn = TrainStep(InjectInf(model, steps_with_inf), AdamW(model.parameters()),
                            precision="fp16")
        monitor = SkipRateMonitor(max_rate=0.2, window=5)
        for step in range(n_steps):
            record = step_fn(*get_batch(DATA, 2, 8, rng), 1e-3, step)
            monitor.update(record.skipped, step)
        return step_fn

    clean = run([], 12)  # no alert
    assert clean.scaler.get_scale() == 65536.0
    with pytest.raises(SkipRateExceeded) as err:
        run(range(3, 100), 12)  # every step from 3 on has an inf gradient
    # rolling rate: step 3 -> 1/4 = 0.25 > 0.2 (first step above), 4 -> 2/5, 5 -> 3/5,
    # 6 -> 4/5, 7 -> 5/5 (window of 5): the 5th consecutive step above the limit is step 7
    assert err.value.step == 7 and err.value.rate == 1.0


def test_amp_demo_prints_a_skip_where_the_scale_halves(capsys):
    import importlib.util
    path = Path(__file__).resolve().parents[1] / "examples" / "amp_demo.py"
    spec = importlib.util.spec_from_file_location("amp_demo", path)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    assert demo.main(["--steps", "8", "--inject-step", "5"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line[:4] in ("STEP", "SKIP")]
    assert [line[:4] for line in lines] == ["STEP"] * 5 + ["SKIP"] + ["STEP"] * 2
    assert "scale 65536 -> 32768" in lines[5] and "unchanged: True" in lines[5]
    assert lines[6].endswith("scale 32768")


def test_csv_log_on_a_full_disk_is_an_oserror_naming_the_file(tmp_path):
    """A row that cannot be written (a full disk; here RLIMIT_FSIZE, write() fails EFBIG as
    Python ignores SIGXFSZ) is an OSError naming the CSV, from write() and from close()."""
    import os
    import resource

    path = tmp_path / "steps.csv"
    code = textwrap.dedent(f"""
        import errno
        from glassllm.training.safety import StepCSVLog, StepRecord
        record = StepRecord(step=0, lr=1e-3, grad_l2_pre_clip=1.0, grad_l2_post_clip=1.0,
                            loss=2.0, skipped=False, skip_reason="", scaler_scale=1.0)
        log = StepCSVLog({str(path)!r})
        for where in ("write", "close"):
            try:
                for _ in range(10000):
                    log.write(record) if where == "write" else log.close()
            except OSError as e:
                print(where, e.errno == errno.EFBIG, e.filename)
    """)
    limit = 4096
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"write True {path}", f"close True {path}"], \
        result.stdout
