"""Checkpoints: file round trip, clear errors, and exact resume (issue 4's acceptance):
N steps straight and k steps + stop + resume + N-k steps give bit-identical weights, optimizer
state and history."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from glassllm import Config, GlassLM
from glassllm.formats import files
from glassllm.amp import GradScaler
from glassllm.formats.checkpoint import (Checkpoint, load_checkpoint, load_optimizer_state,
                                 optimizer_state, save_checkpoint)
from glassllm.training.data import ArrayBatches
from glassllm.optim import AdamW
from glassllm.training import Checkpointed, Trainer, TrainingInterrupted, TrainSettings

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
    with pytest.raises(IsADirectoryError, match="is a directory, not a checkpoint"):
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


# ------------------------------------------------------------------ issue 9: nothing damaged
def written_checkpoint(tmp_path, **kw):
    t = make_trainer(tmp_path, "run", checkpoint_every=3, steps=3, **kw)
    t.run(GlassLM(Config(**CFG)))
    return tmp_path / "run.ckpt"


def rewrite(path, out, tensors=None, state=None, digest=True, version=None):
    """A copy of checkpoint `path` with other tensors and/or state, with a fresh digest (as
    a tool that rewrote the file consistently would make) unless digest=False."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    from glassllm.formats import integrity
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
        old = {n: f.get_tensor(n) for n in f.keys()}
    tensors = old if tensors is None else tensors(old)
    meta = {k: v for k, v in meta.items() if k != "digest"}
    if state is not None:
        s = json.loads(meta["state"])
        state(s)
        meta["state"] = json.dumps(s)
    if version is not None:
        meta["version"] = version
    if digest:
        meta = integrity.sign(tensors, meta)
    save_file(tensors, str(out), metadata=meta)
    return out


def test_a_checkpoint_rewritten_as_int32_is_refused(tmp_path):
    """Today's bug: int32 tensors loaded as zero weights and the run went on (exit 0)."""
    ckpt = written_checkpoint(tmp_path)
    as_int = {"tensors": lambda t: {n: a.astype(np.int32) for n, a in t.items()}}
    for digest in (True, False):  # a consistent rewrite, and one that kept the old digest
        bad = rewrite(ckpt, tmp_path / f"int{digest}.ckpt", digest=digest, **as_int)
        with pytest.raises(ValueError, match=f"int{digest}.ckpt") as info:
            load_checkpoint(bad)
        assert ("dtype I32; checkpoints hold float32" if digest else "digest") in \
            str(info.value) or "damaged" in str(info.value)
        with pytest.raises(ValueError):
            make_trainer(tmp_path, "run", steps=3).run(GlassLM(Config(**CFG)), resume=bad)


def test_a_flipped_bit_in_a_checkpoint_names_the_file_and_the_tensor(tmp_path):
    ckpt = written_checkpoint(tmp_path)
    data = bytearray(ckpt.read_bytes())
    n = int.from_bytes(data[:8], "little")
    header = json.loads(bytes(data[8:8 + n]))
    lo = header["optimizer.v.blocks.1.mlp.up.weight"]["data_offsets"][0]
    data[8 + n + lo + 2] ^= 0x01  # the lowest mantissa bit of one moment: finite, positive
    (tmp_path / "flip.ckpt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"flip\.ckpt.*tensor "
                                         r"'optimizer\.v\.blocks\.1\.mlp\.up\.weight' is damaged"):
        load_checkpoint(tmp_path / "flip.ckpt")


def set_path(state, dotted, value):
    *parents, last = dotted.split(".")
    for p in parents:
        state = state[int(p) if p.isdigit() else p]
    state[int(last) if last.isdigit() else last] = value


@pytest.mark.parametrize("field, value, match", [
    ("step", "3", "state.step must be an integer"),
    ("step", -1, "state.step must be an integer >= 0"),
    ("step", 4, "state.history must be a list of 4 entries"),
    ("config", [1], "state.config must be an object"),
    ("config.d_model", "16", "state.config is invalid"),
    ("optimizer.t", 2.5, "state.optimizer.t must be an integer"),
    ("optimizer.lr", "0.01", "state.optimizer.lr must be a finite number"),
    ("optimizer.betas", [0.9], "state.optimizer.betas must be two numbers"),
    ("optimizer.steps", {}, "state.optimizer.steps must map each parameter"),
    ("optimizer.eps", 0, "state.optimizer.eps must be a finite positive number"),
    ("rng_state", None, "state.rng_state is not a PCG64 state"),
    ("rng_state.state.state", -5, "state.rng_state is not a PCG64 state"),
    ("rng_state.bit_generator", "MT19937", "state.rng_state is not a PCG64 state"),
    ("settings", [], "state.settings must be an object"),
    ("best_val_loss", "low", "state.best_val_loss must be a finite number"),
    ("best_step", None, "must both be set or both null"),
    ("best_step", 3, "state.best_step must be an integer in [0, 2]"),
    ("history", {}, "state.history must be a list"),
    ("history.0", 5, "state.history[0] must be an object"),
    ("history.1.step", 0, "state.history[1].step must be 1"),
    ("history.1.lr", None, "state.history[1].lr must be a finite number"),
    ("history.0.skipped", "yes", "state.history[0].skipped must be one of"),
    ("scaler", "fp32", "state.scaler must be null or"),
    ("scaler.precision", "fp16", "state.scaler.precision is 'fp16' but state.settings"),
    ("extra", [], "state.extra must be an object"),
    ("data", {"train": 1}, "state: data must be an object with 'train' and 'val'"),
    ("data.train.sha256", "abc", "data.train must be"),
    ("data.val.tokens", -1, "data.val must be"),
])
def test_every_json_field_of_the_state_is_checked(tmp_path, field, value, match):
    """A consistent rewrite (fresh digest) with one field of the wrong type or range: one
    ValueError line naming the file and the field, never AttributeError/TypeError/KeyError."""
    ckpt = written_checkpoint(tmp_path)
    bad = rewrite(ckpt, tmp_path / "bad.ckpt", state=lambda s: set_path(s, field, value))
    with pytest.raises(ValueError) as info:
        load_checkpoint(bad)
    message = str(info.value)
    assert message.startswith(f"checkpoint {str(bad)!r}: ") and match in message, message
    assert "\n" not in message
    # the same state with the digest of the original file: refused as damaged
    stale = rewrite(ckpt, tmp_path / "stale.ckpt", state=lambda s: set_path(s, field, value),
                    digest=False, version="2")
    with pytest.raises(ValueError, match="stale.ckpt.*(digest|not what was written)"):
        load_checkpoint(stale)


