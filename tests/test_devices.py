"""Devices (glassllm.devices): the glass on device="strict" -- the array API standard alone,
`array_api_strict` on the CPU -- gives what it gives on "cpu", through the public API: the same
initial weights, logits and every gradient to float32 rounding, the same names, the same
errors for bad input, training, generation, traces, the lens, autocast, files and resumes.

"strict" fails on any call outside the standard, on an implicit conversion to NumPy and on
arrays of two devices mixed, so a NumPy-only call in the glass fails here, on a machine
without a GPU, where it would fail on CUDA (tests/test_cuda.py holds the GPU's own checks).
"""
from __future__ import annotations

import operator
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("array_api_strict")

import glassllm
from glassllm import Config, GlassLM, Tensor, devices, kernels
from glassllm import functional as F
from glassllm.amp import GradScaler, autocast
from glassllm.generate import Sampling, generate
from glassllm.lens import interpret
from glassllm.lens.trace import Edit, run_with_cache, run_with_hooks
from glassllm.model import KVCache
from glassllm.optim import AdamW, clip_grad_norm
from glassllm.train import evaluate, train

from test_architectures import CASES, config_of, model_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = Config(vocab_size=48, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_len=32)
IDS = np.random.default_rng(0).integers(0, 48, size=(2, 10))


def host(array) -> np.ndarray:
    return devices.to_host(array)


def pair(cfg=CFG, seed=0):
    """The same model on "cpu" and on "strict"."""
    return GlassLM(cfg, seed=seed, device="cpu"), GlassLM(cfg, seed=seed, device="strict")


# --------------------------------------------------------------------------- names, moves
def test_device_names_and_their_errors():
    assert [devices.parse(d) for d in ("cpu", "CPU", "strict", "cuda", "cuda:1")] == \
        ["cpu", "cpu", "strict", "cuda:0", "cuda:1"]
    with pytest.raises(ValueError, match=r"expected 'cpu', 'cuda', 'cuda:N' or 'strict', "
                                         r"got 'tpu'"):
        GlassLM(CFG, device="tpu")


def test_cuda_without_cupy_or_a_gpu_is_one_line():
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed: tests/test_cuda.py covers this device")
    except ImportError:
        pass
    with pytest.raises(devices.DeviceUnavailable, match="CuPy is not installed") as caught:
        GlassLM(CFG, device="cuda")
    assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value)


def test_strict_refuses_implicit_host_conversion_and_mixed_devices():
    """What makes the strict pass worth running: NumPy-only habits fail there."""
    t = Tensor(np.ones((2, 3), np.float32)).to("strict")
    with pytest.raises(RuntimeError, match="convert"):
        np.asarray(t.data)
    with pytest.raises((TypeError, ValueError)):
        t + Tensor(np.ones((2, 3), np.float32))
    with pytest.raises(AttributeError):
        t.data.reshape(3, 2)  # a method NumPy has and the standard does not


@pytest.mark.parametrize("op", [operator.add, operator.sub, operator.mul, operator.truediv,
                                operator.matmul])
@pytest.mark.parametrize("first", ["cpu", "strict"])
def test_tensors_of_two_devices_mixed_are_one_line_naming_both(op, first):
    """Not the array library's own error (a conversion or type message): glassllm's, as torch's
    "Expected all tensors to be on the same device"."""
    a = Tensor(np.ones((3, 3), np.float32))
    a, b = (a, a.to("strict")) if first == "cpu" else (a.to("strict"), a)
    with pytest.raises(ValueError) as info:
        op(a, b)
    message = str(info.value)
    assert "different devices" in message and "'cpu'" in message and "'strict'" in message
    assert "\n" not in message


def test_tensor_device_numpy_and_to():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = Tensor(a, requires_grad=True)
    assert t.device == "cpu" and t.numpy() is a and t.to("cpu") is t
    s = t.to("strict")
    assert s.device == "strict" and s.requires_grad and s.grad is None
    back = s.numpy()
    assert type(back) is np.ndarray and back is not a
    np.testing.assert_array_equal(back, a)
    assert s.to("strict") is s and s.to("cpu").device == "cpu"
    assert "device='strict'" in repr(s) and s.sum().item() == 15.0


