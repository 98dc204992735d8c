"""`glassllm train`: data in, best model + history out, clear errors, Ctrl-C and --resume.

Tiny models and few steps keep these fast; the full tinyshakespeare run of the README is
marked slow."""
from __future__ import annotations

import csv
import math
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest

from glassllm import files
from glassllm.checkpoint import load_checkpoint
from glassllm.cli import main, stdlib_corpus
from glassllm.train import TrainSettings

TINY = ["--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--n-kv-heads", "1",
        "--seq-len", "16", "--batch-size", "4", "--eval-batches", "2"]
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("The quick brown fox jumps over the lazy dog.\n" * 60
                    + "Ünïcödé ends here.\n", encoding="utf-8")
    return path


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_train_on_a_text_file_writes_model_history_and_plot(tmp_path, text_file, capsys):
    out = tmp_path / "run" / "model.safetensors"
    rc = main(["train", "--data", str(text_file), "--out", str(out), "--steps", "12",
               "--eval-every", "5", "--lr", "1e-2", "--warmup", "2", *TINY])
    printed = capsys.readouterr().out
    assert rc == 0
    model = files.load(out)
    assert model.cfg.d_model == 16 and model.cfg.max_len == 16 and model.cfg.vocab_size == 257
    assert type(files.load_tokenizer(out)).__name__ == "ByteTokenizer"
    rows = read_csv(tmp_path / "run" / "history.csv")
    assert list(rows[0]) == ["step", "train_loss", "val_loss", "lr"]
    assert [int(r["step"]) for r in rows] == list(range(12))
    vals = {int(r["step"]): float(r["val_loss"]) for r in rows if r["val_loss"]}
    assert sorted(vals) == [0, 5, 10, 11]
    assert (tmp_path / "run" / "loss.png").read_bytes()[:4] == b"\x89PNG"
    # bits per byte of the byte tokenizer: nats / ln 2, printed next to the nats
    best = min(vals.values())
    assert f"best val loss {best:.4f} nats/token = {best / math.log(2):.4f} bits/byte" in printed
    assert "bits/byte" in printed and str(out) in printed


def test_held_out_split_is_the_last_ten_percent(text_file):
    from glassllm.cli import load_corpus
    corpus = load_corpus([str(text_file)], seq_len=16)
    raw = np.frombuffer(text_file.read_bytes(), dtype=np.uint8)
    n_val = len(raw) // 10
    np.testing.assert_array_equal(corpus.val.ids, raw[-n_val:])
    np.testing.assert_array_equal(corpus.train.ids, raw[:-n_val])
    assert corpus.bits_per_byte(math.log(2)) == pytest.approx(1.0)


def test_stdlib_corpus_is_sorted_capped_python_source():
    files_, text = stdlib_corpus(cap_bytes=300_000)
    root = sysconfig.get_paths()["stdlib"]
    assert len(text) == 300_000
    assert all(f.endswith(".py") and f.startswith(root) for f in files_)
    rel = [os.path.relpath(f, root) for f in files_]
    assert rel == sorted(rel)
    assert not any("site-packages" in r or "dist-packages" in r for r in rel)
    assert b"def " in text and b"import " in text
    assert stdlib_corpus(cap_bytes=300_000) == (files_, text)  # deterministic


def test_train_without_data_uses_the_stdlib_and_its_loss_falls(tmp_path, capsys):
    out = tmp_path / "model.safetensors"
    rc = main(["train", "--out", str(out), "--steps", "50", "--eval-every", "49",
               "--lr", "1e-2", "--warmup", "5", *TINY])
    printed = capsys.readouterr().out
    assert rc == 0 and "Python standard library" in printed
    rows = read_csv(tmp_path / "history.csv")
    val = [float(r["val_loss"]) for r in rows if r["val_loss"]]
    assert len(val) == 2
    assert val[-1] < val[0] - 0.5, val  # from ~5.5 nats (uniform over 257) to well below
    assert files.load(out).cfg.d_model == 16


