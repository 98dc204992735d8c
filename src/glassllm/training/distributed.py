"""Data-parallel training over MPI: communicators, the gradient buffer, agreement between ranks.

`mpiexec -n N glassllm train ...` starts N copies (ranks) of the same program. Every rank holds
the whole model, draws the same global batch from the shared seed, computes the gradient of its
own slice of it, and the gradients are summed over the ranks (`Allreduce`) before the one
clip and AdamW step that every rank then makes identically, so the weights stay equal on every
rank without ever being sent (nanoGPT's DDP recipe; Goyal et al. 2017, "Accurate, Large
Minibatch SGD", for the equivalence with one large batch). Rank 0 alone writes files and prints.

The `Trainer` talks to a *communicator*, a small interface that `SerialCommunicator` (one
process, every call a no-op) and `MPICommunicator` (mpi4py) implement, so a fake works in tests:

    rank: int, size: int
    allreduce_sum(array, what)   sum `array` (contiguous float32/float64) over ranks, in place
    allgather(obj, what)         [obj of rank 0, obj of rank 1, ...] (small, picklable)
    abort(message, code)         print `message`, end every rank (MPI_Abort); never returns

`what` says what the collective is for ("gradients of step 12"); it is what a timeout names.

Gradients travel in one contiguous float32 buffer (`GradientBuffer`): one `Allreduce` per step
for the whole model, never one per tensor, and a float64 vector of a few control values (the
loss, which parameters got a gradient) before it.

Faults (`MPICommunicator`): a rank that raises where the others do not calls `abort` (its
message names it: "rank 1 of 2: ValueError: ..."), and MPI ends the whole job. A rank that dies
without a word (SIGKILL, the out-of-memory killer, a crash) is named by its supervisor
(`glassllm.training.launch`), and mpiexec (hydra) then kills the other ranks itself; for a launcher that
does not, a watchdog thread in each rank ends the job when a collective waits for a rank of the
same host that is no longer running (within ~1 s), or when any collective waits longer than
`timeout_s` (a hung or stopped rank, another host's rank lost).

mpi4py and an MPI library are the optional extra `glassllm[mpi]` (`pip install mpi4py mpich`);
nothing here imports mpi4py unless an MPI launcher started the process.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import sys
import threading
import time

import numpy as np

from ..devices import device_of, to_device, to_host

DEFAULT_TIMEOUT_S = 300.0  # a collective that waits this long means a rank is lost or hung
ABORT_GRACE_S = 0.5  # for a rank's last message to reach the launcher before MPI_Abort


class RanksDisagree(RuntimeError):
    """Ranks that must hold the same state do not (settings, data, weights). Raised on every
    rank at the same point, so the job stops cleanly. `differences` lists (rank, field)."""

    def __init__(self, message: str, differences=()):
        super().__init__(message)
        self.differences = list(differences)


class RanksFailed(ValueError):
    """Some ranks failed where others did not (before training): raised on every rank, with
    each failing rank's message ("rank 1 of 2: ...")."""


class SerialCommunicator:
    """One process: rank 0 of 1. Reductions leave arrays as they are (already the sum)."""

    rank = 0
    size = 1
    allreduce_seconds = 0.0

    def allreduce_sum(self, array: np.ndarray, what: str = "") -> None:
        return None

    def allgather(self, obj, what: str = "") -> list:
        return [obj]

    def abort(self, message: str, code: int = 1):
        raise SystemExit(message)  # nothing else to stop; never called by the Trainer

    def local_size(self) -> int:
        return 1

    def close(self) -> None:
        return None


