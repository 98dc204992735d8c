"""Every code block of README.md and of the documentation (docs/**/*.md) runs, as a user would
paste it.

The blocks are read from the files when the tests are collected, so an edit of a page is tested
by the next run. Each block runs alone in a fresh empty working directory (this checkout's `src`
first on the path), so files it writes (tiny.safetensors, exported/, runs/) land there and one
block cannot lean on another's variables or files. What a fence's info string means:

- `python`: run as `python block.py`; `python slow`: the same, marked slow (`-m slow`);
  `python no-run`: shown, not run.
- `bash`: run as a bash script (`set -euo pipefail`) with `glassllm` and `python` on the PATH
  meaning this checkout's; `bash slow`: the same, marked slow (a 1000-step training run);
  `bash no-run`: shown, not run (installs, benches, mpiexec, clusters, servers);
  `bash download`: the download commands of the data, not run: every destination is one of
  the files below and its SHA-256 there is the workspace copy's.
- `text output` right after a `bash` block: what that block's last command prints on stdout,
  exactly (the test compares); anything else (`text`, no info string): output, not run. A Python or shell
  fence spelt any other way is refused, so a block cannot drop out of this test by accident.

The pages name data by its download destination (`data/tinyshakespeare.txt`,
`data/stories260K.bin`, ...; see "Get the data" in README.md). A block that mentions one gets
`data/` in its directory holding links to the workspace copies (DATA_FILES;
conftest.shared_data_path): it skips when they are missing and fails under CI=true. Nothing
is downloaded.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, shared_data_path

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(.*)$")
RUNNABLE = {"python": "fast", "python slow": "slow", "bash": "fast", "bash slow": "slow"}
NOT_RUN = {"python no-run", "bash no-run", "bash download"}
CODEISH = re.compile(r"^(py|python\d?|pycon|ipython|bash|sh|shell|console|zsh)\b", re.I)
# download destination in the pages -> the workspace copy (under ../shared/data)
DATA_FILES = {
    "tinyshakespeare.txt": "tinyshakespeare.txt",
    "stories260K.bin": "llama2c/stories260K.bin",
    "tok512.bin": "llama2c/tok512.bin",
    "gpt2/vocab.json": "gpt2/vocab.json",
    "gpt2/merges.txt": "gpt2/merges.txt",
}
DATA_REF = re.compile(r"(?<![\w./-])data/(" + "|".join(map(re.escape, DATA_FILES)) + r")\b")


def fenced_blocks(path: Path) -> list[tuple[int, str, str]]:
    """(line number of the opening fence, info string, code) of every fenced block of `path`."""
    blocks, lines, i = [], path.read_text(encoding="utf-8").split("\n"), 0
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
        assert i < len(lines), f"{path.name}:{start}: the block is never closed"
        blocks.append((start, info, "\n".join(body) + "\n"))
        i += 1
    return blocks


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(REPO)}:{line}"


def page_blocks(path: Path) -> list[tuple[str, str, str, str | None]]:
    """(place, info, code, expected stdout or None) of every block of `path`: a `bash` block
    followed by a `text output` block must print that text."""
    blocks = fenced_blocks(path)
    return [(where(path, line), info, code,
             blocks[i + 1][2] if info.startswith("bash") and i + 1 < len(blocks)
             and blocks[i + 1][1] == "text output" else None)
            for i, (line, info, code) in enumerate(blocks)]


EXPECTED = {place: out for path in PAGES for place, _, _, out in page_blocks(path)}
BLOCKS = [(place, info, code) for path in PAGES for place, info, code, _ in page_blocks(path)]


def runnable(kind: str) -> list:
    """The blocks to run as pytest params; the slow ones carry the slow mark."""
    return [pytest.param(info.split()[0], code, id=place,
                         marks=[pytest.mark.slow] if RUNNABLE[info] == "slow" else [])
            for place, info, code in BLOCKS if RUNNABLE.get(info) is not None
            and info.split()[0] == kind]


def test_every_code_fence_is_run_or_explicitly_not():
    odd = [(place, info) for place, info, _ in BLOCKS
           if CODEISH.match(info) and info not in RUNNABLE and info not in NOT_RUN]
    assert odd == [], f"fences neither run nor marked not run: {odd}"
    counts = {info: sum(i == info for _, i, _ in BLOCKS) for info in (*RUNNABLE, *NOT_RUN)}
    assert counts["python"] >= 15 and counts["bash"] >= 4, counts


def test_no_code_block_points_into_the_workspace():
    """A clone has no ../shared/data: the pages' commands use the download destinations."""
    assert [place for place, _, code in BLOCKS if "shared/data" in code] == []


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("place,code", [(p, c) for p, i, c in BLOCKS if i == "bash download"],
                         ids=[p for p, i, _ in BLOCKS if i == "bash download"])
