"""glassllm.lens.health through the real Trainer: rows at the requested rhythm, numbers equal to
what they claim, unchanged training, Ctrl-C safe, lr 1.0 flagged and the default run quiet."""
from __future__ import annotations

import json
import math
import os
import signal

import numpy as np
import pytest

from glassllm import Config, GlassLM
from glassllm.cli import main
from glassllm.training.data import ArrayBatches
from glassllm.lens.health import (HealthChecked, HealthMonitor, HealthWarning, activation_stats,
                             attention_entropy, read_health)
from glassllm.optim import AdamW
from glassllm.training.safety import TrainStep
from glassllm.training import Trainer, TrainingInterrupted, TrainSettings
from conftest import shared_data_path
from test_trainer import CFG, corpus, settings



def run(tmp_path, model=None, resume=None, checkpoint=None, **kw):
    train_ids, val_ids = corpus()
    trainer = Trainer(settings(**kw), ArrayBatches(train_ids), ArrayBatches(val_ids),
                      checkpoint_path=checkpoint)
    model = model or GlassLM(Config(**CFG), seed=0)
    events = []
    summary = trainer.run(model, resume=resume, on_event=events.append)
    return model, summary, events


def test_rows_at_the_rhythm_in_file_and_events(tmp_path):
    log = tmp_path / "health.jsonl"
    _, summary, events = run(tmp_path, steps=10, health_every=3, health_log=log)
    checked = [e for e in events if isinstance(e, HealthChecked)]
    assert [e.step for e in checked] == [0, 3, 6, 9]
    rows = read_health(log)
    assert rows == [e.row for e in checked]  # the file holds exactly the events' rows
    assert [r["interval_steps"] for r in rows] == [1, 3, 3, 3]  # every step counted
    names = {n for n, _ in GlassLM(Config(**CFG)).named_parameters()}
    assert set(rows[1]["params"]) == names
    assert set(rows[1]["activations"]) == {"blocks.0.residual_out", "blocks.0.mlp.hidden_pre"}
    assert set(rows[1]["attention"]) == {"L0H0", "L0H1"}
    with pytest.raises(ValueError, match="health_log needs health_every"):
        TrainSettings(health_log=str(log))
    with pytest.raises(ValueError, match="health_every"):
        TrainSettings(health_every=0)


def test_health_does_not_change_the_training(tmp_path):
    plain, a, _ = run(tmp_path, steps=8)
    watched, b, _ = run(tmp_path, steps=8, health_every=2, health_log=tmp_path / "h.jsonl")
    assert a.history == b.history
    for (name, p), (_, q) in zip(plain.named_parameters(), watched.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)


def test_numbers_are_the_real_update_and_gradient():
    """update_to_data from the weights before/after the real AdamW step; gradient norms before
    clipping (clip 0.01 clips every step), their squares summing to the global norm's."""
    model = GlassLM(Config(**CFG), seed=0)
    opt = AdamW(model.parameters(), lr=1e-2)
    step = TrainStep(model, opt, "fp32", clip=0.01)
    monitor = HealthMonitor(model, opt, every=2, clip=0.01)
    train_ids, _ = corpus()
    rng = np.random.default_rng(0)
    for i in range(3):
        x, y = ArrayBatches(train_ids).batch(rng, 4, 8)
        before = {n: p.data.copy() for n, p in model.named_parameters()}
        with monitor.observe(i):
            record = step(x, y, 1e-2, i)
        events = monitor.after_step(i, record)
    row = events[0].row
    assert events[0].step == 2 and row["clipped"] and row["clip_events"] == 2
    for name, p in model.named_parameters():
        want = math.log10(np.linalg.norm(p.data - before[name]) / np.linalg.norm(before[name]))
        assert row["params"][name]["update_to_data_log10"] == pytest.approx(want, abs=1e-6)
        assert row["params"][name]["weight_norm"] == pytest.approx(
            float(np.linalg.norm(before[name])), rel=1e-6)
    total = math.sqrt(sum(v["grad_norm"] ** 2 for v in row["params"].values()))
    assert record.grad_l2_pre_clip > 0.01
    assert total == pytest.approx(record.grad_l2_pre_clip, rel=1e-5)
    assert row["global_grad_norm"] == pytest.approx(record.grad_l2_pre_clip)


def test_activation_and_entropy_definitions_by_hand():
    pre = np.array([[[-5.0, -1.0, 5.0, 4.0]], [[-6.0, 1.0, 0.0, 4.5]]])  # (B=2, T=1, F=4)
    cache = {"blocks.0.residual_out": np.array([[[1.0, -1.0]]]),
             "blocks.0.mlp.hidden_pre": pre}
    llama = activation_stats(cache, "llama")["blocks.0.mlp.hidden_pre"]
    # SiLU's tanh(x/2) beyond 0.97 from |x| = 4.19: -5, 5, -6, 4.5 (not 4: tanh(2) = 0.964)
    assert llama["saturated"] == pytest.approx(4 / 8)
    assert llama["dead"] == pytest.approx(1 / 4)  # unit 0 is negative at every position
    gelu = activation_stats(cache, "gpt2")["blocks.0.mlp.hidden_pre"]
    assert gelu["saturated"] == pytest.approx(5 / 8)  # GELU's tanh(u): from |x| = 1.97
    T = 5
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    entropy = attention_entropy({"blocks.0.attention.pattern": uniform[None, None]}, 1)
    assert entropy["L0H0"]["entropy"] == pytest.approx(np.mean(np.log(np.arange(1, T + 1))))