def test_same_seed_same_weights_on_every_device():
    cpu, strict = pair(Config.preset("gemma2", vocab_size=40, d_model=16, n_layers=2,
                                     n_heads=2, n_kv_heads=1, max_len=16))
    assert strict.device == "strict"
    for (name, p), (name_s, q) in zip(cpu.named_parameters(), strict.named_parameters()):
        assert name == name_s and q.device == "strict"
        np.testing.assert_array_equal(p.data, q.numpy())


def test_model_to_moves_every_tensor_and_table_and_back():
    model = GlassLM(Config.preset("gemma3", vocab_size=48, d_model=16, n_layers=2, n_heads=2,
                                  n_kv_heads=1, max_len=16, rope_local_theta=100.0),
                    device="cpu")  # (not the pass's default: the strict pass makes it strict)
    ref = model(IDS[:, :8]).numpy()
    assert model.to("strict") is model and model.device == "strict"
    assert devices.device_of(model.rope_local_cos) == "strict"
    np.testing.assert_allclose(model(IDS[:, :8]).numpy(), ref, rtol=1e-5, atol=1e-6)
    model.to("cpu")
    assert type(model.rope_cos) is np.ndarray
    np.testing.assert_array_equal(model(IDS[:, :8]).numpy(), ref)


def test_default_device_from_the_environment(monkeypatch):
    monkeypatch.setenv("GLASSLLM_DEVICE", "strict")
    assert GlassLM(CFG).device == "strict"
    monkeypatch.setenv("GLASSLLM_DEVICE", "gpu")
    with pytest.raises(ValueError, match="GLASSLLM_DEVICE: device: expected"):
        GlassLM(CFG)


