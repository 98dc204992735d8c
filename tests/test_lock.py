"""glassllm.training.lock and `glassllm train`'s output lock: one run per output path, with real processes.

A run holds flock(2) locks on `<path>.lock` files; a second process asking for one of those
paths is refused at once, naming the holder's pid; a lock file left by a killed process is
taken over."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from glassllm.training.lock import OutputLocked, lock_outputs, lock_path

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")

TINY = ["--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--n-kv-heads", "1",
        "--seq-len", "16", "--batch-size", "4", "--eval-batches", "1"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("The quick brown fox jumps over the lazy dog.\n" * 80, encoding="utf-8")
    return path


def holder_process(paths, tmp_path):
    """A real second process that locks `paths` and waits until it is killed."""
    ready = tmp_path / "ready"
    code = textwrap.dedent(f"""
        import time
        from glassllm.training.lock import lock_outputs
        with lock_outputs({[str(p) for p in paths]!r}):
            open({str(ready)!r}, "w").close()
            time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], env=ENV)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "holder did not start"
        time.sleep(0.02)
    return proc


def test_a_second_process_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "model.safetensors"
    proc = holder_process([out], tmp_path)
    try:
        holder = json.loads((tmp_path / "model.safetensors.lock").read_text())
        assert holder["pid"] == proc.pid
        with pytest.raises(OutputLocked) as info:
            lock_outputs([tmp_path / "other.csv", out])
        err = info.value
        assert isinstance(err, OSError) and err.filename == str(out)
        assert f"pid {proc.pid}" in str(err) and str(tmp_path / "model.safetensors.lock") in \
            str(err)
        # nothing stays locked after a refusal: other.csv is free again
        with lock_outputs([tmp_path / "other.csv"]):
            pass
    finally:
        proc.kill()
        proc.wait()


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path):
    out = tmp_path / "model.safetensors"
    proc = holder_process([out], tmp_path)
    proc.send_signal(signal.SIGKILL)  # no clean-up runs: the lock file stays
    proc.wait()
    assert os.path.exists(lock_path(out))
    with lock_outputs([out]) as lock:
        assert [h["pid"] for h in lock.stale] == [proc.pid]
        assert json.loads(open(lock_path(out)).read())["pid"] == os.getpid()
    assert not os.path.exists(lock_path(out))  # a clean release removes the file


def test_locks_are_reentrant_within_a_process_and_released_last_out(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    with lock_outputs([a, b, None]):
        with lock_outputs([a]):  # the CLI locks, then the Trainer it runs locks again
            pass
        assert os.path.exists(lock_path(a))  # still held by the outer lock
    assert not os.path.exists(lock_path(a)) and not os.path.exists(lock_path(b))


def test_two_concurrent_train_runs_on_one_out(tmp_path, text_file):
    """Two real `glassllm train` processes on the same --out: the second exits 2 at once with
    one line naming the first one's pid; the first one's CSV has exactly its own rows."""
    out = tmp_path / "run" / "model.safetensors"
    log = tmp_path / "steps.csv"
    first = subprocess.Popen(
        [sys.executable, "-m", "glassllm.cli", "train", "--data", str(text_file), *TINY,
         "--steps", "3000", "--eval-every", "1000", "--out", str(out), "--log-csv", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and len(log.read_text().splitlines()) > 3):
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.05)
        # --overwrite: without it the first run's files are refused before the lock is
        # tried; with it, the lock still keeps a running run's files from being replaced
        second = subprocess.run(
            [sys.executable, "-m", "glassllm.cli", "train", "--data", str(text_file), *TINY,
             "--steps", "5", "--out", str(out), "--log-csv", str(tmp_path / "other.csv"),
             "--overwrite"],
            capture_output=True, text=True, env=ENV, timeout=120)
        assert second.returncode == 2, second.stderr
        assert second.stderr.count("\n") == 1 and "Traceback" not in second.stderr
        assert f"{out}: in use by another glassllm run (pid {first.pid}" in second.stderr
        assert "initial val loss" not in second.stdout
        assert not (tmp_path / "other.csv").exists()  # refused before writing anything
        assert first.poll() is None  # the first run goes on
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=120)
    assert first.returncode == 130
    with open(log, newline="") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f)]
    assert steps == list(range(len(steps)))  # one run's rows, in order, none interleaved
    assert not os.path.exists(lock_path(out))  # released on Ctrl-C


def test_the_trainer_locks_its_outputs(tmp_path):
    """The Python Trainer takes the same locks: a run on a model path another process holds
    is refused before it writes anything."""
    import numpy as np

    from glassllm import Config, GlassLM
    from glassllm.training.data import ArrayBatches
    from glassllm.training import Trainer, TrainSettings
    model_path = tmp_path / "m.safetensors"
    proc = holder_process([model_path], tmp_path)
    try:
        ids = np.arange(300) % 50
        trainer = Trainer(TrainSettings(steps=2, batch_size=2, seq_len=8, eval_batches=1,
                                        log_csv=str(tmp_path / "steps.csv")),
                          ArrayBatches(ids), ArrayBatches(ids), model_path=model_path)
        with pytest.raises(OutputLocked, match=f"pid {proc.pid}"):
            trainer.run(GlassLM(Config(d_model=16, n_layers=1, n_heads=2, max_len=8)))
        assert not (tmp_path / "steps.csv").exists() and not model_path.exists()
    finally:
        proc.kill()
        proc.wait()


