"""The command-line habits of nanoGPT and Unix users: `train --config FILE.toml` with flags
overriding it, a warning when --steps ends inside the warmup, and `inspect ... | head`, which
writes its report and exits 0 quietly. (generate --num-samples, --prompt-file and the default
prompt: tests/test_lm.py.)"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from glassllm import Config, GlassLM
from glassllm.cli import main
from glassllm.formats import files
from glassllm.tokenizers import ByteTokenizer

from conftest import REPO

TINY = {"d_model": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "seq_len": 16,
        "batch_size": 4, "eval_batches": 2}


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("The quick brown fox jumps over the lazy dog.\n" * 60, encoding="utf-8")
    return path


def toml(path, **keys) -> str:
    lines = []
    for key, value in keys.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (str, os.PathLike)):
            text = '"' + str(value) + '"'
        elif isinstance(value, list):
            text = "[" + ", ".join(f'"{v}"' for v in value) + "]"
        else:
            text = repr(value)
        lines.append(f"{key} = {text}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def notes(err: str) -> list[str]:
    """The lines of stderr that are not the progress bar (tqdm's lines start with "\\r")."""
    return [line for line in err.split("\n") if line and "\r" not in line]


def train(capsys, *argv):
    code = main(["train", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_config_file_sets_options_and_flags_override_it(tmp_path, text_file, capsys):
    out = tmp_path / "run" / "model.safetensors"
    config = toml(tmp_path / "run.toml", data=[text_file], out=out, steps=50, warmup=2,
                  lr=0.01, eval_every=3, **{"max-skip-rate": 0.5}, **TINY)
    code, printed, err = train(capsys, "--config", config, "--steps", 4, "--d-model", 24)
    assert code == 0 and notes(err) == [], err
    model = files.load(out)
    assert (model.cfg.d_model, model.cfg.n_layers, model.cfg.max_len) == (24, 1, 16)
    rows = (tmp_path / "run" / "history.csv").read_text().splitlines()
    assert len(rows) == 1 + 4  # --steps 4 on the command line beat steps = 50 in the file
    assert "lr" in rows[0] and abs(float(rows[2].split(",")[-1]) - 0.01) < 1e-6  # lr, warmup


@pytest.mark.parametrize("content,message", [
    ("stepz = 3\n", "{path}: unknown key 'stepz': not an option of glassllm train"),
    ("steps = \"3\"\n", "{path}: key 'steps' must be an integer, got '3'"),
    ("steps = true\n", "{path}: key 'steps' must be an integer, got True"),
    ("lr = \"fast\"\n", "{path}: key 'lr' must be a number, got 'fast'"),
    ("precision = \"fp8\"\n", "{path}: key 'precision' must be one of fp32, fp16, bf16, got"),
    ("data = [1]\n", "{path}: key 'data' must be a string or a list of strings, got [1]"),
    ("serve = 1\n", "{path}: key 'serve' must be true or false, got 1"),
    ("steps = \n", "--config {path}: not valid TOML: "),
    ("d-model = 8\nd_model = 16\n",
     "{path}: keys 'd-model' and 'd_model' are the same option; give one"),
])
def test_config_file_errors_name_the_file_and_key(tmp_path, capsys, content, message):
    path = tmp_path / "bad.toml"
    path.write_text(content, encoding="utf-8")
    code, out, err = train(capsys, "--config", path)
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith("glassllm train: error: " + message.format(path=path)), err


def test_a_missing_config_file(tmp_path, capsys):
    code, _, err = train(capsys, "--config", tmp_path / "none.toml")
    assert code == 2 and f"--config {tmp_path / 'none.toml'}: No such file" in err


def test_warning_when_steps_end_before_the_warmup(tmp_path, text_file, capsys):
    args = ["--data", text_file, "--out", tmp_path / "m.safetensors", "--lr", "3e-3",
            "--eval-every", 10, *[x for k, v in TINY.items()
                                  for x in ("--" + k.replace("_", "-"), v)]]
    code, _, err = train(capsys, *args, "--steps", 4, "--warmup", 10)
    assert code == 0
    assert notes(err) == ["warning: --steps 4 ends before the warmup does (--warmup 10): the "
                          "learning rate climbs to 0.0012, 40% of --lr 0.003, and never "
                          "decays; give --warmup below --steps"]
    code, _, err = train(capsys, *args, "--steps", 4, "--warmup", 4, "--out",
                         tmp_path / "n" / "n.safetensors")  # a run's own folder
    assert code == 0 and notes(err) == []


def test_inspect_into_a_closed_pipe_writes_its_report_and_exits_0(tmp_path):
    path = tmp_path / "m.safetensors"
    files.save(GlassLM(Config(d_model=16, n_layers=1, n_heads=2, max_len=32)), path,
               tokenizer=ByteTokenizer())
    report = tmp_path / "report.html"
    proc = subprocess.Popen(
        [sys.executable, "-m", "glassllm.cli", "inspect", "--model", str(path), "--prompt",
         "Hello there, closed pipe", "--out", str(report)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    proc.stdout.close()  # as `| head -0`: no reader before the first line is printed
    _, err = proc.communicate(timeout=300)
    assert (proc.returncode, err) == (0, "")
    assert report.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