def test_missing_and_unknown_state_fields_are_named(tmp_path):
    ckpt = written_checkpoint(tmp_path)
    bad = rewrite(ckpt, tmp_path / "bad.ckpt", state=lambda s: (s.pop("rng_state"),
                                                               s.update(lucky=7)))
    with pytest.raises(ValueError, match=r"lacks \['rng_state'\]; has unknown \['lucky'\]"):
        load_checkpoint(bad)


def test_a_pipe_or_device_is_refused_without_blocking(tmp_path):
    """The model files' reader refused a FIFO (opening one blocks until a writer comes); the
    checkpoint's own loop did not. One reader now: both refuse it, naming it."""
    fifo = tmp_path / "pipe.ckpt"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/null"):
        with pytest.raises(ValueError, match=f"{path}: not a regular file"):
            load_checkpoint(path)


@pytest.mark.parametrize("field, value, match", [
    ("optimizer.lr", 10 ** 400, "state.optimizer.lr must be a finite number >= 0.0, got 1000"),
    ("step", list(range(10 ** 4)), "state.step must be an integer >= 0, got [0, 1, 2"),
])
def test_a_number_out_of_floats_range_or_a_huge_value_is_one_short_line(tmp_path, field,
                                                                         value, match):
    """10**400 made math.isfinite raise OverflowError (not a ValueError naming the file); a
    10**4-long list was printed whole."""
    bad = rewrite(written_checkpoint(tmp_path), tmp_path / "bad.ckpt",
                  state=lambda s: set_path(s, field, value))
    with pytest.raises(ValueError) as info:
        load_checkpoint(bad)
    message = str(info.value)
    assert message.startswith(f"checkpoint {str(bad)!r}: {match}") and len(message) < 300, \
        message


def test_version_1_checkpoints_load_but_cannot_be_resumed(tmp_path):
    """Written before digests and data identities: they load (all checks but the digest), and
    a Trainer refuses to resume one, since it cannot tell whether the data is the same."""
    ckpt = written_checkpoint(tmp_path)
    old = rewrite(ckpt, tmp_path / "v1.ckpt", state=lambda s: s.pop("data"), digest=False,
                  version="1")
    back = load_checkpoint(old)
    assert back.step == 3 and back.data is None
    np.testing.assert_array_equal(back.weights["token_embedding.weight"],
                                  load_checkpoint(ckpt).weights["token_embedding.weight"])
    with pytest.raises(ValueError, match="records no data identity"):
        make_trainer(tmp_path, "run", steps=3).run(GlassLM(Config(**CFG)), resume=old)
    for version, match in (("3", "has version '3'"), ("2", "must carry a digest")):
        other = rewrite(ckpt, tmp_path / f"v{version}.ckpt", digest=False, version=version)
        with pytest.raises(ValueError, match=match):
            load_checkpoint(other)


def test_a_trainer_checkpoint_refuses_to_resume_on_other_data(tmp_path):
    """The Python Trainer records the data identity in every checkpoint and checks it."""
    ckpt = written_checkpoint(tmp_path)
    state = load_checkpoint(ckpt)
    train, val = data()
    assert state.data == {"train": {"tokens": 540, "sha256": train.fingerprint()},
                          "val": {"tokens": 60, "sha256": val.fingerprint()}}
    t = make_trainer(tmp_path, "again", steps=3, checkpoint_every=3)
    t.train_data = ArrayBatches(train.ids[::-1].copy())  # same tokens and count, other order
    with pytest.raises(ValueError, match="the training data differs from the checkpoint's "
                                         r"\(same length, other content"):
        t.run(GlassLM(Config(**CFG)), resume=ckpt)
    assert not (tmp_path / "again.ckpt").exists()


def test_save_refuses_what_load_would_refuse(tmp_path):
    ckpt = small_checkpoint()
    ckpt.weights["token_embedding.weight"] = ckpt.weights["token_embedding.weight"].astype(
        np.float64)
    with pytest.raises(ValueError, match="token_embedding.weight' has dtype float64"):
        save_checkpoint(tmp_path / "c.ckpt", ckpt)
    ckpt = small_checkpoint()
    ckpt.optimizer["t"] = "0"
    with pytest.raises(ValueError, match="state.optimizer.t must be an integer"):
        save_checkpoint(tmp_path / "c.ckpt", ckpt)
    assert os.listdir(tmp_path) == []
