"""A newcomer's first five minutes: Ctrl-C while `glassllm` starts (glassllm._startup), the
README's install and training output, `glassllm --help`, how events and tokenizers print.
(The data tests' search for the README's data/ folder: tests/test_shared_data.py.)"""
from __future__ import annotations

import os
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
    assert not _startup.is_the_command([str(mine)], [python, str(mine)])  # a program of one's own
    assert not _startup.is_the_command(["-m"], [python, "-m", "pytest", "-q"])
    assert not _startup.is_the_command(["-c"], [python, "-c", "import glassllm"])
    assert not _startup.is_the_command([""], [python])


def test_the_startup_guard_knows_the_launchers_variables():
    from glassllm import _startup
    from glassllm.training import launch
    assert _startup._LAUNCHER_SIZE_VARIABLES == launch.LAUNCHER_SIZE_VARIABLES