def test_ctrl_c_keeps_whole_rows_and_resume_continues_them(tmp_path):
    train_ids, val_ids = corpus()
    log, ckpt = tmp_path / "health.jsonl", tmp_path / "ckpt.safetensors"
    s = settings(steps=20, health_every=2, health_log=str(log))

    class SignalMidStep(GlassLM):
        calls = 0

        def loss(self, idx, targets):
            out = super().loss(idx, targets)
            if out.requires_grad:
                SignalMidStep.calls += 1
                if SignalMidStep.calls == 7:  # in update 6, a health step, before backward
                    os.kill(os.getpid(), signal.SIGINT)
            return out
    trainer = Trainer(s, ArrayBatches(train_ids), ArrayBatches(val_ids), checkpoint_path=ckpt)
    with pytest.raises(TrainingInterrupted) as info:
        trainer.run(SignalMidStep(Config(**CFG), seed=0))
    assert info.value.step == 7
    lines = log.read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 2, 4, 6]  # the finished step's
    log.write_text(log.read_text() + '{"step": 8, "par')  # a torn line, as after kill -9
    resumed = Trainer(s, ArrayBatches(train_ids), ArrayBatches(val_ids), checkpoint_path=ckpt)
    resumed.run(GlassLM(Config(**CFG), seed=0), resume=ckpt)
    straight = tmp_path / "straight.jsonl"
    Trainer(settings(steps=20, health_every=2, health_log=str(straight)),
            ArrayBatches(train_ids), ArrayBatches(val_ids)).run(GlassLM(Config(**CFG), seed=0))
    got, want = read_health(log), read_health(straight)
    assert [r["step"] for r in got] == list(range(0, 20, 2))
    drop = ("interval_steps", "clip_events", "skipped_steps")  # counted from the resume on
    assert [{k: v for k, v in r.items() if k not in drop} for r in got] == \
        [{k: v for k, v in r.items() if k not in drop} for r in want]


def _shakespeare_run(lr, steps=40, warmup=10, every=5, d_model=64, n_layers=2, batch=8,
                     family="llama"):
    # through conftest: skipped with the path as reason, and a failure under CI=true
    data = np.frombuffer(shared_data_path("tinyshakespeare.txt").read_bytes()[:200_000],
                         dtype=np.uint8)
    data = data.astype(np.int64)
    s = TrainSettings(steps=steps, batch_size=batch, seq_len=64, lr=lr, warmup=warmup,
                      eval_every=10**6, eval_batches=1, health_every=every)
    model = GlassLM(Config(family=family, d_model=d_model, n_layers=n_layers, n_heads=4,
                           n_kv_heads=2 if family == "llama" else 4, max_len=64))
    events = []
    Trainer(s, ArrayBatches(data[:180_000]), ArrayBatches(data[180_000:])).run(
        model, on_event=events.append)
    return [e for e in events if isinstance(e, HealthWarning)], \
        [e.row for e in events if isinstance(e, HealthChecked)]


def _check_flagged_and_quiet(**run):
    warnings, rows = _shakespeare_run(2e-3, **run)  # the default learning rate
    assert warnings == [], [w.message for w in warnings]
    assert len(rows) == run.get("steps", 40) // run.get("every", 5)
    warnings, rows = _shakespeare_run(1.0, **run)
    assert warnings, "lr 1.0 was not flagged"
    assert all(len(w.message.splitlines()) == 1 for w in warnings)
    assert max(a["saturated"] for a in rows[-1]["activations"].values()
               if "saturated" in a) > 0.25
    return warnings


def test_lr_1_is_flagged_and_the_default_lr_is_quiet():
    _check_flagged_and_quiet()


def test_lr_1_is_flagged_and_the_default_lr_is_quiet_for_gpt2():
    # breakit11: gpt2's zero-initialised biases have update:data near 10^-0.3 early, so the
    # default run warned "17 of 36 params"; only weight matrices are watched
    _check_flagged_and_quiet(family="gpt2")


@pytest.mark.slow
def test_lr_1_is_flagged_and_the_default_run_is_quiet_full_settings():
    """`glassllm train`'s own settings (default model, batch, warmup 100), 300 steps."""
    _check_flagged_and_quiet(steps=300, warmup=100, every=10, d_model=128, n_layers=4,
                             batch=16)


def test_cli_health_every_writes_beside_history_and_plot_draws_it(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat. " * 200)
    out = tmp_path / "run" / "model.safetensors"
    assert main(["train", "--data", str(text), "--out", str(out), "--steps", "30",
                 "--health-every", "3", "--d-model", "32", "--n-layers", "1", "--n-heads", "2",
                 "--seq-len", "16", "--batch-size", "4", "--eval-every", "10",
                 "--lr", "1.0", "--warmup", "0"]) == 0
    rows = read_health(tmp_path / "run" / "health.jsonl")
    assert [r["step"] for r in rows] == list(range(0, 30, 3))
    printed = capsys.readouterr()
    assert "warning: health: saturated fraction" in printed.out + printed.err
    assert main(["plot", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "health.png").stat().st_size > 10_000
    assert main(["train", "--data", str(text), "--out", str(out), "--steps", "1",
                 "--health-every", "0"]) == 2
