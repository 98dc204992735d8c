"""glassllm.train against its documented contract (docs/training.md "The pieces of the loop"), sentence by sentence.

Each test is headed by the sentence of ../shared/spec/001_*.txt it checks. Models are tiny
(d_model 8, one layer), so the whole file runs in seconds.
"""
from __future__ import annotations

import numpy as np
import pytest

import glassllm.train as train_module
from glassllm import Config, GlassLM, devices
from glassllm.optim import AdamW, clip_grad_norm, lr_schedule
from glassllm.tensor import is_grad_enabled
from glassllm.train import evaluate, get_batch, train

CFG = dict(vocab_size=8, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, max_len=8)
DATA = np.tile(np.arange(8, dtype=np.int64), 5)
VAL = DATA[::-1].copy()  # the reversed pattern: training on DATA makes it worse, not better


def tiny_model(seed=0, **overrides) -> GlassLM:
    return GlassLM(Config(**{**CFG, **overrides}), seed=seed)


def weights(model) -> dict:
    return model.state_dict()


def assert_same_weights(a: dict, b: dict):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def hand_loop(model, data, steps, batch_size, seq_len, lr, warmup, seed=0, val_data=None,
              eval_every=100, keep_best=False, states=None):
    """The spec's steps written out: get_batch -> loss -> zero_grad -> backward ->
    clip_grad_norm(params, 1.0) -> step(lr_schedule(...)), validation after the update.
    `states`, if a list, receives the weights after every update."""
    params = model.parameters()
    optimizer = AdamW(params, lr=lr)
    rng = np.random.default_rng(seed)
    history, best, best_state = [], float("inf"), None
    for step in range(steps):
        x, y = get_batch(data, batch_size, seq_len, rng)
        loss = model.loss(x, y)
        optimizer.zero_grad()
        loss.backward()
        clip_grad_norm(params, 1.0)
        step_lr = lr_schedule(step, steps, lr, warmup)
        optimizer.step(step_lr)
        entry = {"step": step, "loss": float(loss.item()), "lr": step_lr}
        if val_data is not None and (step % eval_every == 0 or step == steps - 1):
            entry["val_loss"] = evaluate(model, val_data, batch_size, seq_len, 10, 1234)
            if keep_best and entry["val_loss"] < best:
                best, best_state = entry["val_loss"], model.state_dict()
        history.append(entry)
        if states is not None:
            states.append(model.state_dict())
    if best_state is not None:
        model.load_state_dict(best_state)
    return history


# =========================================================================== examples, verbatim
# Spec 001, the get_batch example, verbatim.
def test_spec_example_get_batch():
    import numpy as np
    from glassllm.train import get_batch

    data = np.arange(12, dtype=np.int64)
    x, y = get_batch(data, batch_size=2, seq_len=4, rng=np.random.default_rng(0))
    assert x.shape == y.shape == (2, 4)
    np.testing.assert_array_equal(y, x + 1)


# Spec 001, the train example, verbatim.
def test_spec_example_train():
    import numpy as np
    from glassllm import Config, GlassLM
    from glassllm.train import evaluate, train

    cfg = Config(vocab_size=8, d_model=8, n_layers=1,
                 n_heads=2, n_kv_heads=1, max_len=4)
    model = GlassLM(cfg, seed=0)
    data = np.tile(np.arange(8, dtype=np.int64), 5)
    history = train(model, data, steps=3, batch_size=2, seq_len=4,
                    warmup=1, val_data=data, eval_every=2,
                    keep_best=True, log=None)
    assert [entry["step"] for entry in history] == [0, 1, 2]
    assert [entry["step"] for entry in history if "val_loss" in entry] == [0, 2]
    best = min(entry["val_loss"] for entry in history if "val_loss" in entry)
    np.testing.assert_allclose(evaluate(model, data, 2, 4), best)


