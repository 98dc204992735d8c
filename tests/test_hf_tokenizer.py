"""`to_hf` writes every glassllm tokenizer as a tokenizer.json that transformers' AutoTokenizer
loads with identical ids (byte-level, GPT-2 BPE, llama2.c's SentencePiece tok512), and that
glassllm reads back as the same tokenizer."""
from __future__ import annotations

import json

import numpy as np
import pytest

from glassllm import Config, GlassLM
from glassllm.formats import hf
from glassllm.tokenizers.hf import _scores_from_merges, from_hf_json
from glassllm.formats.llama2c import tokenizer_from_llama2c
from glassllm.tokenizers import (BPETokenizer, ByteTokenizer, SentencePieceTokenizer,
                                 load_tokenizer)

from conftest import shared_data_path

SAMPLES = ["Hello, world! The quick brown fox jumps over the lazy dog.\n",
           "  two spaces, a tab\t, 株式会社 and 🙂 emoji; Ünïcödé.\n\nOnce upon a time",
           "<0x41> <s> [INST]",
           # special tokens' text is text (glassllm never matches it; transformers would)
           "<|endoftext|> <unk> \n<s>\n </s> \n</s>\n"]


def sample_texts():
    text = shared_data_path("utf8-sample.txt").read_text(encoding="utf-8")
    return SAMPLES + [text[:3000]]


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


def tokenizers():
    gpt2 = shared_data_path("gpt2")
    yield "byte", ByteTokenizer()
    yield "gpt2", BPETokenizer.from_gpt2_files(gpt2 / "vocab.json", gpt2 / "merges.txt")
    yield "tok512", tokenizer_from_llama2c(shared_data_path("llama2c", "tok512.bin"))


@pytest.fixture(scope="module", params=["byte", "gpt2", "tok512"])
def exported(request, tmp_path_factory):
    """(glassllm tokenizer, directory written by to_hf) of each kind."""
    tokenizer = dict(tokenizers())[request.param]
    family = "llama" if request.param == "tok512" else "gpt2"
    model = GlassLM(Config(vocab_size=tokenizer.vocab_size, d_model=8, n_layers=1, n_heads=2,
                           max_len=16, family=family))
    directory = tmp_path_factory.mktemp("hf") / request.param
    hf.to_hf(model, directory, tokenizer)
    return tokenizer, directory


def test_autotokenizer_gives_the_same_ids(transformers, exported):
    tokenizer, directory = exported
    assert (directory / "tokenizer.json").is_file()
    auto = transformers.AutoTokenizer.from_pretrained(directory)
    bos = getattr(tokenizer, "bos_id", None)
    for text in sample_texts():
        ids = tokenizer.encode(text).tolist()
        assert len(ids) > 5
        assert auto(text, add_special_tokens=False)["input_ids"] == ids, text
        # the default call builds the context `glassllm generate` builds: BOS first if any
        assert auto(text)["input_ids"] == ([bos] if bos is not None else []) + ids
        assert auto.decode(ids, skip_special_tokens=True) == tokenizer.decode(ids)
    assert auto.eos_token_id == tokenizer.eot_id


def test_glassllm_reads_its_export_back_as_the_same_tokenizer(exported):
    tokenizer, directory = exported
    back = hf.tokenizer_from_hf(directory, tokenizer.vocab_size)
    assert type(back) is type(tokenizer)
    for text in sample_texts():
        assert back.encode(text).tolist() == tokenizer.encode(text).tolist()
    if isinstance(tokenizer, SentencePieceTokenizer):
        # llama2.c's scores are -merge rank: recovered exactly where merges are made
        assert back.pieces == tokenizer.pieces
        made = np.array([s < 0 for s in back.scores])
        assert np.array_equal(back.scores[made], tokenizer.scores[made])


def test_the_byte_layout_is_recognised_only_as_written(tmp_path):
    text = (tmp_path / "t.json")
    hf.write_tokenizer(tmp_path, ByteTokenizer(), 8)
    assert isinstance(load_tokenizer(tmp_path / "tokenizer.json"), ByteTokenizer)
    spec = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    spec["added_tokens"][0]["content"] = "<eos>"  # another end token: not ByteTokenizer's
    text.write_text(json.dumps(spec), encoding="utf-8")
    assert from_hf_json(text.read_text(encoding="utf-8")) is None
    config = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["eos_token"] == "<|endoftext|>" and config["model_max_length"] == 8


def test_scores_from_merges():
    pieces = ["<unk>", "a", "b", "c", "ab", "abc", "bc", "ca"]
    # "ab" first, then "abc" (as "ab"+"c"); "bc" and "ca" could be made but are not merges
    assert _scores_from_merges(pieces, [["a", "b"], "ab c"]) == [
        0.0, 0.0, 0.0, 0.0, -0.0, -1.0, -1e10, -1e10]


def test_convert_writes_the_sentencepiece_tokenizer(tmp_path, capsys):
    from glassllm.cli import main
    from glassllm.formats import files
    sp = tokenizer_from_llama2c(shared_data_path("llama2c", "tok512.bin"))
    model = GlassLM(Config(vocab_size=512, d_model=8, n_layers=1, n_heads=2, max_len=8))
    files.save(model, tmp_path / "m.safetensors", sp)
    code = main(["convert", "--model", str(tmp_path / "m.safetensors"), "--to-hf",
                 str(tmp_path / "d")])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "") and out.rstrip().endswith("tokenizer sentencepiece"), out
    back = hf.tokenizer_from_hf(tmp_path / "d", 512)
    assert back.encode("Once upon a time").tolist() == sp.encode("Once upon a time").tolist()
