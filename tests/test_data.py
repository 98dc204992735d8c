"""glassllm.training.data: the Batches sources, token files on disk, and streaming `prepare`."""
import json
import os

import numpy as np
import pytest

import glassllm.train
from glassllm.formats import checkpoint
from glassllm.training import data
from glassllm.training.data import (ArrayBatches, Batches, TokenFile, TokenWriter, get_batch, prepare,
                           token_dtype)
from glassllm.tokenizers import BPETokenizer, ByteTokenizer
from conftest import shared_data_path


def write_tokens(path, ids, tokenizer=None):
    with TokenWriter(path, tokenizer or ByteTokenizer(), sources=["src.txt"]) as w:
        w.append(ids, text_bytes=len(ids))
    return TokenFile(path)


# --- batches ---------------------------------------------------------------------------------

def test_train_get_batch_is_the_data_sampler():
    assert glassllm.train.get_batch is get_batch


def test_array_batches_draw_the_windows_of_get_batch():
    ids = (np.arange(600) * 7 % 257).astype(np.uint16)
    src = ArrayBatches(ids)
    assert isinstance(src, Batches) and src.token_count() == 600
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    for _ in range(3):
        x, y = src.batch(rng_a, 4, 16)
        x_ref, y_ref = get_batch(ids, 4, 16, rng_b)
        assert x.dtype == y.dtype == np.int64 and x.shape == (4, 16)
        np.testing.assert_array_equal(x, x_ref)
        np.testing.assert_array_equal(y, y_ref)
        np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
        windows = np.lib.stride_tricks.sliding_window_view(ids, 17)  # every (x, y) window
        for row_x, row_y in zip(x, y):
            match = np.flatnonzero((windows[:, :16] == row_x).all(1))
            assert match.size and (windows[match[0], 1:] == row_y).all()
    with pytest.raises(ValueError, match="1-D integer"):
        ArrayBatches(np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="1-D integer"):
        ArrayBatches(np.zeros(5))
    with pytest.raises(ValueError, match="len\\(data\\) > seq_len"):
        src.batch(np.random.default_rng(0), 2, 600)


def test_token_dtype_rule():
    assert token_dtype(257) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32
    with pytest.raises(ValueError):
        token_dtype(0)


# --- token files -----------------------------------------------------------------------------

def test_token_file_round_trip_and_same_draws_as_memory(tmp_path):
    ids = np.random.default_rng(0).integers(0, 257, size=1000)
    f = write_tokens(tmp_path / "t.bin", ids)
    assert isinstance(f, Batches)
    assert os.path.getsize(tmp_path / "t.bin") == 2000  # uint16, no header
    assert f.token_count() == 1000 and f.dtype == np.uint16 and f.vocab_size == 257
    assert f.meta["sources"] == ["src.txt"] and f.text_bytes == 1000
    assert isinstance(f.tokenizer(), ByteTokenizer)
    np.testing.assert_array_equal(f.tokens, ids)
    x, y = f.batch(np.random.default_rng(3), 8, 32)
    x_mem, y_mem = ArrayBatches(ids).batch(np.random.default_rng(3), 8, 32)
    assert x.dtype == np.int64
    np.testing.assert_array_equal(x, x_mem)
    np.testing.assert_array_equal(y, y_mem)
    assert not list(tmp_path.glob("*.tmp"))


def test_token_file_uint32_for_large_vocab(tmp_path):
    class Big:
        vocab_size, eot_id = 70000, 69999

        def to_json(self):
            return json.dumps({"type": "big"})
    ids = np.array([0, 65535, 65536, 69999])
    f = write_tokens(tmp_path / "t.bin", ids, Big())
    assert f.dtype == np.uint32 and os.path.getsize(tmp_path / "t.bin") == 16
    np.testing.assert_array_equal(f.tokens, ids)


