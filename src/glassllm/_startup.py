"""Ctrl-C while the `glassllm` command starts or ends: one line and exit 130, no traceback.

`glassllm.cli.main` turns a Ctrl-C into one line and exit code 130 (`glassllm.cli.entry`), but
only from its first `try` on. Before that the process imports NumPy, the library and every
command's module (the first 0.2-2 s, where a Ctrl-C most often lands: the user saw the wrong
command line) and after it the interpreter exits; a KeyboardInterrupt there reaches Python's own
top level, which prints its traceback. `glassllm/__init__.py` calls `guard()` first thing, so
from then until `release()` (main's first `try`) and again from `guard()` in main's `finally`,
SIGINT prints the one line and ends the process.

Only in the `glassllm` command itself (the console script or `python -m glassllm.cli`,
`is_the_command`): `import glassllm` in a program of one's own keeps Python's KeyboardInterrupt.
This module imports nothing but the standard library: it runs before NumPy is imported.
"""
from __future__ import annotations

import os
import signal
import sys

LINE = "\nglassllm: interrupted"  # "\n": the terminal echoed ^C on the current line
# The MPI launchers' "how many ranks" variables (glassllm.training.launch.LAUNCHER_SIZE_VARIABLES,
# repeated here because importing glassllm.training would import NumPy first).
_LAUNCHER_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE",
                            "SLURM_STEP_NUM_TASKS")
# What pip's generated console script `glassllm` imports (pyproject.toml [project.scripts])
_SCRIPT_IMPORT = b"from glassllm.cli import main"


def is_the_command(argv=None, orig_argv=None) -> bool:
    """True in the process of the `glassllm` command: pip's console script (its file imports
    `glassllm.cli.main`) or `python [options] -m glassllm.cli` (sys.orig_argv, Python >= 3.10;
    sys.argv[0] is "-m" while the package imports). argv / orig_argv: for tests."""
    argv = (getattr(sys, "argv", None) or [""]) if argv is None else argv
    orig_argv = getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv
    script = argv[0] if argv else ""
    for i, word in enumerate(orig_argv[1:-1], start=1):
        if word == "-m":  # the first -m names the module Python runs
            return orig_argv[i + 1] == "glassllm.cli" and \
                (script == "-m" or script.endswith("__main__.py"))
    name = os.path.basename(script)
    if name.removesuffix(".exe") not in ("glassllm", "glassllm-script.py"):
        return False
    if name.endswith(".exe"):  # pip's Windows launcher: the script is zipped inside it
        return True
    try:
        with open(script, "rb") as f:
            return _SCRIPT_IMPORT in f.read(4096)
    except OSError:  # a frozen or zipped launcher: the name alone
        return True


def guard() -> None:
    """In the command's process (`is_the_command`) and over Python's own SIGINT handler: from
    now on Ctrl-C prints one line and ends the process (`_interrupted`)."""
    if not is_the_command():
        return
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _interrupted)
    except ValueError:  # not the main thread: its signals are not ours to set
        pass


def release() -> None:
    """Give SIGINT back to Python's KeyboardInterrupt: main()'s own handling begins (the
    commands' clean-up of temporary files, `--resume` hints, glassllm.training.stopping)."""
    try:
        if signal.getsignal(signal.SIGINT) is _interrupted:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # pragma: no cover - guard() set nothing outside the main thread
        pass


def _interrupted(signum, frame) -> None:
    """The one line, then exit 130 at once: nothing the process started needs undoing yet
    (imports) or any more (main() has returned). One of N > 1 ranks of an MPI launcher dies by
    SIGINT instead: hydra waits forever for the others of a rank that exits with a code before
    MPI_Init (glassllm.training.launch.interrupted_exit)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # a closed pipe: nothing more to say there
            pass
    try:
        os.write(2, (LINE + "\n").encode())
    except OSError:
        pass
    if _launcher_size() > 1:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(130)


def _launcher_size() -> int:
    for name in _LAUNCHER_SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) >= 2:
            return int(value)
    return 1
