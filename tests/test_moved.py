"""The import paths of glassllm 0.1 that moved in 0.2 (glassllm/_moved.py, glassllm.train's
`__getattr__`): each still works, warns once with a DeprecationWarning naming the new home, and
gives the very object of the new path. Every check runs in a fresh interpreter, so that no
earlier import of the test session hides a warning.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# The imports the 0.1 README showed, as a user's code has them.
README_01_IMPORTS = """\
from glassllm.data import ArrayBatches, get_batch, load_corpus, data_identity, Batches
from glassllm.train import Evaluated, Trainer, TrainSettings
from glassllm import files
from glassllm.tokenizer import ByteTokenizer, StreamDecoder, start_id
from glassllm.hf import from_hf, to_hf
from glassllm.llama2c import from_llama2c, to_llama2c, tokenizer_from_llama2c
from glassllm.trace import NAMES, run_with_cache
from glassllm.interpret import ablate, detect_heads, logit_attribution, logit_difference
from glassllm.interpret import logit_lens, patching_sweep, token_surprise
from glassllm.graph import draw_dot
from glassllm.health import BANDS
from glassllm.safety import StepCSVLog, SkipRateMonitor, TrainStep
from glassllm.distributed import from_environment
from glassllm.cpu import use_threads, LoadMeter
from glassllm.decode import step
import glassllm.report, glassllm.blas, glassllm.parallel, glassllm.launch
"""


def python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SRC)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    return subprocess.run([sys.executable, *args, "-c", textwrap.dedent(code)] if code else
                          [sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_every_old_module_path_warns_once_and_is_the_new_module():
    run = python("""
        import importlib, json, sys, warnings
        from glassllm._moved import MOVED
        out = {}
        for old, new in MOVED.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                first = importlib.import_module(old)
                again = importlib.import_module(old)
            messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
            out[old] = [first is again is importlib.import_module(new), first.__name__,
                        first.__spec__.name, messages]
        print(json.dumps(out))
    """)
    assert run.returncode == 0, run.stderr
    from glassllm._moved import MOVED
    for old, (same, name, spec_name, messages) in json.loads(run.stdout).items():
        new = MOVED[old]
        assert same and name == new and spec_name == new, (old, name, spec_name)
        assert messages == [f"{old} moved to {new}; import it from there (the old path goes "
                            f"in a later release)"], (old, messages)


def test_the_01_readme_imports_work_and_warn_at_the_users_line():
    run = python(README_01_IMPORTS, "-W", "default")
    assert run.returncode == 0, run.stderr
    warned = [line for line in run.stderr.splitlines() if "DeprecationWarning" in line]
    # each line is the user's (<string>:N), none inside importlib or glassllm
    assert warned and all(line.startswith("<string>:") for line in warned), run.stderr
    for old in ("glassllm.data", "glassllm.files", "glassllm.safety", "glassllm.launch",
                "glassllm.train.Trainer", "glassllm.train.TrainSettings"):
        assert any(f" {old} moved to " in line for line in warned), (old, run.stderr)


def test_the_old_names_give_the_same_objects():
    run = python("""
        import pickle, warnings
        warnings.simplefilter("ignore")
        from glassllm.train import Trainer, TrainSettings
        from glassllm import training
        import glassllm.tokenizer as old_tok
        from glassllm.formats import tokenizer as new_tok
        assert Trainer is training.Trainer and TrainSettings is training.TrainSettings
        assert isinstance(old_tok.ByteTokenizer(), new_tok.ByteTokenizer)
        old_tok.patched = 7                      # a monkeypatch through the old name
        assert new_tok.patched == 7
        settings = pickle.loads(pickle.dumps(TrainSettings(steps=3)))
        assert settings == training.TrainSettings(steps=3)
        print("ok")
    """)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_a_moved_module_as_an_attribute_of_the_bare_package():
    """0.1's `import glassllm` loaded blas and parallel as a side effect: `glassllm.blas` worked."""
    run = python("""
        import glassllm, glassllm.engine.blas, glassllm.engine.cpu
        assert glassllm.blas is glassllm.engine.blas and glassllm.blas is glassllm.engine.blas
        from glassllm import cpu
        assert cpu is glassllm.engine.cpu
        try:
            glassllm.no_such_module
        except AttributeError as e:
            print(e)
    """, "-W", "default")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "module 'glassllm' has no attribute 'no_such_module'"
    warned = [line for line in run.stderr.splitlines() if "DeprecationWarning" in line]
    assert warned == [
        "<string>:3: DeprecationWarning: glassllm.blas moved to glassllm.engine.blas; import it "
        "from there (the old path goes in a later release)",
        "<string>:4: DeprecationWarning: glassllm.cpu moved to glassllm.engine.cpu; import it "
        "from there (the old path goes in a later release)"], run.stderr


def test_python_m_the_old_launch_runs_the_new_one(tmp_path):
    """`mpiexec -n 2 python -m glassllm.launch this.py` (0.1's README); outside a launcher the
    supervisor execs the script in place, with its arguments."""
    script = tmp_path / "this.py"
    script.write_text("import sys; print(sys.argv[1:], __name__)\n")
    for module, warning in (("glassllm.launch", True), ("glassllm.training.launch", False)):
        run = python("", "-m", module, str(script), "a", "b")
        assert run.returncode == 0, (module, run.stderr)
        assert run.stdout == "['a', 'b'] __main__\n", (module, run.stdout)
        # no runpy RuntimeWarning ("found in sys.modules ... prior to execution")
        assert ("glassllm.launch moved to glassllm.training.launch" in run.stderr) == warning
        assert "RuntimeWarning" not in run.stderr, (module, run.stderr)


def test_two_imports_in_flight_each_get_their_own_module_spec_back():
    """Threads import different names at once; the finder once kept the new module's spec in
    one attribute of its own, so A's exec_module could give A the spec of B's module (then
    importlib.reload(A) would run B's code into A)."""
    import importlib.util
    from glassllm._moved import MovedModuleFinder
    from glassllm.formats import files
    from glassllm.training import safety
    finder = MovedModuleFinder()
    a = importlib.util.spec_from_loader("glassllm.files", finder)
    b = importlib.util.spec_from_loader("glassllm.safety", finder)
    with pytest.warns(DeprecationWarning):
        module_a = finder.create_module(a)
        module_b = finder.create_module(b)
    own = files.__spec__, safety.__spec__
    try:
        module_a.__spec__, module_b.__spec__ = a, b  # as the import system does
        finder.exec_module(module_a)
        finder.exec_module(module_b)
        assert module_a is files and files.__spec__.name == "glassllm.formats.files"
        assert module_b is safety and safety.__spec__.name == "glassllm.training.safety"
    finally:
        files.__spec__, safety.__spec__ = own


def test_the_cli_still_names_the_default_training_model():
    """`glassllm.cli.TRAIN_MODEL_DEFAULTS` (the old cli.py's) is the run plan's table."""
    from glassllm import cli
    from glassllm.training import plan
    assert cli.TRAIN_MODEL_DEFAULTS is plan.TRAIN_MODEL_DEFAULTS
    assert cli.TRAIN_MODEL_DEFAULTS["d_model"] == 128
