"""Output paths checked before anything is computed: a file path that can be written.

A long computation (a training run, the analyses of `glassllm inspect`) must not end by
failing to write its result, nor by overwriting its own input: `check_output_paths` refuses
such paths up front, with one line naming the flag and the path. The training run's files
(`glassllm.training.runfiles`) and the report (`glassllm.lens.report`) both use it.

This module imports nothing from glassllm, so every module may use it.
"""
from __future__ import annotations

import os


def check_output_paths(outputs: dict, inputs=()) -> None:
    """Refuse output paths that would fail or do harm, before anything is written.

    Args:
        outputs: {label: path or None}; the label is what messages call the path (the CLI
            passes its flag names, e.g. "--out").
        inputs: paths the computation reads (its data files): no output may be one of them.

    Refused: an empty path; a path that names a directory (it exists as one, or ends with a
    separator, "." or ".."); two outputs on one file (they would overwrite each other midway);
    an output that is an input (it would overwrite what it reads); a path whose nearest
    existing ancestor is a file, or a directory without write permission.

    Raises:
        ValueError: one line, naming the label and the path.
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
        if any(same_file(path, source) for source in inputs or ()):
            raise ValueError(f"{label} {path} is one of the data files; training would "
                             f"overwrite its own data")


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
    """Whether two paths name the same file (after links and `..`; the files need not exist)."""
    return os.path.normcase(os.path.realpath(a)) == os.path.normcase(os.path.realpath(b))
