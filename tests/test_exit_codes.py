"""Every command ends a run failure with exit 1 (a full disk is not a usage error, 2) and a
stop signal as Ctrl-C does (128 + the signal, one line, no temporary left)."""
from __future__ import annotations

import os


def test_a_full_disk_in_any_command_exits_1_not_the_usage_code(tmp_path, monkeypatch, capsys):
    """`glassllm prepare` on a huge file filled the disk and exited 2, the code of a bad
    command line; a full disk (or quota, or I/O error) is a run failure: 1, as in train."""
    import errno
    from glassllm import cli
    from glassllm.training import data
    text = tmp_path / "a.txt"
    text.write_text("hello world\n" * 50)

    def full(self, ids, text_bytes=0):
        raise OSError(errno.ENOSPC, "No space left on device", self.path)
    monkeypatch.setattr(data.TokenWriter, "append", full)
    assert cli.main(["prepare", str(text), "--out", str(tmp_path / "p")]) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert cli._error_report("x", FileNotFoundError(errno.ENOENT, "No such file", "f"))[0] == 2


def test_sigterm_during_prepare_unwinds_and_leaves_no_temporary(tmp_path, monkeypatch, capsys):
    """SIGTERM (or SIGHUP) in any command but train ended the process where it stood: exit
    143 without a word, a `.train.bin.*.tmp` of the tokens so far left in --out."""
    import signal
    from glassllm import cli
    from glassllm.training import data
    text = tmp_path / "a.txt"
    text.write_text("hello world\n" * 500)
    append = data.TokenWriter.append

    def append_then_terminated(self, ids, text_bytes=0):
        append(self, ids, text_bytes)
        os.kill(os.getpid(), signal.SIGTERM)  # delivered here, between two Python lines
    monkeypatch.setattr(data.TokenWriter, "append", append_then_terminated)
    assert cli.main(["prepare", str(text), "--out", str(tmp_path / "p")]) == 143
    assert capsys.readouterr().err.strip().endswith("glassllm prepare: interrupted by SIGTERM")
    left = [os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path)
            for f in fs]
    assert left == ["a.txt"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