def test_token_file_errors(tmp_path):
    path = tmp_path / "t.bin"
    with pytest.raises(FileNotFoundError, match="token file not found"):
        TokenFile(path)
    path.write_bytes(np.arange(10, dtype=np.uint16).tobytes())
    with pytest.raises(FileNotFoundError, match="sidecar"):
        TokenFile(path)
    side = tmp_path / "t.bin.json"
    side.write_text("{ not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        TokenFile(path)
    side.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError, match="not a glassllm-tokens"):
        TokenFile(path)
    good = {"format": "glassllm-tokens", "version": 1, "dtype": "uint16", "vocab_size": 257,
            "token_count": 10, "tokenizer": {"type": "byte"}}
    side.write_text(json.dumps({k: v for k, v in good.items() if k != "vocab_size"}))
    with pytest.raises(ValueError, match="lacks vocab_size"):
        TokenFile(path)
    side.write_text(json.dumps(dict(good, dtype="float32")))
    with pytest.raises(ValueError, match="dtype"):
        TokenFile(path)
    side.write_text(json.dumps(dict(good, vocab_size=70000)))
    with pytest.raises(ValueError, match="does not fit"):
        TokenFile(path)
    side.write_text(json.dumps(dict(good, token_count=11)))
    with pytest.raises(ValueError, match="holds 10 tokens"):
        TokenFile(path)
    side.write_text(json.dumps(good))
    assert TokenFile(path).token_count() == 10
    with open(path, "ab") as fh:
        fh.write(b"\x01")  # 21 bytes: not whole uint16s
    with pytest.raises(ValueError, match="not a multiple of 2"):
        TokenFile(path)
    path.write_bytes(np.array([1, 2, 300, 4, 5, 6, 7, 8, 9, 10], np.uint16).tobytes())
    TokenFile(path)  # ids are not scanned by default
    with pytest.raises(ValueError, match="token 2 is 300"):
        TokenFile(path, check_ids=True)
    with pytest.raises(ValueError, match="token 2 is 300"):
        TokenFile(path).check_ids(chunk_tokens=2)


