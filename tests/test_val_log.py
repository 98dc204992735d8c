"""val.csv: a run's validation losses, a row per evaluation as it happens
(`glassllm.training.runfiles.ValLog`, `TrainSettings.val_log`), so that `glassllm serve --run`
shows them live instead of in history.csv at the end. Written by the Trainer before it sends
`Evaluated`; locked with the run's other outputs; rewritten from the checkpoint's history on a
resume (no row of the interrupted run after its checkpoint survives); one of the run's files
for the refusal to overwrite another run, --overwrite and the numbered default folders."""
from __future__ import annotations

import csv
import os

import pytest

from glassllm import Config, GlassLM
from glassllm.training import (Evaluated, Stepped, Trainer, TrainingInterrupted,
                               TrainSettings)
from glassllm.training import runfiles
from glassllm.training.data import ArrayBatches
from glassllm.training.lock import lock_path

from test_trainer import CFG, corpus


def _trainer(tmp_path, name="val.csv", **kw):
    train_ids, val_ids = corpus()
    base = dict(steps=10, batch_size=4, seq_len=8, lr=1e-2, warmup=2, eval_every=2,
                eval_batches=2, seed=0, val_log=str(tmp_path / name))
    return Trainer(TrainSettings(**{**base, **kw}), ArrayBatches(train_ids),
                   ArrayBatches(val_ids), checkpoint_path=tmp_path / f"{name}.ckpt")


def _rows(path) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f))


def _expected(history) -> list[list[str]]:
    """val.csv as the history says it: the header, then each evaluation's step, val_loss and
    mean train loss, floats as repr."""
    return [list(runfiles.VAL_COLUMNS)] + [
        [str(h["step"]), repr(h["val_loss"]), repr(h["train_loss"])]
        for h in history if "val_loss" in h]


def test_each_evaluation_is_in_the_file_when_its_event_arrives(tmp_path):
    """Before: the validation losses reached a file only in history.csv, when the run ended."""
    trainer = _trainer(tmp_path)
    seen = []

    def check(event):
        if isinstance(event, Evaluated):  # the file, read mid-run by another reader
            rows = _rows(tmp_path / "val.csv")
            seen.append(rows[-1])
            assert rows[-1][:2] == [str(event.step), repr(event.val_loss)]
            assert float(rows[-1][2]) == event.train_loss
            assert os.path.exists(lock_path(tmp_path / "val.csv"))  # locked while it runs
    summary = trainer.run(GlassLM(Config(**CFG), seed=0), on_event=check)
    assert [int(r[0]) for r in seen] == [0, 2, 4, 6, 8, 9]
    assert _rows(tmp_path / "val.csv") == _expected(summary.history)
    assert not os.path.exists(lock_path(tmp_path / "val.csv"))


def test_ctrl_c_leaves_every_evaluation_done_and_the_resume_continues_it(tmp_path):
    straight = _trainer(tmp_path, "straight.csv").run(GlassLM(Config(**CFG), seed=0))

    def stop(event):
        if isinstance(event, Stepped) and event.step == 5:
            raise KeyboardInterrupt
    trainer = _trainer(tmp_path)
    with pytest.raises(TrainingInterrupted) as info:
        trainer.run(GlassLM(Config(**CFG), seed=0), on_event=stop)
    assert info.value.step == 6
    assert [r[0] for r in _rows(tmp_path / "val.csv")] == ["step", "0", "2", "4"]
    trainer.run(GlassLM(Config(**CFG), seed=0), resume=info.value.checkpoint_path)
    assert _rows(tmp_path / "val.csv") == _expected(straight.history)
    assert (tmp_path / "val.csv").read_bytes() == (tmp_path / "straight.csv").read_bytes()