def test_train_on_a_prepare_directory(tmp_path, text_file, capsys):
    from glassllm.data import prepare
    prepare([str(text_file)], tmp_path / "prepared")
    out = tmp_path / "model.safetensors"
    rc = main(["train", "--data", str(tmp_path / "prepared"), "--out", str(out),
               "--steps", "3", "--eval-every", "2", *TINY])
    assert rc == 0
    assert "train.bin" not in capsys.readouterr().err
    assert files.load(out).cfg.vocab_size == 257


@pytest.mark.parametrize("argv, message", [
    (["--data", "/nonexistent/text.txt"], "not found"),
    (["--steps", "-3"], "--steps"),
    (["--lr", "0"], "--lr"),
    (["--d-model", "30", "--n-heads", "4"], "divisible"),
    (["--seq-len", "5000"], "too little text"),
    (["--resume", "/nonexistent/ckpt"], "does not exist"),
    (["--threads", "0"], "--threads"),
])
def test_bad_paths_and_options_exit_2_with_one_line(tmp_path, text_file, capsys, argv, message):
    full = ["train", "--out", str(tmp_path / "m.safetensors")]
    if "--data" not in argv:
        full += ["--data", str(text_file)]
    rc = main(full + argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "m.safetensors").exists()


def test_resume_refuses_flags_that_change_the_run(tmp_path, text_file, capsys):
    out = tmp_path / "model.safetensors"
    assert main(["train", "--data", str(text_file), "--out", str(out), "--steps", "4",
                 "--checkpoint-every", "2", *TINY]) == 0
    capsys.readouterr()
    rc = main(["train", "--resume", str(tmp_path / "checkpoint.safetensors"), "--lr", "0.5",
               "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "--lr 0.5" in err


def test_ctrl_c_exits_130_with_checkpoint_and_csv_intact_then_resume_matches(tmp_path,
                                                                             text_file):
    """SIGINT to a real `glassllm train` process; then --resume finishes the run, and its
    history equals an uninterrupted run's."""
    steps = "250"
    common = ["--data", str(text_file), "--steps", steps, "--eval-every", "50", *TINY]
    log = tmp_path / "a" / "steps.csv"
    (tmp_path / "a").mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "glassllm.cli", "train", *common,
         "--out", str(tmp_path / "a" / "model.safetensors"), "--log-csv", str(log)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) > 8:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "--resume" in err and "Traceback" not in err
    ckpt = load_checkpoint(tmp_path / "a" / "checkpoint.safetensors")
    rows = read_csv(log)
    assert 8 <= ckpt.step < int(steps)
    assert [int(r["step"]) for r in rows] == list(range(ckpt.step))  # complete rows only
    assert all(len(r) == 8 and None not in r.values() for r in rows)
    assert TrainSettings.from_dict(ckpt.settings).steps == int(steps)

    # resume: data, --out and --log-csv come from the checkpoint; then a straight run
    assert main(["train", "--resume", str(tmp_path / "a" / "checkpoint.safetensors")]) == 0
    assert load_checkpoint(tmp_path / "a" / "checkpoint.safetensors").step == ckpt.step
    assert main(["train", *common, "--out", str(tmp_path / "b" / "model.safetensors"),
                 "--log-csv", str(tmp_path / "b.csv")]) == 0
    assert (tmp_path / "a" / "history.csv").read_text() == \
        (tmp_path / "b" / "history.csv").read_text()
    assert log.read_text() == (tmp_path / "b.csv").read_text()


@pytest.mark.slow
def test_readme_main_job_tinyshakespeare_defaults(tmp_path, capsys):
    """The README's first command, with the default model and steps: under 15 minutes on two
    cores, validation below 2.0 nats per byte."""
    data = DATA / "tinyshakespeare.txt"
    if not data.exists():
        pytest.skip("../shared/data/tinyshakespeare.txt is not available")
    out = tmp_path / "model.safetensors"
    started = time.monotonic()
    assert main(["train", "--data", str(data), "--out", str(out)]) == 0
    elapsed = time.monotonic() - started
    rows = read_csv(tmp_path / "history.csv")
    best = min(float(r["val_loss"]) for r in rows if r["val_loss"])
    assert best <= 2.0, best
    assert elapsed < 15 * 60, elapsed