# =========================================================================== get_batch
# "It samples batch_size windows and returns (batch_size,seq_len) x,y, preserving the data
# dtype."
@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.uint32, np.int64])
def test_get_batch_shape_and_dtype(dtype):
    data = np.arange(50, dtype=dtype)
    x, y = get_batch(data, batch_size=3, seq_len=5, rng=np.random.default_rng(1))
    assert x.shape == y.shape == (3, 5)
    assert x.dtype == y.dtype == dtype


def test_get_batch_reads_a_memmap(tmp_path):
    path = tmp_path / "ids.bin"
    np.arange(40, dtype=np.uint16).tofile(path)
    data = np.memmap(path, dtype=np.uint16, mode="r")
    x, y = get_batch(data, 2, 6, np.random.default_rng(0))
    assert x.dtype == np.uint16 and not isinstance(x, np.memmap)
    np.testing.assert_array_equal(y, x + 1)


# "Each target is the next token: y[:, :-1] == x[:, 1:]."
def test_get_batch_targets_are_next_tokens():
    data = np.random.default_rng(0).integers(0, 1000, size=100)
    x, y = get_batch(data, 16, 7, np.random.default_rng(2))
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
    for row_x, row_y in zip(x, y):  # each row is a contiguous window of data
        starts = [s for s in range(len(data) - 7) if np.array_equal(data[s:s + 7], row_x)]
        assert any(np.array_equal(data[s + 1:s + 8], row_y) for s in starts)


# "Sampling includes the last window with complete targets and may repeat windows."
def test_get_batch_reaches_last_window_and_repeats():
    data = np.arange(10)
    x, y = get_batch(data, 500, 4, np.random.default_rng(3))
    assert set(x[:, 0].tolist()) == set(range(6))  # starts 0..5; 5 is the last full window
    np.testing.assert_array_equal(y[x[:, 0] == 5][0], [6, 7, 8, 9])
    x, y = get_batch(np.arange(5), 3, 4, np.random.default_rng(0))  # only one window exists
    np.testing.assert_array_equal(x, np.tile(np.arange(4), (3, 1)))
    np.testing.assert_array_equal(y, np.tile(np.arange(1, 5), (3, 1)))


def test_get_batch_is_reproducible_from_the_rng():
    a = get_batch(DATA, 4, 5, np.random.default_rng(7))
    b = get_batch(DATA, 4, 5, np.random.default_rng(7))
    np.testing.assert_array_equal(a[0], b[0])


# "Batch size and sequence length must be positive and len(data)>seq_len, otherwise ValueError
# is raised."
@pytest.mark.parametrize("batch_size, seq_len, n", [
    (0, 4, 10), (-1, 4, 10), (2, 0, 10), (2, -3, 10), (2, 10, 10), (2, 11, 10), (1, 1, 1),
])
def test_get_batch_value_errors(batch_size, seq_len, n):
    with pytest.raises(ValueError):
        get_batch(np.arange(n), batch_size, seq_len, np.random.default_rng(0))


def test_get_batch_smallest_valid_corpus():
    x, y = get_batch(np.arange(2), 1, 1, np.random.default_rng(0))
    assert x.tolist() == [[0]] and y.tolist() == [[1]]


# "The function neither tokenizes text nor validates every ID."
def test_get_batch_does_not_validate_ids():
    data = np.array([-5, 10 ** 9, -1, 7, 123456], dtype=np.int64)
    x, y = get_batch(data, 2, 4, np.random.default_rng(0))
    np.testing.assert_array_equal(x[0], data[:4])
    np.testing.assert_array_equal(y[0], data[1:])


# "Model usage also requires seq_len<=cfg.max_len."
def test_seq_len_beyond_max_len_fails_in_the_model():
    model = tiny_model(max_len=4)
    before = weights(model)
    with pytest.raises(ValueError, match="max_len"):
        train(model, DATA, steps=2, batch_size=2, seq_len=5, log=None)
    with pytest.raises(ValueError, match="max_len"):
        evaluate(model, DATA, 2, 5)
    assert_same_weights(weights(model), before)


