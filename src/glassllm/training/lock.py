"""Output locks: one training run at a time writes a given file.

Two runs started on the same `--out` would interleave their CSV rows and overwrite each other's
model and checkpoint. So a run locks each of its output paths first: `lock_outputs(paths)`
takes, for every path, an exclusive `flock(2)` on `<path>.lock` beside it, and writes the
holder into that file as JSON (pid, host, start time, command line). A second run asking for
any of those paths gets `OutputLocked` naming the holder, at once (no waiting).

Stale locks: the operating system drops a flock when its process ends, however it ends
(exit, exception, SIGKILL, a crash), so the lock file a dead process left behind is simply
taken over by the next run; `OutputLock.stale` lists the holders found that way (their pid
is no longer running), for a note to the user, and `OutputLock.stale_paths` their paths: a run
killed outright (SIGKILL, MPI's force abort) may have left its temporaries there, which
`glassllm.formats.atomic.remove_leftover_temporaries` then clears. The file is removed on a clean release (after
checking that it is still the one locked, so a waiting reader never locks a removed file).

Within one process the locks are re-entrant: `glassllm train` locks every output, then the
`Trainer` it runs locks its own again, and that is not a conflict. Locks are advisory (they
bind glassllm runs, not other programs) and need POSIX `fcntl.flock`; where it does not exist
(Windows) `lock_outputs` locks nothing.

This module imports nothing from glassllm, so every module may use it.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import sys
import threading
import time

try:
    import fcntl
except ImportError:  # Windows: no flock; see the module docstring
    fcntl = None

_held: dict[str, list] = {}  # lock file (real path) -> [fd, holders in this process]
_held_guard = threading.Lock()


class OutputLocked(OSError):
    """Another live process holds the lock on `filename` (the output path).

    Attributes: filename (the output), lock_path, holder (the lock file's JSON: pid, host,
    started, argv; {} if unreadable). An OSError with errno EBUSY, so callers that report
    file errors as "PATH: reason" print "PATH: in use by another run (pid N, ...)".
    """

    def __init__(self, path: str, lock_path: str, holder: dict):
        self.lock_path, self.holder = lock_path, holder
        who = f"pid {holder['pid']}" if "pid" in holder else "an unknown process"
        if holder.get("host") and holder.get("host") != socket.gethostname():
            who += f" on {holder['host']}"
        since = f", started {holder['started']}" if holder.get("started") else ""
        super().__init__(errno.EBUSY, f"in use by another glassllm run ({who}{since}; lock "
                                      f"file {lock_path})", path)


class OutputLock:
    """The locks of `lock_outputs`; a context manager that releases them on exit.

    Attributes:
        paths: the output paths locked. stale: holder dicts of lock files left by processes
            that had ended (taken over). stale_paths: the output paths of those lock files.
    """

    def __init__(self, paths):
        self.paths = []
        for p in paths:
            if p is not None and os.path.abspath(p) not in map(os.path.abspath, self.paths):
                self.paths.append(os.fspath(p))
        self.stale: list[dict] = []
        self.stale_paths: list[str] = []
        self._locked: list[str] = []
        _check_no_output_is_a_lock(self.paths)
        try:
            # Ctrl-C held while the lock files are made and recorded (a few non-blocking
            # calls): one arriving between a file's creation and its record would leave the
            # file behind (and the folder a failed `glassllm prepare` made, not empty).
            with signals_held():
                for path in self.paths:
                    previous = _acquire(path, lock_path(path))
                    self._locked.append(lock_path(path))
                    if previous and previous.get("pid") != os.getpid():
                        self.stale.append(previous)
                        self.stale_paths.append(path)
        except BaseException:  # a signal held above is raised here, on the way out
            self.release()
            raise

    def release(self) -> None:
        """Release every lock (idempotent)."""
        while self._locked:
            _release(self._locked.pop())

    def __enter__(self) -> "OutputLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_outputs(paths) -> OutputLock:
    """Lock each output path (None entries are skipped) for this process; use as
    `with lock_outputs([model_path, csv_path]) as lock: ...`.

    Raises:
        OutputLocked: a path is held by another running process (nothing stays locked).
        FileNotFoundError: an output's directory does not exist, naming that directory.
        OSError: a lock file cannot be created (e.g. no permission in its directory),
            naming it; FileExistsError where a file that is not a lock has its name.
        ValueError: an output is another output's lock file.
    """
    return OutputLock(paths)


@contextlib.contextmanager
def signals_held():
    """SIGINT, SIGTERM and SIGHUP held while the block runs: one that arrives meanwhile is
    recorded, and raised again (its own handler runs) when the block ends. Done with Python
    handlers, which always run in the main thread: a signal mask (pthread_sigmask) holds
    nothing once the process has other threads (tqdm's monitor, the engine's pool), since the
    kernel delivers the signal to a thread that does not block it. Outside the main thread
    (where handlers cannot be set) nothing is held; an ignored signal stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {}
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        signum = getattr(signal, name, None)
        if signum is None or signal.getsignal(signum) in (signal.SIG_IGN, None):
            continue  # None: a handler not set from Python, left alone
        previous[signum] = signal.signal(signum, lambda s, frame: caught.append(s))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if caught:
            signal.raise_signal(caught[0])  # the first, as if it arrived now


