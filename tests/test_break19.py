"""A new user's unusual inputs to the front door (`glassllm.load`, `generate --prompt-file`,
`train --config`, hooks, to_hf): each valid one works, each bad one is one clear line."""
from __future__ import annotations

import os

import pytest

from glassllm.cli import SMALL_FILE_BYTES, main


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
@pytest.mark.parametrize("argv", [["generate", "--model", "m.safetensors", "--prompt-file"],
                                  ["train", "--config"]])
def test_an_endless_file_is_refused_not_read_until_memory_runs_out(capsys, argv):
    code, out, err = cli(capsys, *argv, "/dev/zero")
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert f"{argv[-1]} /dev/zero: longer than {SMALL_FILE_BYTES >> 20} MiB; not read" in err


def test_a_prompt_file_from_a_pipe_is_read(capsys, tmp_path):
    """/dev/stdin or a shell's <(...) is a pipe, not a regular file: still a prompt."""
    from glassllm import Config, GlassLM
    from glassllm.formats import files
    from glassllm.formats.tokenizer import ByteTokenizer
    path = tmp_path / "m.safetensors"
    files.save(GlassLM(Config(d_model=8, n_layers=1, n_heads=2, max_len=16)), path,
               tokenizer=ByteTokenizer())
    read, write = os.pipe()
    os.write(write, "héllo\r\n".encode())
    os.close(write)
    try:
        code, out, err = cli(capsys, "generate", "--model", path, "--prompt-file",
                             f"/dev/fd/{read}", "--max-new-tokens", 0)
    finally:
        os.close(read)
    assert (code, out) == (0, "héllo\n\n"), err