def test_token_writer_rejects_bad_ids_and_leaves_nothing(tmp_path):
    path = tmp_path / "t.bin"
    with pytest.raises(ValueError, match="must be in"):
        with TokenWriter(path, ByteTokenizer()) as w:
            w.append(np.array([1, 2, 3]))
            w.append(np.array([257]))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="1-D integers"):
        with TokenWriter(path, ByteTokenizer()) as w:
            w.append(np.array([1.5]))
    assert list(tmp_path.iterdir()) == []
    f = write_tokens(path, np.array([], dtype=np.int64))  # an empty split is a valid file
    assert f.token_count() == 0


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_batches_from_a_5gb_sparse_file_do_not_read_it(tmp_path):
    path = tmp_path / "huge.bin"
    size = 5 * 1024**3  # 5 GiB, 2.68e9 uint16 ids; sparse: no disk blocks, reads give zeros
    with open(path, "wb") as fh:
        fh.truncate(size)
    meta = {"format": "glassllm-tokens", "version": 1, "dtype": "uint16", "vocab_size": 50257,
            "token_count": size // 2, "tokenizer": {"type": "byte"}, "sources": []}
    (tmp_path / "huge.bin.json").write_text(json.dumps(meta))
    # Make the start visible so we know batches read real data through the map.
    with open(path, "r+b") as fh:
        fh.write(np.arange(1, 1001, dtype=np.uint16).tobytes())
    try:  # reset the peak-RSS mark (Linux >= 4.0); otherwise measure current RSS only
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        peak_field = "VmHWM"
    except OSError:
        peak_field = "VmRSS"
    before = _rss_kb("VmRSS")
    f = TokenFile(path)
    assert f.token_count() == size // 2
    rng = np.random.default_rng(0)
    for _ in range(200):
        x, y = f.batch(rng, 16, 256)
        assert x.shape == (16, 256)
    x, y = f.batch(np.random.default_rng(1), 1, 8)
    head = np.asarray(f.tokens[:8])
    growth_mb = (max(_rss_kb(peak_field), _rss_kb("VmRSS")) - before) / 1024
    assert head.tolist() == list(range(1, 9))
    assert growth_mb < 100, f"RSS grew {growth_mb:.0f} MB while sampling a 5 GiB file"
    del f


# --- prepare ---------------------------------------------------------------------------------

def test_cut_only_where_tokens_cannot_change():
    from glassllm.training import text
    cut = text._cut
    assert cut(b"ab\ncd\n\n  ef") == 3  # after the lone newline of "ab\ncd"
    assert cut(b"ab\n\ncd") == 0  # a newline run, no space: nothing safe
    assert cut(b"ab cd  ef\n") == 2  # before the lone space of "ab cd"
    assert cut("x\u00a0\ny z".encode()) == 5  # U+00A0 is whitespace: not that newline
    assert cut("é\né".encode()) == 3  # neighbours may be multi-byte characters
    assert cut("é\né".encode()[:-1]) == 0  # the character after is cut off: unsafe
    assert text._char_boundary("xé".encode()) == 1  # last resort: before the lead byte
    assert text._char_boundary(b"abcd") == 4


def test_prepare_byte_split_is_deterministic_and_line_aligned(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    a = "".join(f"line {i} of a ✓\n" for i in range(100))
    b = "ünïcödé 🙂 " * 30 + "\nend\n"
    (corpus / "a.txt").write_text(a, encoding="utf-8")
    (corpus / "sub" / "b.txt").write_text(b, encoding="utf-8")
    (corpus / ".hidden").write_text("skipped")
    events = []
    out = tmp_path / "out"
    result = prepare([corpus], out, "byte", val_fraction=0.2, chunk_bytes=7,
                     on_progress=events.append)
    tok = ByteTokenizer()
    train, val = TokenFile(out / "train.bin"), TokenFile(out / "val.bin")
    a_bytes, b_bytes = a.encode(), b.encode()
    a_cut = a_bytes.index(b"\n", int(len(a_bytes) * 0.8) - 1) + 1
    b_cut = b_bytes.index(b"\n", int(len(b_bytes) * 0.8) - 1) + 1
    # Files in sorted order; an end-of-text id (256) between files of a split.
    expected_train = np.concatenate([tok.encode(a[:len(a_bytes[:a_cut].decode())]), [256],
                                     tok.encode(b_bytes[:b_cut].decode())])
    expected_val = np.concatenate([tok.encode(a_bytes[a_cut:].decode()), [256],
                                   tok.encode(b_bytes[b_cut:].decode())])
    np.testing.assert_array_equal(train.tokens, expected_train)
    np.testing.assert_array_equal(val.tokens, expected_val)
    assert train.text_bytes + val.text_bytes == len(a_bytes) + len(b_bytes)
    assert result["files"] == [str(corpus / "a.txt"), str(corpus / "sub" / "b.txt")]
    assert train.meta["sources"] == result["files"]
    assert not (out / "tokenizer.json").exists()
    # Progress: increasing, ends at the total byte count.
    done = [e.done for e in events]
    assert done == sorted(done) and done[-1] == events[-1].total == len(a_bytes) + len(b_bytes)
    # Deterministic: a second run writes the same bytes.
    prepare([corpus], tmp_path / "again", "byte", val_fraction=0.2, chunk_bytes=1 << 20)
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes()


def test_prepare_without_validation_and_errors(tmp_path):
    src = tmp_path / "a.txt"
    src.write_text("hello\nworld\n")
    prepare([src], tmp_path / "o", val_fraction=0.0)
    assert TokenFile(tmp_path / "o" / "val.bin").token_count() == 0
    assert ByteTokenizer().decode(TokenFile(tmp_path / "o" / "train.bin").tokens) == \
        "hello\nworld\n"
    with pytest.raises(FileNotFoundError, match="input not found"):
        prepare([tmp_path / "missing.txt"], tmp_path / "o")
    with pytest.raises(ValueError, match="val_fraction"):
        prepare([src], tmp_path / "o", val_fraction=1.0)
    with pytest.raises(ValueError, match="unknown tokenizer"):
        prepare([src], tmp_path / "o", "words")
    with pytest.raises(ValueError, match="bpe:N"):
        prepare([src], tmp_path / "o", "bpe:many")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good line\n" * 5 + b"\xff\xfe oops\n")  # the bad bytes land in val
    before = {p.name: p.read_bytes() for p in (tmp_path / "o").iterdir()}
    with pytest.raises(ValueError, match="not UTF-8.*offset 50"):
        prepare([bad], tmp_path / "o", val_fraction=0.2, chunk_bytes=16)
    # Nothing published: train.bin (which had succeeded) and val.bin are the old ones.
    assert {p.name: p.read_bytes() for p in (tmp_path / "o").iterdir()} == before


def test_prepare_bpe_trains_saves_and_encodes(tmp_path):
    src = tmp_path / "a.txt"
    text = "".join(f"To be, or not to be: that is question {i % 7}.\n\n  Indented.\n"
                   for i in range(200))
    src.write_text(text)
    result = prepare([src], tmp_path / "o", "bpe:280", val_fraction=0.1, chunk_bytes=64)
    tok = result["tokenizer"]
    assert isinstance(tok, BPETokenizer) and tok.vocab_size == 280
    train, val = TokenFile(tmp_path / "o" / "train.bin"), TokenFile(tmp_path / "o" / "val.bin")
    saved = BPETokenizer.load(tmp_path / "o" / "tokenizer.json")
    assert train.tokenizer().to_json() == saved.to_json() == tok.to_json()
    assert tok.decode(train.tokens) + tok.decode(val.tokens) == text
    # Chunked encoding gave exactly the ids of encoding each split whole.
    cut = len(text) - len(tok.decode(val.tokens))
    assert train.tokens.tolist() == tok.encode(text[:cut]).tolist()
    assert val.tokens.tolist() == tok.encode(text[cut:]).tolist()
    assert train.token_count() < 0.7 * train.text_bytes  # merges learned


PUBLISH_FAILURES = ["train.bin", "train.bin.json", "val.bin", "val.bin.json",
                    "tokenizer.json"]
PUBLISH_ORDER = PUBLISH_FAILURES  # the order prepare renames its outputs in


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()],
                         ids=["disk-full", "ctrl-c"])