# =========================================================================== evaluate
# "evaluate(...) averages losses from sampled batches."
# "The metric is mean natural-log cross-entropy per token, not accuracy."
def test_evaluate_is_mean_of_batch_losses():
    model = tiny_model()
    for n_batches, seed in ((10, 1234), (3, 7)):
        rng = np.random.default_rng(seed)
        losses = [model.loss(*get_batch(DATA, 2, 5, rng)).item() for _ in range(n_batches)]
        got = evaluate(model, DATA, 2, 5, n_batches=n_batches, seed=seed)
        assert isinstance(got, float)
        np.testing.assert_allclose(got, np.mean(losses), rtol=1e-12)
    rng = np.random.default_rng(1234)  # the defaults are 10 batches and seed 1234
    losses = [model.loss(*get_batch(DATA, 2, 5, rng)).item() for _ in range(10)]
    np.testing.assert_allclose(evaluate(model, DATA, 2, 5), np.mean(losses), rtol=1e-12)


# "Perplexity is np.exp(loss)" -- with all-zero weights every logit is 0: loss ln V, ppl V.
def test_evaluate_in_nats_uniform_model():
    model = tiny_model()
    for p in model.parameters():
        p.data[...] = 0.0
    loss = evaluate(model, DATA, 2, 5)
    np.testing.assert_allclose(loss, np.log(8), rtol=1e-6)
    np.testing.assert_allclose(np.exp(loss), 8.0, rtol=1e-6)


# "A fixed seed reproduces windows; this is not an exhaustive corpus pass."
def test_evaluate_fixed_seed_reproduces():
    model = tiny_model()
    data = np.random.default_rng(0).integers(0, 8, size=200)
    assert evaluate(model, data, 2, 5, seed=3) == evaluate(model, data, 2, 5, seed=3)
    assert evaluate(model, data, 2, 5, seed=3) != evaluate(model, data, 2, 5, seed=4)


# "It requires n_batches>0 as well as get_batch and forward conditions."
@pytest.mark.parametrize("kwargs", [dict(n_batches=0), dict(n_batches=-2), dict(seq_len=40),
                                    dict(seq_len=0), dict(batch_size=0), dict(seq_len=9)])
def test_evaluate_value_errors(kwargs):
    args = dict(batch_size=2, seq_len=4, n_batches=2)
    args.update(kwargs)
    with pytest.raises(ValueError):
        evaluate(tiny_model(), DATA, **args)


def test_evaluate_bad_ids_raise():
    with pytest.raises(ValueError, match="outside"):
        evaluate(tiny_model(), DATA + 1, 2, 4)  # id 8 with vocab 8


# "It runs inside no_grad and changes neither weights nor existing gradients."
def test_evaluate_no_grad_weights_and_grads_untouched():
    model = tiny_model()
    params = model.parameters()
    rng = np.random.default_rng(0)
    for p in params[::2]:
        p.grad = rng.standard_normal(p.shape).astype(np.float32)
    grads_before = [None if p.grad is None else p.grad.copy() for p in params]
    before = weights(model)
    seen = []
    real_loss = model.loss

    def spy(x, y):
        seen.append(is_grad_enabled())
        out = real_loss(x, y)
        seen.append(out.requires_grad)
        return out

    model.loss = spy
    evaluate(model, DATA, 2, 4, n_batches=3)
    assert seen == [False, False] * 3
    assert_same_weights(weights(model), before)
    for p, g in zip(params, grads_before):
        if g is None:
            assert p.grad is None
        else:
            np.testing.assert_array_equal(p.grad, g)
    assert is_grad_enabled()


