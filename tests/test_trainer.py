"""The Trainer: events, best-model file, non-finite stop, equality with train().

As 004 describes: a tiny model and a 600-token array, so the loop is tested like any function.
"""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from glassllm import Config, GlassLM, Tensor
from glassllm.formats import files
from glassllm.training.data import ArrayBatches
from glassllm.train import evaluate, train
from glassllm.training import (Checkpointed, Evaluated, Finished, NonFiniteLossError, Resumed,
                               Saved, Started, Stepped, Trainer, TrainingInterrupted,
                               TrainSettings)

CFG = dict(vocab_size=257, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, max_len=16)


def corpus(n=600):
    """600 byte tokens of a repetitive text: learnable in a few steps, 540 train / 60 val."""
    text = ("the cat sat on the mat. " * 40).encode()[:n]
    ids = np.frombuffer(text, dtype=np.uint8).astype(np.int64)
    return ids[:540], ids[540:]


def settings(**kw):
    base = dict(steps=10, batch_size=4, seq_len=8, lr=1e-2, warmup=2, eval_every=4,
                eval_batches=2, seed=0)
    base.update(kw)
    return TrainSettings(**base)


def run(tmp_path=None, model=None, on_event=None, **kw):
    train_ids, val_ids = corpus()
    path = None if tmp_path is None else tmp_path / "model.safetensors"
    trainer = Trainer(settings(**kw), ArrayBatches(train_ids), ArrayBatches(val_ids),
                      model_path=path)
    model = model or GlassLM(Config(**CFG), seed=0)
    events = []

    def record(event):
        events.append(event)
        if on_event:
            on_event(event)
    summary = trainer.run(model, on_event=record)
    return model, summary, events, path


def test_events_arrive_at_the_requested_rhythm_and_at_the_last_step(tmp_path):
    _, summary, events, _ = run(tmp_path)
    assert isinstance(events[0], Started) and isinstance(events[-1], Finished)
    assert [e.step for e in events if isinstance(e, Stepped)] == list(range(10))
    assert [e.step for e in events if isinstance(e, Evaluated)] == [0, 4, 8, 9]
    # each evaluation comes right after the update it measures
    for i, e in enumerate(events):
        if isinstance(e, Evaluated):
            assert isinstance(events[i - 1], Stepped) and events[i - 1].step == e.step
    assert events[-1].summary is summary and summary.steps == 10
    assert [h["step"] for h in summary.history] == list(range(10))
    assert [h["step"] for h in summary.history if "val_loss" in h] == [0, 4, 8, 9]
    stepped = [e for e in events if isinstance(e, Stepped)]
    assert all(e.tokens_per_s > 0 and np.isfinite(e.loss) for e in stepped)
    assert [e.lr for e in stepped] == [h["lr"] for h in summary.history]


def test_eval_every_larger_than_the_run_still_evaluates_the_last_step():
    _, summary, events, _ = run(steps=3, eval_every=100)
    assert [e.step for e in events if isinstance(e, Evaluated)] == [0, 2]
    assert summary.final_val_loss == summary.history[-1]["val_loss"]


def test_loss_falls_and_train_loss_is_the_mean_since_the_last_evaluation():
    _, summary, events, _ = run(steps=30, eval_every=10)
    evaluated = [e for e in events if isinstance(e, Evaluated)]
    started = events[0]
    assert evaluated[-1].val_loss < started.val_loss - 1.0  # learnt something real
    losses = [h["loss"] for h in summary.history]
    assert evaluated[1].step == 10
    assert evaluated[1].train_loss == pytest.approx(np.mean(losses[1:11]), rel=1e-12)
    assert evaluated[0].train_loss == losses[0]


