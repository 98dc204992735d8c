"""A run never destroys a file that is not its own: the model a fine-tune starts from, a file
at a recorded step log's path, a user's file named like a lock; and a resume continues on the
thread count its run used."""
from __future__ import annotations

import json
import os


# ------------------------------------------------------------------ --init-from kept
def _tiny_model_file(path):
    from glassllm.formats import files
    from glassllm.tokenizers import ByteTokenizer
    from glassllm.model import Config, GlassLM
    path.parent.mkdir(parents=True, exist_ok=True)
    files.save(GlassLM(Config(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, max_len=16),
                       seed=0), path, tokenizer=ByteTokenizer())
    return path


def test_a_fine_tune_never_replaces_the_model_it_starts_from(tmp_path, capsys):
    """`--init-from base/m --out base/m` replaced the base model with the fine-tune, exit 0;
    `--checkpoint base/m` would have on the first stop."""
    from glassllm.cli import main
    base = _tiny_model_file(tmp_path / "base" / "model.safetensors")
    before = base.read_bytes()
    data = tmp_path / "a.txt"
    data.write_text("to be or not to be, that is the question. " * 40)
    common = ["train", "--data", str(data), "--init-from", str(base), "--steps", "2",
              "--seq-len", "16", "--batch-size", "2", "--eval-batches", "1"]
    for extra in (["--out", str(base)],
                  ["--out", str(tmp_path / "ft" / "m.safetensors"), "--checkpoint", str(base)]):
        assert main(common + extra) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"would overwrite --init-from {base}" in line, line
    assert base.read_bytes() == before
    assert not (tmp_path / "base" / "history.csv").exists()


def test_no_output_inside_an_init_from_directory(tmp_path):
    import pytest
    from glassllm.training.runfiles import check_init_from_kept
    hf = tmp_path / "hf"
    (hf / "sub").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"^--out .*sub/m.safetensors would overwrite "
                                         r"--init-from .*hf, the model"):
        check_init_from_kept({"--out": hf / "sub" / "m.safetensors", "--log-csv": None}, hf)
    check_init_from_kept({"--out": tmp_path / "m.safetensors"}, hf)  # beside it: fine


def test_a_resume_keeps_the_thread_count_the_run_measured(tmp_path, monkeypatch, capsys):
    """Without --threads the count comes from the load measured at start; on NumPy's BLAS
    the last bits depend on it (a d_model 16 model: 6.6e-7 apart after 40 steps on 1 and 2
    threads), so a resume under another load did not continue bit for bit. The checkpoint
    now keeps the count in effect, and the resume uses it."""
    import re
    from glassllm.cli import main
    from glassllm.engine import cpu
    from glassllm.formats.checkpoint import load_checkpoint
    data = tmp_path / "a.txt"
    data.write_text("to be or not to be, that is the question. " * 40)
    monkeypatch.delenv("GLASSLLM_THREADS", raising=False)  # (conftest pins it) measured here
    monkeypatch.setattr(cpu, "choose_threads", lambda requested=None, load=None:
                        (requested, "as requested") if requested else (2, "measured"))
    run = ["--seq-len", "16", "--batch-size", "2", "--eval-batches", "1", "--d-model", "16",
           "--n-layers", "1", "--n-heads", "2"]
    assert main(["train", "--data", str(data), "--steps", "4", "--checkpoint-every", "2",
                 "--out", str(tmp_path / "r" / "m.safetensors"), *run]) == 0
    ckpt = tmp_path / "r" / "checkpoint.safetensors"
    assert load_checkpoint(str(ckpt)).extra["threads"] == 2
    capsys.readouterr()
    monkeypatch.setattr(cpu, "choose_threads", lambda requested=None, load=None:
                        (requested, "as requested") if requested else (1, "measured"))
    try:
        assert main(["train", "--resume", str(ckpt)]) == 0
    finally:  # the CLI's choice is process-wide: the next tests run on conftest's one thread
        cpu.set_default_threads(1)
    assert re.search(r"^threads: 2 \(the resumed run's", capsys.readouterr().out, re.M)


# ------------------------------------------------------------------ a step log not the run's
def _tiny_run(tmp_path, name, log_csv, seed="0"):
    from glassllm.cli import main
    data = tmp_path / "a.txt"
    if not data.exists():
        data.write_text("to be or not to be, that is the question. " * 40)
    assert main(["train", "--data", str(data), "--steps", "4", "--checkpoint-every", "2",
                 "--seq-len", "16", "--batch-size", "2", "--eval-batches", "1", "--d-model",
                 "16", "--n-layers", "1", "--n-heads", "2", "--threads", "1", "--seed", seed,
                 "--out", str(tmp_path / name / "m.safetensors"), "--log-csv",
                 str(log_csv)]) == 0
    return tmp_path / name / "checkpoint.safetensors"


def test_a_resume_never_rewrites_a_file_that_is_not_its_step_log(tmp_path, capsys):
    """A moved run's recorded --log-csv (relative to the checkpoint) can name any file by
    now: the resume rewrote it to its first line before finding its header wrong."""
    from glassllm.cli import main
    log = tmp_path / "steps.csv"
    ckpt = _tiny_run(tmp_path, "r", log)
    log.write_text("".join(f"someone else's row {i}\n" for i in range(100)))
    before = log.read_bytes()
    assert main(["train", "--resume", str(ckpt)]) == 2
    assert log.read_bytes() == before
    assert "is not a glassllm step log" in capsys.readouterr().err


def test_another_runs_step_log_is_refused_by_its_rows(tmp_path):
    import pytest
    from glassllm.formats.checkpoint import load_checkpoint
    from glassllm.training.safety import check_own_step_log
    ours, theirs = tmp_path / "ours.csv", tmp_path / "theirs.csv"
    history = load_checkpoint(str(_tiny_run(tmp_path, "a", ours))).history
    _tiny_run(tmp_path, "b", theirs, seed="1")
    check_own_step_log(ours, history)
    with pytest.raises(ValueError, match=r"theirs.csv is not this run's step log \(no row for "
                                         r"its step 3 with its loss"):
        check_own_step_log(theirs, history)


# ------------------------------------------------------------------ lock files and outputs
def test_an_output_named_as_another_outputs_lock_is_refused(tmp_path):
    """`--log-csv m.safetensors.lock` beside `--out m.safetensors`: the step log was written
    into the lock file, and removed with it when the run ended."""
    import pytest
    from glassllm.training.lock import lock_outputs
    out = tmp_path / "m.safetensors"
    with pytest.raises(ValueError, match=r"m.safetensors.lock is the lock file of the output "):
        lock_outputs([out, tmp_path / "m.safetensors.lock"])
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_a_lock_is_never_taken_over(tmp_path):
    """A user's file that happened to be named `<output>.lock` was emptied, then removed."""
    import pytest
    from glassllm.training.lock import lock_outputs
    (tmp_path / "history.csv.lock").write_text("precious\n")
    with pytest.raises(FileExistsError, match="not a glassllm lock"):
        lock_outputs([tmp_path / "history.csv"])
    assert (tmp_path / "history.csv.lock").read_text() == "precious\n"
    (tmp_path / "m.lock").write_text('{"pid": 999999999, "ho')  # a holder killed mid-write
    with lock_outputs([tmp_path / "m"]):  # taken over
        assert json.loads((tmp_path / "m.lock").read_text())["pid"] == os.getpid()