# --------------------------------------------------------------------------- forward, grads
def _grads(model, ids):
    model.zero_grad()
    model.loss(ids[:, :-1], ids[:, 1:]).backward()
    return {n: host(p.grad) for n, p in model.named_parameters()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_and_every_gradient_equal_cpu(case):
    """Every family and switch: strict's logits and gradients are cpu's to float32 rounding
    (cpu runs the engine's fast forms, strict the references: the same sums, other orders)."""
    cpu = model_of(case)
    strict = model_of(case).to("strict")
    ids = np.random.default_rng(1).integers(0, cpu.cfg.vocab_size, size=(2, cpu.cfg.max_len))
    logits = strict(ids)
    assert logits.device == "strict"
    np.testing.assert_allclose(logits.numpy(), cpu(ids).numpy(), rtol=1e-4, atol=2e-5)
    want, got = _grads(cpu, ids), _grads(strict, ids)
    assert list(want) == list(got)
    for name in want:  # a key bias's gradient is 0 but for rounding (softmax's shift)
        scale = max(float(np.abs(want[name]).max()), 1e-3)
        assert float(np.abs(got[name] - want[name]).max()) <= 1e-4 * scale, name


def test_float64_tensor_ops_on_strict_equal_numpy():
    """The Tensor's own ops (the micrograd layer) in float64 on both devices."""
    rng = np.random.default_rng(2)
    a64, b64 = rng.normal(size=(3, 4)), rng.normal(size=(2, 4, 5))
    results = {}
    for device in ("cpu", "strict"):
        a, b = Tensor(a64, requires_grad=True).to(device), Tensor(b64, requires_grad=True).to(device)
        out = ((a @ b).exp().log() * 2.0 - 1.0) / 3.0
        out = (out.transpose(0, 2, 1).reshape(2, -1)[:, 1:7] ** 2).mean(axis=1).sum()
        out.backward()
        results[device] = (out.item(), host(a.grad), host(b.grad))
    assert results["cpu"][0] == pytest.approx(results["strict"][0], rel=1e-12)
    for x, y in zip(results["cpu"][1:], results["strict"][1:]):
        np.testing.assert_allclose(y, x, rtol=1e-12)


def test_bad_input_gives_the_same_errors_on_strict():
    cpu, strict = pair()
    for bad in (np.array([[1.5, 2.0]]), np.array([[1, 99]]), np.zeros((1, 0), np.int64),
                np.zeros((1, 33), np.int64), np.zeros((1, 2, 3), np.int64)):
        with pytest.raises(ValueError) as on_cpu:
            cpu(bad)
        with pytest.raises(ValueError) as on_strict:
            strict(bad)
        assert str(on_cpu.value) == str(on_strict.value)
    logits = strict(IDS)
    with pytest.raises(ValueError, match=r"target ids must be in \[0, 48\)"):
        F.cross_entropy(logits, np.full((2, 10), 48))
    with pytest.raises(ValueError, match="targets must be integer ids"):
        F.cross_entropy(logits, np.zeros((2, 10)))


# --------------------------------------------------------------------------- training
def test_train_on_strict_gives_the_losses_of_cpu():
    data = np.random.default_rng(3).integers(0, 48, size=600)
    histories = {}
    for device in ("cpu", "strict"):
        model = GlassLM(CFG, seed=0)
        histories[device] = train(model, data, steps=8, batch_size=2, seq_len=12, warmup=2,
                                  val_data=data, eval_every=4, log=None, device=device)
        assert model.device == device
        histories[device].append(evaluate(model, data, 2, 12, n_batches=2))
    got, want = histories["strict"], histories["cpu"]
    assert [sorted(e) for e in got[:-1]] == [sorted(e) for e in want[:-1]]
    np.testing.assert_allclose([e["loss"] for e in got[:-1]], [e["loss"] for e in want[:-1]],
                               rtol=1e-5)
    assert got[-1] == pytest.approx(want[-1], rel=1e-5)


def test_adamw_clip_and_autocast_training_on_strict(monkeypatch):
    """AdamW, clipping and the loss scaler with bf16 and fp16 autocast (products rounded as
    tensor cores do: on strict through the host, explicitly)."""
    for low in ("bfloat16", "float16"):
        losses = {}
        for device in ("cpu", "strict"):
            model = GlassLM(CFG, seed=0, device=device)
            opt, scaler = AdamW(model.parameters(), lr=1e-2), GradScaler()
            run = []
            for _ in range(4):
                with autocast(low):
                    loss = model.loss(IDS[:, :-1], IDS[:, 1:])
                opt.zero_grad()
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                clip_grad_norm(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()
                run.append(loss.item())
            losses[device] = run
        np.testing.assert_allclose(losses["strict"], losses["cpu"], rtol=2e-3)
        assert losses["strict"][-1] < losses["strict"][0]


def test_trainer_checkpoint_from_strict_resumes_on_cpu(tmp_path):
    from glassllm.training.data import ArrayBatches
    from glassllm.training.settings import TrainSettings
    from glassllm.training.trainer import Trainer
    data = ArrayBatches(np.random.default_rng(4).integers(0, 48, size=800))
    settings = TrainSettings(steps=6, batch_size=2, seq_len=8, warmup=1, eval_every=3,
                             eval_batches=2, checkpoint_every=3)

    def run(device, folder, resume=None, steps=6):
        folder.mkdir(exist_ok=True)
        trainer = Trainer(dataclass_replace(settings, steps=steps), data, data,
                          model_path=folder / "model.safetensors",
                          checkpoint_path=folder / "ckpt.safetensors", device=device)
        model = GlassLM(CFG, seed=0)
        return trainer.run(model, resume=resume), model

    whole, whole_model = run("cpu", tmp_path / "whole")
    run("strict", tmp_path / "part")
    resumed, model = run("cpu", tmp_path / "resumed", resume=tmp_path / "part" / "ckpt.safetensors")
    assert model.device == "cpu" and resumed.steps == whole.steps == 6
    assert resumed.best_val_loss == pytest.approx(whole.best_val_loss, rel=1e-5)
    for p, q in zip(whole_model.parameters(), model.parameters()):
        # Adam steps by about lr where a gradient is tiny: rounding may flip such a step
        np.testing.assert_allclose(q.data, p.data, rtol=1e-4, atol=1e-4)
        assert float(np.abs(q.data - p.data).mean()) < 1e-6


def dataclass_replace(obj, **changes):
    import dataclasses
    return dataclasses.replace(obj, **changes)


def test_load_with_a_device(tmp_path):
    from glassllm.formats import files
    from glassllm.tokenizers import ByteTokenizer
    cfg = Config(vocab_size=260, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, max_len=16)
    model = GlassLM(cfg, seed=5)
    files.save(model, tmp_path / "m.safetensors", tokenizer=ByteTokenizer())
    lm = glassllm.load(tmp_path / "m.safetensors", device="strict")
    assert lm.model.device == "strict"
    text = lm.generate("ab", max_new_tokens=6, seed=1)
    assert text == glassllm.load(tmp_path / "m.safetensors").generate("ab", max_new_tokens=6,
                                                                       seed=1)


# --------------------------------------------------------------------------- generation
def test_generation_draws_the_same_tokens_on_every_device():
    """Sampling runs on the host with NumPy's Generator: one seed, one sequence anywhere."""
    cpu, strict = pair()
    for sampling, rng in ((Sampling(temperature=0), None), (Sampling(0.9, top_k=20), 7),
                          (Sampling(1.0, top_p=0.8), 8)):
        assert generate(strict, [1, 2, 3], 20, sampling, rng) == \
            generate(cpu, [1, 2, 3], 20, sampling, rng)


def test_kv_cache_lives_on_the_models_device_and_follows_it():
    strict = GlassLM(CFG, seed=0, device="strict")
    cache = KVCache(CFG, device="strict")
    assert devices.device_of(cache.k) == "strict"
    full = strict(IDS[:1]).numpy()
    moved = KVCache(CFG)  # made for the CPU: moves at its first extend
    step = np.concatenate([strict(IDS[:1, :6], cache=moved).numpy(),
                           strict(IDS[:1, 6:], cache=moved).numpy()], axis=1)
    assert devices.device_of(moved.k) == "strict"
    np.testing.assert_allclose(step, full, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- the lens
def test_run_with_cache_on_strict_gives_cpus_names_values_and_gradients():
    cpu, strict = pair()
    targets = (IDS + 1) % 48
    want_logits, want = run_with_cache(cpu, IDS, targets=targets, grads=True)
    got_logits, got = run_with_cache(strict, IDS, targets=targets, grads=True)
    assert type(got_logits) is np.ndarray and list(got.values) == list(want.values)
    assert list(got.grads) == list(want.grads) and got.loss == pytest.approx(want.loss, 1e-6)
    for name in want.values:
        assert type(got[name]) is np.ndarray
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)
    for name in want.grads:
        np.testing.assert_allclose(got.grads[name], want.grads[name], rtol=1e-3, atol=1e-7,
                                   err_msg=name)


def test_hooks_edits_and_interpret_on_strict():
    cpu, strict = pair()
    zero = [("blocks.0.mlp.output", lambda value, name: value * 0)]
    np.testing.assert_allclose(run_with_hooks(strict, IDS, zero), run_with_hooks(cpu, IDS, zero),
                               rtol=1e-5, atol=1e-6)
    head = Edit("blocks.1.attention.head_output", (slice(None), slice(None), 1), 0.0)
    np.testing.assert_allclose(run_with_cache(strict, IDS, edits=[head])[0],
                               run_with_cache(cpu, IDS, edits=[head])[0], rtol=1e-5, atol=1e-6)
    source = run_with_cache(cpu, IDS[1:])[1]
    np.testing.assert_allclose(
        interpret.patch(strict, IDS[:1], source, "blocks.0.residual_out", (slice(None), 2)),
        interpret.patch(cpu, IDS[:1], source, "blocks.0.residual_out", (slice(None), 2)),
        rtol=1e-5, atol=1e-6)
    got, want = interpret.logit_attribution(strict, IDS[:1]), interpret.logit_attribution(cpu,
                                                                                        IDS[:1])
    assert got.labels == want.labels
    np.testing.assert_allclose(got.values, want.values, rtol=1e-4, atol=1e-5)
    lens_got, lens_want = interpret.logit_lens(strict, IDS[:1]), interpret.logit_lens(cpu, IDS[:1])
    assert lens_got.layers == lens_want.layers
    np.testing.assert_allclose(lens_got.top_probs, lens_want.top_probs, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------- the pieces
def test_engine_forms_run_on_numpy_arrays_only():
    strict = devices.to_device(np.ones(3, np.float32), "strict")
    with kernels.use("engine"):
        assert kernels.pick(F.linear_forward, on=strict) is F.linear_forward
        assert kernels.pick(F.linear_forward, on=np.ones(3)) is kernels.registered().get(
            F.linear_forward, F.linear_forward)


def test_scatter_add_without_a_scatter_adds_repeated_rows():
    rng = np.random.default_rng(5)
    index, values = np.array([0, 3, 3, 1, 0]), rng.normal(size=(5, 4)).astype(np.float32)
    want = np.zeros((4, 4), np.float32)
    np.add.at(want, index, values)
    got = devices.zeros((4, 4), "strict")
    devices.scatter_add(got, devices.to_device(index, "strict"), devices.to_device(values,
                                                                                   "strict"))
    np.testing.assert_allclose(host(got), want, rtol=1e-6)
    basic = devices.zeros((4, 4), "strict")
    devices.scatter_add(basic, (slice(1, 3), 2), devices.to_device(np.ones(2, np.float32),
                                                                   "strict"))
    assert host(basic)[1:3, 2].tolist() == [1.0, 1.0] and float(host(basic).sum()) == 2.0


def test_erf_and_host_dtype_on_strict():
    x = np.linspace(-3, 3, 13)
    got = host(devices.erf(devices.to_device(x, "strict")))
    np.testing.assert_allclose(got, devices.erf(x), rtol=0, atol=0)
    assert devices.host_dtype(devices.to_device(x.astype(np.float32), "strict")) == np.float32


def test_cli_generate_on_strict_writes_cpus_text(tmp_path):
    from glassllm.formats import files
    from glassllm.tokenizers import ByteTokenizer
    cfg = Config(vocab_size=260, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, max_len=24)
    files.save(GlassLM(cfg, seed=3), tmp_path / "m.safetensors", tokenizer=ByteTokenizer())
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}

    def text(*extra):
        done = subprocess.run([sys.executable, "-m", "glassllm.cli", "generate", "--model",
                               str(tmp_path / "m.safetensors"), "--prompt", "hi",
                               "--max-new-tokens", "8", "--seed", "2", *extra],
                              capture_output=True, env=env, timeout=120)
        return done.returncode, done.stdout, done.stderr.decode()

    assert text("--device", "strict")[:2] == text()[:2]
    code, _, err = text("--device", "tpu")
    assert code != 0 and err.strip().endswith("got 'tpu'") and len(err.strip().splitlines()) == 1


def test_an_optimizer_built_before_model_to_says_so_and_changes_nothing():
    # the step failed inside array_api_strict: "Can't convert array on the
    # 'array_api_strict.Device('device1')' device to a NumPy array", naming no cause
    cfg = Config(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, max_len=8)
    model = GlassLM(cfg, seed=0, device="cpu")
    opt = AdamW(model.parameters(), lr=1e-3)
    model.to("strict")
    ids = np.arange(8)[None]
    F.cross_entropy(model(ids), ids).backward()
    before = [host(p.data).copy() for p in model.parameters()]
    with pytest.raises(ValueError, match="parameter 0 is on strict but the optimizer's moments "
                                         "are on cpu; build the optimizer after model.to"):
        opt.step()
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(host(p.data), b)
    AdamW(model.parameters(), lr=1e-3).step()  # built after: steps