# "It does not call .eval(): there is no dropout or batch-normalization mode."
def test_evaluate_does_not_call_eval_and_measures_the_training_mode_loss():
    """No mode to switch: evaluate's number is the mean of the very losses the model gives
    in training (gradients on) on the windows of get_batch(rng=default_rng(seed)), bit for
    bit; a model with .eval()/.train() that raise, and a bare object with only .loss, both
    work (evaluate never looks for a mode)."""
    model = tiny_model(seed=3)
    rng = np.random.default_rng(1234)
    losses = []
    for _ in range(3):
        x, y = get_batch(VAL, 2, 4, rng)
        losses.append(float(model.loss(x, y).item()))  # grad mode on, as in training
    assert len(set(losses)) == 3  # three different windows, so the seed matters

    def forbidden():
        raise AssertionError("evaluate called .eval() / .train()")

    model.eval = model.train = forbidden
    assert evaluate(model, VAL, 2, 4, n_batches=3) == sum(losses) / 3

    class OnlyLoss:  # the whole interface evaluate may use
        def __init__(self, inner):
            self.loss = inner.loss
    assert evaluate(OnlyLoss(tiny_model(seed=3)), VAL, 2, 4, n_batches=3) == sum(losses) / 3


# =========================================================================== train
# "model is modified in place; ... steps counts updates rather than epochs."
# "History contains one dictionary per completed update: zero-based step, pre-update batch
# loss, and applied lr."
def test_history_entries():
    model = tiny_model()
    before = weights(model)
    history = train(model, DATA, steps=5, batch_size=2, seq_len=4, lr=0.01, warmup=2, log=None)
    assert len(history) == 5
    assert [h["step"] for h in history] == [0, 1, 2, 3, 4]
    for h in history:
        assert set(h) == {"step", "loss", "lr"}
        assert type(h["step"]) is int and type(h["loss"]) is float
        assert h["lr"] == lr_schedule(h["step"], 5, 0.01, 2)
    assert any(not np.array_equal(before[n], w) for n, w in weights(model).items())
    history = train(tiny_model(), np.arange(9) % 8, steps=7, batch_size=1, seq_len=8,
                    log=None)
    assert len(history) == 7  # a corpus with a single window: still 7 updates, no epochs


def test_zero_steps_changes_nothing():
    model = tiny_model()
    before = weights(model)
    assert train(model, DATA, steps=0, batch_size=2, seq_len=4, val_data=DATA,
                 keep_best=True, log=None) == []
    assert_same_weights(weights(model), before)


# "Each iteration samples a batch, calculates loss, resets parameter gradients, runs backward,
# clips global norm to 1, computes learning rate and calls AdamW."
# "Randomness is reproducible by hand" (issue 2): the hand-written loop gives the same
# weights and history, bit for bit -- with and without validation and keep_best.
@pytest.mark.parametrize("with_val", [False, True])
def test_train_equals_hand_written_loop(with_val):
    kwargs = dict(steps=6, batch_size=2, seq_len=5, lr=0.05, warmup=2, seed=3)
    if with_val:
        kwargs.update(val_data=VAL, eval_every=2, keep_best=True)
    a, b = tiny_model(seed=1), tiny_model(seed=1)
    history = train(a, DATA, log=None, **kwargs)
    expected = hand_loop(b, DATA, **kwargs)
    assert history == expected
    assert_same_weights(weights(a), weights(b))
    for pa, pb in zip(a.parameters(), b.parameters()):  # final gradients too (clipped)
        np.testing.assert_array_equal(devices.to_host(pa.grad), devices.to_host(pb.grad))


