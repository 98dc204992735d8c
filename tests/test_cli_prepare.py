"""`glassllm prepare`: text files -> train.bin / val.bin (+ sidecars, + tokenizer.json)."""
import json

import numpy as np
import pytest

from glassllm.cli import main
from glassllm.formats.token_file import TokenFile
from glassllm.tokenizers import BPETokenizer, ByteTokenizer
from conftest import shared_data_path

TEXT = "".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(300))


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_prepare_byte(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["prepare", str(corpus), "--out", str(out), "--val-fraction", "0.25"]) == 0
    printed = capsys.readouterr()
    assert "train: " in printed.out and "tokenizer: byte, vocab_size 257" in printed.out
    assert "tokenizing" in printed.err  # the tqdm bar goes to stderr
    train, val = TokenFile(out / "train.bin"), TokenFile(out / "val.bin")
    assert ByteTokenizer().decode(np.concatenate([train.tokens, val.tokens])) == TEXT
    # Val is the last quarter of the bytes, from a line start.
    n = len(TEXT.encode())
    assert n * 0.25 - 60 < val.token_count() <= n * 0.25
    assert ByteTokenizer().decode(val.tokens).startswith("Line ")
    assert not (out / "tokenizer.json").exists()


def test_prepare_bpe_writes_tokenizer(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["prepare", str(corpus), "--out", str(out), "--tokenizer", "bpe:300"]) == 0
    assert "tokenizer: bpe, vocab_size 300" in capsys.readouterr().out
    tok = BPETokenizer.load(out / "tokenizer.json")
    train, val = TokenFile(out / "train.bin"), TokenFile(out / "val.bin")
    assert json.loads(train.tokenizer().to_json()) == json.loads(tok.to_json())
    assert tok.decode(train.tokens) + tok.decode(val.tokens) == TEXT
    assert train.token_count() < train.text_bytes / 2
    # The saved tokenizer is reusable as --tokenizer PATH and gives the same ids.
    again = tmp_path / "again"
    assert main(["prepare", str(corpus), "--out", str(again), "--tokenizer",
                 str(out / "tokenizer.json")]) == 0
    assert (again / "train.bin").read_bytes() == (out / "train.bin").read_bytes()


def test_prepare_with_gpt2_directory(corpus, tmp_path, capsys):
    shared_data_path("gpt2", "vocab.json")
    gpt2 = shared_data_path("gpt2", "merges.txt").parent
    out = tmp_path / "out"
    assert main(["prepare", str(corpus), "--out", str(out), "--tokenizer", str(gpt2)]) == 0
    assert "vocab_size 50257" in capsys.readouterr().out
    train = TokenFile(out / "train.bin")
    assert train.tokens[:4].tolist() == [13949, 657, 25, 262]  # "Line", " 0", ":", " the"
    assert (out / "tokenizer.json").is_file()


@pytest.mark.parametrize("argv, message", [
    (["prepare", "MISSING", "--out", "OUT"], "input not found"),
    (["prepare", "CORPUS", "--out", "OUT", "--tokenizer", "bpe:x"], "bpe:N"),
    (["prepare", "CORPUS", "--out", "OUT", "--tokenizer", "bpe:100"], "257"),
    (["prepare", "CORPUS", "--out", "OUT", "--tokenizer", "nope.json"], "nope.json"),
    (["prepare", "CORPUS", "--out", "OUT", "--val-fraction", "1.5"], "--val-fraction"),
    (["prepare", "CORPUS", "--out", "OUT", "--val-fraction", "nan"], "--val-fraction"),
    (["prepare", "CORPUS", "--out", "OUT", "--tokenizer", "bpe:" + "9" * 30],
     "--tokenizer: tokenizer bpe:999999999999... (30 digits): N must be in [257, 16777216]"),
    (["prepare", "CORPUS", "--out", "OUT", "--tokenizer", "bpe:16777217"], "[257, 16777216]"),
])
def test_prepare_errors_are_one_line(corpus, tmp_path, capsys, argv, message):
    argv = [str(corpus) if a == "CORPUS" else str(tmp_path / "o") if a == "OUT"
            else str(tmp_path / a) if a in ("MISSING",) else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("glassllm prepare: error:") and message in err
    assert len(err.splitlines()) == 1


def test_missing_tokenizer_file_names_the_flag_and_path(corpus, tmp_path, capsys):
    missing = tmp_path / "nonexist.json"
    assert main(["prepare", str(corpus), "--out", str(tmp_path / "o"),
                 "--tokenizer", str(missing)]) == 2
    err = capsys.readouterr().err
    assert f"--tokenizer {missing}: no such tokenizer file" in err and "[Errno" not in err
    assert not (tmp_path / "o").exists()


def test_failed_prepare_leaves_no_directory_it_created(corpus, tmp_path, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(TEXT.encode() + b"caf\xe9\n")  # not UTF-8: tokenizing fails midway
    out = tmp_path / "new" / "out"
    assert main(["prepare", str(corpus), str(bad), "--out", str(out)]) == 2
    assert "latin1.txt" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # both levels it made are gone
    existing = tmp_path / "existing"  # a directory that was there before stays, untouched
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    assert main(["prepare", str(corpus), str(bad), "--out", str(existing)]) == 2
    assert sorted(p.name for p in existing.iterdir()) == ["notes.txt"]
