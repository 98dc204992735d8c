"""Output paths checked before anything is computed: a file path that can be written.

A long computation (a training run, the analyses of `glassllm inspect`) must not end by
failing to write its result, nor by overwriting its own input: `check_output_paths` refuses
such paths up front, with one line naming the flag and the path. The training run's files
(`glassllm.training.runfiles`) and the report (`glassllm.lens.report`) both use it.

This module imports nothing from glassllm, so every module may use it.
"""
from __future__ import annotations

import os
import stat


def check_output_paths(outputs: dict, inputs=(), data_dirs=()) -> None:
    """Refuse output paths that would fail or do harm, before anything is written.

    Args:
        outputs: {label: path or None}; the label is what messages call the path (the CLI
            passes its flag names, e.g. "--out").
        inputs: paths the computation reads (its data files): no output may be one of them.
        data_dirs: directories the computation reads whole (`--data DIR`): no output may be
            inside one (a file written there would be read as data by the next run, and a
            resume would find its data changed).

    Refused: an empty path; a path that names a directory (it exists as one, or ends with a
    separator, "." or ".."); two outputs on one file (they would overwrite each other midway);
    an output that is an input (it would overwrite what it reads), compared by identity
    (`same_file`: a hard link or symbolic link to an input is that input); an output inside
    a data directory; a path whose nearest existing ancestor is a file, or a directory
    without write permission.

    Raises:
        ValueError: one line, naming the label and the path (and the input or directory).
    """
    named = []
    for label, path in outputs.items():
        if path is None:
            continue
        path = os.fspath(path)
        _check_file_path(label, path)
        named.append((label, path))
    for i, (label_a, a) in enumerate(named):
        for label_b, b in named[i + 1:]:
            if same_file(a, b):
                raise ValueError(f"{label_a} and {label_b} are the same file ({b}); give "
                                 f"them different paths")
    for label, path in named:
        for source in inputs or ():
            if same_file(path, source):
                shown = "" if os.path.abspath(path) == os.path.abspath(source) else \
                    f" ({source}, by a link)"
                raise ValueError(f"{label} {path} is one of the data files{shown}; training "
                                 f"would overwrite its own data")
        for folder in data_dirs or ():
            if is_inside(path, folder):
                raise ValueError(f"{label} {path} is inside the data directory {folder}; "
                                 f"write the run's files elsewhere (the next run would read "
                                 f"them as data)")


def _check_file_path(label: str, path: str) -> None:
    if not path:
        raise ValueError(f"{label} is empty; give a file path such as runs/model.safetensors")
    seps = tuple({os.sep, os.altsep or os.sep})
    if path.endswith(seps) or os.path.basename(path) in (".", ".."):
        raise ValueError(f"{label} {path} names a directory; give a file path such as "
                         f"{os.path.join(path, 'model.safetensors')}")
    if os.path.isdir(path):
        raise ValueError(f"{label} {path} is a directory; give a file path")
    parent = os.path.dirname(os.path.abspath(path))
    existing = parent
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"{label} {path}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{label} {path}: no permission to write in {existing}")


def same_file(a, b) -> bool:
    """Whether two paths name the same file: by identity (device and inode, `os.stat`) when
    both exist, so a hard link is caught as well as a symbolic link; else by name after links
    and `..` (a file not yet written)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))


def is_inside(path, folder) -> bool:
    """Whether `path` lies inside directory `folder` (below it at any depth), comparing each
    existing ancestor of `path` with `folder` by identity (a bind mount or link to the folder
    counts)."""
    try:
        target = os.stat(folder)
    except OSError:
        return False
    if not stat.S_ISDIR(target.st_mode):
        return False
    current = os.path.dirname(os.path.abspath(path))
    while True:
        try:
            st = os.stat(current)
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                return True
        except OSError:
            pass  # not created yet: its parent may be the folder
        parent = os.path.dirname(current)
        if parent == current:
            return False
        current = parent


def regular_file_size(path, what: str = "file") -> int:
    """The size in bytes of `path`, checked to be a regular file (after symbolic links)
    before anything reads it: a FIFO would block the reader forever, and a device such as
    /dev/zero or /dev/urandom never ends.

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: one line naming `path` and what it is, when it is not a regular file.
    """
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(st.st_mode) else
                "a character device" if stat.S_ISCHR(st.st_mode) else
                "a block device" if stat.S_ISBLK(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else
                "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file")
        raise ValueError(f"{path} is {kind}, not a regular {what}; give regular files only")
    return st.st_size


def read_regular_file(path, what: str = "file") -> bytes:
    """The bytes of a regular file, read after `regular_file_size`'s check: at most the size
    that check saw (a file that grows meanwhile is read as it was), opened without blocking
    (a FIFO swapped in after the check cannot hang the reader).

    Raises:
        FileNotFoundError, ValueError: see `regular_file_size`.
    """
    size = regular_file_size(path, what)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"{path} is not a regular {what}; give regular files only")
        return f.read(size)
