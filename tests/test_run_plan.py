"""A training run as a library object, without the CLI: `RunPlan` and `execute`.

A run, a resume that continues bit for bit, a SIGTERM at a step boundary, a locked output;
and the plan's builders (options, TOML, checkpoint) against the CLI's parser.
"""
import csv
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

from glassllm.formats.checkpoint import load_checkpoint
from glassllm.formats import files
from glassllm.training import events, stopping
from glassllm.training.lock import OutputLocked
from glassllm.training.plan import OPTIONS, RunPlan, read_options_file
from glassllm.training.run import COMPLETE, INTERRUPTED, RunResult, execute

TINY = dict(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, seq_len=16, batch_size=4,
            eval_batches=2, threads=1)


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("The quick brown fox jumps over the lazy dog.\n" * 60, encoding="utf-8")
    return path


def plan_of(text_file, out, **options) -> RunPlan:
    return RunPlan.from_options({"data": [str(text_file)], "out": str(out), **TINY, **options})


def history(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def weights(path) -> dict:
    return {n: p.data for n, p in files.load(path).named_parameters()}


def test_a_short_run_writes_its_files_and_returns_a_complete_result(tmp_path, text_file):
    out = tmp_path / "run" / "model.safetensors"
    plan = plan_of(text_file, out, steps=6, eval_every=3, warmup=2)
    assert plan.run_dir == str(tmp_path / "run") and plan.config.d_model == 16
    assert plan.config.vocab_size == 257 and plan.settings.steps == 6
    seen = []
    result = execute(plan, seen.append)
    assert isinstance(result, RunResult)
    assert (result.reason, result.exit_code, result.error) == (COMPLETE, 0, None)
    kinds = [type(e).__name__ for e in seen]
    assert kinds[:3] == ["RunBegins", "LoopBegins", "Started"]
    assert kinds.count("Stepped") == 6 and kinds[-1] == "LoopEnded"
    assert kinds.index("Finished") < kinds.index("LoopEnded")
    begins = seen[0]
    assert begins.parameters == sum(p.size for p in files.load(out).parameters())
    assert begins.threads == 1 and begins.threads_why == "as requested"
    summary = result.summary
    assert summary.steps == 6 and summary.best_step == 5
    losses = [e.loss for e in seen if isinstance(e, events.Stepped)]
    # a byte model starts near ln(257) = 5.549 nats and learns a repeated sentence
    assert 5.3 < losses[0] < 5.8 and all(np.isfinite(losses))
    assert summary.final_val_loss < seen[2].val_loss  # evaluated below its initial loss
    rows = history(result.history_csv)
    assert result.history_csv == plan.paths["history_csv"]
    assert [int(r["step"]) for r in rows] == list(range(6))
    assert [float(r["train_loss"]) for r in rows] == losses  # repr: read back exactly
    assert out.exists() and (result.plot is None or os.path.exists(result.plot))
    assert not list((tmp_path / "run").glob("*.lock"))  # released


def test_a_resume_continues_bit_for_bit(tmp_path, text_file):
    """Four steps, then a resume from the checkpoint of step 4 to 8, equal an uninterrupted
    run of 8: weights, history.csv and every step's loss."""
    whole = tmp_path / "whole" / "model.safetensors"
    assert execute(plan_of(text_file, whole, steps=8, eval_every=4)).reason == COMPLETE

    part = tmp_path / "part" / "model.safetensors"

    def stop_after_four(event):
        if isinstance(event, events.Stepped) and event.step == 3:
            os.kill(os.getpid(), signal.SIGINT)  # held to the step boundary
    with stopping.signals_raise():
        first = execute(plan_of(text_file, part, steps=8, eval_every=4), stop_after_four)
    assert (first.reason, first.step, first.signum) == (INTERRUPTED, 4, signal.SIGINT)
    ckpt = part.parent / "checkpoint.safetensors"
    assert first.checkpoint == str(ckpt) and load_checkpoint(ckpt).step == 4

    plan = RunPlan.from_checkpoint(ckpt)
    assert plan.resume.step == 4 and plan.paths["model"] == str(part)
    assert plan.threads == 1 and plan.threads_kept  # the interrupted run's count
    seen = []
    second = execute(plan, seen.append)
    assert second.reason == COMPLETE and second.summary.steps == 8
    resumed = [e for e in seen if isinstance(e, events.Resumed)]
    assert len(resumed) == 1 and resumed[0].step == 4
    assert any(isinstance(e, events.WarmupOutlastsRun) and e.peak == pytest.approx(0.002 * 0.08)
               for e in seen)  # 8 steps of a warmup of 100: a warning, as an event
    a, b = weights(whole), weights(part)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert (whole.parent / "history.csv").read_text() == (part.parent / "history.csv").read_text()


def test_a_sigterm_stops_at_a_step_boundary_with_a_checkpoint(tmp_path, text_file):
    out = tmp_path / "run" / "model.safetensors"
    steps = []

    def sigterm_at_step_2(event):
        if isinstance(event, events.Stepped):
            steps.append(event.step)
            if event.step == 2:
                os.kill(os.getpid(), signal.SIGTERM)
    with stopping.signals_raise():  # as `glassllm train` runs it
        result = execute(plan_of(text_file, out, steps=50, eval_every=10), sigterm_at_step_2)
    assert result.reason == INTERRUPTED and result.signum == signal.SIGTERM
    assert result.exit_code == 143 and isinstance(result.error, KeyboardInterrupt)
    assert steps == [0, 1, 2] and result.step == 3  # the update in progress completed
    ckpt = load_checkpoint(result.checkpoint)
    assert ckpt.step == 3 and len(ckpt.history) == 3
    rows = history(result.history_csv)
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    assert not list((tmp_path / "run").glob("*.lock"))


def _holder(paths, tmp_path):
    """A real second process locking `paths` until it is killed."""
    ready = tmp_path / "ready"
    code = textwrap.dedent(f"""
        import time
        from glassllm.training.lock import lock_outputs
        with lock_outputs({[str(p) for p in paths]!r}):
            open({str(ready)!r}, "w").close()
            time.sleep(600)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "holder did not start"
        time.sleep(0.02)
    return proc


def test_a_locked_output_is_refused_and_nothing_is_overwritten(tmp_path, text_file):
    out = tmp_path / "run" / "model.safetensors"
    out.parent.mkdir()
    history_csv = out.parent / "history.csv"
    history_csv.write_text("another run's history\n")
    holder = _holder([history_csv], tmp_path)
    try:
        seen = []
        with pytest.raises(OutputLocked) as info:
            # --overwrite: a folder of another run's files is otherwise refused before the
            # lock is tried; even told to overwrite, a run in progress keeps its files
            execute(plan_of(text_file, out, steps=3, overwrite=True), seen.append)
        message = str(info.value)
        assert f"in use by another glassllm run (pid {holder.pid}" in message
        assert info.value.filename == str(history_csv)
        assert seen == []  # refused before the run began
        assert history_csv.read_text() == "another run's history\n"
        assert not out.exists() and not (out.parent / "checkpoint.safetensors").exists()
        assert not os.path.exists(str(out) + ".lock")  # what it had locked, released
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_left_by_a_dead_run_is_an_event(tmp_path, text_file):
    """A lock file whose process ended is taken over; the run says so through an event (the
    library never prints), and removes the temporaries that run left."""
    out = tmp_path / "run" / "model.safetensors"
    out.parent.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (out.parent / "model.safetensors.lock").write_text(json.dumps({"pid": int(dead)}))
    left = out.parent / ".model.safetensors.0123456789ab.tmp"  # the dead run's, half written
    left.write_bytes(b"x" * 100)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, as an event: the Trainer warns no more
        assert execute(plan_of(text_file, out, steps=2), seen.append).reason == COMPLETE
    taken = [e for e in seen if isinstance(e, events.LockTakenOver)]
    assert [e.holder["pid"] for e in taken] == [int(dead)]
    removed = [e.path for e in seen if isinstance(e, events.TemporaryRemoved)]
    assert removed == [str(left)] and not left.exists()
    assert kinds_before(seen, events.RunBegins) == ["LockTakenOver", "TemporaryRemoved"]


def kinds_before(seen, kind) -> list[str]:
    """The names of the event types sent before the first `kind`."""
    first = next(i for i, e in enumerate(seen) if isinstance(e, kind))
    return [type(e).__name__ for e in seen[:first]]


def test_plan_errors_name_the_option(tmp_path, text_file):
    with pytest.raises(ValueError, match=r"^--steps must be an integer in \[1, 1000000000\], "
                                         r"got 0$"):
        plan_of(text_file, tmp_path / "m.safetensors", steps=0)
    with pytest.raises(ValueError, match="unknown option 'stepz'"):
        RunPlan.from_options({"stepz": 3})
    with pytest.raises(ValueError, match="^--data is an empty path$"):
        RunPlan.from_options({"data": [""]})


def test_a_plan_from_a_toml_file(tmp_path, text_file):
    config = tmp_path / "run.toml"
    config.write_text(f'data = ["{text_file}"]\nd-model = 16\nn_layers = 1\nn_heads = 2\n'
                      f'seq_len = 16\nsteps = 7\nprecision = "bf16"\n')
    plan = RunPlan.from_toml(config, out=str(tmp_path / "r" / "m.safetensors"), steps=5)
    assert plan.settings.steps == 5 and plan.settings.precision == "bf16"  # keyword wins
    assert (plan.config.d_model, plan.config.n_layers, plan.config.max_len) == (16, 1, 16)
    config.write_text("steps = 1.5\n")
    with pytest.raises(ValueError, match=r"run.toml: key 'steps' must be an integer, got 1.5"):
        read_options_file(config)


def test_the_plan_options_are_the_cli_flags():
    """OPTIONS (what a plan and a TOML file take) and `glassllm train`'s parser name the same
    options with the same kinds; the CLI's copies of the library's constants are equal."""
    from glassllm import cli
    from glassllm.cli import common
    from glassllm.training import plan
    parser = cli.build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    actions = {a.dest: a for a in train._actions if a.dest not in ("help", "config")}
    assert set(actions) == set(OPTIONS)
    for name, action in actions.items():
        kind = OPTIONS[name]
        if action.choices is not None:
            assert tuple(action.choices) == kind, name
        elif action.nargs == "+":
            assert kind == "paths", name
        elif action.nargs == 0:
            assert kind is bool, name
        elif action.type in (int, float):
            assert action.type is kind, name
    assert common.SMALL_FILE_BYTES == plan.SMALL_FILE_BYTES


def test_the_serve_training_view_reads_the_run_execute_writes(tmp_path, text_file):
    """`glassllm serve --run` (and `glassllm train --serve`, which starts it on the plan's
    run_dir) reads the files `execute` writes: history, the per-step log, health."""
    from glassllm.serve.run import RunWatcher
    out = tmp_path / "run" / "model.safetensors"
    plan = plan_of(text_file, out, steps=4, eval_every=2, health_every=2,
                   log_csv=str(tmp_path / "run" / "steps.csv"))
    result = execute(plan)
    assert result.reason == COMPLETE
    seen = RunWatcher(plan.run_dir).snapshot()
    assert seen["exists"] and seen["problems"] == []
    assert seen["history"]["step"] == [0, 1, 2, 3]
    assert seen["history"]["train_loss"] == [h["loss"] for h in result.summary.history]
    assert seen["steps"]["step"] == [0, 1, 2, 3]
    assert [row["step"] for row in seen["health"]] == [0, 2]


@pytest.mark.parametrize("backend, follows", [("mkl", True), ("numpy", False)])
def test_a_run_follows_the_load_only_where_the_count_leaves_the_bits_alone(
        tmp_path, text_file, monkeypatch, backend, follows):
    """No count asked for: on a BLAS whose bits do not depend on the thread count (MKL, strict
    reproducible mode) the run computes on the process default, revisited as the load changes,
    and its checkpoint records no count; on NumPy's BLAS the count measured at the start is
    kept for the run and recorded, so a resume continues bit for bit."""
    from glassllm.engine import blas, cpu, parallel
    monkeypatch.delenv("GLASSLLM_THREADS", raising=False)  # (conftest pins it)
    monkeypatch.setattr(blas, "backend", lambda: backend)
    monkeypatch.setattr(cpu, "choose_threads", lambda requested=None, load=None:
                        (requested, "as requested") if requested else (2, "measured"))
    revisits = []

    def during_the_loop(event):
        if isinstance(event, events.Stepped):
            revisits.append(parallel.on_revisit(None))  # (fn, every_s): fn None when pinned
            parallel.on_revisit(*revisits[-1])
    plan = plan_of(text_file, tmp_path / "r" / "m.safetensors", steps=2, threads=None,
                   checkpoint_every=1)
    try:
        result = execute(plan, during_the_loop)
    finally:
        cpu.set_default_threads(1)  # the next tests run on conftest's one thread
    assert result.reason == COMPLETE
    extra = load_checkpoint(plan.paths["checkpoint"]).extra
    assert ("threads" not in extra) == follows
    assert all((fn is not None) == follows for fn, _ in revisits) and len(revisits) == 2
    if not follows:
        assert extra["threads"] == 2


def test_executing_a_fine_tune_plan_twice_starts_from_the_same_weights(tmp_path, text_file):
    """execute trains a copy of a --init-from plan's model: the plan keeps the weights it
    starts from, so a second execute equals the first (it once went on from the first's end)."""
    from glassllm.config import Config
    from glassllm.model import GlassLM
    from glassllm.tokenizers import ByteTokenizer
    base = tmp_path / "base.safetensors"
    files.save(GlassLM(Config(vocab_size=257, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
                              max_len=16), seed=0), base, tokenizer=ByteTokenizer())
    plan = RunPlan.from_options({"data": [str(text_file)], "init_from": str(base),
                                 "out": str(tmp_path / "ft" / "model.safetensors"),
                                 "steps": 3, "seq_len": 16, "batch_size": 4,
                                 "eval_batches": 2, "threads": 1, "overwrite": True})
    start = {n: p.data.copy() for n, p in plan.initial_model.named_parameters()}
    first, second = execute(plan), execute(plan)
    assert first.reason == second.reason == COMPLETE
    assert [h["loss"] for h in first.summary.history] == \
        [h["loss"] for h in second.summary.history]
    assert all(np.array_equal(p.data, start[n])
               for n, p in plan.initial_model.named_parameters())


@pytest.mark.parametrize("option, value, message", [
    ("steps", "10", "--steps must be an integer, got '10'"),
    ("lr", "0.1", "--lr must be a number, got '0.1'"),
    ("threads", 1.5, "--threads must be an integer, got 1.5"),
    ("data", [], "--data must be a path or a non-empty list of paths, got []"),
    ("data", [1], "--data must be a path or a non-empty list of paths, got [1]"),
    ("family", "bert", "--family must be one of llama, gpt2, neox"),
    ("init_from", {}, "--init-from must be a path, got {}"),
    ("serve", "yes", "--serve must be true or false, got 'yes'"),
])
def test_plan_options_of_the_wrong_kind_are_one_error_naming_the_option(
        tmp_path, text_file, option, value, message):
    """A plan from a mapping checks each option's kind as the command line's parser does
    (a string for --steps was a TypeError; --data [] trained on the default corpus)."""
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        plan_of(text_file, tmp_path / "m.safetensors", **{option: value})


def test_plan_options_take_one_data_path_pathlib_paths_and_numpy_integers(tmp_path, text_file):
    plan = RunPlan.from_options({**TINY, "data": text_file, "steps": np.int64(3),
                                 "lr": 1, "out": tmp_path / "r" / "m.safetensors"})
    assert plan.corpus.input_files() == [str(text_file)]
    assert plan.paths["model"] == str(tmp_path / "r" / "m.safetensors")
    assert type(plan.settings.steps) is int and plan.settings.steps == 3
    assert type(plan.settings.lr) is float and plan.settings.lr == 1.0


def test_a_resume_whose_data_moved_says_to_give_data(tmp_path, text_file):
    """The checkpoint names its data; when that file moved, the error says which run's data
    it is and that --data gives the new path (it said only "input not found")."""
    out = tmp_path / "run" / "model.safetensors"
    assert execute(plan_of(text_file, out, steps=2, checkpoint_every=1)).reason == COMPLETE
    ckpt = out.parent / "checkpoint.safetensors"
    moved = tmp_path / "moved.txt"
    os.rename(text_file, moved)
    with pytest.raises(FileNotFoundError) as info:
        RunPlan.from_checkpoint(ckpt)
    assert str(info.value) == (f"input not found: {text_file} (the data --resume {ckpt} was "
                               f"trained on; if it moved, give its new path with --data)")
    assert RunPlan.from_checkpoint(ckpt, data=[str(moved)]).resume.step == 2


# ------------------------------------------------------------------ runs never overwrite runs
def _run_files(folder) -> dict:
    """{name: bytes} of every file in a run folder (lock files aside: a run leaves none)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_new_run_into_another_runs_folder_is_refused_naming_its_files(tmp_path, text_file):
    """A second run with the same --out replaced the first one's model, history and plot;
    now it is refused before any work, the files named, the two ways on given, nothing
    changed. A folder of an interrupted run (a checkpoint alone) is refused too, and the
    message says how to continue it."""
    out = tmp_path / "run" / "model.safetensors"
    assert execute(plan_of(text_file, out, steps=2, eval_every=1)).reason == COMPLETE
    before = _run_files(out.parent)
    assert set(before) == {"model.safetensors", "history.csv", "loss.png", "val.csv"}
    with pytest.raises(ValueError) as info:
        plan_of(text_file, out, steps=3)
    message = str(info.value)
    assert "\n" not in message
    for name in before:
        assert str(out.parent / name) in message
    assert "--out in a new folder" in message and "--overwrite" in message
    assert "--resume" not in message  # nothing to resume: no checkpoint
    assert _run_files(out.parent) == before
    # an interrupted run's folder: its checkpoint there, refused, --resume named
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / "checkpoint.safetensors").write_bytes(b"an interrupted run's checkpoint")
    with pytest.raises(ValueError, match=r"holds another run's files \(.*checkpoint"
                                         r"\.safetensors\).*or continue it with --resume "):
        plan_of(text_file, stopped / "model.safetensors", steps=3)
    assert _run_files(stopped) == {"checkpoint.safetensors": b"an interrupted run's checkpoint"}
    # an existing --log-csv elsewhere is another run's step log too; a new folder alone would
    # not free it, and the message says so
    log = tmp_path / "steps.csv"
    log.write_text("step,lr,loss\n")
    with pytest.raises(ValueError, match=r"\(" + re.escape(str(log)) + r"\); give --out in a "
                                         r"new folder \(and new --checkpoint/--log-csv paths\)"):
        plan_of(text_file, tmp_path / "fresh" / "model.safetensors", log_csv=str(log))
    assert log.read_text() == "step,lr,loss\n"


def test_without_out_a_second_run_goes_to_a_numbered_folder(tmp_path, text_file, monkeypatch):
    """No --out: the first run writes runs/model.safetensors, the second runs/2/..., the
    third runs/3/...; each model kept byte for byte."""
    monkeypatch.chdir(tmp_path)
    options = {"data": [str(text_file)], **TINY, "steps": 2, "eval_every": 1}
    models = []
    for n, seed in ((1, 0), (2, 1), (3, 2)):
        plan = RunPlan.from_options({**options, "seed": seed})
        want = os.path.join("runs", "model.safetensors") if n == 1 else \
            os.path.join("runs", str(n), "model.safetensors")
        assert plan.paths["model"] == want
        seen = []
        assert execute(plan, seen.append).reason == COMPLETE
        begins = [e for e in seen if isinstance(e, events.RunBegins)]
        assert begins[0].model_path == want  # the header's "best model -> ..."
        models.append((want, (tmp_path / want).read_bytes()))
    for path, data in models:
        assert (tmp_path / path).read_bytes() == data
    assert len({data for _, data in models}) == 3  # three runs, three models


def test_overwrite_replaces_the_whole_run(tmp_path, text_file):
    """--overwrite: every file of the old run goes (its checkpoint, step log and health rows
    too, which the new run does not write), the new run's files come; never a mix."""
    out = tmp_path / "run" / "model.safetensors"
    old = plan_of(text_file, out, steps=4, eval_every=2, health_every=1, checkpoint_every=2,
                  log_csv=str(out.parent / "steps.csv"))
    assert execute(old).reason == COMPLETE
    names = set(_run_files(out.parent))
    assert {"model.safetensors", "history.csv", "loss.png", "checkpoint.safetensors",
            "health.jsonl", "steps.csv", "val.csv"} <= names, names
    old_model = out.read_bytes()
    toml = tmp_path / "overwrite.toml"
    toml.write_text("overwrite = true\n")
    plan = RunPlan.from_toml(toml, data=[str(text_file)], out=str(out), **TINY, steps=2,
                             eval_every=1, seed=7)
    assert plan.overwrite is True
    seen = []
    assert execute(plan, seen.append).reason == COMPLETE
    assert set(_run_files(out.parent)) == {"model.safetensors", "history.csv", "loss.png",
                                           "val.csv"}
    # val.csv the new run's alone: its two evaluations, none of the old run's four steps
    assert [r.split(",")[0] for r in (out.parent / "val.csv").read_text().split()] == \
        ["step", "0", "1"]
    replaced = [e for e in seen if isinstance(e, events.RunReplaced)]
    assert sorted(os.path.basename(p) for p in replaced[0].paths) == sorted(names)
    assert kinds_before(seen, events.RunBegins) == ["RunReplaced"]  # before the first write
    assert out.read_bytes() != old_model
    assert [int(r["step"]) for r in history(out.parent / "history.csv")] == [0, 1]
    with pytest.raises(ValueError, match="--overwrite starts a new run"):
        RunPlan.from_options({"resume": str(out.parent / "x.safetensors"), "overwrite": True})


def test_serve_logs_steps_beside_the_numbered_folder(tmp_path, text_file, monkeypatch):
    """--serve's per-step CSV goes beside the model the run writes: runs/2/steps.csv for a
    second run without --out, never runs/steps.csv of the first run."""
    monkeypatch.chdir(tmp_path)
    options = {"data": [str(text_file)], **TINY, "steps": 2, "eval_every": 1, "serve": True}
    first = RunPlan.from_options(options)
    assert first.settings.log_csv == str(tmp_path / "runs" / "steps.csv")
    assert execute(first).reason == COMPLETE
    second = RunPlan.from_options(options)
    assert second.paths["model"] == os.path.join("runs", "2", "model.safetensors")
    assert second.settings.log_csv == str(tmp_path / "runs" / "2" / "steps.csv")
    again = RunPlan.from_options({**options, "overwrite": True})  # replaces runs/ itself
    assert again.settings.log_csv == str(tmp_path / "runs" / "steps.csv")


def test_overwrite_never_removes_the_runs_own_data(tmp_path):
    """A data file named like a run's file (steps.csv) beside --out is the run's input, not
    another run's file: not refused, and --overwrite keeps it."""
    out = tmp_path / "run" / "model.safetensors"
    out.parent.mkdir()
    data = out.parent / "steps.csv"
    data.write_text("The quick brown fox jumps over the lazy dog.\n" * 60)
    options = {"data": [str(data)], "out": str(out), **TINY, "steps": 2, "eval_every": 1}
    assert execute(RunPlan.from_options(options)).reason == COMPLETE
    assert execute(RunPlan.from_options({**options, "overwrite": True})).reason == COMPLETE
    assert data.read_text() == "The quick brown fox jumps over the lazy dog.\n" * 60
    with pytest.raises(ValueError, match=r"holds another run's files \([^)]*history\.csv"):
        RunPlan.from_options(options)
    assert data.exists()


def test_a_second_execute_of_a_plan_does_not_replace_the_first_runs_files(tmp_path,
                                                                           text_file):
    """The "another run's files" check is made again under the locks: an earlier execute of
    the same plan (or a run that wrote there after the plan was made) is not silently
    replaced; overwrite=True replaces it."""
    out = tmp_path / "run" / "model.safetensors"
    plan = plan_of(text_file, out, steps=2)
    assert execute(plan).reason == COMPLETE
    before = _run_files(out.parent)
    with pytest.raises(ValueError, match="holds another run's files"):
        execute(plan)
    assert _run_files(out.parent) == before
    later = plan_of(text_file, tmp_path / "later" / "model.safetensors", steps=2)
    assert execute(plan_of(text_file, later.paths["model"], steps=3)).reason == COMPLETE
    with pytest.raises(ValueError, match="holds another run's files"):
        execute(later)  # planned before the other run wrote there
    again = plan_of(text_file, out, steps=2, overwrite=True)
    assert execute(again).reason == COMPLETE and execute(again).reason == COMPLETE