def from_environment(timeout_s: float = DEFAULT_TIMEOUT_S):
    """An `MPICommunicator` when an MPI launcher started this process with more than one rank
    (`glassllm.training.launch.launcher_size`), else a `SerialCommunicator`.

    Raises:
        RuntimeError: started by a launcher with N > 1 ranks but mpi4py is not installed.
    """
    # imported here, not at the top: `python -m glassllm.training.launch` imports this package
    # first, and runpy warns when the module it is about to run was already imported
    from .launch import launcher_size
    size = launcher_size()
    if size == 1:
        return SerialCommunicator()
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        raise RuntimeError(f"this process is one of {size} MPI ranks but mpi4py is not "
                           f"installed; install the extra: pip install 'glassllm[mpi]'") from None
    return MPICommunicator(timeout_s=timeout_s)


class MPICommunicator:
    """A communicator over mpi4py's COMM_WORLD (or `comm`), with the watchdog of the module
    doc.

    Args:
        comm: an mpi4py communicator (default MPI.COMM_WORLD).
        timeout_s: a collective that has not completed after this many seconds ends the job
            (checked twice a second; None: wait forever).

    Attributes: rank, size, timeout_s (the watchdog reads it at each check, so it may be
    changed after start), allreduce_seconds (wall time spent in allreduce_sum, waiting for
    slower ranks included), peers (each rank's {"host", "pid"}).
    """

    def __init__(self, comm=None, timeout_s: float | None = DEFAULT_TIMEOUT_S):
        from mpi4py import MPI
        self._MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.timeout_s = timeout_s
        self.allreduce_seconds = 0.0
        self._waiting: tuple[float, str] | None = None  # (since, what) while in a collective
        self._closed = threading.Event()
        self.peers = self.comm.allgather({"host": socket.gethostname(), "pid": os.getpid()})
        self._watchdog = threading.Thread(target=self._watch, name="glassllm-mpi-watchdog",
                                          daemon=True)
        self._watchdog.start()

    # ------------------------------------------------------------------ collectives
    def allreduce_sum(self, array: np.ndarray, what: str = "sums") -> None:
        if not (array.flags.c_contiguous and array.dtype in (np.float32, np.float64)):
            raise ValueError("allreduce_sum: needs a contiguous float32 or float64 array")
        t0 = time.perf_counter()
        with self._collective(f"allreduce of the {what}"):
            self.comm.Allreduce(self._MPI.IN_PLACE, array, op=self._MPI.SUM)
        self.allreduce_seconds += time.perf_counter() - t0

    def allgather(self, obj, what: str = "objects") -> list:
        with self._collective(f"allgather of the {what}"):
            return self.comm.allgather(obj)

    @contextlib.contextmanager
    def _collective(self, what: str):
        self._waiting = (time.monotonic(), what)
        try:
            yield
        finally:
            self._waiting = None

    # ------------------------------------------------------------------ faults
    def abort(self, message: str, code: int = 1):
        """Print `message` on stderr and end every rank of the job (MPI_Abort)."""
        print(message, file=sys.stderr, flush=True)
        # The launcher forwards a rank's output through a pipe; MPI_Abort tears the job down
        # at once and could drop what is still in it (seen: 1 run in 5 lost the message).
        time.sleep(ABORT_GRACE_S)
        self.comm.Abort(code)
        os._exit(code)  # not reached: MPI_Abort does not return

    def local_size(self) -> int:
        """How many ranks of the job run on this rank's host (itself included)."""
        host = self.peers[self.rank]["host"]
        return sum(1 for p in self.peers if p["host"] == host)

    def close(self) -> None:
        """Stop the watchdog (idempotent); the communicator is not used afterwards."""
        self._closed.set()

    def _watch(self) -> None:
        """The watchdog: runs while the main thread sits in MPI calls (they release the GIL)."""
        host = socket.gethostname()
        local = [(r, p["pid"]) for r, p in enumerate(self.peers)
                 if r != self.rank and p["host"] == host]
        while not self._closed.wait(0.5):
            waiting = self._waiting
            if waiting is None:
                continue
            since, what = waiting
            waited = time.monotonic() - since
            if waited < 1.0:
                continue
            gone = [(r, pid) for r, pid in local if _process_state(pid) in (None, "Z", "X")]
            if gone:
                names = ", ".join(f"rank {r} (pid {pid} on {host})" for r, pid in gone)
                self.abort(f"glassllm: rank {self.rank} of {self.size}: {names} is no longer "
                           f"running (killed or crashed) while this rank waited in the "
                           f"{what}; ending the job", 1)
            if self.timeout_s is not None and waited > self.timeout_s:
                states = ", ".join(f"rank {r} (pid {pid}): "
                                   f"{_STATE_WORDS.get(_process_state(pid), 'running')}"
                                   for r, pid in local)
                self.abort(f"glassllm: rank {self.rank} of {self.size}: the {what} got no answer "
                           f"from the other ranks for {waited:.0f} s (timeout {self.timeout_s:g}"
                           f" s): a rank is hung, stopped or lost"
                           + (f"; on this host {states}" if states else "")
                           + "; ending the job", 1)


