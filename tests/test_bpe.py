"""BPETokenizer: GPT-2 ids against the reference encodings and transformers' GPT2TokenizerFast,
exact bytes for streaming decode, training, and its JSON/file round trips."""
import json

import numpy as np
import pytest

from conftest import shared_data_path
from glassllm.tokenizers import (BPETokenizer, ByteTokenizer, StreamDecoder, load_tokenizer,
                                 tokenizer_from_json)
from glassllm.tokenizers.bpe import bytes_to_unicode as _bytes_to_unicode

SAMPLE = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
          "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than "
          "to famish?\n\nAll:\nResolved. resolved.\n") * 20 + "Ünïcödé 日本語 🙂 don't 1234\n"


@pytest.fixture(scope="module")
def gpt2_dir():
    """../shared/data/gpt2 (the test skips if absent, and fails with CI=true)."""
    for name in ("vocab.json", "merges.txt", "reference_encodings.json"):
        shared_data_path("gpt2", name)
    return shared_data_path("gpt2")


@pytest.fixture(scope="module")
def gpt2(gpt2_dir):
    return BPETokenizer.from_gpt2_files(gpt2_dir / "vocab.json", gpt2_dir / "merges.txt")


@pytest.fixture(scope="module")
def small():
    return BPETokenizer.train([SAMPLE], vocab_size=300)


def reference_cases():
    return json.loads(shared_data_path("gpt2", "reference_encodings.json")
                      .read_text(encoding="utf-8"))


def test_gpt2_ids_match_every_reference_encoding(gpt2):
    cases = reference_cases()
    assert len(cases) == 69
    for case in cases:
        ids = gpt2.encode(case["text"], allowed_special=case.get("allowed_special", "none"))
        assert ids.tolist() == case["ids"], case["text"]
        assert ids.dtype == np.uint16
        if "allowed_special" not in case:
            assert gpt2.decode(ids) == case["text"]
    assert gpt2.vocab_size == 50257 and gpt2.eot_id == 50256


def test_special_token_is_ordinary_text_unless_allowed(gpt2):
    text = "hello <|endoftext|>"
    ordinary = gpt2.encode(text).tolist()
    assert 50256 not in ordinary
    assert gpt2.decode(ordinary) == text  # spelled out, round-trips
    assert gpt2.encode(text, allowed_special="all").tolist() == [31373, 220, 50256]
    assert gpt2.decode([31373, 220, 50256]) == "hello "  # end-of-text stands for no bytes
    with pytest.raises(ValueError, match="allowed_special"):
        gpt2.encode(text, allowed_special="some")


def test_gpt2_ids_equal_transformers_gpt2_tokenizer_fast(gpt2, gpt2_dir):
    transformers = pytest.importorskip("transformers")
    # Built offline from the same two files (the directory holds vocab.json + merges.txt).
    reference = transformers.GPT2TokenizerFast.from_pretrained(str(gpt2_dir),
                                                               local_files_only=True)
    assert len(reference) == 50257
    texts = [c["text"] for c in reference_cases()]
    for name in ("utf8-emoji-cjk.txt", "utf8-sample.txt"):
        texts.append(shared_data_path(name).read_text(encoding="utf-8"))
    texts.append(shared_data_path("tinyshakespeare.txt").read_text(encoding="utf-8")[:50_000])
    for text in texts:
        # GPT2TokenizerFast always treats "<|endoftext|>" as the special token.
        ours = gpt2.encode(text, allowed_special="all").tolist()
        assert ours == reference.encode(text), text[:40]
        assert gpt2.decode(ours) == reference.decode(ours, skip_special_tokens=True)


def test_decode_bytes_are_the_raw_token_bytes(gpt2):
    # " the" is id 262: its vocabulary string is "Ġthe" (Ġ stands for the space byte).
    assert gpt2.id_to_token(262) == "\u0120the"
    assert gpt2.decode_bytes([262]) == b" the"
    # A lone emoji byte token: decode_bytes keeps the byte, decode replaces it.
    emoji = "🙂".encode()
    ids = gpt2.encode("🙂").tolist()
    assert len(ids) > 1 and b"".join(gpt2.decode_bytes([i]) for i in ids) == emoji
    assert gpt2.decode(ids[:1]) == "\ufffd"
    with pytest.raises(ValueError, match="ids must be in"):
        gpt2.decode([50257])
    with pytest.raises(ValueError, match="ids must be in"):
        gpt2.decode_bytes([-1])