def test_release_never_removes_a_lock_file_that_is_no_longer_its_own(tmp_path):
    """The module promises to remove its lock file on release only "after checking that it is
    still the one locked". If the file was replaced meanwhile (removed by hand, then locked
    by a new run; or an output that happens to be named like the lock), removing it would
    delete the other run's lock -- letting a third run in beside it -- or that output."""
    out = tmp_path / "model.safetensors"
    with lock_outputs([out]):
        os.remove(lock_path(out))
        with open(lock_path(out), "w") as f:  # now someone else's file at that path
            f.write('{"pid": 1}')
    assert os.path.exists(lock_path(out)) and open(lock_path(out)).read() == '{"pid": 1}'
    os.remove(lock_path(out))
    with lock_outputs([out]):  # and a clean run still removes its own
        assert os.path.exists(lock_path(out))
    assert not os.path.exists(lock_path(out))


def test_temporaries_of_a_killed_run_are_removed_by_the_next_run(tmp_path, text_file):
    """A run killed outright (SIGKILL, MPI's force abort) leaves its lock file and may leave
    `glassllm.formats.atomic` temporaries (up to a checkpoint's size). The next `glassllm train` on
    those paths takes the lock over and removes exactly those temporaries, saying so; a run
    that finds no dead holder removes nothing (another writer might own the file)."""
    out = tmp_path / "model.safetensors"
    ckpt = tmp_path / "checkpoint.safetensors"
    proc = holder_process([out, ckpt], tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = [tmp_path / ".model.safetensors.0123456789ab.tmp",
            tmp_path / ".checkpoint.safetensors.ba9876543210.tmp"]
    kept = [tmp_path / ".model.safetensors.notahexname.tmp",    # not atomic's name
            tmp_path / ".other.safetensors.0123456789ab.tmp",   # another path's
            tmp_path / "model.safetensors.0123456789ab.tmp"]    # no leading dot
    for path in left + kept:
        path.write_bytes(b"x" * 100)
    run = subprocess.run(
        [sys.executable, "-m", "glassllm.cli", "train", "--data", str(text_file), *TINY,
         "--steps", "2", "--out", str(out)], capture_output=True, text=True, env=ENV,
        timeout=120)
    assert run.returncode == 0, run.stderr
    assert not any(p.exists() for p in left) and all(p.exists() for p in kept)
    for path in left:
        assert f"note: removed {path}, a temporary file left by that run" in run.stderr

    from glassllm.formats.atomic import leftover_temporaries
    fresh = tmp_path / ".model.safetensors.00000000cafe.tmp"
    fresh.write_bytes(b"x")
    assert leftover_temporaries(out) == [str(fresh)]
    # the lock was released cleanly: no dead holder, no sweep (--overwrite: the folder now
    # holds the run above, which this one replaces)
    again = subprocess.run(
        [sys.executable, "-m", "glassllm.cli", "train", "--data", str(text_file), *TINY,
         "--steps", "2", "--out", str(out), "--overwrite"], capture_output=True, text=True,
        env=ENV, timeout=120)
    assert again.returncode == 0 and fresh.exists() and "removed" not in again.stderr


def test_the_trainer_removes_temporaries_of_a_killed_run(tmp_path):
    import numpy as np

    from glassllm import Config, GlassLM
    from glassllm.training.data import ArrayBatches
    from glassllm.training import Trainer, TrainSettings
    model_path = tmp_path / "m.safetensors"
    proc = holder_process([model_path], tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = tmp_path / ".m.safetensors.0123456789ab.tmp"
    left.write_bytes(b"x" * 100)
    ids = np.arange(300) % 50
    trainer = Trainer(TrainSettings(steps=2, batch_size=2, seq_len=8, eval_batches=1),
                      ArrayBatches(ids), ArrayBatches(ids), model_path=model_path)
    with pytest.warns(UserWarning, match="removed .*0123456789ab.tmp"):
        trainer.run(GlassLM(Config(d_model=16, n_layers=1, n_heads=2, max_len=8)))
    assert not left.exists() and model_path.exists()


def test_a_ctrl_c_while_the_locks_are_taken_leaves_no_lock_file(tmp_path, monkeypatch):
    """A SIGINT that arrives just after a lock file is made (before it is recorded) is held
    until every lock is recorded, then raised and all released: no lock file is left (a
    Ctrl-C early in `glassllm prepare` left val.bin.lock in the folder it had made)."""
    from glassllm.training import lock as lock_module
    real_acquire = lock_module._acquire

    def acquire_then_interrupt(path, lock_file):
        previous = real_acquire(path, lock_file)
        if path.endswith("b"):
            os.kill(os.getpid(), signal.SIGINT)
        return previous
    monkeypatch.setattr(lock_module, "_acquire", acquire_then_interrupt)
    paths = [str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c")]
    with pytest.raises(KeyboardInterrupt):
        lock_module.lock_outputs(paths)
    assert os.listdir(tmp_path) == []
    assert lock_module._held == {}