_STATE_WORDS = {"T": "stopped", "t": "stopped (traced)", "D": "waiting for the disk",
                "Z": "dead", None: "gone"}


def _process_state(pid: int) -> str | None:
    """The state letter of a process of this host (R, S, D, T, Z, ...), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:
            pass
        return "?"


# ------------------------------------------------------------------------------ gradients
class GradientBuffer:
    """The gradients of `params` in one contiguous float32 array, for accumulation and one
    Allreduce per step.

    `add(params)` adds every present `.grad` into its slice and counts it; `reduce(comm,
    loss)` sums the losses, the counts and (if every loss is finite) the gradients over the
    ranks; `to_params(params, factor)` multiplies by `factor` and makes each `.grad` a view of
    its slice (None for a parameter that no micro-batch of any rank gave a gradient).
    """

    def __init__(self, params):
        self.shapes = [p.data.shape for p in params]
        sizes = [int(np.prod(s)) for s in self.shapes]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        self.flat = np.zeros(int(self.offsets[-1]), dtype=np.float32)
        self.present = np.zeros(len(sizes), dtype=np.float64)

    def zero(self) -> None:
        self.flat.fill(0.0)
        self.present.fill(0.0)

    def add(self, params) -> None:
        for i, p in enumerate(params):
            if p.grad is not None:
                piece = self.flat[self.offsets[i]:self.offsets[i + 1]]
                piece += to_host(p.grad).reshape(-1)  # summed on the host (MPI's buffers)
                self.present[i] += 1.0

    def reduce(self, comm, loss_sum: float, what: str) -> float:
        """Sum over ranks: the losses (float64, with the presence counts) and, when their sum
        is finite, the gradients (float32, in place). Returns the summed loss."""
        control = np.concatenate([[loss_sum], self.present])
        comm.allreduce_sum(control, what=f"losses of {what}")
        self.present[:] = control[1:]
        total = float(control[0])
        if np.isfinite(total):
            comm.allreduce_sum(self.flat, what=f"gradients of {what}")
        return total

    def to_params(self, params, factor: float) -> None:
        if factor != 1.0:
            self.flat *= np.float32(factor)
        for i, p in enumerate(params):
            grad = self.flat[self.offsets[i]:self.offsets[i + 1]].reshape(self.shapes[i]) \
                if self.present[i] else None
            p.grad = grad if grad is None or isinstance(p.data, np.ndarray) else \
                to_device(grad.copy(), device_of(p.data))


# ------------------------------------------------------------------------------ agreement
def weights_digest(model) -> str:
    """SHA-256 (hex) of every parameter's float32 bytes, in `named_parameters()` order."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(memoryview(np.ascontiguousarray(p.data)).cast("B"))
    return h.hexdigest()


