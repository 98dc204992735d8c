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


def test_a_prompt_file_from_a_pipe_is_read(capsys, byte_lm):
    """/dev/stdin or a shell's <(...) is a pipe, not a regular file: still a prompt."""
    path = byte_lm[0]
    read, write = os.pipe()
    os.write(write, "héllo\r\n".encode())
    os.close(write)
    try:
        code, out, err = cli(capsys, "generate", "--model", path, "--prompt-file",
                             f"/dev/fd/{read}", "--max-new-tokens", 0)
    finally:
        os.close(read)
    assert (code, out) == (0, "héllo\n\n"), err


@pytest.fixture(scope="module")
def byte_lm(tmp_path_factory):
    import glassllm
    from glassllm import Config, GlassLM
    from glassllm.formats import files
    from glassllm.tokenizers import ByteTokenizer
    path = tmp_path_factory.mktemp("lm") / "byte.safetensors"
    files.save(GlassLM(Config(d_model=8, n_layers=1, n_heads=2, max_len=16)), path,
               tokenizer=ByteTokenizer())
    return path, glassllm.load(path)


@pytest.mark.parametrize("seed", [-1, 1.5, "0", True])
def test_a_bad_seed_is_a_value_error_naming_it(byte_lm, seed):
    _, lm = byte_lm
    for call in (lm.generate, lm.stream):
        with pytest.raises(ValueError, match=f"seed must be an integer >= 0, got {seed!r}"):
            call("hi", max_new_tokens=2, seed=seed)


def test_a_tokenizer_of_no_known_kind_is_a_type_error(byte_lm):
    import glassllm
    with pytest.raises(TypeError, match="tokenizer must be None, a path or a glassllm "
                                        "tokenizer, got int"):
        glassllm.load(byte_lm[0], tokenizer=5)


def test_a_broken_link_is_named_as_one_not_answered_as_a_hub_name(tmp_path, monkeypatch):
    import glassllm
    monkeypatch.chdir(tmp_path)
    os.symlink("gone/model.safetensors", "gpt2")  # "gpt2" reads as a hub name, but is a link
    with pytest.raises(FileNotFoundError, match=r"^no such model file: gpt2 is a symbolic "
                                                r"link to gone/model.safetensors, which does "
                                                r"not exist$"):
        glassllm.load("gpt2")


@pytest.fixture
def hf_dir(tmp_path):
    from glassllm import Config, GlassLM
    from glassllm.formats import hf
    from glassllm.tokenizers import ByteTokenizer
    directory = tmp_path / "tiny"
    hf.to_hf(GlassLM(Config(d_model=8, n_layers=1, n_heads=2, max_len=16)), directory,
             ByteTokenizer())
    return directory


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_hf_directory_whose_files_are_pipes_says_so(hf_dir):
    """Opening a FIFO blocks for ever: it is named, never opened."""
    import glassllm
    (hf_dir / "model.safetensors").unlink()
    os.mkfifo(hf_dir / "model.safetensors")
    with pytest.raises(ValueError, match=r"model.safetensors: not a regular file \(a device, "
                                         r"pipe or socket\)"):
        glassllm.load(hf_dir)
    (hf_dir / "config.json").unlink()
    os.mkfifo(hf_dir / "config.json")
    with pytest.raises(IsADirectoryError, match=r"its config.json is no regular file: a link "
                                                r"to nowhere, a device or a pipe"):
        glassllm.load(hf_dir)


def test_to_hf_into_a_file_is_one_clear_line(capsys, byte_lm, tmp_path):
    taken = tmp_path / "notes.txt"
    taken.write_text("mine\n")
    code, out, err = cli(capsys, "convert", "--model", byte_lm[0], "--to-hf", taken)
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert f"--to-hf: {taken} is a file, not a directory; give a directory path" in err
    assert taken.read_text() == "mine\n"


def test_convert_of_a_llama2c_checkpoint_says_how(capsys, tmp_path):
    from conftest import shared_data_path
    checkpoint = shared_data_path("llama2c", "stories260K.bin")
    code, out, err = cli(capsys, "convert", "--model", checkpoint, "--to-hf", tmp_path / "hf")
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert (f"--model takes a glassllm model file: for a llama2.c checkpoint, first `glassllm "
            f"convert --from-llama2c {checkpoint} --tokenizer TOKENIZER.bin --out") in err
    assert not (tmp_path / "hf").exists()


def test_a_config_file_saved_with_a_bom_is_read(capsys, tmp_path):
    """Windows editors start UTF-8 files with a byte-order mark; tomllib alone refuses it."""
    path = tmp_path / "run.toml"
    path.write_bytes("\ufeffstepz = 3\n".encode("utf-8"))
    code, _, err = cli(capsys, "train", "--config", path)
    assert code == 2 and f"{path}: unknown key 'stepz'" in err  # parsed: the key is seen


def test_a_full_disk_under_stdout_is_a_failure_not_a_usage_error(capsys, monkeypatch, byte_lm):
    """`glassllm generate > /dev/full`: exit 1 (the machine failed), not 2 (usage)."""
    import errno
    import sys

    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Full())
    code = main(["generate", "--model", str(byte_lm[0]), "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert code == 1 and err == ("glassllm generate: error: cannot write: "
                                 f"{os.strerror(errno.ENOSPC)}\n"), err
