"""A newcomer's first five minutes: Ctrl-C while `glassllm` starts (glassllm._startup), the
README's install and training output, `glassllm --help`, how events and tokenizers print.
(The data tests' search for the README's data/ folder: tests/test_shared_data.py.)"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

# Sends this very process a SIGINT -- a Ctrl-C at a moment chosen exactly -- when the module
# GLASSLLM_TEST_SIGINT_AT is first imported, or while the interpreter exits ("exit").
SITECUSTOMIZE = textwrap.dedent("""
    import os, signal, sys
    AT = os.environ.get("GLASSLLM_TEST_SIGINT_AT", "")

    class CtrlCOnImport:
        def find_spec(self, name, path=None, target=None):
            if name == AT:
                os.kill(os.getpid(), signal.SIGINT)
            return None

    if AT == "exit":
        import atexit
        atexit.register(lambda: [os.kill(os.getpid(), signal.SIGINT)] + [0] * 1000)
    elif AT:
        sys.meta_path.insert(0, CtrlCOnImport())
""")
# What pip writes as the console script of [project.scripts] glassllm = "glassllm.cli:main"
CONSOLE_SCRIPT = textwrap.dedent("""\
    import sys
    from glassllm.cli import main
    if __name__ == '__main__':
        sys.argv[0] = sys.argv[0].removesuffix('.exe')
        sys.exit(main())
