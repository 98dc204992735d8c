"""glassllm.formats.atomic: the one atomic-write helper every writer of the package uses."""
import os

import pytest

from glassllm.formats.atomic import AtomicFile, atomic_replace, atomic_write


def test_atomic_write_replaces_the_file_and_leaves_only_it(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("old")
    with atomic_write(path, "w") as f:
        f.write("new é")
        assert path.read_text() == "old"  # not visible before the block ends
    assert path.read_text(encoding="utf-8") == "new é"
    assert os.listdir(tmp_path) == ["a.txt"]


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_an_error_in_the_block_keeps_the_old_file_and_removes_the_temporary(tmp_path, error):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")
    with pytest.raises(type(error)):
        with atomic_write(path, "wb") as f:
            f.write(b"half")
            raise error
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["a.bin"]


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_atomic_replace_failure_removes_the_temporary(tmp_path, error):
    path = tmp_path / "m.bin"
    path.write_bytes(b"old")

    def half_write(tmp):
        with open(tmp, "wb") as f:
            f.write(b"partial")
        raise error

    with pytest.raises(type(error)) as info:
        atomic_replace(path, half_write, doing="cannot write the thing")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["m.bin"]
    if isinstance(error, OSError):
        assert str(path) in str(info.value) and ".tmp" not in str(info.value)
        assert "cannot write the thing" in str(info.value)


def test_os_errors_name_the_users_path_with_their_errno(tmp_path):
    (tmp_path / "adir").mkdir()
    with pytest.raises(IsADirectoryError) as info:  # the rename onto a directory fails
        atomic_replace(tmp_path / "adir", lambda tmp: open(tmp, "wb").close())
    assert info.value.filename == str(tmp_path / "adir") and ".tmp" not in str(info.value)
    target = tmp_path / "missing" / "x.txt"
    with pytest.raises(FileNotFoundError) as info:
        atomic_write(target, "w")
    assert info.value.filename == str(target) and info.value.strerror.startswith("cannot write")
    assert sorted(os.listdir(tmp_path)) == ["adir"] and os.listdir(tmp_path / "adir") == []


def test_make_parents_creates_missing_directories(tmp_path):
    target = tmp_path / "a" / "b" / "x.txt"
    with atomic_write(target, "w", make_parents=True) as f:
        f.write("hi")
    assert target.read_text() == "hi" and os.listdir(target.parent) == ["x.txt"]


def test_a_file_a_library_creates_0600_gets_umask_permissions(tmp_path):
    path = tmp_path / "m.bin"

    def private_writer(tmp):  # as safetensors does: a fresh file readable by its owner only
        os.remove(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"data")
        os.close(fd)

    atomic_replace(path, private_writer)
    probe = tmp_path / "probe"
    probe.write_bytes(b"")  # created the ordinary way, under the current umask
    assert path.read_bytes() == b"data"
    assert (path.stat().st_mode & 0o777) == (probe.stat().st_mode & 0o777)


def test_atomic_file_streams_then_commits_or_discards(tmp_path):
    kept, dropped = tmp_path / "kept.bin", tmp_path / "dropped.bin"
    out = AtomicFile(kept, "wb")
    for chunk in (b"ab", b"cd"):
        out.file.write(chunk)
    assert not kept.exists()
    out.commit()
    assert kept.read_bytes() == b"abcd"
    gone = AtomicFile(dropped, "wb")
    gone.file.write(b"x")
    gone.discard()
    gone.discard()  # twice is harmless
    assert os.listdir(tmp_path) == ["kept.bin"]
    with pytest.raises(ValueError, match="mode"):
        AtomicFile(tmp_path / "r", "r")


def _run_with_file_size_limit(code: str, limit: int = 64 << 10):
    """Run Python `code` in a child whose files cannot grow past `limit` bytes (RLIMIT_FSIZE:
    a full disk, as the writer sees it -- Python ignores SIGXFSZ, so write() fails EFBIG)."""
    import resource
    import subprocess
    import sys

    def limit_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          preexec_fn=limit_files,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def test_a_full_disk_is_an_oserror_naming_the_path_for_every_kind_of_writer(tmp_path):
    """safetensors (a Rust library) reports a failed write as SafetensorError("... (os error
    27)"), and a write inside `with atomic_write(...)` raised a bare OSError: both must be
    the OSError of the module docstring, naming the user's path, with no temporary left."""
    code = f"""
import errno, os
import numpy as np
from safetensors.numpy import save_file
from glassllm.formats.atomic import atomic_replace, atomic_write
d = {str(tmp_path)!r}
tensors = {{"w": np.zeros(1 << 16, np.float32)}}  # 256 KiB > the 64 KiB limit
def own(p):
    with atomic_write(p, "wb") as f:
        f.write(bytes(1 << 18))
        f.flush()
for name, write in [("lib.safetensors",
                     lambda p: atomic_replace(p, lambda tmp: save_file(tensors, tmp))),
                    ("own.bin", own)]:
    path = os.path.join(d, name)
    try:
        write(path)
    except OSError as e:
        print(name, e.errno == errno.EFBIG, e.filename == path, repr(e.strerror))
    print(name, "left:", sorted(os.listdir(d)))
"""
    result = _run_with_file_size_limit(code)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines == ["lib.safetensors True True 'cannot write: File too large'",
                     "lib.safetensors left: []",
                     "own.bin True True 'cannot write: File too large'",
                     "own.bin left: []"], result.stdout
