"""The training page's validation points, live: `glassllm serve --run` reads val.csv (a row per
evaluation, written by the trainer as it happens) incrementally, as it reads the per-step log
and health.jsonl; before, validation losses reached the page only in history.csv, at the end
of the run. A malformed row is skipped and said, never a 500."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("aiohttp")

from glassllm import Config, GlassLM  # noqa: E402
from glassllm.serve.run import RunWatcher  # noqa: E402
from glassllm.training import Evaluated, Trainer, TrainSettings  # noqa: E402
from glassllm.training.data import ArrayBatches  # noqa: E402

from serve_client import Running  # noqa: E402
from test_trainer import CFG, corpus  # noqa: E402

HEADER = "step,val_loss,train_loss\n"


def _rows(steps, val=lambda s: 5.0 - s / 100, train=lambda s: 5.25 - s / 80) -> str:
    return "".join(f"{s},{val(s)!r},{train(s)!r}\n" for s in steps)


def test_the_poll_returns_new_validation_points_only(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "val.csv").write_text(HEADER + _rows([0, 10]))
    running = Running(None, run_dir=run)
    try:
        first = running.call("/api/run?after=")[1]
        assert first["incremental"] is False and first["steps"] is None  # not a step log
        assert first["val"] == {"step": [0, 10], "val_loss": [5.0, 4.9],
                                "train_loss": [5.25, 5.125]}
        assert running.call("/api/run")[1]["val"]["step"] == [0, 10]  # the snapshot too
        again = running.call("/api/run?after=" + first["cursor"])[1]
        assert again["incremental"] is True and again["val"]["step"] == []
        with open(run / "val.csv", "a") as f:
            f.write(_rows([20]) + "30,4.7")  # the last row still being written
        more = running.call("/api/run?after=" + again["cursor"])[1]
        assert more["incremental"] is True and more["val"]["step"] == [20]
        assert more["val"]["val_loss"] == [4.8]
        with open(run / "val.csv", "a") as f:
            f.write(",4.9\n")
        done = running.call("/api/run?after=" + more["cursor"])[1]
        assert done["val"] == {"step": [30], "val_loss": [4.7], "train_loss": [4.9]}
        # a resume rewrites val.csv (a new file, the evaluations of its checkpoint): afresh
        tmp = run / "val.csv.tmp"
        tmp.write_text(HEADER + _rows([0, 10], val=lambda s: 1.0))
        os.replace(tmp, run / "val.csv")
        resumed = running.call("/api/run?after=" + done["cursor"])[1]
        assert resumed["incremental"] is False
        assert resumed["val"]["step"] == [0, 10] and resumed["val"]["val_loss"] == [1.0, 1.0]
        assert resumed["problems"] == []
    finally:
        running.stop()


def test_a_malformed_validation_row_is_skipped_and_said(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "val.csv").write_bytes(HEADER.encode() + b"0,5.0,5.1\nx,5.0,5.1\n10,nan,5.0\n"
                                  b"20,,5.0\n30,low,\n40.5,4.0,4.1\n50,1e999,4.0\n\xff\n"
                                  b"60,4.5,\n")
    running = Running(None, run_dir=run)
    try:
        for query in ("", "?after=", "?after=", "?version=0"):
            status, r = running.call("/api/run" + query)
            assert status == 200, (query, r)
            assert r["val"] == {"step": [0, 60], "val_loss": [5.0, 4.5],
                                "train_loss": [5.1, None]}
            assert r["problems"] == [
                "val.csv: line 3: step 'x' is not a whole number; skipped",
                "val.csv: line 4: val_loss 'nan' is not a finite number; skipped",
                "val.csv: line 5: val_loss '' is not a finite number; skipped",
                "val.csv: line 6: val_loss 'low' is not a finite number; skipped",
                "val.csv: line 7: step '40.5' is not a whole number; skipped",
                "val.csv: line 8: val_loss '1e999' is not a finite number; skipped",
                "val.csv: line 9 is not UTF-8 text; skipped"], \
                r["problems"]
    finally:
        running.stop()


def test_a_running_trainers_evaluations_reach_the_poll_as_they_happen(tmp_path):
    """The trainer and the watcher of its folder together: at each `Evaluated` the poll
    answers that evaluation's point, and only the new one."""
    train_ids, val_ids = corpus()
    trainer = Trainer(TrainSettings(steps=7, batch_size=4, seq_len=8, eval_every=3,
                                    eval_batches=1, val_log=str(tmp_path / "val.csv")),
                      ArrayBatches(train_ids), ArrayBatches(val_ids))
    watcher = RunWatcher(str(tmp_path))
    cursor, seen = "", []

    def poll(event):
        nonlocal cursor
        if isinstance(event, Evaluated):
            answer = watcher.poll(cursor)
            cursor = answer["cursor"]
            seen.append((answer["val"]["step"], answer["val"]["val_loss"]))
            assert answer["val"]["step"] == [event.step]
            assert answer["val"]["val_loss"] == [event.val_loss]
    trainer.run(GlassLM(Config(**CFG), seed=0), on_event=poll)
    assert [steps for steps, _ in seen] == [[0], [3], [6]]
