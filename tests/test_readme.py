"""Every Python code block of README.md runs, as a user would paste it.

The blocks are read from README.md when the tests are collected, so an edit of the README is
tested by the next run. Each block runs alone (`python block.py`, this checkout's `src` first on
the path) in a fresh empty working directory, so files it writes (tiny.safetensors, exported/,
steps.csv) land there and one block cannot lean on another's variables or files.

A block that mentions `../shared/data/...` gets that path (a link to the workspace data beside
the temporary directory); when the data is missing the block is skipped with the reason, and
fails under CI=true (conftest.shared_data_path).

A Python block that is not meant to run has the info string `python no-run` (still highlighted
as Python); there are none today. Any other spelling of a Python fence is refused, so a block
cannot drop out of this test by accident.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, shared_data_dir, shared_data_path

README = REPO / "README.md"
FENCE = re.compile(r"^```(.*)$")
RUN, NO_RUN = "python", "python no-run"
PYTHONISH = re.compile(r"^(py|python\d?|pycon|ipython|Python)\b", re.I)
DATA_REF = re.compile(r"\.\./shared/data/([\w./-]+)")


def fenced_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line number of the opening fence, info string, code) of every fenced block."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        start, info, body = i + 1, opening[1].strip(), []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"README.md:{start}: the block is never closed"
        blocks.append((start, info, "\n".join(body) + "\n"))
        i += 1
    return blocks


BLOCKS = fenced_blocks(README.read_text(encoding="utf-8"))
PYTHON = [(line, code) for line, info, code in BLOCKS if info == RUN]


def test_every_python_fence_is_either_run_or_explicitly_not():
    odd = [(line, info) for line, info, _ in BLOCKS
           if PYTHONISH.match(info) and info not in (RUN, NO_RUN)]
    assert odd == [], f"README.md fences neither {RUN!r} nor {NO_RUN!r}: {odd}"
    assert len(PYTHON) >= 8, f"only {len(PYTHON)} Python blocks found in README.md"


@pytest.mark.parametrize("line,code", PYTHON, ids=[f"README.md:{line}" for line, _ in PYTHON])
def test_readme_python_block_runs(line, code, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    referenced = DATA_REF.findall(code)
    if referenced:
        for name in referenced:
            shared_data_path(*name.split("/"))
        (tmp_path / "shared").mkdir()
        (tmp_path / "shared" / "data").symlink_to(shared_data_dir(), target_is_directory=True)
    (work / "block.py").write_text(code, encoding="utf-8")
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "block.py"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, (f"README.md:{line}: the block exited {done.returncode}\n"
                                  f"{done.stderr[-3000:]}")
    assert "Traceback" not in done.stderr and "Warning" not in done.stderr, done.stderr[-3000:]