def test_the_saved_model_is_the_best_one(tmp_path):
    # A constant lr of 0.3 makes validation go up and down, so "last" and "best" differ and
    # some evaluations are no improvement.
    model, summary, events, path = run(tmp_path, steps=24, eval_every=3, lr=0.3, warmup=0,
                                       min_lr_ratio=1.0)
    evaluated = [e for e in events if isinstance(e, Evaluated)]
    val = [e.val_loss for e in evaluated]
    assert summary.final_val_loss > min(val), "precondition: the last evaluation is not best"
    best = min(evaluated, key=lambda e: e.val_loss)
    assert summary.best_val_loss == best.val_loss and summary.best_step == best.step
    # a file write exactly when validation improved
    running, improved = np.inf, []
    for e in evaluated:
        if e.val_loss < running:
            running = e.val_loss
            improved.append(e.step)
    assert [e.step for e in events if isinstance(e, Saved)] == improved
    assert len(improved) < len(evaluated)
    # the file holds the best weights: its loss on the same windows is the best loss
    saved = files.load(path)
    _, val_ids = corpus()
    assert evaluate(saved, val_ids, 4, 8, n_batches=2, seed=1234) == best.val_loss
    assert evaluate(model, val_ids, 4, 8, n_batches=2, seed=1234) == summary.final_val_loss


class ExplodingLM(GlassLM):
    """A GlassLM whose training loss is +inf at the training steps in `bad` (counted from 0
    over calls with gradients on; evaluation runs under no_grad and is left alone)."""

    def __init__(self, cfg, bad):
        super().__init__(cfg, seed=0)
        self.bad, self.calls = set(bad), 0

    def loss(self, idx, targets):
        loss = super().loss(idx, targets)
        if loss.requires_grad:
            self.calls += 1
            if self.calls - 1 in self.bad:
                return loss * Tensor(np.float32(np.inf))
        return loss


def test_an_infinite_loss_stops_the_run_and_writes_nothing(tmp_path):
    model = ExplodingLM(Config(**CFG), bad=range(100))
    before = model.state_dict()
    with pytest.raises(NonFiniteLossError, match="step 0") as info:
        run(tmp_path, model=model)
    assert isinstance(info.value, FloatingPointError) and isinstance(info.value, ValueError)
    assert info.value.step == 0
    assert os.listdir(tmp_path) == []  # no model file, no temporary left behind
    for name, p in model.named_parameters():  # the bad step changed nothing
        np.testing.assert_array_equal(p.data, before[name])


def test_an_infinite_loss_later_leaves_the_earlier_best_file_untouched(tmp_path):
    model = ExplodingLM(Config(**CFG), bad=range(5, 100))
    events = []
    with pytest.raises(NonFiniteLossError, match="step 5"):
        run(tmp_path, model=model, on_event=events.append)
    assert [e.step for e in events if isinstance(e, Saved)] == [0, 4]
    assert not any(isinstance(e, (Stepped, Evaluated)) and e.step >= 5 for e in events)
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]
    saved = files.load(tmp_path / "model.safetensors")
    _, val_ids = corpus()
    best = min(e.val_loss for e in events if isinstance(e, Evaluated))
    assert evaluate(saved, val_ids, 4, 8, n_batches=2, seed=1234) == best


def test_skipping_instead_of_stopping_when_a_skip_rate_alert_is_set():
    model = ExplodingLM(Config(**CFG), bad=[3, 4])
    _, summary, events, _ = run(model=model, max_skip_rate=0.5)
    stepped = {e.step: e for e in events if isinstance(e, Stepped)}
    assert [s for s, e in stepped.items() if e.skipped] == [3, 4]
    assert summary.skipped_steps == 2
    assert summary.history[3]["skipped"] == "nonfinite_loss" and summary.history[3]["loss"] is None
    assert np.isfinite(summary.final_val_loss)


def test_fp32_trainer_equals_the_spec_train_loop():
    train_ids, val_ids = corpus()
    a = GlassLM(Config(**CFG), seed=0)
    b = GlassLM(Config(**CFG), seed=0)
    history = train(a, train_ids, steps=7, batch_size=4, seq_len=8, lr=1e-2, warmup=2,
                    seed=3, val_data=val_ids, eval_every=3, log=None)
    _, summary, _, _ = run(model=b, steps=7, seed=3, eval_every=3, eval_batches=10)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)
    assert [h["loss"] for h in history] == [h["loss"] for h in summary.history]
    assert [h["lr"] for h in history] == [h["lr"] for h in summary.history]
    # same evaluation windows: evaluate() with 10 batches and seed 1234
    assert [h.get("val_loss") for h in history] == [h.get("val_loss") for h in summary.history]