def lock_path(path) -> str:
    """The lock file of an output path: `<path>.lock`."""
    return os.fspath(path) + ".lock"


def _holder() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[:8]}


def _acquire(path: str, lock_file: str) -> dict | None:
    """Lock `lock_file`; return the stale holder found in it (None if the file was new)."""
    if fcntl is None:
        return None
    key = os.path.realpath(lock_file)
    with _held_guard:
        if key in _held:
            _held[key][1] += 1
            return None
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):  # say the folder the user named, not our lock file
            raise FileNotFoundError(errno.ENOENT, "the output's directory does not exist "
                                    "(create it first)", folder)
        while True:
            fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _read(fd)
                os.close(fd)
                if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise OutputLocked(path, lock_file, holder) from None
                raise
            # The holder may have released and removed the file between our open and flock:
            # then we hold a lock on a file nobody else will see; start again.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(lock_file))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            if os.fstat(fd).st_size and not _written_by_a_lock(fd):  # not ours: keep it
                os.close(fd)
                raise FileExistsError(errno.EEXIST, f"a file that is not a glassllm lock is "
                                      f"where the lock of {path} goes; rename it, or give "
                                      f"the output another name", lock_file)
            previous = _read(fd) or None
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(_holder()).encode())
            _held[key] = [fd, 1]
            return previous


def _check_no_output_is_a_lock(paths: list[str]) -> None:
    """Refuse an output that is another output's lock file (`--log-csv m.safetensors.lock`
    beside `--out m.safetensors`): the release at the end would remove it."""
    named = {os.path.realpath(p): p for p in paths}
    for path in paths:
        other = named.get(os.path.realpath(lock_path(path)))
        if other is not None:
            raise ValueError(f"{other} is the lock file of the output {path} (removed when "
                             f"the run ends); give it another name")


def _release(lock_file: str) -> None:
    if fcntl is None:
        return
    key = os.path.realpath(lock_file)
    with _held_guard:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1]:
            return
        del _held[key]
        fd = entry[0]
        try:
            # Only our own file (the one we hold the flock on), and while still locked, so a
            # waiting opener sees it vanish; a file put there since is another run's.
            if os.path.samestat(os.fstat(fd), os.stat(lock_file)):
                os.remove(lock_file)
        except OSError:
            pass
        os.close(fd)


def _written_by_a_lock(fd: int) -> bool:
    """Whether the file holds what `_holder` writes (a JSON object starting with "pid"),
    even cut short by a process killed while writing it."""
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 8) == b'{"pid": '


def _read(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, 1 << 16)
        holder = json.loads(data.decode("utf-8")) if data else {}
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {}
