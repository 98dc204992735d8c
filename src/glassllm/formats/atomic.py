"""Atomic file writes: the one place glassllm replaces a file on disk.

A new file is written under a fresh temporary name in the destination's directory, flushed and
fsync'ed, then renamed over the destination with `os.replace`. A reader therefore sees either
the old file or the complete new one, never half of it; a crash, an error or Ctrl-C mid-write
leaves the old file untouched and removes the temporary. The temporary lives beside the
destination because a rename is only atomic within one filesystem (POSIX rename(2)).

Two forms:
    with atomic_write(path, "w") as f:      # we open the file
        f.write(text)
    atomic_replace(path, lambda tmp: save_file(tensors, tmp))   # a library writes a path

`AtomicFile` is the object behind `atomic_write`, for writers that stay open across calls
(streaming token files).

Errors: any OSError while writing is re-raised as the same type with the same errno, but naming
the user's `path` (its `filename`) and saying what was being done; the temporary's name would
only confuse. So is an OSError raised by a write inside `with atomic_write(...)`, and a library's
own exception for a failed system call (safetensors raises SafetensorError("... No space left
on device (os error 28)") on a full disk): an OSError with that errno. The new
file gets the permissions an ordinary new file gets under the umask (some libraries,
safetensors among them, create 0600 files).

This module imports nothing from glassllm, so every module may use it.
"""
from __future__ import annotations

import os
import re
import secrets
from typing import Callable


def atomic_replace(path, write: Callable[[str], object], *, doing: str = "cannot write",
                   make_parents: bool = False) -> None:
    """Call `write(tmp)` to write a temporary file beside `path`, then publish it as `path`.

    Args:
        path: the destination (str or os.PathLike); replaced if it exists.
        write: writes the whole file at the str path it is given (e.g. safetensors'
            save_file, matplotlib's savefig); the file already exists, empty.
        doing: what the error message says failed, e.g. "cannot write the checkpoint".
        make_parents: create missing parent directories first.

    Raises:
        OSError: (its subclass kept) naming `path`, see the module docstring; also for a
            library's exception that wraps a failed system call ("(os error N)"). Whatever
            `write` raises otherwise passes through; in every case the temporary is removed.
    """
    path = os.fspath(path)
    tmp, mode = _new_temporary(path, doing, make_parents)
    try:
        write(tmp)
        os.chmod(tmp, mode)  # the library may have recreated the file with its own mode
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # libraries rarely fsync; the data must be on disk before the rename
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:  # Ctrl-C included: never leave a temporary behind
        _remove(tmp)
        e = _as_os_error(e)
        if isinstance(e, OSError):
            raise about(e, path, doing) from None
        raise


class AtomicFile:
    """An open temporary file beside `path`; `commit()` publishes it as `path`, `discard()`
    drops it. As a context manager it yields the file object and commits on a clean exit,
    discards on an exception.

    Args:
        path: the destination (str or os.PathLike); replaced if it exists.
        mode: "w" (text, `encoding`, `newline` as for open) or "wb".
        doing: as for `atomic_replace`.
        make_parents: as for `atomic_replace`.

    Raises:
        OSError: naming `path` (see the module docstring), from the constructor or `commit`.
        ValueError: a mode other than "w" or "wb".
    """

    def __init__(self, path, mode: str = "wb", *, encoding: str = "utf-8",
                 newline: str | None = None, doing: str = "cannot write",
                 make_parents: bool = False):
        if mode not in ("w", "wb"):
            raise ValueError(f"AtomicFile: mode must be 'w' or 'wb', got {mode!r}")
        self.path = os.fspath(path)
        self.doing = doing
        self.tmp, _ = _new_temporary(self.path, doing, make_parents)
        try:
            self.file = open(self.tmp, mode, encoding=None if "b" in mode else encoding,
                             newline=newline)
        except BaseException as e:
            _remove(self.tmp)
            if isinstance(e, OSError):
                raise about(e, self.path, doing) from None
            raise

    def commit(self) -> None:
        """Flush, fsync, close and rename over `path`. On failure the temporary is removed."""
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.tmp, self.path)
        except BaseException as e:
            self.discard()
            if isinstance(e, OSError):
                raise about(e, self.path, self.doing) from None
            raise

    def discard(self) -> None:
        """Close and remove the temporary; `path` is not touched. Safe to call twice."""
        try:
            self.file.close()
        except OSError:  # a failed flush of data we are throwing away anyway
            pass
        _remove(self.tmp)

    def __enter__(self):
        return self.file

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()
            if isinstance(exc, OSError):  # a write in the block (a full disk): name `path`
                raise about(exc, self.path, self.doing) from None