def test_mixed_precision_runs_and_learns():
    _, fp32, _, _ = run(steps=12, eval_every=6)
    _, bf16, _, _ = run(steps=12, eval_every=6, precision="bf16")
    assert bf16.skipped_steps == 0
    assert bf16.final_val_loss < bf16.history[0]["val_loss"]
    assert bf16.final_val_loss == pytest.approx(fp32.final_val_loss, rel=0.05)
    assert bf16.final_val_loss != fp32.final_val_loss  # the matmuls really were rounded


def test_keyboard_interrupt_from_a_callback_writes_a_checkpoint(tmp_path):
    train_ids, val_ids = corpus()
    trainer = Trainer(settings(), ArrayBatches(train_ids), ArrayBatches(val_ids),
                      checkpoint_path=tmp_path / "ckpt.safetensors")

    def stop(event):
        if isinstance(event, Stepped) and event.step == 3:
            raise KeyboardInterrupt
    with pytest.raises(TrainingInterrupted) as info:
        trainer.run(GlassLM(Config(**CFG)), on_event=stop)
    assert info.value.step == 4 and len(info.value.history) == 4
    assert info.value.checkpoint_path == os.fspath(tmp_path / "ckpt.safetensors")
    assert isinstance(info.value, KeyboardInterrupt)
    events = []
    summary = trainer.run(GlassLM(Config(**CFG), seed=5), resume=info.value.checkpoint_path,
                          on_event=events.append)
    assert events[0] == Resumed(4, summary.history[0]["val_loss"])
    assert [e.step for e in events if isinstance(e, Stepped)] == list(range(4, 10))
    assert summary.steps == 10


def test_sigint_waits_for_the_update_to_finish(tmp_path):
    """A real SIGINT in the middle of an update: the update completes, then the checkpoint."""
    train_ids, val_ids = corpus()
    ckpt = tmp_path / "ckpt.safetensors"
    trainer = Trainer(settings(steps=50), ArrayBatches(train_ids), ArrayBatches(val_ids),
                      checkpoint_path=ckpt)

    class SignalMidStep(GlassLM):
        calls = 0

        def loss(self, idx, targets):
            out = super().loss(idx, targets)
            if out.requires_grad:
                SignalMidStep.calls += 1
                if SignalMidStep.calls == 6:  # during update 5, before its backward
                    os.kill(os.getpid(), signal.SIGINT)
            return out
    with pytest.raises(TrainingInterrupted) as info:
        trainer.run(SignalMidStep(Config(**CFG)))
    assert info.value.step == 6  # update 5 was finished, not cut in half
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored
    from glassllm.formats.checkpoint import load_checkpoint
    assert load_checkpoint(ckpt).step == 6


def test_checkpoint_every_emits_checkpointed(tmp_path):
    train_ids, val_ids = corpus()
    trainer = Trainer(settings(checkpoint_every=4), ArrayBatches(train_ids),
                      ArrayBatches(val_ids), checkpoint_path=tmp_path / "c.safetensors")
    events = []
    trainer.run(GlassLM(Config(**CFG)), on_event=events.append)
    assert [e.step for e in events if isinstance(e, Checkpointed)] == [4, 8]


@pytest.mark.parametrize("field, value", [
    ("steps", -1), ("batch_size", 0), ("seq_len", 0), ("lr", 0.0), ("lr", float("nan")),
    ("warmup", -1), ("clip", 0.0), ("eval_every", 0), ("eval_batches", 0),
    ("precision", "fp8"), ("max_skip_rate", 1.0), ("checkpoint_every", 0)])
def test_settings_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        settings(**{field: value})