@pytest.mark.parametrize("left", ["stale rows", "no file"])
def test_a_resume_drops_the_rows_after_its_checkpoint(tmp_path, left):
    """A run that died (killed, a crash) after its periodic checkpoint at 4 had written the
    evaluations of steps 4 and 6: the resume redoes them, so their rows go, as the step log's
    do; a val.csv removed since is written again from the checkpoint's history."""
    straight = _trainer(tmp_path, "straight.csv").run(GlassLM(Config(**CFG), seed=0))

    class Killed(Exception):
        pass

    def die(event):
        if isinstance(event, Stepped) and event.step == 6:
            raise Killed
    with pytest.raises(Killed):
        _trainer(tmp_path, checkpoint_every=4).run(GlassLM(Config(**CFG), seed=0),
                                                   on_event=die)
    assert [r[0] for r in _rows(tmp_path / "val.csv")] == ["step", "0", "2", "4", "6"]
    if left == "no file":
        os.remove(tmp_path / "val.csv")
    resumed = []
    _trainer(tmp_path).run(GlassLM(Config(**CFG), seed=0), resume=tmp_path / "val.csv.ckpt",
                           on_event=lambda e: isinstance(e, Evaluated) and resumed.append(
                               [r[0] for r in _rows(tmp_path / "val.csv")]))
    assert resumed[0] == ["step", "0", "2", "4"]  # 4 and 6 once each, never twice
    assert _rows(tmp_path / "val.csv") == _expected(straight.history)


def test_a_resume_never_rewrites_a_file_that_is_not_a_val_csv(tmp_path):
    def stop(event):
        if isinstance(event, Stepped) and event.step == 3:
            raise KeyboardInterrupt
    with pytest.raises(TrainingInterrupted) as info:
        _trainer(tmp_path).run(GlassLM(Config(**CFG), seed=0), on_event=stop)
    (tmp_path / "val.csv").write_text("my notes\n")
    with pytest.raises(ValueError, match=r"val.csv is not a glassllm val.csv \(its header is "
                                         r"\['my notes'\]\)"):
        _trainer(tmp_path).run(GlassLM(Config(**CFG), seed=0),
                               resume=info.value.checkpoint_path)
    assert (tmp_path / "val.csv").read_text() == "my notes\n"
    assert not os.path.exists(lock_path(tmp_path / "val.csv"))


def test_no_val_log_no_file_and_settings_take_it_as_an_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a file written anywhere relative would be here
    train_ids, val_ids = corpus()
    Trainer(TrainSettings(steps=2, batch_size=2, seq_len=8, eval_batches=1),
            ArrayBatches(train_ids), ArrayBatches(val_ids)).run(GlassLM(Config(**CFG)))
    assert list(tmp_path.iterdir()) == []
    assert "val_log" in TrainSettings.OUTPUT_FIELDS  # a resume may move it
    with pytest.raises(ValueError, match="TrainSettings.val_log must be a path or None"):
        TrainSettings(val_log=3)
    assert TrainSettings(val_log=tmp_path / "v.csv").val_log == str(tmp_path / "v.csv")


# ------------------------------------------------------------------ one of the run's files
def test_a_val_csv_alone_is_another_runs_file(tmp_path, monkeypatch):
    """A folder whose run left only val.csv (killed before its first model file) is a run's
    folder: refused, replaced whole by --overwrite, skipped by the numbered default."""
    paths = runfiles.run_paths(tmp_path / "run" / "model.safetensors")
    assert paths["val_csv"] == str(tmp_path / "run" / "val.csv")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "val.csv").write_text("step,val_loss,train_loss\n0,5.5,5.6\n")
    with pytest.raises(ValueError, match=r"holds another run's files \(.*run/val.csv\); give "
                                         r"--out in a new folder, or --overwrite"):
        runfiles.check_no_other_run(paths)
    assert runfiles.remove_other_run_files(paths) == [str(tmp_path / "run" / "val.csv")]
    assert list((tmp_path / "run").iterdir()) == []
    monkeypatch.chdir(tmp_path)
    os.makedirs("runs")
    open(os.path.join("runs", "val.csv"), "w").close()
    assert runfiles.free_default_out() == os.path.join("runs", "2", "model.safetensors")