""")


def run_interrupted(tmp_path, at: str, command: list[str]) -> subprocess.CompletedProcess:
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    env = {**os.environ, "GLASSLLM_TEST_SIGINT_AT": at,
           "PYTHONPATH": os.pathsep.join([str(hooks), str(REPO / "src")])}
    return subprocess.run([sys.executable, *command], capture_output=True, text=True, env=env,
                          timeout=120)


# numpy: inside `import glassllm`; glassllm.training: importing the commands (glassllm.cli);
# glassllm.cli.entry: the last module before main(); exit: after main() returned
@pytest.mark.parametrize("at", ["numpy", "glassllm.training", "glassllm.cli.entry", "exit"])
def test_ctrl_c_while_the_command_starts_or_ends_is_one_line_and_exit_130(tmp_path, at):
    result = run_interrupted(tmp_path, at, ["-m", "glassllm.cli", "train", "--help"])
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == "glassllm: interrupted", result.stderr
    assert result.returncode == 130


def test_ctrl_c_while_the_console_script_imports_numpy_is_one_line_and_exit_130(tmp_path):
    script = tmp_path / "bin" / "glassllm"
    script.parent.mkdir()
    script.write_text(CONSOLE_SCRIPT, encoding="utf-8")
    result = run_interrupted(tmp_path, "numpy", [str(script), "train", "--help"])
    assert result.stderr.strip() == "glassllm: interrupted", result.stderr
    assert result.returncode == 130


def test_without_ctrl_c_the_command_runs_as_before(tmp_path):
    result = run_interrupted(tmp_path, "", ["-m", "glassllm.cli", "train", "--help"])
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.startswith("usage: glassllm train")


def test_a_program_that_imports_glassllm_keeps_pythons_keyboard_interrupt(tmp_path):
    """Only the command swallows the Ctrl-C of its start: a program of one's own gets its
    KeyboardInterrupt where it happened (here while `import glassllm` imports NumPy)."""
    program = ("import signal\ntry:\n    import glassllm\nexcept KeyboardInterrupt:\n"
               "    print('caught')\nprint(signal.getsignal(signal.SIGINT) is "
               "signal.default_int_handler)\n")
    result = run_interrupted(tmp_path, "numpy", ["-c", program])
    assert result.returncode == 0 and result.stdout.split() == ["caught", "True"], result


def test_the_command_is_recognised_by_its_script_or_module(tmp_path):
    from glassllm import _startup
    script = tmp_path / "glassllm"
    script.write_text(CONSOLE_SCRIPT, encoding="utf-8")
    mine = tmp_path / "other" / "glassllm"
    mine.parent.mkdir()
    mine.write_text("import glassllm\n", encoding="utf-8")
    python = sys.executable
    assert _startup.is_the_command([str(script)], [python, str(script), "train"])
    assert _startup.is_the_command(["-m"], [python, "-X", "utf8", "-m", "glassllm.cli", "train"])
    assert _startup.is_the_command(["/x/glassllm/cli/__main__.py"],
                                   [python, "-m", "glassllm.cli"])
    assert _startup.is_the_command(["/x/glassllm.exe"], [python, "/x/glassllm.exe"])  # pip's
    assert not _startup.is_the_command([str(mine)], [python, str(mine)])  # a program of one's own
    assert not _startup.is_the_command(["-m"], [python, "-m", "pytest", "-q"])
    assert not _startup.is_the_command(["-c"], [python, "-c", "import glassllm"])
    assert not _startup.is_the_command([""], [python])


def test_the_startup_guard_knows_the_launchers_variables():
    from glassllm import _startup
    from glassllm.training import launch
    assert _startup._LAUNCHER_SIZE_VARIABLES == launch.LAUNCHER_SIZE_VARIABLES


# ------------------------------------------------------------------ --help names every command
def test_help_names_every_command():
    from glassllm.cli import SUBCOMMANDS, build_parser
    parser = build_parser()
    names = [name.removeprefix("add_") for name in (add.__name__ for add in SUBCOMMANDS)]
    assert "serve" in names and len(names) == 8
    for name in names:
        assert name in parser.description, (name, parser.description)
        assert name in parser.format_help()


# ------------------------------------------------------------------ how events and tokenizers print
def test_events_print_rounded_floats_and_their_values_stay_exact():
    from glassllm.training import events
    stepped = events.Stepped(step=3, loss=5.5240302085876465, lr=0.00030000001,
                             tokens_per_s=12345.6789)
    assert repr(stepped) == str(stepped) == \
        "Stepped(step=3, loss=5.524, lr=0.0003, tokens_per_s=12346, skipped=False)"
    assert stepped.loss == 5.5240302085876465  # only the printing rounds
    assert str(events.Evaluated(10, 5.5240302085876465, float("nan"), 999.94)) == \
        "Evaluated(step=10, train_loss=5.524, val_loss=nan, tokens_per_s=999.9)"
    assert str(events.Started(val_loss=5.0)) == "Started(val_loss=5.0)"
    assert str(events.Resumed(4, None)) == "Resumed(step=4, best_val_loss=None)"
    assert str(events.Saved(4, "runs/model.safetensors", 2.0000001)) == \
        "Saved(step=4, path='runs/model.safetensors', val_loss=2.0)"
    assert str(events.LoopEnded()) == "LoopEnded()"
    summary = events.TrainSummary(200, 150, 1.23456789, 1.3, [{"step": i} for i in range(200)],
                                  0, 409600, 12.3456, "runs/model.safetensors")
    assert str(events.Finished(summary)) == (
        "Finished(summary=TrainSummary(steps=200, best_step=150, best_val_loss=1.235, "
        "final_val_loss=1.3, history=[200 items], skipped_steps=0, tokens=409600, "
        "elapsed_s=12.35, model_path='runs/model.safetensors'))")
    assert str(events.HealthChecked(5, {"grad_norm": 0.123456789, "warnings": []})) == \
        "HealthChecked(step=5, row={'grad_norm': 0.1235, 'warnings': []})"
    assert str(events.HealthWarning(5, "blocks.0: dead 0.6")) == \
        "HealthWarning(step=5, message='blocks.0: dead 0.6')"


def test_every_event_prints_readably():
    """No event class is left with dataclass's raw repr."""
    import dataclasses

    from glassllm.lens.health import readable_repr
    from glassllm.training import events
    classes = [v for v in vars(events).values()
               if isinstance(v, type) and dataclasses.is_dataclass(v)]
    assert len(classes) >= 17
    assert [c.__name__ for c in classes if c.__repr__ is not readable_repr] == []