def test_settings_round_trip_through_a_dict():
    s = settings(precision="fp16", max_skip_rate=0.2)
    assert TrainSettings.from_dict(s.to_dict()) == s
    with pytest.raises(ValueError, match="unknown"):
        TrainSettings.from_dict({**s.to_dict(), "momentum": 0.9})


def test_data_and_model_mismatches_are_clear_errors():
    train_ids, val_ids = corpus()
    model = GlassLM(Config(**CFG))
    with pytest.raises(ValueError, match="max_len"):
        Trainer(settings(seq_len=32), ArrayBatches(train_ids), ArrayBatches(val_ids)).run(model)
    with pytest.raises(ValueError, match="validation data has 8 tokens"):
        Trainer(settings(), ArrayBatches(train_ids), ArrayBatches(val_ids[:8])).run(model)
    with pytest.raises(ValueError, match="checkpoint_path"):
        Trainer(settings(checkpoint_every=2), ArrayBatches(train_ids), ArrayBatches(val_ids))


class NaNAtEval(Trainer):
    """A Trainer whose evaluations number `bad` (0 = the one before training) return `value`,
    optionally after breaking a weight first: divergence seen only at validation."""

    def __init__(self, *a, bad=(), value=float("nan"), break_weights=False, **kw):
        super().__init__(*a, **kw)
        self.bad, self.value, self.break_weights, self.calls = set(bad), value, \
            break_weights, 0

    def _evaluate(self, model):
        self.calls += 1
        if self.calls - 1 not in self.bad:
            return super()._evaluate(model)
        if self.break_weights:
            model.token_embedding.weight.data[0, 0] = np.inf
        return self.value


def run_nan_eval(tmp_path, **kw):
    train_ids, val_ids = corpus()
    trainer = NaNAtEval(settings(), ArrayBatches(train_ids), ArrayBatches(val_ids),
                        model_path=tmp_path / "model.safetensors", **kw)
    events = []
    with pytest.raises(NonFiniteLossError) as info:
        trainer.run(GlassLM(Config(**CFG), seed=0), on_event=events.append)
    return info.value, events


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_validation_loss_is_never_saved_nor_best(tmp_path, value):
    """Evaluations run after updates 0, 4, 8, 9 (calls 1..4); call 1 is bad: nothing saved."""
    err, events = run_nan_eval(tmp_path, bad={1}, value=value)
    assert err.step == 0 and err.reason == "nonfinite_val_loss"
    assert "validation loss is not finite" in str(err)
    assert "no model file was written" in str(err) and err.kept_path is None
    assert not any(isinstance(e, (Saved, Evaluated)) for e in events)
    assert os.listdir(tmp_path) == []


def test_a_later_non_finite_validation_loss_keeps_the_earlier_best_file(tmp_path):
    err, events = run_nan_eval(tmp_path, bad={2})
    assert err.step == 4
    assert [e.step for e in events if isinstance(e, Saved)] == [0]
    path = str(tmp_path / "model.safetensors")
    assert err.kept_path == path and err.kept_step == 0
    assert f"{path} keeps the best model, from step 0" in str(err)
    assert np.isfinite(files.load(path).token_embedding.weight.data).all()


def test_non_finite_weights_with_a_finite_validation_loss_are_never_saved(tmp_path):
    """The weights are checked before the model file is written: a diverged model must end
    the run as NonFiniteLossError, not as files.save's ValueError."""
    err, events = run_nan_eval(tmp_path, bad={1}, value=1.0, break_weights=True)
    assert err.step == 0 and err.reason == "nonfinite_weights"
    assert "weights are not finite" in str(err)
    assert os.listdir(tmp_path) == [] and not any(isinstance(e, Saved) for e in events)