@pytest.mark.parametrize("failing", PUBLISH_FAILURES)
def test_a_failure_while_publishing_leaves_no_output(tmp_path, monkeypatch, failing, error):
    """The last stage of prepare -- moving train.bin / val.bin into place, writing their
    sidecars and tokenizer.json -- fails at each of its five writes in turn: no file of the
    call is left (nor a temporary), the directory it created is gone, and a directory that
    existed keeps its other files."""
    import glassllm.formats.atomic
    src = tmp_path / "a.txt"
    src.write_text("".join(f"to be or not to be, line {i}\n" for i in range(300)))
    real_replace = os.replace

    def replace(a, b):  # every published file goes through os.replace (glassllm.formats.atomic)
        if os.path.basename(b) == failing:
            raise error
        real_replace(a, b)
    monkeypatch.setattr(glassllm.formats.atomic.os, "replace", replace)
    for out, existed in ((tmp_path / "new" / "out", False), (tmp_path / "kept", True)):
        if existed:
            out.mkdir()
            (out / "notes.txt").write_text("mine")
        with pytest.raises(type(error)):
            prepare([src], out, "bpe:270", val_fraction=0.2, chunk_bytes=256)
        if existed:
            assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
        else:
            assert not (tmp_path / "new").exists()
    monkeypatch.setattr(glassllm.formats.atomic.os, "replace", real_replace)
    prepare([src], tmp_path / "ok", "bpe:270", val_fraction=0.2, chunk_bytes=256)
    assert sorted(p.name for p in (tmp_path / "ok").iterdir()) == sorted(PUBLISH_FAILURES)


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()],
                         ids=["disk-full", "ctrl-c"])
