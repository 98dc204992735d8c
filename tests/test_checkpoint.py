"""Checkpoints: file round trip, clear errors, and exact resume (issue 4's acceptance):
N steps straight and k steps + stop + resume + N-k steps give bit-identical weights, optimizer
state and history."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from glassllm import Config, GlassLM, files
from glassllm.amp import GradScaler
from glassllm.checkpoint import (Checkpoint, load_checkpoint, load_optimizer_state,
                                 optimizer_state, save_checkpoint)
from glassllm.data import ArrayBatches
from glassllm.optim import AdamW
from glassllm.train import (Checkpointed, Trainer, TrainingInterrupted, TrainSettings)

CFG = dict(vocab_size=257, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, max_len=16)
N, K = 9, 4


def data():
    text = ("It was the best of times, it was the worst of times. " * 12).encode()[:600]
    ids = np.frombuffer(text, dtype=np.uint8).astype(np.int64)
    return ArrayBatches(ids[:540]), ArrayBatches(ids[540:])


def make_trainer(tmp_path, name, **kw):
    train, val = data()
    s = dict(steps=N, batch_size=4, seq_len=8, lr=1e-2, warmup=2, eval_every=3,
             eval_batches=2, seed=7, log_csv=str(tmp_path / f"{name}.csv"))
    s.update(kw)
    return Trainer(TrainSettings(**s), train, val, model_path=tmp_path / f"{name}.safetensors",
                   checkpoint_path=tmp_path / f"{name}.ckpt")



@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_stop_and_resume_is_bit_identical_to_a_straight_run(tmp_path, precision):
    straight = make_trainer(tmp_path, "straight", precision=precision, checkpoint_every=N)
    a = GlassLM(Config(**CFG), seed=0)
    summary_a = straight.run(a)

    # k steps, then stop (as Ctrl-C would) right after the checkpoint of step K
    stopped = make_trainer(tmp_path, "resumed", precision=precision, checkpoint_every=K)

    def stop(event):
        if isinstance(event, Checkpointed) and event.step == K:
            raise KeyboardInterrupt
    with pytest.raises(TrainingInterrupted) as info:
        stopped.run(GlassLM(Config(**CFG), seed=0), on_event=stop)
    assert info.value.step == K
    assert load_checkpoint(info.value.checkpoint_path).step == K

    # a new process would build a model from scratch: a different init must not matter
    b = GlassLM(Config(**CFG), seed=123)
    resumed = make_trainer(tmp_path, "resumed", precision=precision, checkpoint_every=N)
    summary_b = resumed.run(b, resume=info.value.checkpoint_path)

    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)
    assert summary_b.history == summary_a.history  # every loss, lr, val_loss, bit for bit
    assert (summary_b.best_step, summary_b.best_val_loss) == \
        (summary_a.best_step, summary_a.best_val_loss)
    # optimizer moments, per-parameter counts, t and the scaler: the final checkpoints agree
    ca = load_checkpoint(tmp_path / "straight.ckpt")
    cb = load_checkpoint(tmp_path / "resumed.ckpt")
    assert ca.step == cb.step == N
    for key in ("m", "v"):
        for name in ca.optimizer[key]:
            np.testing.assert_array_equal(ca.optimizer[key][name], cb.optimizer[key][name])
    assert ca.optimizer["steps"] == cb.optimizer["steps"] and ca.optimizer["t"] == N
    assert ca.rng_state == cb.rng_state and ca.scaler == cb.scaler
    if precision == "fp16":
        assert ca.scaler["scaler"]["scale"] > 0  # the loss scale was saved and restored
    # the best-model files hold the same weights, and the per-step CSV logs are identical
    best_a = files.load(tmp_path / "straight.safetensors").state_dict()
    best_b = files.load(tmp_path / "resumed.safetensors").state_dict()
    for name, w in best_a.items():
        np.testing.assert_array_equal(w, best_b[name], err_msg=name)
    assert (tmp_path / "straight.csv").read_text() == (tmp_path / "resumed.csv").read_text()


def test_resume_drops_csv_rows_of_updates_after_the_checkpoint(tmp_path):
    """A run killed after its last checkpoint logged rows the resumed run redoes."""
    straight = make_trainer(tmp_path, "straight")
    straight.run(GlassLM(Config(**CFG)))
    t = make_trainer(tmp_path, "crashed", checkpoint_every=K)

    def crash(event):  # a hard crash two updates after the checkpoint: no checkpoint then
        if getattr(event, "step", None) == K + 1 and not isinstance(event, Checkpointed):
            raise RuntimeError("power cut")
    with pytest.raises(RuntimeError):
        t.run(GlassLM(Config(**CFG)), on_event=crash)
    assert load_checkpoint(tmp_path / "crashed.ckpt").step == K
    t.run(GlassLM(Config(**CFG)), resume=tmp_path / "crashed.ckpt")
    assert (tmp_path / "crashed.csv").read_text() == (tmp_path / "straight.csv").read_text()


def test_checkpoint_round_trip(tmp_path):
    model = GlassLM(Config(**CFG), seed=1)
    opt = AdamW(model.parameters(), lr=0.01)
    for p in model.parameters():
        p.grad = np.full_like(p.data, 0.5)
    opt.step()
    rng = np.random.default_rng(9)
    rng.integers(0, 10, size=3)
    ckpt = Checkpoint(step=1, config=model.cfg.to_dict(), weights=model.state_dict(),
                      optimizer=optimizer_state(model, opt), rng_state=rng.bit_generator.state,
                      settings={"steps": 5}, best_val_loss=1 / 3, best_step=0,
                      history=[{"step": 0, "loss": 0.1 + 0.2, "lr": 1e-3, "val_loss": 1 / 3}],
                      scaler={"precision": "fp16", "scaler": GradScaler().state_dict()},
                      extra={"tokenizer": '{"type": "byte"}'})
    path = save_checkpoint(tmp_path / "sub" / "c.ckpt", ckpt)
    assert sorted(os.listdir(tmp_path / "sub")) == ["c.ckpt"]  # no temporary left
    back = load_checkpoint(path)
    assert back.history == ckpt.history and back.history[0]["loss"] == 0.1 + 0.2
    assert back.rng_state == ckpt.rng_state  # 128-bit integers survive JSON
    restored_rng = np.random.default_rng(0)
    restored_rng.bit_generator.state = back.rng_state
    assert restored_rng.integers(0, 1 << 30) == rng.integers(0, 1 << 30)
    assert (back.best_val_loss, back.best_step, back.scaler, back.extra, back.settings) == \
        (1 / 3, 0, ckpt.scaler, ckpt.extra, {"steps": 5})
    for name, w in ckpt.weights.items():
        np.testing.assert_array_equal(back.weights[name], w)
    other = GlassLM(Config(**CFG), seed=2)
    opt2 = AdamW(other.parameters())
    load_optimizer_state(other, opt2, back.optimizer)
    assert opt2.t == 1 and opt2.steps == opt.steps and opt2.lr == 0.01
    for m1, m2 in zip(opt.m + opt.v, opt2.m + opt2.v):
        np.testing.assert_array_equal(m1, m2)


def test_missing_corrupt_and_foreign_files_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.ckpt"):
        load_checkpoint(tmp_path / "nope.ckpt")
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(ValueError, match="junk.ckpt.*corrupt"):
        load_checkpoint(junk)
    model_file = tmp_path / "model.safetensors"
    files.save(GlassLM(Config(**CFG)), model_file)
    with pytest.raises(ValueError, match="not a glassllm checkpoint"):
        load_checkpoint(model_file)
    with pytest.raises(ValueError, match="directory"):
        load_checkpoint(tmp_path)


def test_truncated_checkpoint_is_refused(tmp_path):
    t = make_trainer(tmp_path, "run", checkpoint_every=3, steps=3)
    t.run(GlassLM(Config(**CFG)))
    raw = (tmp_path / "run.ckpt").read_bytes()
    (tmp_path / "cut.ckpt").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="cut.ckpt"):
        load_checkpoint(tmp_path / "cut.ckpt")


def test_resume_refuses_other_settings_or_another_model(tmp_path):
    t = make_trainer(tmp_path, "run", checkpoint_every=3, steps=3)
    t.run(GlassLM(Config(**CFG)))
    ckpt = tmp_path / "run.ckpt"
    with pytest.raises(ValueError, match="lr"):
        make_trainer(tmp_path, "run", steps=3, lr=0.5).run(GlassLM(Config(**CFG)), resume=ckpt)
    bigger = Config(**{**CFG, "d_model": 32})
    with pytest.raises(ValueError, match="config"):
        make_trainer(tmp_path, "run", steps=3).run(GlassLM(bigger), resume=ckpt)
    # output settings may change on resume
    make_trainer(tmp_path, "run", steps=3, checkpoint_every=1, log_csv=None).run(
        GlassLM(Config(**CFG)), resume=ckpt)


def test_the_checkpoint_state_is_plain_json(tmp_path):
    """No pickle anywhere: the metadata is JSON text and the tensors are raw arrays."""
    from safetensors import safe_open
    t = make_trainer(tmp_path, "run", checkpoint_every=3, steps=3)
    t.run(GlassLM(Config(**CFG)))
    with safe_open(str(tmp_path / "run.ckpt"), framework="numpy") as f:
        meta = f.metadata()
        names = set(f.keys())
    state = json.loads(meta["state"])
    assert meta["format"] == "glassllm-checkpoint" and state["step"] == 3
    assert {"model.token_embedding.weight", "optimizer.m.token_embedding.weight",
            "optimizer.v.token_embedding.weight"} <= names
    assert state["optimizer"]["t"] == 3 and state["settings"]["steps"] == 3


def small_checkpoint():
    model = GlassLM(Config(**CFG), seed=1)
    opt = AdamW(model.parameters(), lr=0.01)
    return Checkpoint(step=0, config=model.cfg.to_dict(), weights=model.state_dict(),
                      optimizer=optimizer_state(model, opt),
                      rng_state=np.random.default_rng(0).bit_generator.state,
                      settings={"steps": 5})


def test_unwritable_checkpoint_paths_name_the_path_not_a_temporary(tmp_path):
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    ckpt = small_checkpoint()
    with pytest.raises(IsADirectoryError) as info:
        save_checkpoint(tmp_path / "adir", ckpt)
    assert info.value.filename == str(tmp_path / "adir") and ".tmp" not in str(info.value)
    for target in (tmp_path / "afile" / "c.ckpt", tmp_path / "afile" / "sub" / "c.ckpt"):
        with pytest.raises(OSError) as info:  # FileExistsError / NotADirectoryError
            save_checkpoint(target, ckpt)
        assert info.value.filename == str(target) and ".tmp" not in str(info.value)
        assert "cannot write the checkpoint" in str(info.value)
    assert sorted(os.listdir(tmp_path)) == ["adir", "afile"]
    assert os.listdir(tmp_path / "adir") == []