@pytest.mark.parametrize("field, value, message", [
    ("batch_size", True, "batch_size must be an integer >= 1, got True"),
    ("steps", 2.5, "steps must be an integer >= 0, got 2.5"),
    ("steps", 3.0, "steps must be an integer >= 0, got 3.0"),
    ("steps", -1, "steps must be an integer >= 0, got -1"),
    ("seq_len", "8", "seq_len must be an integer >= 1, got '8'"),
    ("seed", None, "seed must be an integer >= 0, got None"),
    ("checkpoint_every", 1.5, "checkpoint_every must be an integer >= 1, got 1.5"),
    ("health_every", 0, "health_every must be an integer >= 1, got 0"),
    ("grad_accum", np.int64(0), "grad_accum must be an integer >= 1, got "),
    ("lr", "0.01", "lr must be a finite positive number, got '0.01'"),
    ("lr", True, "lr must be a finite positive number, got True"),
    ("lr", float("inf"), "lr must be a finite positive number, got inf"),
    ("lr", 0, "lr must be a finite positive number, got 0"),
    ("clip", float("nan"), "clip must be a finite positive number, got nan"),
    ("max_skip_rate", float("nan"), "max_skip_rate must be a finite number >= 0, got nan"),
    ("max_skip_rate", 1.0, "max_skip_rate must be a finite number in [0, 1), got 1.0"),
    ("weight_decay", float("inf"), "weight_decay must be a finite number >= 0, got inf"),
    ("min_lr_ratio", complex(0.1, 0), "min_lr_ratio must be a finite number in [0, 1], got"),
    ("min_lr_ratio", 1.5, "min_lr_ratio must be a finite number in [0, 1], got 1.5"),
])
def test_settings_reject_wrong_types_naming_the_field(field, value, message):
    with pytest.raises(ValueError) as info:
        settings(**{field: value})
    assert f"TrainSettings.{message}" in str(info.value)


def test_settings_take_numpy_numbers_as_plain_python_ones():
    s = settings(steps=np.int64(10), batch_size=np.int32(4), lr=np.float32(0.5), warmup=1)
    assert type(s.steps) is int and type(s.batch_size) is int and type(s.lr) is float
    assert s.steps == 10 and s.lr == 0.5 and s.warmup == 1
    assert TrainSettings.from_dict(s.to_dict()) == s


@pytest.mark.parametrize("cfg", [
    dict(vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, max_len=16),
    dict(vocab_size=8, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, max_len=4),  # the README's train() example
], ids=["vocab16", "spec001_vocab8"])
def test_any_vocab_size_saves_its_best_model_and_checkpoints(tmp_path, cfg):
    """No tokenizer given: the model file is weights-only, whatever the vocabulary (a model
    of vocab 16 used to be refused for not fitting the 257-id byte tokenizer)."""
    from glassllm.formats import checkpoint
    V, T = cfg["vocab_size"], cfg["max_len"]
    ids = np.tile(np.arange(V, dtype=np.int64), 40)
    path, ckpt = tmp_path / "model.safetensors", tmp_path / "ckpt.safetensors"
    trainer = Trainer(settings(steps=6, seq_len=T, eval_every=2, checkpoint_every=3),
                      ArrayBatches(ids[:-5 * V]), ArrayBatches(ids[-5 * V:]),
                      model_path=path, checkpoint_path=ckpt)
    model = GlassLM(Config(**cfg), seed=0)
    events = []
    summary = trainer.run(model, on_event=events.append)
    assert [e.step for e in events if isinstance(e, Checkpointed)] == [3, 6]
    assert any(isinstance(e, Saved) for e in events) and summary.model_path == str(path)
    saved = files.load(path)
    assert saved.cfg == model.cfg and files.load_tokenizer(path) is None
    assert evaluate(saved, ids[-5 * V:], 4, T, n_batches=2, seed=1234) == \
        summary.best_val_loss
    state = checkpoint.load_checkpoint(ckpt)
    assert state.step == 6 and "tokenizer" not in state.extra
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(state.weights[name], value, err_msg=name)


# ------------------------------------------------------------- no real update (issue 9, point 6)
class OverflowingLM(GlassLM):
    """Every weight x100: finite float32 numbers, but the fp16 matrix products of the forward
    overflow (attention scores ~1e6 > 65504), so every fp16 loss is NaN and every step is
    skipped, for ever (a skipped step changes no weight)."""

    def __init__(self, cfg, seed=0):
        super().__init__(cfg, seed=seed)
        for p in self.parameters():
            p.data *= 100