@pytest.mark.parametrize("after", [1, 2, 4])
def test_an_interrupted_publish_puts_the_earlier_prepare_back(tmp_path, monkeypatch, error,
                                                              after):
    """prepare publishes all its outputs or none: a failure (or Ctrl-C) between the renames
    of two outputs, after `after` of them are in place, undoes those: the directory holds
    exactly the earlier prepare's files, byte for byte, and no temporary (not even the
    second names that kept the earlier files)."""
    from glassllm.training import prepare as prepare_module
    src = tmp_path / "a.txt"
    src.write_text("".join(f"to be or not to be, line {i}\n" for i in range(300)))
    out = tmp_path / "out"
    prepare([src], out, "bpe:270", val_fraction=0.2, chunk_bytes=256)
    src.write_text("".join(f"all the world's a stage, {i}\n" for i in range(200)))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_replace, renames = os.replace, []

    def replace(a, b):  # fails once, on the rename after `after` outputs are in place
        renames.append(os.path.basename(b))
        if len(renames) == after + 1:
            raise error
        real_replace(a, b)
    monkeypatch.setattr(prepare_module.os, "replace", replace)
    with pytest.raises(type(error)):
        prepare([src], out, "bpe:280", val_fraction=0.2, chunk_bytes=256)
    monkeypatch.setattr(prepare_module.os, "replace", real_replace)
    assert renames[:after] == PUBLISH_ORDER[:after]  # those were published, then undone
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    done = prepare([src], out, "bpe:280", val_fraction=0.2, chunk_bytes=256)
    assert sorted(os.listdir(out)) == sorted(PUBLISH_FAILURES)  # no second name left
    assert TokenFile(out / "val.bin").token_count() == done["val"]["token_count"]
    assert (out / "train.bin").read_bytes() != before["train.bin"]


def test_a_failure_between_two_outputs_being_written_publishes_nothing(tmp_path,
                                                                       monkeypatch):
    """The validation file fails to be written after the training file was (a full disk
    while staging it): neither is published, no temporary is left, a directory of an earlier
    prepare is as it was."""
    src = tmp_path / "a.txt"
    src.write_text("".join(f"to be or not to be, line {i}\n" for i in range(300)))
    out = tmp_path / "out"
    prepare([src], out, "byte", val_fraction=0.2)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    stage = TokenWriter.stage

    def stage_then_full(self):
        if self.path.endswith("val.bin"):
            raise OSError(28, "No space left on device", self.path)
        return stage(self)
    monkeypatch.setattr(TokenWriter, "stage", stage_then_full)
    src.write_text("other text\n" * 500)
    with pytest.raises(OSError, match="No space left"):
        prepare([src], out, "byte", val_fraction=0.2)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with pytest.raises(OSError):
        prepare([src], tmp_path / "new" / "out", "byte", val_fraction=0.2)
    assert sorted(os.listdir(tmp_path)) == ["a.txt", "out"]


def test_prepare_memory_is_bounded_by_the_chunk_not_the_corpus(tmp_path):
    """The docstring's claim: memory is bounded by chunk_bytes whatever the corpus size.
    Byte tokenizer, a 4 MiB corpus in 16 KiB chunks: the peak of Python and NumPy
    allocations (tracemalloc) stays under 256 KiB, a sixteenth of the corpus (reading it
    whole takes 4 MiB of bytes and 8 MiB of ids). BPE (the `tokenizers` library allocates
    in Rust, out of tracemalloc's sight), a 1 MiB corpus: the peak RSS grows by less than
    16 MiB, where encoding the corpus whole grows it by ~230 MiB."""
    import tracemalloc
    line = "".join(f"def f_{i}(x):\n    return x * {i} + 'ünï'\n\n" for i in range(100))
    chunk = 16 << 10
    for name, tokenizer, size in (("byte", "byte", 4 << 20),
                                  ("bpe", BPETokenizer.train([line * 5], vocab_size=300),
                                   1 << 20)):
        src = tmp_path / f"{name}.txt"
        with open(src, "w", encoding="utf-8") as f:
            while f.tell() < size:
                f.write(line)
        rss_before = _reset_peak_rss()
        if name == "byte":
            tracemalloc.start()
        try:
            result = prepare([src], tmp_path / name, tokenizer, val_fraction=0.1,
                             chunk_bytes=chunk)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        rss_growth = None if rss_before is None else _rss_kb("VmHWM") * 1024 - rss_before
        assert result["train"]["text_bytes"] + result["val"]["text_bytes"] == \
            src.stat().st_size
        if name == "byte":
            assert peak < 256 << 10, f"peak {peak / 2**10:.0f} KiB for a 4 MiB corpus"
        elif rss_growth is not None:
            assert rss_growth < 16 << 20, f"bpe: RSS grew {rss_growth / 2**20:.0f} MiB"