def check_same(comm, facts: dict, what: str) -> None:
    """Every rank's `facts` (a JSON-able dict) must equal rank 0's.

    Raises (on every rank alike):
        RanksDisagree: naming each rank and field that differs, with both values.
    """
    everyone = [_flatten(f) for f in
                comm.allgather(json.loads(json.dumps(facts)), what=f"check of the {what}")]
    reference = everyone[0]
    differences = [(r, key) for r, theirs in enumerate(everyone[1:], start=1)
                   for key in sorted(set(reference) | set(theirs))
                   if reference.get(key) != theirs.get(key)]
    if differences:
        shown = "; ".join(f"rank {r} {key} {_short(everyone[r].get(key))} vs rank 0 "
                          f"{_short(reference.get(key))}" for r, key in differences[:4])
        more = f" (and {len(differences) - 4} more)" if len(differences) > 4 else ""
        raise RanksDisagree(f"the ranks' {what} differ: {shown}{more}; every rank must run "
                            f"the same settings on the same data and weights", differences)


@contextlib.contextmanager
def agreement(comm, errors: tuple = (OSError, ValueError, MemoryError)):
    """A block that every rank runs and leaves together: if it raises one of `errors` on some
    ranks, every rank raises, so none waits forever in the next collective.

    When every rank failed with the same message, each re-raises its own exception (rank 0
    prints it once); otherwise every rank raises RanksFailed naming the failing ranks. Any
    other exception (a bug, KeyboardInterrupt) on one rank ends the job with `comm.abort`.
    With one rank the block runs as if unguarded.
    """
    if comm.size == 1:
        yield
        return
    error = None
    try:
        yield
    except errors as e:
        error = e
    except BaseException as e:
        fail(comm, e)  # ends the job (MPI_Abort); the raise is for a fake communicator
        raise
    outcome = None if error is None else _one_line(error)
    outcomes = comm.allgather(outcome, what="outcome of the start-up")
    failed = [(r, o) for r, o in enumerate(outcomes) if o is not None]
    if not failed:
        return
    if len(failed) == comm.size and len({o for _, o in failed}) == 1:
        raise mark_every_rank(error)
    raise RanksFailed("; ".join(f"rank {r} of {comm.size}: {o}" for r, o in failed)) \
        from error


def fail(comm, e: BaseException):
    """End the job for an error of this rank alone: "glassllm: rank R of N: <error>; ending
    the job" on stderr, then `comm.abort` (exit code 128 + the signal for an interrupt: 130
    for Ctrl-C, 143 for SIGTERM; else 1)."""
    signum = getattr(e, "signum", None) or 2  # SIGTERM / SIGHUP carry theirs (StopSignal)
    how = "Ctrl-C" if signum == 2 else f"signal {signum}"
    what = f"interrupted ({how}) outside a step boundary" if isinstance(e, KeyboardInterrupt) \
        else f"{type(e).__name__}: {_one_line(e)}"
    comm.abort(f"glassllm: rank {comm.rank} of {comm.size}: {what}; ending the job",
               128 + signum if isinstance(e, KeyboardInterrupt) else 1)


def _flatten(facts: dict, prefix: str = "") -> dict:
    """{"settings": {"lr": 0.01}} -> {"settings.lr": 0.01}, so a difference names its field."""
    flat = {}
    for key, value in facts.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def mark_every_rank(e: BaseException) -> BaseException:
    """Mark `e` as raised on every rank at the same point (so no rank is left waiting)."""
    with contextlib.suppress(AttributeError):
        e.raised_on_every_rank = True
    return e


def raised_on_every_rank(e: BaseException) -> bool:
    """Whether `e` was raised on every rank alike: RanksDisagree, RanksFailed, or marked."""
    return isinstance(e, (RanksDisagree, RanksFailed)) or \
        getattr(e, "raised_on_every_rank", False) is True


def _one_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return f"{e.filename}: {e.strerror}"
    return " ".join(str(e).split("\n"))


def _short(x, n: int = 70) -> str:
    text = json.dumps(x, sort_keys=True)
    return text if len(text) <= n else text[:n] + "..."
