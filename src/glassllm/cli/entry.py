"""The program: the parser of every command, `main` and how an error that reaches it ends.

Errors a user can cause (bad paths, bad options, corrupt files) end with one line on stderr
and exit code 2, never a traceback; Ctrl-C ends with exit code 130, SIGTERM 143, SIGHUP 129.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys

from .. import _startup
from .common import UsageError, one_line


def build_parser() -> argparse.ArgumentParser:
    """The parser of `glassllm`: one subparser per entry of the package's SUBCOMMANDS."""
    package = sys.modules[__package__]  # glassllm.cli: its SUBCOMMANDS, as it lists them now
    parser = argparse.ArgumentParser(prog="glassllm",
                                     description=package.__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"glassllm {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in package.SUBCOMMANDS:
        add(sub)
    return parser


def version() -> str:
    """The installed distribution's version (importlib.metadata), else the package's
    `__version__` (a source tree on PYTHONPATH, never installed)."""
    from importlib import metadata
    try:
        return metadata.version("glassllm")
    except metadata.PackageNotFoundError:
        from .. import __version__
        return __version__
def main(argv: list[str] | None = None) -> int:
    from ..training import launch
    _print_paths_as_given()
    if argv is None and sys.argv[1:2] == ["train"] and launch.needs_supervisor():
        # One rank of `mpiexec -n N glassllm train`: this process watches the real one, so a
        # rank killed without a word is still named (glassllm.training.launch).
        return launch.supervise([sys.executable, "-m", "glassllm.cli", *sys.argv[1:]])
    try:  # building the parser imports numpy and the library: Ctrl-C often lands here
        _startup.release()  # until here a Ctrl-C was glassllm._startup's: one line, exit 130
        parser = build_parser()
        args = parser.parse_args(argv)  # argparse itself exits 2 with a usage line
        from ..engine.blas import BlasError
        from ..lens.interpret import AttributionError
        from .. import kernels
        from ..training import stopping
    except KeyboardInterrupt:
        print(_startup.LINE, file=sys.stderr, flush=True)
        return launch.interrupted_exit(130)  # under mpiexec: never leave the others waiting
    except SystemExit:  # --help, --version, a usage error: the interpreter exits now
        if argv is None:
            _startup.guard()
        raise
    try:
        # SIGTERM and SIGHUP unwind every command as Ctrl-C does (its temporary files
        # removed, one line, exit 128 + N) instead of ending it where it stands
        with stopping.signals_raise():
            kernels.mode()  # a mistyped GLASSLLM_KERNELS is this command's one error line
            return int(args.func(args) or 0)
    except (KeyboardInterrupt, BrokenPipeError, MemoryError, UsageError, OSError,
            ValueError, BlasError, AttributionError) as e:
        # "glassllm features train: error: ...", as argparse's own errors of a sub-command
        command = " ".join(filter(None, (args.command, getattr(args, "features_command", None))))
        code, line = _error_report(command, e)
        # Under mpiexec every rank meets the same errors (glassllm.training.distributed.agreement):
        # rank 0 alone says so.
        if line is not None and getattr(getattr(args, "comm", None), "rank", 0) == 0:
            print(line, file=sys.stderr, flush=True)
        if isinstance(e, KeyboardInterrupt):  # e.g. before MPI_Init: see interrupted_exit
            return launch.interrupted_exit(code, getattr(e, "signum", None))
        return code
    finally:
        if argv is None:  # the process's own command: it exits now, a late stop changes nothing
            stopping.ignore_further_stops()
            _startup.guard()  # a Ctrl-C while the interpreter exits: one line too


def _print_paths_as_given() -> None:
    """Let stdout print any path the user gave. A file name that is not UTF-8 reaches Python
    as lone surrogates (PEP 383); a stdout with errors="strict" (a UTF-8 locale other than C,
    PYTHONIOENCODING=utf-8) fails on the first line naming it, before or after a whole run.
    "surrogateescape" writes its bytes back as they were, as Python itself does in the C
    locale (stderr already uses "backslashreplace")."""
    stream = sys.stdout
    if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
        stream.reconfigure(errors="surrogateescape")


def _error_report(command: str, e: BaseException) -> tuple[int, str | None]:
    """(exit code, the one line for stderr or None) of an error that reached main()."""
    if isinstance(e, KeyboardInterrupt):  # Ctrl-C, or SIGTERM / SIGHUP (StopSignal)
        from ..training import stopping
        signum = getattr(e, "signum", None)
        if signum is None or signum == 2:  # "\n": the terminal echoed ^C on the current line
            return 130, f"\nglassllm {command}: interrupted"
        return stopping.exit_code(e), \
            f"glassllm {command}: interrupted by {stopping.signal_name(signum)}"
    if isinstance(e, BrokenPipeError):
        # The reader of stdout left (`glassllm train ... | head -1`): stop quietly, as Unix
        # tools do; stdout -> devnull so the interpreter's final flush does not complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1, None
    if isinstance(e, MemoryError):  # NumPy's _ArrayMemoryError says which array did not fit
        detail = f" ({e})" if str(e) else ""
        return 2, (f"glassllm {command}: error: not enough memory for this {command} "
                   f"run{detail}; use smaller sizes")
    from ..lens.interpret import AttributionError
    if isinstance(e, AttributionError):  # not the user's input: the numbers disagree
        hint = "" if "not finite" in str(e) else " (float32 overflow in this model's forward?)"
        return 1, f"glassllm {command}: error: self-check failed: {one_line(e)}{hint}"
    if isinstance(e, OSError) and e.errno in _WRITE_FAILURES:  # not the user's input: exit 1
        where = f" {e.filename}" if e.filename is not None else ""
        return 1, f"glassllm {command}: error: cannot write{where}: {e.strerror}"
    return 2, f"glassllm {command}: error: {one_line(e)}"


# disk full, quota exceeded, an I/O error: a failure of the machine, not of the command line
_WRITE_FAILURES = (errno.ENOSPC, errno.EDQUOT, errno.EIO)