def test_download_commands_name_the_workspace_copies(place, code):
    """Every file downloaded is one the pages use, with the SHA-256 and size of the copy
    the tests read; every file has its checksum line."""
    destinations = re.findall(r"curl -L -o data/(\S+) https://\S+", code)
    sums = dict((name, digest) for digest, name in re.findall(r"^([0-9a-f]{64})  data/(\S+)$",
                                                               code, re.M))
    assert sorted(destinations) == sorted(DATA_FILES) == sorted(sums), (place, destinations)
    sizes = {shared_data_path(*DATA_FILES[name].split("/")).stat().st_size
             for name in destinations}
    for name in destinations:
        assert sums[name] == sha256(shared_data_path(*DATA_FILES[name].split("/"))), name
    stated = {int(n.replace(",", "")) for n in re.findall(r"([\d,]{4,}) bytes", code)}
    assert stated and stated <= sizes, (place, stated - sizes)


def test_data_tables_give_the_workspace_copies_sizes_and_digests():
    """Rows `| `data/NAME` | bytes | `sha256` | ...` of any page hold the workspace copy's."""
    row = re.compile(r"^\| `data/(\S+)` \| ([\d,]+) \| `([0-9a-f]{64})` \|", re.M)
    rows = [m for path in PAGES for m in row.findall(path.read_text(encoding="utf-8"))]
    assert sorted(name for name, _, _ in rows) == sorted(DATA_FILES)
    for name, size, digest in rows:
        copy = shared_data_path(*DATA_FILES[name].split("/"))
        assert (int(size.replace(",", "")), digest) == (copy.stat().st_size, sha256(copy)), name


def block_directory(tmp_path: Path, code: str) -> Path:
    """A fresh working directory; with `data/` linking the workspace copies the code names."""
    work = tmp_path / "work"
    work.mkdir()
    for name in sorted(set(DATA_REF.findall(code))):
        copy = shared_data_path(*DATA_FILES[name].split("/"))
        (work / "data" / name).parent.mkdir(parents=True, exist_ok=True)
        (work / "data" / name).symlink_to(copy)
    return work


def environment(tmp_path: Path) -> dict:
    """This checkout's src first on the path; `glassllm` and `python` as this interpreter."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, command in (("glassllm", f'"{sys.executable}" -m glassllm.cli "$@"'),
                          ("python", f'"{sys.executable}" "$@"')):
        (bin_dir / name).write_text(f"#!/bin/sh\nexec {command}\n")
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "MPLBACKEND": "Agg",
            "PATH": os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]),
            "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize("kind,code", runnable("python"))
def test_python_block_runs(kind, code, tmp_path, request):
    work = block_directory(tmp_path, code)
    (work / "block.py").write_text(code, encoding="utf-8")
    done = subprocess.run([sys.executable, "block.py"], cwd=work, env=environment(tmp_path),
                          capture_output=True, text=True, timeout=1800)
    place = request.node.callspec.id
    assert done.returncode == 0, (f"{place}: the block exited {done.returncode}\n"
                                  f"{done.stderr[-3000:]}")
    assert "Traceback" not in done.stderr and "Warning" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("kind,code", runnable("bash"))
def test_shell_block_runs(kind, code, tmp_path, request):
    work = block_directory(tmp_path, code)
    (work / "block.sh").write_text("set -euo pipefail\n" + code, encoding="utf-8")
    done = subprocess.run(["bash", "block.sh"], cwd=work, env=environment(tmp_path),
                          capture_output=True, text=True, timeout=1800)
    place = request.node.callspec.id
    assert done.returncode == 0, (f"{place}: the block exited {done.returncode}\n"
                                  f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    if EXPECTED[place] is not None:
        # the text is what the block's last command prints: the end of its stdout
        assert done.stdout.rstrip("\n").endswith("\n" + EXPECTED[place].rstrip("\n")), \
            done.stdout[-3000:]


def test_the_readme_shows_the_documented_run_trimmed():
    """README.md's output of `glassllm train` is the run docs/getting-started.md prints in
    full (and tests/test_cli_train.py re-measures): each of its lines is a line of that one."""
    readme = [code for place, info, code in BLOCKS
              if place.startswith("README.md:") and code.startswith("glassllm train:")]
    page = [code for place, info, code in BLOCKS
            if place.startswith("docs/getting-started.md:") and code.startswith("glassllm train:")]
    assert len(readme) == 1 and page, (len(readme), len(page))
    assert set(readme[0].splitlines()) <= set(page[0].splitlines())


def test_the_readme_stays_a_front_door():
    """README.md is read in five minutes: at most 400 lines; the rest lives in docs/."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 400, f"README.md has {lines} lines; move sections into docs/"