def atomic_write(path, mode: str = "wb", **options) -> AtomicFile:
    """`with atomic_write(path, "w") as f: ...`: write `path` atomically through a file
    object. Options and errors as `AtomicFile`."""
    return AtomicFile(path, mode, **options)


def about(e: OSError, path, doing: str) -> OSError:
    """The same kind of OSError (errno kept) saying `doing`, naming `path` instead of whatever
    file failed."""
    reason = e.strerror or str(e)
    path = os.fspath(path)
    return type(e)(e.errno, f"{doing}: {reason}", path) if e.errno is not None \
        else type(e)(f"{doing} {path!r}: {reason}")


# Rust's std::io::Error prints "<reason> (os error N)"; libraries written in Rust (safetensors)
# wrap it in their own exception type, so a full disk would not be an OSError without this.
_RUST_OS_ERROR = re.compile(r"(?:I/O error: )?([^:]*?) \(os error (\d+)\)")


def _as_os_error(e: BaseException) -> BaseException:
    """`e` itself, or, for a library's exception wrapping an operating-system error (the
    "(os error N)" of Rust's io::Error), the OSError of that errno."""
    if isinstance(e, OSError) or not isinstance(e, Exception):
        return e
    found = _RUST_OS_ERROR.search(str(e))
    if found is None:
        return e
    number = int(found.group(2))
    return OSError(number, os.strerror(number) if number else found.group(1))


def _new_temporary(path: str, doing: str, make_parents: bool) -> tuple[str, int]:
    """Create a fresh empty file beside `path`; returns its name and its permission bits."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    try:
        if make_parents:
            os.makedirs(directory, exist_ok=True)
        # O_EXCL: never reuse another writer's file; 0o666 under the umask is what open() gives.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as e:
        raise about(e, path, doing) from None
    try:
        mode = os.fstat(fd).st_mode & 0o777
    finally:
        os.close(fd)
    return tmp, mode


def leftover_temporaries(path) -> list[str]:
    """The temporaries this module's writers create for `path` (`.<name>.<12 hex>.tmp` in its
    directory) that exist now, sorted. A writer removes its own on any error or Ctrl-C; only a
    process killed outright (SIGKILL, the OOM killer, MPI's force abort) leaves one behind."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    pattern = re.compile(r"\." + re.escape(os.path.basename(path)) + r"\.[0-9a-f]{12}\.tmp")
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(os.path.join(directory, n) for n in names if pattern.fullmatch(n))


def remove_leftover_temporaries(path) -> list[str]:
    """Remove `leftover_temporaries(path)`; returns the ones removed. Call it only while no
    other writer can be writing `path`: `glassllm train` and the Trainer call it for the paths
    whose lock they took over from a process that had ended (`glassllm.training.lock`)."""
    removed = []
    for tmp in leftover_temporaries(path):
        try:
            os.remove(tmp)
        except FileNotFoundError:
            continue
        removed.append(tmp)
    return removed


def _remove(tmp: str) -> None:
    """Remove a temporary if it is there; a failure here must not hide the error being raised."""
    try:
        os.remove(tmp)
    except OSError:
        pass