def _reset_peak_rss():
    """Reset the peak-RSS mark (Linux >= 4.0); the current RSS in bytes, or None."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return _rss_kb("VmRSS") * 1024
    except OSError:
        return None


def test_prepare_with_gpt2_matches_whole_text_encoding(tmp_path):
    gpt2 = BPETokenizer.from_gpt2_files(shared_data_path("gpt2", "vocab.json"),
                                        shared_data_path("gpt2", "merges.txt"))
    text = shared_data_path("tinyshakespeare.txt").read_text(encoding="utf-8")[:120_000]
    text += "\n\n\n   spaced\n\u00a0\u00a0nbsp\n\n'tis\n" * 3
    src = tmp_path / "shakespeare.txt"
    src.write_text(text, encoding="utf-8")
    prepare([src], tmp_path / "o", gpt2, val_fraction=0.0, chunk_bytes=997)
    assert TokenFile(tmp_path / "o" / "train.bin").tokens.tolist() == gpt2.encode(text).tolist()
    assert (tmp_path / "o" / "tokenizer.json").is_file()


# --- data identity (issue 9) -----------------------------------------------------------------

def test_the_fingerprint_is_the_sha256_of_the_ids_whatever_their_dtype(tmp_path):
    import hashlib
    ids = np.random.default_rng(0).integers(0, 257, size=1000)
    expected = hashlib.sha256(b"glassllm-tokens|<u4|1000|"
                              + ids.astype("<u4").tobytes()).hexdigest()
    assert data.token_fingerprint(ids) == expected
    for dtype in (np.uint16, np.int32, np.int64, np.uint64):
        assert ArrayBatches(ids.astype(dtype)).fingerprint() == expected
    assert write_tokens(tmp_path / "t.bin", ids).fingerprint() == expected  # memory-mapped
    swapped = ids.copy()
    swapped[[10, 11]] = swapped[[11, 10]]
    assert data.token_fingerprint(swapped) != expected or ids[10] == ids[11]
    assert data.token_fingerprint(ids[:-1]) != expected
    # ids outside uint32 (invalid, but an ArrayBatches may hold them) hash as int64
    neg = np.array([-1, 2, 3])
    assert data.token_fingerprint(neg) == hashlib.sha256(
        b"glassllm-tokens|<i8|3|" + neg.astype("<i8").tobytes()).hexdigest()
    from glassllm.formats import token_file
    small = token_file.FINGERPRINT_CHUNK
    token_file.FINGERPRINT_CHUNK = 7  # chunked hashing equals one pass
    try:
        assert data.token_fingerprint(ids) == expected
    finally:
        token_file.FINGERPRINT_CHUNK = small


def test_data_identity_and_the_resume_check():
    a, b = ArrayBatches(np.arange(100) % 7), ArrayBatches(np.arange(50) % 5)
    identity = data.data_identity(a, b)
    assert identity == {"train": {"tokens": 100, "sha256": a.fingerprint()},
                        "val": {"tokens": 50, "sha256": b.fingerprint()}}
    checkpoint.check_identity(identity, "here")  # what a checkpoint's reader checks
    data.check_same_data(identity, a, b)
    with pytest.raises(ValueError, match=r"^resume: the validation data differs from the "
                                         r"checkpoint's \(49 tokens vs 50\)"):
        data.check_same_data(identity, a, ArrayBatches(np.arange(49) % 5))
    with pytest.raises(ValueError, match="the training data differs .*other content"):
        data.check_same_data(identity, ArrayBatches(np.arange(100) % 11), b)
    with pytest.raises(ValueError, match="records no data identity"):
        data.check_same_data(None, a, b)

    class NoFingerprint:
        def token_count(self):
            return 10
    with pytest.raises(ValueError, match="training data .NoFingerprint. has no fingerprint"):
        data.data_identity(NoFingerprint(), b)


def test_load_corpus_offers_what_train_data_reads(tmp_path):
    text = tmp_path / "a.txt"
    text.write_bytes(b"hello world\n" * 100)
    corpus = data.load_corpus([str(text)], seq_len=16)
    assert corpus.sources == [str(text)] and corpus.name == str(text)
    assert corpus.train.token_count() == 1080 and corpus.val.token_count() == 120
    assert corpus.identity() == data.data_identity(corpus.train, corpus.val)
    assert corpus.describe()["sha256"] == corpus.fingerprint() and len(corpus.fingerprint()) == 64
    prepare([str(text)], tmp_path / "p")
    prepared = data.load_corpus([str(tmp_path / "p")], seq_len=16)
    assert isinstance(prepared.train, TokenFile) and prepared.tokenizer.vocab_size == 257
    stdlib = data.load_corpus(None, seq_len=64, stdlib_bytes=100_000)
    assert stdlib.sources is None and "Python standard library" in stdlib.name
    assert stdlib.train.token_count() + stdlib.val.token_count() == 100_000
    with pytest.raises(ValueError, match="too little text for seq_len 200"):
        data.load_corpus([str(text)], seq_len=200)
    with pytest.raises(ValueError, match="val_fraction"):
        data.load_corpus([str(text)], val_fraction=0)


def test_prepare_on_a_full_disk_names_the_token_file_and_leaves_nothing(tmp_path):
    """A write of the ids that fails (a full disk; here RLIMIT_FSIZE, which makes write()
    fail with EFBIG as Python ignores SIGXFSZ) is an OSError naming the token file, and the
    output directory prepare created is gone again."""
    import resource
    import subprocess
    import sys

    text = tmp_path / "a.txt"
    text.write_text("the cat sat on the mat.\n" * 20000)  # 480 KB of ids > the 64 KiB limit
    out = tmp_path / "out"
    code = f"""