def test_a_fully_skipped_fp16_run_fails_with_no_progress_and_logs_every_step(tmp_path):
    from glassllm.training import NoProgressError
    log = tmp_path / "steps.csv"
    with pytest.raises(NoProgressError) as info:
        run(model=OverflowingLM(Config(**CFG)), precision="fp16", steps=6,
            log_csv=str(log))
    err = info.value
    assert isinstance(err, NonFiniteLossError) and err.step == 5 and err.skipped == 6
    assert "the last 6 updates were all skipped (last: non-finite training loss (nan)" in \
        str(err)
    assert [h["skipped"] for h in err.history] == ["nonfinite_loss"] * 6
    rows = log.read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == list(range(6))  # the last one included


class GradOverflowLM(GlassLM):
    """Finite losses whose gradients, times fp16's initial loss scale 2**16, overflow float16:
    what the GradScaler backs off from at the start of a run."""

    def loss(self, idx, targets):
        return super().loss(idx, targets) * 1e6


def test_a_short_fp16_run_spent_on_gradient_overflows_is_no_failure():
    """The scaler halving its scale on every step of a 3-step run is its ordinary start, not a
    run without progress (found by the pipeline property test: a 2-step fp16 run)."""
    _, summary, _, _ = run(model=GradOverflowLM(Config(**CFG)), precision="fp16", steps=3)
    assert summary.steps == 3 and summary.skipped_steps == 3
    assert [h["skipped"] for h in summary.history] == ["nonfinite_grad"] * 3


def test_max_consecutive_skips_stops_a_long_run_in_time():
    from glassllm.training import NoProgressError
    with pytest.raises(NoProgressError) as info:
        run(model=OverflowingLM(Config(**CFG)), precision="fp16", steps=1000,
            max_consecutive_skips=7)
    assert info.value.step == 6 and len(info.value.history) == 7


def test_a_few_skips_among_real_updates_are_no_failure():
    """The loss scaler's ordinary back-off (fp16, a skip now and then) must not stop a run:
    skips at steps 3 and 4 of 10, then real updates again, in a run whose limit is 2."""
    model = ExplodingLM(Config(**CFG), bad=[3, 4])
    _, summary, _, _ = run(model=model, precision="fp16", max_consecutive_skips=3)
    assert summary.skipped_steps == 2 and summary.steps == 10
    # ...but a run whose last steps are all skipped, as many as the limit, does fail
    from glassllm.training import NoProgressError
    with pytest.raises(NoProgressError):
        run(model=ExplodingLM(Config(**CFG), bad=[7, 8, 9]), precision="fp16",
            max_consecutive_skips=3)


def test_fp32_with_a_skip_alert_fails_when_no_update_is_made():
    """fp32 skips instead of stopping when max_skip_rate is set; a run whose every step is
    skipped must still fail, even if it is shorter than the alert's 100-step window."""
    from glassllm.training import NoProgressError
    with pytest.raises(NoProgressError) as info:  # every training loss inf
        run(model=ExplodingLM(Config(**CFG), bad=range(100)), max_skip_rate=0.99, steps=5)
    assert info.value.skipped == 5


def test_the_skip_rate_alert_works_in_a_run_shorter_than_its_window():
    from glassllm.training.safety import SkipRateExceeded
    # 2 skips in 10 steps: rate 0.2, above 0.1 -> the short run fails at its end
    with pytest.raises(SkipRateExceeded) as info:
        run(model=ExplodingLM(Config(**CFG), bad=[3, 4]), max_skip_rate=0.1)
    assert info.value.rate == pytest.approx(0.2) and info.value.step == 9
    # below the limit it passes
    _, summary, _, _ = run(model=ExplodingLM(Config(**CFG), bad=[3, 4]), max_skip_rate=0.25)
    assert summary.skipped_steps == 2


