"""A run's files against its inputs and other runs: nothing a user does with paths, links or
moved folders loses a file (docs/faults.md)."""
from __future__ import annotations

import os

import numpy as np
import pytest

from glassllm.cli import main
from glassllm.formats import files
from glassllm.formats.checkpoint import load_checkpoint

TINY = ["--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--n-kv-heads", "1",
        "--seq-len", "16", "--batch-size", "4", "--eval-batches", "2", "--threads", "1"]
TEXT = "The quick brown fox jumps over the lazy dog.\n" * 60


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def refused(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ---------------------------------------------------------------- outputs vs inputs, by identity
@pytest.mark.parametrize("flag", ["--log-csv", "history", "health"])
def test_an_output_hard_linked_to_the_data_is_refused_and_the_data_kept(tmp_path, text_file,
                                                                        capsys, flag):
    """A hard link is the data file under another name: comparing names missed it and the
    step CSV (or the appended health.jsonl) replaced the text."""
    run = tmp_path / "run"
    run.mkdir()
    linked = {"--log-csv": tmp_path / "steps.csv", "history": run / "history.csv",
              "health": run / "health.jsonl"}[flag]
    os.link(text_file, linked)
    argv = ["train", "--data", str(text_file), "--out", str(run / "model.safetensors"),
            "--steps", "3", "--health-every", "1", *TINY]
    if flag == "--log-csv":
        argv += ["--log-csv", str(linked)]
    err = refused(capsys, argv)
    assert f"{linked} is one of the data files ({text_file}, by a link)" in err
    assert text_file.read_text(encoding="utf-8") == TEXT
    assert not (run / "model.safetensors").exists()


def test_an_output_hard_linked_to_a_prepared_token_file_is_refused(tmp_path, text_file,
                                                                   capsys):
    assert main(["prepare", str(text_file), "--out", str(tmp_path / "p")]) == 0
    capsys.readouterr()
    before = (tmp_path / "p" / "train.bin").read_bytes()
    os.link(tmp_path / "p" / "train.bin", tmp_path / "steps.csv")
    err = refused(capsys, ["train", "--data", str(tmp_path / "p"), "--out",
                           str(tmp_path / "run" / "model.safetensors"), "--log-csv",
                           str(tmp_path / "steps.csv"), "--steps", "2", *TINY])
    assert "is one of the data files" in err
    assert (tmp_path / "p" / "train.bin").read_bytes() == before


@pytest.mark.parametrize("where", ["--out", "--log-csv"])
def test_an_output_inside_a_data_directory_is_refused_at_start(tmp_path, capsys, where):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text(TEXT)
    out = tmp_path / "run" / "model.safetensors"
    extra = ["--log-csv", str(data / "sub" / "steps.csv")] if where == "--log-csv" else []
    if where == "--out":
        out = data / "run" / "model.safetensors"
    err = refused(capsys, ["train", "--data", str(data), "--out", str(out), "--steps", "2",
                           *extra, *TINY])
    assert f"is inside the data directory {data}" in err
    assert sorted(p.name for p in data.rglob("*")) == ["a.txt"]


# ---------------------------------------------------------------------------- relocatable runs
def test_a_moved_run_resumes_where_it_now_is_and_leaves_the_new_run_alone(tmp_path,
                                                                          text_file,
                                                                          monkeypatch):
    """`mv runs archive`, a new run in runs/, then `--resume archive/checkpoint...`: the
    resumed run writes beside its checkpoint; the new run's model and history stay."""
    from glassllm.formats.checkpoint import save_checkpoint
    monkeypatch.chdir(tmp_path)
    common = ["--data", str(text_file), "--steps", "6", "--eval-every", "2", *TINY]
    assert main(["train", *common, "--out", "runs/model.safetensors", "--log-csv",
                 "runs/steps.csv", "--checkpoint-every", "3"]) == 0
    ckpt = load_checkpoint(tmp_path / "runs" / "checkpoint.safetensors")
    assert ckpt.extra["out"] == "model.safetensors" and ckpt.extra["log_csv"] == "steps.csv"
    finished = (tmp_path / "runs" / "model.safetensors").read_bytes()
    os.rename(tmp_path / "runs", tmp_path / "archive")
    os.remove(tmp_path / "archive" / "history.csv")  # to see where the resume writes it
    wide = [a if a != "16" else "32" for a in TINY]  # d_model 32
    assert main(["train", "--data", str(text_file), "--steps", "2", *wide,
                 "--out", "runs/model.safetensors"]) == 0
    new_model = (tmp_path / "runs" / "model.safetensors").read_bytes()
    new_history = (tmp_path / "runs" / "history.csv").read_text()
    assert main(["train", "--resume", "archive/checkpoint.safetensors"]) == 0
    assert (tmp_path / "runs" / "model.safetensors").read_bytes() == new_model
    assert (tmp_path / "runs" / "history.csv").read_text() == new_history
    assert files.load(tmp_path / "runs" / "model.safetensors").cfg.d_model == 32
    assert (tmp_path / "archive" / "model.safetensors").read_bytes() == finished
    assert len((tmp_path / "archive" / "history.csv").read_text().splitlines()) == 7
    assert not (tmp_path / "runs" / "steps.csv").exists()
    # the same with the new run's folder gone: it is not made again
    import shutil
    shutil.rmtree(tmp_path / "runs")
    assert main(["train", "--resume", "archive/checkpoint.safetensors"]) == 0
    assert not (tmp_path / "runs").exists()


def test_an_old_checkpoint_with_absolute_paths_into_another_run_is_refused(tmp_path,
                                                                           text_file, capsys):
    """A checkpoint written before paths were relative records where its run was; moved,
    that path may hold another run now: the resume is refused, naming the files."""
    from glassllm.formats.checkpoint import save_checkpoint
    a = tmp_path / "runs" / "model.safetensors"
    assert main(["train", "--data", str(text_file), "--out", str(a), "--steps", "4",
                 "--checkpoint-every", "2", "--eval-every", "2", *TINY]) == 0
    ckpt = load_checkpoint(tmp_path / "runs" / "checkpoint.safetensors")
    os.rename(tmp_path / "runs", tmp_path / "archive")
    ckpt.extra["out"] = str(a)  # as an old checkpoint recorded it: absolute
    save_checkpoint(tmp_path / "archive" / "checkpoint.safetensors", ckpt)
    assert main(["train", "--data", str(text_file), "--out", str(a), "--steps", "2",
                 *TINY]) == 0
    capsys.readouterr()
    before = a.read_bytes()
    err = refused(capsys, ["train", "--resume", str(tmp_path / "archive" /
                                                    "checkpoint.safetensors")])
    assert f"would write into {a.parent}, which holds another run's files (" in err
    assert str(a.parent / "history.csv") in err
    assert a.read_bytes() == before


# ------------------------------------------------------------------------------ prepare's files
def test_prepare_refuses_to_replace_its_own_input(tmp_path, text_file, capsys):
    assert main(["prepare", str(text_file), "--out", str(tmp_path / "p")]) == 0
    capsys.readouterr()
    train = tmp_path / "p" / "train.bin"
    before = train.read_bytes()
    err = refused(capsys, ["prepare", str(train), "--out", str(tmp_path / "p")])
    assert f"{train} is an input and {train} an output of this prepare" in err
    assert train.read_bytes() == before


def test_an_id_outside_the_vocabulary_in_train_bin_is_found_at_start(tmp_path, text_file,
                                                                     capsys):
    """One bad id among many: drawn rarely, it trained to exit 0; now it is named at once."""
    assert main(["prepare", str(text_file), "--out", str(tmp_path / "p")]) == 0
    capsys.readouterr()
    train = tmp_path / "p" / "train.bin"
    ids = np.fromfile(train, dtype="<u2")
    ids[100] = 300  # byte vocabulary: 257 ids
    ids.tofile(train)
    err = refused(capsys, ["train", "--data", str(tmp_path / "p"), "--steps", "2", "--out",
                           str(tmp_path / "run" / "model.safetensors"), *TINY])
    assert f"{train}: token 100 is 300, outside the vocabulary [0, 257)" in err
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------- a full disk
def test_a_full_disk_mid_run_exits_1_and_writes_the_history_so_far(tmp_path, text_file,
                                                                   capsys, monkeypatch):
    """ENOSPC while writing the step log at update 5: not a usage error (exit 1, not 2),
    and history.csv holds the 5 updates done."""
    import errno
    from glassllm.training import safety
    real = safety.StepCSVLog.write

    def write(self, record):
        if record.step == 5:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
        real(self, record)

    monkeypatch.setattr(safety.StepCSVLog, "write", write)
    run = tmp_path / "run"
    rc = main(["train", "--data", str(text_file), "--steps", "20", "--out",
               str(run / "model.safetensors"), "--log-csv", str(tmp_path / "steps.csv"),
               *TINY])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert f"glassllm train: error: {tmp_path / 'steps.csv'}: No space left on device (after " \
        f"5 updates; the run stopped)" in err
    assert len((run / "history.csv").read_text().splitlines()) == 1 + 5
    assert not list(run.glob("*.lock"))


def test_steps_0_is_refused_and_overwrites_nothing(tmp_path, text_file, capsys):
    out = tmp_path / "run" / "model.safetensors"
    assert main(["train", "--data", str(text_file), "--out", str(out), "--steps", "3",
                 *TINY]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.parent.iterdir()}
    err = refused(capsys, ["train", "--data", str(text_file), "--out", str(out), "--steps",
                           "0", *TINY])
    assert "--steps must be an integer in [1, 1000000000], got 0" in err
    assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == before
