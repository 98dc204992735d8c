"""The workspace data (../shared/data) that the data-dependent tests read: present and intact,
and never skipped silently on CI.

`conftest.shared_data_path` is the one place a test finds a data file: a missing file skips the
test with its path as the reason, and fails it when CI=true. The first test below checks the
whole directory against the size and SHA-256 its README lists, so on CI a missing or damaged
data directory is one clear failure, not a run that passes by testing nothing.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

import conftest
from conftest import SHARED_DATA_ENV, shared_data_dir, shared_data_path

# | `gpt2/vocab.json` | 1,042,301 | `1961...` |  -- the table of ../shared/data/README.md
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*([\d,]+)\s*\|\s*`([0-9a-f]{64})`\s*\|", re.M)


def listed_files() -> list[tuple[str, int, str]]:
    readme = shared_data_path("README.md").read_text(encoding="utf-8")
    return [(name, int(size.replace(",", "")), digest)
            for name, size, digest in ROW.findall(readme)]


def test_the_workspace_data_is_present_and_matches_its_readme():
    files = listed_files()
    names = {name for name, _, _ in files}
    # what the tests read (test_bpe, test_tokenizer, test_data, test_cli_prepare, test_llama2c)
    assert {"tinyshakespeare.txt", "gpt2/vocab.json", "gpt2/merges.txt",
            "gpt2/reference_encodings.json", "utf8-sample.txt", "utf8-emoji-cjk.txt",
            "llama2c/stories260K.bin", "llama2c/tok512.bin"} <= names, names
    for name, size, digest in files:
        path = shared_data_path(*name.split("/"))
        data = path.read_bytes()
        assert len(data) == size, f"{path}: {len(data)} bytes, the README says {size}"
        assert hashlib.sha256(data).hexdigest() == digest, f"{path}: SHA-256 differs"


def test_a_missing_file_skips_with_its_path_and_fails_under_ci(tmp_path, monkeypatch):
    monkeypatch.setenv(SHARED_DATA_ENV, str(tmp_path))
    assert shared_data_dir() == tmp_path
    (tmp_path / "there.txt").write_text("x")
    assert shared_data_path("there.txt") == tmp_path / "there.txt"

    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="gpt2.merges.txt is missing"):
        shared_data_path("gpt2", "merges.txt")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        shared_data_path("gpt2", "merges.txt")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="merges.txt is missing.*CI=true"):
        shared_data_path("gpt2", "merges.txt")


def test_the_default_location_is_shared_data_beside_the_checkout(monkeypatch):
    monkeypatch.delenv(SHARED_DATA_ENV, raising=False)
    repo = Path(conftest.__file__).resolve().parents[1]
    assert (repo / "pyproject.toml").is_file()
    assert shared_data_dir() == repo.parent / "shared" / "data"


def test_no_test_finds_the_data_on_its_own():
    """Every data path goes through conftest.shared_data_path: a test that built its own path
    (and its own skip) could skip silently on CI again."""
    here = Path(__file__).resolve().parent
    offenders = []
    for source in sorted(here.glob("*.py")):
        if source.name in ("conftest.py", Path(__file__).name):
            continue
        text = source.read_text(encoding="utf-8")
        # a path built from the test file's location, or the override read directly
        if re.search(r"""(parents\[\d+\]|\.parent)\s*/\s*["']shared["']"""
                     r"""|environ[^\n]*SHARED_DATA"""
                     r"""|os\.path\.join\([^\n]*["']shared["']""", text):  # os.path's form too
            offenders.append(source.name)
    assert offenders == []


def test_the_readmes_data_folder_is_found_by_glassllm_data(tmp_path, monkeypatch):
    """After README.md's "Get the data" (files in data/, llama2.c's two directly there), the
    data tests read them: GLASSLLM_DATA names that folder, first of every place."""
    monkeypatch.delenv(SHARED_DATA_ENV, raising=False)
    monkeypatch.setenv(conftest.DATA_ENV, str(tmp_path))
    for name in ("stories260K.bin", "tok512.bin", "tinyshakespeare.txt", "gpt2/merges.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    assert shared_data_path("llama2c", "stories260K.bin") == tmp_path / "stories260K.bin"
    assert shared_data_path("llama2c", "tok512.bin") == tmp_path / "tok512.bin"
    assert shared_data_path("llama2c") == tmp_path  # the folder of both
    assert shared_data_path("tinyshakespeare.txt") == tmp_path / "tinyshakespeare.txt"
    assert shared_data_path("gpt2", "merges.txt") == tmp_path / "gpt2" / "merges.txt"
    assert conftest.data_dirs()[0] == tmp_path


def test_the_checkouts_data_folder_is_found_and_a_skip_names_every_place(tmp_path, monkeypatch):
    """A clone with no ../shared/data: the data tests read the clone's data/; a file found
    nowhere skips naming each path looked at (and fails under CI=true)."""
    clone = tmp_path / "clone"
    (clone / "data" / "gpt2").mkdir(parents=True)
    (clone / "data" / "stories260K.bin").write_bytes(b"x")
    (clone / "data" / "gpt2" / "vocab.json").write_bytes(b"{}")
    monkeypatch.setattr(conftest, "REPO", clone)
    monkeypatch.delenv(SHARED_DATA_ENV, raising=False)
    monkeypatch.delenv(conftest.DATA_ENV, raising=False)
    assert conftest.data_dirs() == [tmp_path / "shared" / "data", clone / "data"]
    assert shared_data_path("llama2c", "stories260K.bin") == clone / "data" / "stories260K.bin"
    assert shared_data_path("gpt2", "vocab.json") == clone / "data" / "gpt2" / "vocab.json"
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        shared_data_path("llama2c", "tok512.bin")
    reason = str(skipped.value)
    for place in (tmp_path / "shared" / "data" / "llama2c" / "tok512.bin",
                  clone / "data" / "llama2c" / "tok512.bin", clone / "data" / "tok512.bin"):
        assert str(place) in reason, reason
    assert conftest.DATA_ENV in reason
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="tok512.bin is missing.*CI=true"):
        shared_data_path("llama2c", "tok512.bin")