def test_divergence_messages_name_the_quantity_that_is_not_finite(tmp_path):
    """lr 1e30: after step 0 the weights are ~1e30; step 1's loss is still finite (the norms
    rescale) but its gradient is NaN: the error names the gradient norm and its value, and the
    per-step CSV has the failing step's row."""
    log = tmp_path / "steps.csv"
    with pytest.raises(NonFiniteLossError) as info:
        run(lr=1e30, warmup=0, eval_every=100, log_csv=str(log))
    err = info.value
    rows = log.read_text().splitlines()
    last = dict(zip(rows[0].split(","), rows[-1].split(",")))
    assert err.reason == "nonfinite_grad" and err.step == int(last["step"]) == 1
    assert np.isfinite(float(last["loss"])) and np.isnan(err.value)
    assert "step 1: the gradient norm (before clipping) is not finite (nan)" in str(err)
    assert last["loss"] not in str(err)


def test_a_resume_that_writes_no_better_model_names_none_not_a_missing_file(tmp_path):
    """Resumed with another model_path (`glassllm train --resume CKPT --out NEW`) and no later
    evaluation better than the checkpoint's best, the run writes no model file at NEW: the
    summary must not name NEW as where the best model is."""
    train_ids, val_ids = corpus()
    ckpt = tmp_path / "ckpt.safetensors"
    first = Trainer(settings(checkpoint_every=10), ArrayBatches(train_ids),
                    ArrayBatches(val_ids), model_path=tmp_path / "a.safetensors",
                    checkpoint_path=ckpt)
    done = first.run(GlassLM(Config(**CFG), seed=0))
    assert done.model_path == str(tmp_path / "a.safetensors") and done.best_step == 9
    new = tmp_path / "b.safetensors"  # nothing left to train: NEW is never written
    again = Trainer(settings(checkpoint_every=10), ArrayBatches(train_ids),
                    ArrayBatches(val_ids), model_path=new, checkpoint_path=ckpt)
    summary = again.run(GlassLM(Config(**CFG), seed=0), resume=ckpt)
    assert not new.exists()
    assert summary.model_path is None and summary.best_step == 9
    # resumed on the same path, the file the first part wrote is still the best model
    same = Trainer(settings(checkpoint_every=10), ArrayBatches(train_ids),
                   ArrayBatches(val_ids), model_path=tmp_path / "a.safetensors",
                   checkpoint_path=ckpt)
    summary = same.run(GlassLM(Config(**CFG), seed=0), resume=ckpt)
    assert summary.model_path == str(tmp_path / "a.safetensors")


def test_every_event_in_its_order(tmp_path):
    """The whole sequence of a run with health, evaluations, saves and checkpoints: an
    update's events come once it is complete (health, Stepped, Evaluated, Saved), then its
    checkpoint (Checkpointed counts the updates done)."""
    train_ids, val_ids = corpus()
    trainer = Trainer(settings(health_every=3, checkpoint_every=3), ArrayBatches(train_ids),
                      ArrayBatches(val_ids), model_path=tmp_path / "model.safetensors",
                      checkpoint_path=tmp_path / "run.ckpt")
    events = []
    trainer.run(GlassLM(Config(**CFG), seed=0), on_event=events.append)
    seen = [(type(e).__name__, getattr(e, "step", None)) for e in events
            if type(e).__name__ != "HealthWarning"]  # warnings depend on the numbers
    saved = [e.step for e in events if isinstance(e, Saved)]
    expected = [("Started", None)]
    for step in range(10):
        expected += [("HealthChecked", step)] * (step % 3 == 0) + [("Stepped", step)]
        if step in (0, 4, 8, 9):
            expected += [("Evaluated", step)] + [("Saved", step)] * (step in saved)
        expected += [("Checkpointed", step + 1)] * ((step + 1) % 3 == 0)
    assert seen == expected + [("Finished", None)]
    assert saved[0] == 0


