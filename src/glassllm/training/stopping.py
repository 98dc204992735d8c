"""Stop signals: Ctrl-C (SIGINT), SIGTERM and SIGHUP all stop a run the same careful way.

`kill`, `timeout`, `docker stop`, systemd and Slurm (a time limit, `scancel`, preemption) send
SIGTERM; a closed terminal or ssh session sends SIGHUP. Left at their default action they end
the process at once: no checkpoint, no history, locks left behind. Here all three are treated
as Ctrl-C is:

- `DeferredStop` (around the training loop) holds a stop signal until the update in progress
  is complete: the loop sees `pending` at the next step boundary, writes a checkpoint of a
  whole number of updates and stops. A *second Ctrl-C* interrupts at once (the user insists);
  a repeated SIGTERM or SIGHUP does not (mpiexec and srun send SIGTERM to every process of a
  rank's group, so one `scancel` can arrive twice).
- `signals_raise` (around a whole command) turns SIGTERM and SIGHUP into `StopSignal`, a
  `KeyboardInterrupt`, so outside the loop they unwind as Ctrl-C does (locks released, one line
  printed) instead of killing the process.

A process that ends because of signal N exits with 128 + N (130 for SIGINT, 143 for SIGTERM,
129 for SIGHUP), the shell's convention (POSIX, "Exit Status for Commands"), so `timeout`,
Slurm and systemd see the cause. `exit_code(e)` gives it.

Handlers are only ever set in the main thread, and only over a signal's default action (or
over these helpers' own handlers): a program that set its own keeps it.
"""
from __future__ import annotations

import contextlib
import signal
import threading

# SIGHUP does not exist on Windows
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))
_REPEATS_INTERRUPT = (signal.SIGINT,)  # a second one of these stops at once


class StopSignal(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the program was (`signals_raise`).

    signum: the signal's number. A KeyboardInterrupt, so code that handles Ctrl-C handles it."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal_name(signum)}")
        self.signum = int(signum)

    def __reduce__(self):
        return (StopSignal, (self.signum,))


def signal_name(signum: int) -> str:
    """"SIGTERM" for 15, "signal 99" for a number without a name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_code(e: BaseException | None = None, signum: int | None = None) -> int:
    """128 + the signal that stopped the process: of `e` (its `signum`, SIGINT for a plain
    KeyboardInterrupt) or `signum` itself."""
    if signum is None:
        signum = getattr(e, "signum", None) or signal.SIGINT
    return 128 + int(signum)


def _is_default(signum: int, handler) -> bool:
    """Whether `handler` is what Python leaves on `signum` unless a program changes it, or one
    of this module's own handlers (which nest)."""
    if signum == signal.SIGINT and handler is signal.default_int_handler:
        return True
    if handler is signal.SIG_DFL:
        return True
    return isinstance(getattr(handler, "__self__", None), (DeferredStop, _RaiseOnce))


class _RaiseOnce:
    """The handler of `signals_raise`: StopSignal at the first signal, nothing at repeats
    (the same SIGTERM delivered to the process group and passed on by a supervisor must not
    interrupt the unwinding the first one started)."""

    def __init__(self):
        self.raised = False

    def handler(self, signum, frame):
        if not self.raised:
            self.raised = True
            raise StopSignal(signum)


_ACTIVE: list[_RaiseOnce] = []  # the handlers of the open `signals_raise` blocks


def stop_begun() -> None:
    """Say that this process has begun to stop (its checkpoint and history are being written):
    from here on SIGTERM and SIGHUP are repeats, which `signals_raise` ignores. Under MPI a
    rank is told to stop by the others' agreement and its own SIGTERM (`scancel` signals
    every rank) may arrive only then: it must not cut the checkpoint short."""
    for once in _ACTIVE:
        once.raised = True


def ignore_further_stops() -> None:
    """For a process about to exit: SIGTERM and SIGHUP ignored from here on (SIGINT keeps its
    action). A late one -- another rank's `scancel` SIGTERM reaching a rank that the others'
    agreement already stopped, a supervisor passing one on -- would otherwise end the process
    by the signal during its exit, and MPICH would end the job with that signal's status."""
    if _in_main_thread():
        for signum in STOP_SIGNALS:
            if signum != signal.SIGINT:
                signal.signal(signum, signal.SIG_IGN)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def signals_raise():
    """While inside: SIGTERM and SIGHUP raise `StopSignal` (as SIGINT raises
    KeyboardInterrupt), where their action is the default. Restored on exit."""
    previous, once = {}, _RaiseOnce()
    if _in_main_thread():
        for signum in STOP_SIGNALS:
            if signum != signal.SIGINT and _is_default(signum, signal.getsignal(signum)):
                previous[signum] = signal.signal(signum, once.handler)
    _ACTIVE.append(once)
    try:
        yield
    finally:
        _ACTIVE.remove(once)
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class DeferredStop:
    """Hold stop signals until the code inside checks `pending` (a context manager).

    pending: the number of the first stop signal received, or 0. A second SIGINT raises
    `KeyboardInterrupt` at once (a second Ctrl-C); a repeated SIGTERM or SIGHUP is ignored
    (module doc). Nested: an inner one starts with what the outer one holds and hands what
    it held back on exit, so no signal is lost between the two. Only in the main thread,
    over default handlers (module doc).
    """

    def __init__(self):
        self.pending = 0
        self._previous: dict[int, object] = {}
        self._outer: DeferredStop | None = None

    def __enter__(self) -> "DeferredStop":
        if not _in_main_thread():
            return self
        for signum in STOP_SIGNALS:
            handler = signal.getsignal(signum)
            if _is_default(signum, handler):
                outer = getattr(handler, "__self__", None)
                if isinstance(outer, DeferredStop):  # what it holds is held here now
                    self._outer, self.pending = outer, outer.pending
                self._previous[signum] = signal.signal(signum, self._handler)
        return self

    def _handler(self, signum, frame):
        if self.pending and signum in _REPEATS_INTERRUPT:
            raise KeyboardInterrupt
        if not self.pending:
            self.pending = int(signum)

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        if self._outer is not None and self.pending and not self._outer.pending:
            self._outer.pending = self.pending
