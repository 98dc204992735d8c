"""How a rank of an MPI job is started and watched: its number from the launcher, a supervisor.

An MPI launcher (`mpiexec`, `srun`) starts N processes and tells each, in its environment, how
many there are and which one it is. `launcher_size()` / `launcher_rank()` read that before MPI
itself starts (this module imports nothing but the standard library).

A rank that dies without a word -- SIGKILL, the out-of-memory killer, a crash in C -- cannot
say who it was, and mpiexec's own report names only a process id. So under a launcher,
`glassllm train` runs as two processes per rank, as torchrun's agent does: the process the
launcher started becomes a *supervisor* that starts the real work as its child and waits for
it. When the child is killed by a signal, the supervisor prints

    glassllm: rank 1 of 2 (pid 4242 on node7) was killed by SIGKILL (signal 9) ...

and ends itself by the same signal, and only then does the launcher learn that a rank
failed and end the others (an exit code would not do: before MPI_Init, hydra waits forever
for the other ranks of a process that exited with one). The child dies with its supervisor (PR_SET_PDEATHSIG on Linux).
Signals: mpiexec (hydra) and srun signal the whole process group, so the child receives Ctrl-C
itself and the supervisor ignores it; a SIGTERM sent to the supervisor alone is passed on.

`python -m glassllm.training.launch SCRIPT [ARGS...]` gives a Python script of one's own the same
supervisor (as `python -m mpi4py SCRIPT` gives it its error handling).
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

SUPERVISED = "GLASSLLM_SUPERVISED"  # set in the child: it is the rank's real work
# What MPI launchers set: MPICH's hydra, Intel MPI and Slurm's PMI-2 (PMI_*), Open MPI,
# MVAPICH, and srun itself (SLURM_STEP_NUM_TASKS and SLURM_PROCID exist only inside a step).
LAUNCHER_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE",
                           "SLURM_STEP_NUM_TASKS")
LAUNCHER_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK",
                           "SLURM_PROCID")


def launcher_size(environ=None) -> int:
    """The number of ranks an MPI launcher announced in the environment (1 if none did)."""
    return _first_number(LAUNCHER_SIZE_VARIABLES, environ, default=1, least=2)


def launcher_rank(environ=None) -> int | None:
    """This process's rank as the launcher announced it, or None."""
    return _first_number(LAUNCHER_RANK_VARIABLES, environ, default=None, least=0)


def _first_number(names, environ, default, least):
    environ = os.environ if environ is None else environ
    for name in names:
        value = environ.get(name, "")
        if value.isdigit() and int(value) >= least:
            return int(value)
    return default


def needs_supervisor(environ=None) -> bool:
    """True in a process an MPI launcher started as one of N > 1 ranks, not yet supervised."""
    environ = os.environ if environ is None else environ
    return launcher_size(environ) > 1 and environ.get(SUPERVISED) != "1"


def supervise(command: list[str]) -> int:
    """Run `command` as this rank's child and return its exit status; if signal N ended
    the child, print which rank it was and end this process by signal N too (see the module
    doc and `interrupted_exit`)."""
    rank, size = launcher_rank(), launcher_size()
    # The launcher signals the whole process group: the child gets Ctrl-C itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SIGTERM / SIGHUP sent to this process alone are passed on (the child stops as for
    # Ctrl-C; glassllm.training.stopping); sent to the group, the child gets them twice, which
    # it counts once. Installed before the child starts: one arriving in between is passed on
    # once it has.
    child, early = [], []
    for number in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if number is not None and signal.getsignal(number) is not signal.SIG_IGN:
            signal.signal(number, lambda signum, frame: child[0].send_signal(signum)
                          if child else early.append(signum))
    child.append(subprocess.Popen(command, env={**os.environ, SUPERVISED: "1"},
                                  close_fds=False, preexec_fn=_child_setup()))
    for signum in early:
        child[0].send_signal(signum)
    code = _wait(child[0])
    if code >= 0:
        return code
    number = -code
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    who = f"rank {rank} of {size}" if rank is not None else "an MPI rank"
    if number in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        # Ctrl-C or SIGTERM, which the launcher sends to every rank, landed where the rank cannot
        # stop at a step boundary (importing, starting MPI, or ending after its last step): no crash.
        what = "Ctrl-C (SIGINT)" if number == signal.SIGINT else name
        cause = f"{what} outside the training loop (while starting or ending)"
    else:
        cause = f"`kill -{number}`, the out-of-memory killer or a crash"
    print(f"glassllm: {who} (pid {child[0].pid} on {socket.gethostname()}) was killed by "
          f"{name} (signal {number}): {cause}; the launcher ends the other ranks",
          file=sys.stderr, flush=True)
    time.sleep(0.5)  # let the launcher forward that line before it learns of the exit
    # End by the same signal, not with an exit code: hydra ends the job when a process it
    # started dies by a signal, even before MPI_Init, but waits forever for the others when
    # one exits with a code before MPI_Init (seen: Ctrl-C during start-up hung the job).
    _end_by_signal(number)
    return 128 + number  # a signal whose default action does not end a process


def _wait(child) -> int:
    """The child's exit status. Waited for in short slices: a signal the kernel hands to
    another thread of this process (NumPy's BLAS threads) runs its Python handler only when
    the main thread runs Python code, never inside one blocking waitpid."""
    while True:
        try:
            return child.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            continue


def interrupted_exit(code: int = 130, signum: int | None = None) -> int:
    """How a process that Ctrl-C ended outside the code that handles it exits: `code`, or,
    as one of N > 1 ranks of an MPI launcher, by killing itself with SIGINT.

    MPICH's hydra ends the job when one of its processes dies by a signal, even one that
    never reached MPI_Init; but a process that exits with a code before MPI_Init leaves the
    others waiting in MPI_Init forever (seen: Ctrl-C half a second after `mpiexec -n 2
    glassllm train` reached one rank while it built the parser and another in MPI_Init: the
    job hung). Every rank gets the Ctrl-C, so ending the job is what the user asked for.
    SIGTERM and SIGHUP (`signum`) end it the same way, by themselves."""
    if launcher_size() == 1:
        return code
    _end_by_signal(signum or signal.SIGINT)
    return code  # not reached: the default action of these signals ends the process


def _end_by_signal(number: int) -> None:
    """Flush the output and kill this process with signal `number` at its default action."""
    sys.stdout.flush()
    sys.stderr.flush()
    with contextlib.suppress(OSError, ValueError):  # SIGKILL's action cannot be set
        signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)


def _child_setup():
    """What the child does between fork and exec: SIGINT back to its default (an ignored
    SIGINT would be inherited and Ctrl-C would never reach the training loop), and death with
    the supervisor (Linux: prctl PR_SET_PDEATHSIG). libc is loaded here, in the parent."""
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None

    def setup():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if prctl is not None:
            prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    return setup


def main(argv: list[str] | None = None) -> int:
    """`python -m glassllm.training.launch SCRIPT [ARGS...]`: SCRIPT under a supervisor (module doc)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: mpiexec -n N python -m glassllm.training.launch SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    command = [sys.executable, *argv]
    if not needs_supervisor():
        os.execv(sys.executable, command)
    return supervise(command)


if __name__ == "__main__":
    sys.exit(main())