def test_stream_decoder_chunks_join_to_decode(gpt2, small):
    text = shared_data_path("utf8-emoji-cjk.txt").read_text(encoding="utf-8")
    rng = np.random.default_rng(0)
    for tok in (gpt2, small):
        ids = tok.encode(text)
        noise = rng.integers(0, tok.vocab_size, size=300)  # arbitrary ids, invalid UTF-8
        for seq in (ids, noise):
            dec = StreamDecoder(tok)
            chunks = [dec.push(int(i)) for i in seq] + [dec.flush()]
            assert "".join(chunks) == tok.decode(seq)
        assert tok.decode(ids) == text


def test_bytes_to_unicode_is_a_bijection_onto_printables():
    table = _bytes_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert table[ord("A")] == "A" and table[ord(" ")] == "\u0120" and table[ord("\n")] == "\u010a"
    assert all(c.isprintable() and not c.isspace() for c in table.values())


def test_train_gives_requested_vocab_and_round_trips(small):
    assert small.vocab_size == 300 and small.eot_id == 0
    ids = small.encode(SAMPLE)
    assert ids.dtype == np.uint16 and ids.max() < 300
    assert small.decode(ids) == SAMPLE
    # Merges were learned: far fewer ids than bytes on the training text.
    assert len(ids) < 0.6 * len(SAMPLE.encode())
    # Text never seen (other scripts) still encodes, through the byte alphabet.
    unseen = "Ωμέγα ‽ \x00\x7f"
    assert small.decode(small.encode(unseen)) == unseen


def test_train_from_files_equals_train_from_text(tmp_path, small):
    path = tmp_path / "corpus.txt"
    path.write_text(SAMPLE, encoding="utf-8")
    from_file = BPETokenizer.train([path], vocab_size=300)
    assert from_file.encode(SAMPLE).tolist() == small.encode(SAMPLE).tolist()
    with pytest.raises(FileNotFoundError):
        BPETokenizer.train([tmp_path / "missing.txt"], vocab_size=300)
    with pytest.raises(ValueError, match="257"):
        BPETokenizer.train([SAMPLE], vocab_size=256)


def test_train_on_one_str_is_one_text_not_its_characters(small):
    """A str is the whole corpus (it used to be iterated character by character, which
    learns no merge at all); lists, tuples and generators of str still work."""
    one = BPETokenizer.train(SAMPLE, vocab_size=300)
    assert one.vocab_size == 300  # 43 merges learned, as from [SAMPLE]
    assert one.encode(SAMPLE).tolist() == small.encode(SAMPLE).tolist()
    assert len(one.encode(SAMPLE)) < 0.6 * len(SAMPLE.encode())
    assert one.id_to_token(299) is not None and len(one.id_to_token(299)) > 1  # a merge
    lines = SAMPLE.splitlines(keepends=True)
    for texts in (lines, tuple(lines), (line for line in lines)):
        tok = BPETokenizer.train(texts, vocab_size=300)
        assert tok.vocab_size == 300 and len(tok.encode(SAMPLE)) < 0.6 * len(SAMPLE.encode())


@pytest.mark.parametrize("text", ["\udcff", "caf\udce9", "ok \ud800 then", "\udfff"])
def test_encode_of_text_that_is_not_unicode_is_a_value_error(small, text):
    """Lone surrogates (what surrogateescape makes of undecodable bytes) have no UTF-8: both
    tokenizers raise the documented ValueError naming the position (the BPE one used to raise
    TypeError from the Rust side)."""
    where = next(i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)
    for tok in (small, ByteTokenizer()):
        with pytest.raises(ValueError, match=f"not valid Unicode.*at character {where}"):
            tok.encode(text)
    with pytest.raises(ValueError, match="expected str"):
        ByteTokenizer().encode(b"bytes")
    assert small.bos_id is None and ByteTokenizer().bos_id is None