def test_tokenizers_print_their_kind_and_size():
    from glassllm.tokenizers import (BPETokenizer, ByteTokenizer, HFTokenizer,
                                     SentencePieceTokenizer)
    assert repr(ByteTokenizer()) == str(ByteTokenizer()) == "ByteTokenizer(vocab_size=257)"
    bpe = BPETokenizer.train("the cat sat on the mat; the cat ate the rat\n" * 20, 270)
    merges = bpe.vocab_size - 257  # 256 bytes and <|endoftext|>: every other id is a merge
    assert merges > 0
    assert repr(bpe) == (f"BPETokenizer(vocab_size={bpe.vocab_size}, merges={merges}, "
                         "eot_token='<|endoftext|>')")
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [" ", "a", "b"]
    sp = SentencePieceTokenizer(pieces, [0.0] * 259 + [-1.0, -2.0, -3.0])
    assert repr(sp) == "SentencePieceTokenizer(vocab_size=262, bos_id=1, eot_id=2)"
    hf = HFTokenizer(bpe._tok)
    assert repr(hf) == (f"HFTokenizer(vocab_size={bpe.vocab_size}, model='BPE', eot_id=0, "
                        "bos_id=None)")
    for tokenizer in (bpe, sp, hf):
        assert " object at 0x" not in str(tokenizer)


# ------------------------------------------------------------------ the README
def readme() -> str:
    return (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_install_paragraph_names_every_dependency():
    import tomllib
    spec = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    names = [re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0]
             for dep in spec["project"]["dependencies"]]
    assert "numba" in names
    paragraph = readme().split("That is the library and the `glassllm` command, with", 1)[1]
    paragraph = paragraph.split("Extras", 1)[0].replace("\n", " ")
    assert [name for name in names if name not in paragraph] == []


def line_kind(line: str) -> str:
    """What a line of `glassllm train`'s output is: its first word, numbers as #; for the two
    lines that start with the step count, its third word too ("# steps of" / "in")."""
    words = line.split()
    first = re.sub(r"[\d,.]+", "#", words[0])
    return f"{first} {words[2]}" if first == "#" else first


def test_the_readme_training_output_shows_every_kind_of_line_and_says_it_is_trimmed(
        tmp_path, capsys):
    """Every kind of line `glassllm train` prints now (glassllm.cli.printer) is in README.md's
    training output, in the same order, and the text says the output is trimmed."""
    from glassllm.cli import main
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog.\n" * 80, encoding="utf-8")
    assert main(["train", "--data", str(text), "--out", str(tmp_path / "r" / "m.safetensors"),
                 "--steps", "4", "--eval-every", "2", "--warmup", "1", "--d-model", "16",
                 "--n-layers", "1", "--n-heads", "2", "--n-kv-heads", "1", "--seq-len", "16",
                 "--batch-size", "4", "--eval-batches", "2"]) == 0
    printed = [line_kind(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    page = readme()
    block = page.split("```text\nglassllm train:", 1)[1].split("```", 1)[0]
    shown = [line_kind(line) for line in ("glassllm train:" + block).splitlines() if line.strip()]
    assert list(dict.fromkeys(shown)) == list(dict.fromkeys(printed)), (shown, printed)
    for kind in ("threads:", "matrix", "model:", "history:"):
        assert kind in shown
    before = page.split("```text\nglassllm train:", 1)[0].rstrip().rsplit("\n\n", 1)[1]
    assert "trimmed" in before, before


def test_the_readme_quickstart_prints_the_stream_whole_and_readable_events(tmp_path):
    """The Python quickstart's stream example prints the prompt and its continuation (never a
    line that starts with the continuation's ","); its training example prints rounded events
    and the tokenizer by name."""
    from test_readme import BLOCKS, block_directory, environment
    codes = [code for place, info, code in BLOCKS if place.startswith("README.md:")
             and info == "python" and ("lm.stream(" in code or "on_event=" in code)]
    assert len(codes) == 2
    outputs = []
    for i, code in enumerate(codes):
        (tmp_path / str(i)).mkdir()
        work = block_directory(tmp_path / str(i), code)
        (work / "block.py").write_text(code, encoding="utf-8")
        done = subprocess.run([sys.executable, "block.py"], cwd=work, timeout=600,
                              env=environment(tmp_path / str(i)), capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        outputs.append(done.stdout)
    lines = outputs[0].splitlines()
    assert [line for line in lines if line.startswith(",")] == [], lines
    assert any(line.startswith("One day") for line in lines), lines
    events = [line for line in outputs[1].splitlines() if line.startswith("Evaluated(")]
    assert len(events) == 3 and not any(re.search(r"\d\.\d{5,}", e) for e in events), events
    assert outputs[1].rstrip().endswith("ByteTokenizer(vocab_size=257)"), outputs[1]
    assert " object at 0x" not in outputs[1]