def test_train_fixed_seed_reproduces_and_seed_matters():
    runs = [train(tiny_model(), DATA, steps=3, batch_size=2, seq_len=4, seed=s, log=None)
            for s in (5, 5, 6)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


# "Each call creates a new optimizer: calling train again does not resume prior moments."
def test_each_call_creates_a_new_optimizer():
    kwargs = dict(steps=3, batch_size=2, seq_len=4, lr=0.05, warmup=1, seed=0)
    model = tiny_model()
    train(model, DATA, log=None, **kwargs)
    second = train(model, DATA, log=None, **kwargs)
    fresh = tiny_model()
    hand_loop(fresh, DATA, **kwargs)  # first call
    expected = hand_loop(fresh, DATA, **kwargs)  # a new AdamW with zero moments
    assert second == expected
    assert_same_weights(weights(model), weights(fresh))
    # ...and that differs from continuing the first optimizer's moments
    resumed = tiny_model()
    opt = AdamW(resumed.parameters(), lr=0.05)
    for _ in range(2):
        rng = np.random.default_rng(0)
        for step in range(3):
            loss = resumed.loss(*get_batch(DATA, 2, 4, rng))
            opt.zero_grad()
            loss.backward()
            clip_grad_norm(resumed.parameters(), 1.0)
            opt.step(lr_schedule(step, 3, 0.05, 1))
    assert any(not np.array_equal(w, weights(model)[n]) for n, w in weights(resumed).items())


# "With validation, val_loss appears when step % eval_every == 0 and at the final step."
@pytest.mark.parametrize("steps, eval_every, expected", [
    (7, 3, [0, 3, 6]), (8, 3, [0, 3, 6, 7]), (4, 1, [0, 1, 2, 3]), (3, 10, [0, 2]),
    (1, 5, [0]),
])
def test_val_loss_steps(steps, eval_every, expected):
    history = train(tiny_model(), DATA, steps=steps, batch_size=1, seq_len=4, val_data=VAL,
                    eval_every=eval_every, log=None)
    assert [h["step"] for h in history if "val_loss" in h] == expected
    assert all(set(h) == {"step", "loss", "lr", "val_loss"} for h in history if "val_loss" in h)
    assert all(type(h["val_loss"]) is float for h in history if "val_loss" in h)


# "Validation evaluates weights after the update, with 10 batches and seed 1234."
def test_validation_measures_weights_after_the_update():
    model = tiny_model()
    before = evaluate(model, VAL, 2, 4)
    history = train(model, DATA, steps=1, batch_size=2, seq_len=4, lr=0.05, warmup=0,
                    val_data=VAL, log=None)
    after = evaluate(model, VAL, 2, 4, n_batches=10, seed=1234)
    assert history[0]["val_loss"] == after
    assert after != before
    assert after != evaluate(model, VAL, 2, 4, n_batches=10, seed=1235)
    assert after != evaluate(model, VAL, 2, 4, n_batches=9, seed=1234)


# "With keep_best=True, weights are copied whenever measured validation improves and restored
# at the end. There is no early stopping or automatic file save."
# "Optimizer state and final gradients are not restored with the weights."
def test_keep_best_restores_best_weights(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kwargs = dict(steps=5, batch_size=2, seq_len=4, lr=0.05, warmup=0, val_data=VAL,
                  eval_every=1)
    states = []
    reference = tiny_model()
    ref_history = hand_loop(reference, DATA, states=states, **kwargs)  # keep_best off
    val = [h["val_loss"] for h in ref_history]
    best = int(np.argmin(val))
    assert best < 4, "the setup must make the last weights not the best"
    model = tiny_model()
    history = train(model, DATA, keep_best=True, log=None, **kwargs)
    assert history == ref_history  # no early stopping: all 5 updates ran
    assert_same_weights(weights(model), states[best])
    np.testing.assert_allclose(evaluate(model, VAL, 2, 4), min(val))
    for p, q in zip(model.parameters(), reference.parameters()):  # grads of the last step
        np.testing.assert_array_equal(devices.to_host(p.grad), devices.to_host(q.grad))
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_without_keep_best_the_last_weights_stay():
    kwargs = dict(steps=5, batch_size=2, seq_len=4, lr=0.05, warmup=0, val_data=VAL,
                  eval_every=1)
    states = []
    hand_loop(tiny_model(), DATA, states=states, **kwargs)
    model = tiny_model()
    train(model, DATA, log=None, **kwargs)
    assert_same_weights(weights(model), states[-1])


# "Without validation, keep_best has no effect."
def test_keep_best_without_validation_has_no_effect():
    kwargs = dict(steps=4, batch_size=2, seq_len=4, lr=0.05, warmup=1, log=None)
    a, b = tiny_model(), tiny_model()
    ha = train(a, DATA, keep_best=True, **kwargs)
    hb = train(b, DATA, keep_best=False, **kwargs)
    assert ha == hb and all("val_loss" not in h for h in ha)
    assert_same_weights(weights(a), weights(b))


# =========================================================================== deadline, failures
# "Training has a fixed two-hour deadline including validation."
def test_deadline_constant():
    assert train_module.TRAIN_DEADLINE_S == 7200.0


class FakeClock:
    """Stands in for glassllm.train's `time` module; `now` moves only when a test says so."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


# "Expiry raises TimeoutError without returning partial history."
def test_expired_deadline_raises_before_any_update(monkeypatch):
    monkeypatch.setattr(train_module, "TRAIN_DEADLINE_S", -1.0)
    model = tiny_model()
    before = weights(model)
    calls = []
    with pytest.raises(TimeoutError):
        train(model, DATA, steps=3, batch_size=2, seq_len=4, val_data=VAL, keep_best=True,
              log=calls.append)
    assert calls == []
    assert_same_weights(weights(model), before)  # no completed best set: last reached state


# "A previously measured best set of weights is restored in finally, including when execution
# fails"
def test_timeout_restores_best_weights(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(train_module, "time", clock)
    kwargs = dict(steps=5, batch_size=2, seq_len=4, lr=0.05, warmup=0, val_data=VAL,
                  eval_every=1)
    states = []
    ref_history = hand_loop(tiny_model(), DATA, states=states, **kwargs)
    val = [h["val_loss"] for h in ref_history[:3]]
    assert int(np.argmin(val)) < 2, "the setup must make the last weights not the best"
    lines = []

    def log(line):
        lines.append(line)
        if len(lines) == 3:  # after update 2: two hours and a second pass
            clock.now += 7201.0

    model = tiny_model()
    with pytest.raises(TimeoutError, match="deadline"):
        train(model, DATA, keep_best=True, log=log, **kwargs)
    assert len(lines) == 3
    assert_same_weights(weights(model), states[int(np.argmin(val))])


def test_timeout_during_validation_counts(monkeypatch):
    # The deadline includes validation: time spent in evaluate() can expire it. The best set
    # was not completed, so the weights stay at the last reached state (after update 0).
    clock = FakeClock()
    monkeypatch.setattr(train_module, "time", clock)
    real_evaluate = train_module.evaluate

    def slow_evaluate(*args, **kwargs):
        clock.now += 7201.0
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(train_module, "evaluate", slow_evaluate)
    kwargs = dict(steps=3, batch_size=2, seq_len=4, lr=0.05, warmup=0, val_data=VAL)
    states = []
    hand_loop(tiny_model(), DATA, states=states, **kwargs)
    model = tiny_model()
    lines = []
    with pytest.raises(TimeoutError):
        train(model, DATA, keep_best=True, log=lines.append, **kwargs)
    assert lines == []
    assert_same_weights(weights(model), states[0])


def test_deadline_clock_is_time_monotonic_of_the_train_module(monkeypatch):
    # Patching the clock itself (not the constant): 2 hours pass between the first two
    # readings, so the first check of step 0 fails.
    readings = [0.0]

    def monotonic():  # the start reads 0.0, every later reading 7200.5
        value = readings[0]
        readings[0] = 7200.5
        return value

    monkeypatch.setattr(train_module.time, "monotonic", monotonic)
    model = tiny_model()
    before = weights(model)
    with pytest.raises(TimeoutError):
        train(model, DATA, steps=2, batch_size=2, seq_len=4, log=None)
    assert_same_weights(weights(model), before)


def test_deadline_not_reached_just_under_two_hours(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(train_module, "time", clock)

    def log(_line):
        clock.now += 7199.0 / 3  # three steps: just under two hours in total

    assert len(train(tiny_model(), DATA, steps=3, batch_size=2, seq_len=4, log=log)) == 3


# "A failing log callback also interrupts execution."
def test_failing_log_interrupts_and_best_is_restored():
    kwargs = dict(steps=5, batch_size=2, seq_len=4, lr=0.05, warmup=0, val_data=VAL,
                  eval_every=1)
    states = []
    ref_history = hand_loop(tiny_model(), DATA, states=states, **kwargs)
    val = [h["val_loss"] for h in ref_history[:3]]
    calls = []

    def log(line):
        calls.append(line)
        if len(calls) == 3:
            raise RuntimeError("log sink broke")

    model = tiny_model()
    with pytest.raises(RuntimeError, match="log sink broke"):
        train(model, DATA, keep_best=True, log=log, **kwargs)
    assert len(calls) == 3  # no step after the failure
    assert_same_weights(weights(model), states[int(np.argmin(val))])
    model = tiny_model()  # without keep_best: the last reached state (after update 2)
    calls.clear()
    with pytest.raises(RuntimeError):
        train(model, DATA, log=log, **kwargs)
    assert_same_weights(weights(model), states[2])


# "log=None prints nothing" (issue 2: "not even a progress bar"); the default log is print.
def test_log_none_prints_nothing_and_default_prints(capsys):
    train(tiny_model(), DATA, steps=2, batch_size=2, seq_len=4, val_data=VAL, log=None)
    assert capsys.readouterr() == ("", "")
    train(tiny_model(), DATA, steps=2, batch_size=2, seq_len=4)
    out = capsys.readouterr()
    assert out.err == "" and len(out.out.splitlines()) == 2
    lines = []
    train(tiny_model(), DATA, steps=3, batch_size=2, seq_len=4, log=lines.append)
    assert len(lines) == 3 and all(isinstance(line, str) for line in lines)


# "steps<0, warmup<0 or eval_every<=0 raise ValueError before updates."
@pytest.mark.parametrize("bad", [dict(steps=-1), dict(warmup=-1), dict(eval_every=0),
                                 dict(eval_every=-5), dict(steps=True), dict(steps=2.5),
                                 dict(warmup=1.5)])
def test_bad_controls_raise_before_updates(bad):
    model = tiny_model()
    before = weights(model)
    calls = []
    args = dict(steps=2, batch_size=2, seq_len=4, val_data=VAL, log=calls.append)
    args.update(bad)
    with pytest.raises(ValueError, match=next(iter(bad))):
        train(model, DATA, **args)
    assert calls == []
    assert_same_weights(weights(model), before)
    assert all(p.grad is None for p in model.parameters())


# "Corpus, shape and ID failures arise in called components."
@pytest.mark.parametrize("data, seq_len, message", [
    (np.arange(4), 4, "len\\(data\\) > seq_len"),  # corpus too short: get_batch
    (np.arange(20).reshape(4, 5), 3, "1-D"),  # not 1-D: get_batch
    (np.arange(20), 4, "outside \\[0, 8\\)"),  # ids >= vocab: the model
])
def test_corpus_shape_and_id_failures(data, seq_len, message):
    model = tiny_model()
    before = weights(model)
    with pytest.raises(ValueError, match=message):
        train(model, data, steps=2, batch_size=2, seq_len=seq_len, log=None)
    assert_same_weights(weights(model), before)
    with pytest.raises(ValueError, match=message):  # validation data goes the same way
        train(tiny_model(), DATA, steps=1, batch_size=2, seq_len=seq_len, val_data=data,
              log=None)