import errno
from glassllm.training.data import prepare
try:
    prepare([{str(text)!r}], {str(out)!r}, "byte")
except OSError as e:
    print(e.errno == errno.EFBIG, e.filename, e.strerror)
"""
    limit = 64 << 10
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(" ", 2)[:2] == ["True", str(out / "train.bin")], result.stdout
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]


# ------------------------------------------------ only regular files are read, with a size check
@pytest.mark.parametrize("kind", ["fifo", "urandom", "zero"])
def test_a_fifo_or_device_in_a_data_directory_is_one_line_naming_it_not_a_hang(tmp_path,
                                                                               kind):
    """A FIFO blocks its reader until a writer comes (forever); /dev/urandom and /dev/zero
    never end (the second one read until out of memory). Each is refused before reading."""
    import signal
    from glassllm.training.data import load_corpus
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.txt").write_text("hello there\n" * 50)
    odd = folder / "b.txt"
    if kind == "fifo":
        os.mkfifo(odd)
    else:
        odd.symlink_to(f"/dev/{kind}")
    def hung(signum, frame):
        raise TimeoutError(f"reading {odd} hung")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)  # a hang fails the test instead of blocking the suite
    memory = _limit_memory(2 << 30)  # reading /dev/zero whole: MemoryError, not the OOM killer
    try:
        for call in (lambda: load_corpus([str(folder)], seq_len=8),
                     lambda: load_corpus([str(odd)], seq_len=8),
                     lambda: prepare([str(folder)], tmp_path / "out")):
            with pytest.raises(ValueError) as e:
                call()
            assert str(e.value).startswith(f"{odd} is a ") and "not a regular data file" \
                in str(e.value) and "\n" not in str(e.value)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        memory()
    assert not (tmp_path / "out").exists()


def _limit_memory(extra: int):
    """Cap this process's address space at its present size + `extra` bytes (Linux); returns
    the function that lifts the cap again."""
    import resource
    try:
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
    except (OSError, StopIteration):
        return lambda: None
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (size + extra, hard))
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_read_regular_file_reads_at_most_the_size_it_checked(tmp_path, monkeypatch):
    from glassllm.formats import paths
    path = tmp_path / "t.txt"
    path.write_bytes(b"x" * 10)
    monkeypatch.setattr(paths, "regular_file_size", lambda p, what="file": 4)
    assert paths.read_regular_file(path) == b"xxxx"