def test_a_fully_skipped_fp16_run_checkpointed_and_resumed_still_fails(tmp_path):
    """Its checkpoint after the last update resumed: no update is left, but the run is
    judged on its whole history, as the straight run was (it returned normally before)."""
    from glassllm.training import NoProgressError
    train_ids, val_ids = corpus()
    ckpt = tmp_path / "ckpt.safetensors"

    def trainer():
        return Trainer(settings(precision="fp16", steps=6, checkpoint_every=3),
                       ArrayBatches(train_ids), ArrayBatches(val_ids),
                       checkpoint_path=ckpt)
    with pytest.raises(NoProgressError):
        trainer().run(OverflowingLM(Config(**CFG)))
    for _ in range(2):  # resumed from the checkpoint of update 6 (of 6), twice
        with pytest.raises(NoProgressError) as info:
            trainer().run(OverflowingLM(Config(**CFG)), resume=ckpt)
        assert info.value.skipped == 6 and info.value.step == 5
        assert "the last 6 updates were all skipped (last: non-finite training loss" in \
            str(info.value)


def test_the_first_health_row_after_a_resume_counts_its_whole_interval(tmp_path):
    """Health every 4 updates, interrupted with a checkpoint after 6: the row of update 8
    counts updates 5..8 (4, with their clip events), as in the run that never stopped."""
    from glassllm.lens.health import read_health
    train_ids, val_ids = corpus()

    def trainer(name, **kw):
        return Trainer(settings(steps=10, health_every=4, clip=0.05, **kw,
                                health_log=str(tmp_path / f"{name}.jsonl")),
                       ArrayBatches(train_ids), ArrayBatches(val_ids),
                       checkpoint_path=tmp_path / f"{name}.ckpt", model_path=None)
    trainer("straight").run(GlassLM(Config(**CFG), seed=0))

    def stop_after_6(event):
        if isinstance(event, Stepped) and event.step == 5:
            raise KeyboardInterrupt
    with pytest.raises(TrainingInterrupted) as info:
        trainer("resumed").run(GlassLM(Config(**CFG), seed=0), on_event=stop_after_6)
    assert info.value.step == 6
    trainer("resumed").run(GlassLM(Config(**CFG), seed=0),
                           resume=tmp_path / "resumed.ckpt")
    keys = ("step", "interval_steps", "clip_events", "skipped_steps")
    straight = [{k: r[k] for k in keys} for r in read_health(tmp_path / "straight.jsonl")]
    resumed = [{k: r[k] for k in keys} for r in read_health(tmp_path / "resumed.jsonl")]
    assert straight == resumed
    assert straight[2]["interval_steps"] == 4 and straight[2]["clip_events"] == 4


@pytest.mark.parametrize("train, val, hint", [
    ("array", "batches", "train_data must be a Batches (token_count() and batch(), e.g. "
     "glassllm.training.data.ArrayBatches or TokenFile), got ndarray; wrap an array of ids "
     "as ArrayBatches(ids)"),
    ("batches", None, "val_data must be a Batches (token_count() and batch(), e.g. "
     "glassllm.training.data.ArrayBatches or TokenFile), got NoneType; validation picks the "
     "best model and needs its own ids")])
def test_a_plain_array_or_no_validation_data_is_a_clear_error(train, val, hint):
    train_ids, val_ids = corpus()
    pick = {"array": train_ids, "batches": ArrayBatches(train_ids), None: None}
    with pytest.raises(TypeError) as info:
        Trainer(settings(), pick[train], pick[val] if val != "batches" else
                ArrayBatches(val_ids))
    assert str(info.value) == f"Trainer: {hint}"


def test_a_missing_output_directory_is_named_not_its_lock_file(tmp_path):
    train_ids, val_ids = corpus()
    missing = tmp_path / "no" / "such"
    trainer = Trainer(settings(steps=2), ArrayBatches(train_ids), ArrayBatches(val_ids),
                      model_path=missing / "model.safetensors")
    with pytest.raises(FileNotFoundError) as info:
        trainer.run(GlassLM(Config(**CFG), seed=0))
    assert info.value.filename == str(missing) and ".lock" not in str(info.value)
    assert "the output's directory does not exist" in str(info.value)