def test_json_save_load_round_trip(tmp_path, small):
    again = tokenizer_from_json(small.to_json())
    assert isinstance(again, BPETokenizer)
    assert (again.vocab_size, again.eot_id) == (300, 0)
    assert again.encode(SAMPLE).tolist() == small.encode(SAMPLE).tolist()
    path = tmp_path / "tokenizer.json"
    small.save(path)
    assert not list(tmp_path.glob("*.tmp*"))
    for loaded in (BPETokenizer.load(path), load_tokenizer(path), load_tokenizer(tmp_path)):
        assert loaded.encode(SAMPLE).tolist() == small.encode(SAMPLE).tolist()
    # A plain Hugging Face tokenizer.json is accepted too.
    hf_json = json.loads(small.to_json())["tokenizer"]
    (tmp_path / "hf.json").write_text(json.dumps(hf_json), encoding="utf-8")
    assert load_tokenizer(tmp_path / "hf.json").encode("speak").tolist() == \
        small.encode("speak").tolist()
    # The byte tokenizer's JSON goes through load_tokenizer as well.
    (tmp_path / "byte.json").write_text(ByteTokenizer().to_json(), encoding="utf-8")
    assert isinstance(load_tokenizer(tmp_path / "byte.json"), ByteTokenizer)


def test_load_tokenizer_from_gpt2_directory(gpt2_dir):
    tok = load_tokenizer(gpt2_dir)
    assert tok.encode("hello world").tolist() == [31373, 995]


def test_bad_inputs_raise_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="not valid"):
        BPETokenizer.from_json("{not json")
    with pytest.raises(ValueError, match="no tokenizer model"):
        BPETokenizer.from_json('{"type": "bpe"}')
    with pytest.raises(FileNotFoundError, match="vocab.json"):
        BPETokenizer.from_gpt2_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    (tmp_path / "vocab.json").write_text("[1, 2]")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(ValueError, match="cannot read"):
        BPETokenizer.from_gpt2_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "nothing.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="merges.txt"):
        load_tokenizer(tmp_path / "empty")
    (tmp_path / "x.json").write_text("no json here")
    with pytest.raises(ValueError, match="not a tokenizer"):
        load_tokenizer(tmp_path / "x.json")


def test_only_the_tokenizers_librarys_own_errors_become_value_errors(tmp_path, monkeypatch,
                                                                     small):
    """tokenizers raises plain Exception for a bad file or description; that becomes the
    ValueError above. Anything else (here an injected MemoryError) is not about the file and
    propagates as itself."""
    import types

    import tokenizers

    def out_of_memory(*args, **kwargs):
        raise MemoryError("injected")
    (tmp_path / "vocab.json").write_text("{}")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    monkeypatch.setattr(tokenizers, "models",
                        types.SimpleNamespace(BPE=types.SimpleNamespace(from_file=out_of_memory)))
    with pytest.raises(MemoryError, match="injected"):
        BPETokenizer.from_gpt2_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    text = small.to_json()
    monkeypatch.setattr(tokenizers, "Tokenizer", types.SimpleNamespace(from_str=out_of_memory))
    with pytest.raises(MemoryError, match="injected"):
        BPETokenizer.from_json(text)


def test_non_byte_level_vocabulary_is_rejected():
    from tokenizers import Tokenizer, models
    tok = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, " ": 2}, merges=[]))
    tok.add_special_tokens(["<|endoftext|>"])
    with pytest.raises(ValueError, match="not byte-level"):
        BPETokenizer(tok)
    no_eot = Tokenizer(models.BPE(vocab={"a": 0}, merges=[]))
    with pytest.raises(ValueError, match="endoftext"):
        BPETokenizer(no_eot)


def test_vocab_over_65536_encodes_to_uint32():
    from tokenizers import Tokenizer, models
    chars = list(_bytes_to_unicode().values())
    vocab = {c: i for i, c in enumerate(chars)}
    for a in chars:  # pad with two-character tokens past 65536 ids
        for b in chars:
            if len(vocab) >= 65600:
                break
            vocab.setdefault(a + b, len(vocab))
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok = BPETokenizer._byte_level(tok)
    tok.add_special_tokens(["<|endoftext|>"])
    big = BPETokenizer(tok)
    assert big.vocab_size == 65601
    ids = big.encode("hi")
    assert ids.dtype == np.uint32 and big.decode(ids) == "hi"


def test_non_bpe_model_is_rejected():
    from tokenizers import Tokenizer, models
    tok = Tokenizer(models.WordLevel(vocab={"<|endoftext|>": 0, "a": 1}, unk_token="a"))
    with pytest.raises(ValueError, match="expected a BPE model, got WordLevel"):
        BPETokenizer(tok)
