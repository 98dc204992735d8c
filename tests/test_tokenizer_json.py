"""A checkpoint's tokenizer.json, byte-level BPE as Qwen's or SentencePiece-style BPE as
Gemma's, read through the `tokenizers` library: ids equal transformers' AutoTokenizer.

Both tokenizers are trained here, small, with the `tokenizers` library (nothing downloaded),
in the layouts of the real files: Qwen2's NFC normalizer + regex Split + ByteLevel, special
tokens <|endoftext|>, <|im_start|>, <|im_end|>; Gemma's "▁" for spaces, byte fallback to the
pieces <0x00>..<0xFF>, <pad>/<eos>/<bos>/<unk>.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from glassllm.formats import hf  # noqa: E402
from glassllm.tokenizers import tokenizer_from_json  # noqa: E402
from glassllm.tokenizers.tokenizer_json import HFTokenizer  # noqa: E402

CORPUS = ("Once upon a time there was a little girl named Lily. She liked to play outside in "
          "the park with her friends. One day, Lily's mom said they'd go to the sea! 123 4567."
          "\n\nThe end.\n") * 20
SAMPLE = ("Lily's friend said: \"Let's play!\"  Then   they ran 89 miles... naïve café, 日本語, "
          "😀 \n\ttabs and\r\nnewlines")
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # Qwen2's tokenizer.json pattern


def qwen_like():
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, \
        trainers
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator([CORPUS], trainer)
    return tok, {"eos_token": "<|endoftext|>"}


def gemma_like():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")  # training only
    trainer = trainers.BpeTrainer(vocab_size=200, show_progress=False,
                                  special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"])
    tok.train_from_iterator([CORPUS], trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):  # the byte pieces, ordinary vocabulary entries as in Gemma's file
        vocab[f"<0x{b:02X}>"] = len(vocab)
    spec["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    spec["pre_tokenizer"] = None  # Gemma's file: the text is one piece, "▁" for spaces
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}
    tok = Tokenizer.from_str(json.dumps(spec))
    return tok, {"eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>",
                 "pad_token": "<pad>"}


@pytest.fixture(params=["qwen", "gemma"])
def tokenizer_dir(request, tmp_path):
    tok, special = {"qwen": qwen_like, "gemma": gemma_like}[request.param]()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", **special}))
    return request.param, tmp_path


def test_ids_equal_autotokenizer(tokenizer_dir):
    kind, directory = tokenizer_dir
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    ours = hf.tokenizer_from_hf(directory)
    want = theirs(SAMPLE, add_special_tokens=False)["input_ids"]
    assert len(want) > 20
    np.testing.assert_array_equal(ours.encode(SAMPLE), want)
    if kind == "gemma":  # unseen characters fall back to byte pieces
        assert isinstance(ours, HFTokenizer)
        assert ours.id_to_token(int(ours.encode("😀")[0])) == "<0xF0>"
        assert (ours.eot_id, ours.bos_id) == (1, 2)
    assert ours.decode(ours.encode(SAMPLE)) == SAMPLE  # exact bytes back
    assert ours.decode([ours.eot_id]) == ""  # a special token stands for no text
    # glassllm encodes text as text: a special token's name in it is ordinary characters
    # (AutoTokenizer would turn it into the special id), as BPETokenizer.encode does
    name = ours.id_to_token(ours.eot_id)
    assert ours.eot_id not in ours.encode(f"a {name} b")
    assert ours.decode(ours.encode(f"a {name} b")) == f"a {name} b"


def test_survives_a_glassllm_file(tokenizer_dir):
    _, directory = tokenizer_dir
    ours = hf.tokenizer_from_hf(directory)
    again = tokenizer_from_json(ours.to_json())
    np.testing.assert_array_equal(again.encode(SAMPLE), ours.encode(SAMPLE))
    assert (again.eot_id, again.bos_id, again.vocab_size) == \
        (ours.eot_id, ours.bos_id, ours.vocab_size)


def test_to_hf_writes_it_back_for_autotokenizer(tokenizer_dir, tmp_path):
    from glassllm.model import Config, GlassLM
    _, directory = tokenizer_dir
    ours = hf.tokenizer_from_hf(directory)
    model = GlassLM(Config(vocab_size=ours.vocab_size, d_model=16, n_layers=1, n_heads=2,
                           max_len=32))
    hf.to_hf(model, tmp_path / "out", tokenizer=ours)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    np.testing.assert_array_equal(ours.encode(SAMPLE),
                                  theirs(SAMPLE, add_special_tokens=False)["input_ids"])
    assert theirs.eos_token_id == ours.eot_id
    again = hf.tokenizer_from_hf(tmp_path / "out")
    np.testing.assert_array_equal(again.encode(SAMPLE), ours.encode(SAMPLE))


def test_config_json_names_the_special_ids(tmp_path):
    tok, _ = gemma_like()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": [3, 1],
                                                      "bos_token_id": 0}))
    ours = hf.tokenizer_from_hf(tmp_path)
    assert (ours.eot_id, ours.bos_id) == (3, 0)


def test_a_broken_tokenizer_json_names_the_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "Nonsense"}}')
    with pytest.raises(ValueError, match="tokenizer.json"):
        hf.tokenizer_from_hf(tmp_path)
