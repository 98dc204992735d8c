"""glassllm.formats.llama2c on a real trained model: Karpathy's stories260K and its tokenizer tok512.

The references are independent of the code under test: the logits of a NumPy re-implementation
of run.c's arithmetic (adjacent-pair RoPE on the stored, unpermuted weights, in float64), the
200-token greedy story that llama2.c's own test suite expects, token ids from a plain
re-implementation of run.c's `encode` loop, and the file's own bytes.

The data lives in ../shared/data/llama2c (see its README). Without it these tests skip, except
under CI=true, where they fail: a CI run must not pass by testing nothing.
"""
from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import shared_data_path
from glassllm import Config, GlassLM
from glassllm.formats import files
from glassllm import functional as F
from glassllm.cli import main
from glassllm.generate import Sampling, generate
from glassllm.formats.llama2c import (HEADER_BYTES, from_llama2c, read_header, to_llama2c,
                              tokenizer_from_llama2c)
from glassllm.tokenizers import SentencePieceTokenizer, StreamDecoder, tokenizer_from_json


# karpathy/llama2.c test_all.py, `expected_stdout` of test_runc: what
# `./run stories260K.bin -z tok512.bin -t 0.0 -n 200` prints (before its final "\n").
GOLDEN = (
    'Once upon a time, there was a little girl named Lily. She loved to play outside in the '
    'park. One day, she saw a big, red ball. She wanted to play with it, but it was too high.\n'
    'Lily\'s mom said, "Lily, let\'s go to the park." Lily was sad and didn\'t know what to do. '
    'She said, "I want to play with your ball, but I can\'t find it."\n'
    'Lily was sad and didn\'t know what to do. She said, "I\'m sorry, Lily. I didn\'t know what '
    'to do."\nLily didn\'t want to help her mom, so she')


def data_file(name: str) -> Path:
    """A file of ../shared/data/llama2c (skipped if absent; CI=true: fails)."""
    return shared_data_path("llama2c", name)


@pytest.fixture(scope="module")
def ckpt():
    return data_file("stories260K.bin")


@pytest.fixture(scope="module")
def tok_path():
    return data_file("tok512.bin")


@pytest.fixture(scope="module")
def model(ckpt):
    return from_llama2c(ckpt)


@pytest.fixture(scope="module")
def tok(tok_path):
    return tokenizer_from_llama2c(tok_path)


# --------------------------------------------------------------------------- references
def reference_logits(path, ids) -> np.ndarray:
    """(T, V) float64 logits of llama2.c run.c's `forward`, position by position, re-done in
    NumPy from the file's bytes: the stored (unpermuted) weights, RoPE on adjacent pairs."""
    dim, hidden, L, H, KV, V, _ = (int(v) for v in np.fromfile(path, "<i4", count=7))
    shared, V, hd = V > 0, abs(V), dim // H
    seq = int(np.fromfile(path, "<i4", count=7)[6])
    flat = np.fromfile(path, "<f4", offset=28).astype(np.float64)
    sizes = dict(emb=(V, dim), att_norm=(L, dim), wq=(L, dim, dim), wk=(L, KV * hd, dim),
                 wv=(L, KV * hd, dim), wo=(L, dim, dim), ffn_norm=(L, dim), w1=(L, hidden, dim),
                 w2=(L, dim, hidden), w3=(L, hidden, dim), norm=(dim,), fr=(seq, hd // 2),
                 fi=(seq, hd // 2), cls=(V, dim))
    w, offset = {}, 0
    for name, shape in sizes.items():
        if name == "cls" and shared:
            break
        n = int(np.prod(shape))
        w[name] = flat[offset:offset + n].reshape(shape)
        offset += n
    assert offset == flat.size
    cls = w["emb"] if shared else w["cls"]

    def rmsnorm(x, g):
        return g * (x / np.sqrt(np.mean(x * x) + 1e-5))

    def rotate(vec, pos):  # run.c: pairs (i, i+1), frequency 10000^(-(i % hd) / hd)
        i = np.arange(0, vec.size, 2)
        angle = pos * 10000.0 ** (-(i % hd) / hd)
        a, b = vec[i].copy(), vec[i + 1].copy()
        c, s = np.cos(angle), np.sin(angle)
        vec[i], vec[i + 1] = a * c - b * s, a * s + b * c

    keys = np.zeros((L, len(ids), KV * hd))
    values = np.zeros((L, len(ids), KV * hd))
    out = []
    for pos, token in enumerate(ids):
        x = w["emb"][token].copy()
        for l in range(L):
            xb = rmsnorm(x, w["att_norm"][l])
            q, k, v = w["wq"][l] @ xb, w["wk"][l] @ xb, w["wv"][l] @ xb
            rotate(q, pos)
            rotate(k, pos)
            keys[l, pos], values[l, pos] = k, v
            att = np.zeros(dim)
            for h in range(H):
                g = h // (H // KV)  # the kv head this query head shares
                kh = keys[l, :pos + 1, g * hd:(g + 1) * hd]
                score = kh @ q[h * hd:(h + 1) * hd] / np.sqrt(hd)
                p = np.exp(score - score.max())
                att[h * hd:(h + 1) * hd] = (p / p.sum()) @ values[l, :pos + 1, g * hd:(g + 1) * hd]
            x = x + w["wo"][l] @ att
            xb = rmsnorm(x, w["ffn_norm"][l])
            gate = w["w1"][l] @ xb
            x = x + w["w2"][l] @ (gate / (1 + np.exp(-gate)) * (w["w3"][l] @ xb))
        out.append(cls @ rmsnorm(x, w["norm"]))
    return np.array(out)


def read_tokenizer_bin(path):
    """(pieces as bytes, float32 scores) of a tokenizer.bin, read record by record."""
    data = Path(path).read_bytes()
    pieces, scores, offset = [], [], 4
    while offset < len(data):
        score, n = struct.unpack_from("<fi", data, offset)
        pieces.append(data[offset + 8:offset + 8 + n])
        scores.append(score)
        offset += 8 + n
    return pieces, scores


def runc_encode(pieces, scores, text: str) -> list[int]:
    """run.c `encode(t, text, bos=0, eos=0)` transcribed as a plain loop: dummy prefix, each
    UTF-8 character its piece or its bytes + 3, then merge the best-scoring adjacent pair
    (leftmost on ties, strictly above -1e10) until none concatenates to a piece."""
    lookup = {}
    for i, p in enumerate(pieces):
        lookup.setdefault(p, i)
    tokens = [lookup[b" "]] if text else []
    for ch in text:
        b = ch.encode("utf-8")
        tokens += [lookup[b]] if b in lookup else [x + 3 for x in b]
    while True:
        best, best_i, best_id = np.float32(-1e10), -1, -1
        for i in range(len(tokens) - 1):
            j = lookup.get(pieces[tokens[i]] + pieces[tokens[i + 1]])
            if j is not None and scores[j] > best:
                best, best_i, best_id = scores[j], i, j
        if best_i < 0:
            return tokens
        tokens[best_i:best_i + 2] = [best_id]


# --------------------------------------------------------------------------- the model
def test_header_and_config(ckpt, model):
    h = read_header(ckpt)
    assert (h.dim, h.hidden_dim, h.n_layers, h.n_heads, h.n_kv_heads, h.vocab_size,
            h.seq_len, h.shared_classifier) == (64, 172, 5, 8, 4, 512, 512, True)
    cfg = model.cfg
    assert (cfg.family, cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
            cfg.vocab_size, cfg.max_len, cfg.rope_theta, cfg.norm_eps, cfg.tie_embeddings) == \
        ("llama", 64, 172, 5, 8, 4, 512, 512, 10000.0, 1e-5, True)
    assert cfg.n_params() == 260_032


@pytest.mark.parametrize("seed", [0, 1])
def test_logits_equal_a_numpy_reimplementation_of_run_c(ckpt, model, seed):
    """30 tokens (BOS + 29 drawn over the whole vocabulary). Tolerance 1e-5 relative to the
    largest logit (~20 here): float32 arithmetic -- glassllm's and run.c's alike -- lands
    1-3e-5 from the float64 values in absolute terms."""
    ids = [1] + np.random.default_rng(seed).integers(0, 512, size=29).tolist()
    expected = reference_logits(ckpt, ids)
    got = model(np.array(ids)).data[0].astype(np.float64)
    scale = max(1.0, float(np.abs(expected).max()))
    assert np.abs(got - expected).max() <= 1e-5 * scale
    assert (got.argmax(-1) == expected.argmax(-1)).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_float64_logits_equal_the_reimplementation_within_1e_5_absolute(ckpt, seed):
    """The same comparison with glassllm's weights and RoPE tables in float64: the arithmetic,
    the wq/wk permutation and the adjacent-pair -> rotate-half mapping are then checked with no
    float32 rounding in the way (measured: 5e-14), against the issue's absolute 1e-5."""
    model = from_llama2c(ckpt)
    for _, p in model.named_parameters():
        p.data = p.data.astype(np.float64)
    model.rope_cos, model.rope_sin = F.rope_tables(model.cfg.max_len, model.cfg.head_dim,
                                                   model.cfg.rope_theta, dtype=np.float64)
    ids = [1] + np.random.default_rng(seed).integers(0, 512, size=29).tolist()
    got = model(np.array(ids)).data[0]
    assert got.dtype == np.float64
    assert np.abs(got - reference_logits(ckpt, ids)).max() <= 1e-5


def test_greedy_story_is_llama2c_expected_output(model, tok):
    new = generate(model, [tok.bos_id], 200, Sampling(temperature=0.0))
    assert len(new) == 200 and tok.bos_id not in new and tok.eot_id not in new
    text = tok.decode(new)
    assert text.startswith("Once upon a time")
    assert text == GOLDEN


def test_import_export_gives_the_original_header_and_weight_bytes(ckpt, model, tmp_path):
    out = tmp_path / "again.bin"
    to_llama2c(model, out)
    original, written = ckpt.read_bytes(), out.read_bytes()
    assert len(written) == len(original)
    assert written[:HEADER_BYTES] == original[:HEADER_BYTES]
    # every weight byte; the two RoPE tables (seq_len x head_dim/2 floats each, which run.c
    # does not read) are recomputed and may differ from PyTorch's in the last bit
    rope_floats = 2 * 512 * 4
    weights_end = len(original) - 4 * rope_floats
    assert written[:weights_end] == original[:weights_end]
    a = np.frombuffer(original[weights_end:], "<f4")
    b = np.frombuffer(written[weights_end:], "<f4")
    assert np.abs(a - b).max() <= 6e-8  # one float32 ulp just below 1


@pytest.mark.parametrize("tie", [True, False])
def test_round_trip_of_a_glassllm_model(tmp_path, tie):
    """A model made here (GQA, an FFN width of its own, tied or separate classifier) is written,
    read back with the same weights, its file is what the NumPy run.c re-implementation
    computes, and writing it again gives the same bytes."""
    cfg = Config(vocab_size=300, d_model=48, n_layers=2, n_heads=6, n_kv_heads=2, max_len=40,
                 d_ff=100, tie_embeddings=tie)
    model = GlassLM(cfg, seed=3)
    model.token_embedding.weight.data *= 20  # logits of a few units
    path = tmp_path / "m.bin"
    to_llama2c(model, path)
    header = np.fromfile(path, "<i4", count=7).tolist()
    assert header == [48, 100, 2, 6, 2, 300 if tie else -300, 40]
    back = from_llama2c(path)
    assert back.cfg == cfg
    for (name, a), (_, b) in zip(model.named_parameters(), back.named_parameters()):
        assert np.array_equal(a.data, b.data), name
    ids = [1, 7, 299, 0, 42, 42, 3]
    expected = reference_logits(path, ids)
    got = model(np.array(ids)).data[0]
    assert np.abs(got - expected).max() <= 1e-5 * max(1.0, float(np.abs(expected).max()))
    again = tmp_path / "again.bin"
    to_llama2c(back, again)
    assert again.read_bytes() == path.read_bytes()


def test_max_len_override(ckpt):
    short = from_llama2c(ckpt, max_len=64)
    assert short.cfg.max_len == 64 and short.rope_cos.shape[0] == 64
    with pytest.raises(ValueError, match="max_len"):
        from_llama2c(ckpt, max_len=513)


@pytest.mark.parametrize("change, message", [
    (dict(family="gpt2", n_kv_heads=2), "gpt2"),
    (dict(rope_theta=500000.0), "theta"),
    (dict(norm_eps=1e-6), "eps"),
])
def test_export_refuses_what_run_c_cannot_compute(tmp_path, change, message):
    cfg = Config(**{**dict(vocab_size=260, d_model=16, n_layers=1, n_heads=2, max_len=8),
                    **change})
    path = tmp_path / "x.bin"
    with pytest.raises(ValueError, match=message):
        to_llama2c(GlassLM(cfg), path)
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_non_finite_weights(tmp_path):
    model = GlassLM(Config(vocab_size=260, d_model=16, n_layers=1, n_heads=2, max_len=8))
    model.blocks[0].mlp.up.weight.data[0, 0] = np.nan
    with pytest.raises(ValueError, match="mlp.up"):
        to_llama2c(model, tmp_path / "x.bin")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- corrupt files
def corruptions(original: bytes):
    """(label, bytes) of broken llama2.c checkpoints."""
    header = list(struct.unpack("<7i", original[:28]))
    body = original[28:]

    def with_header(**fields):
        names = ["dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                 "seq_len"]
        values = [fields.get(n, v) for n, v in zip(names, header)]
        return struct.pack("<7i", *values) + body

    yield "empty", b""
    yield "short header", original[:13]
    yield "header only", original[:28]
    for cut in (32, len(original) // 2, len(original) - 4, len(original) - 1):
        yield f"truncated at {cut}", original[:cut]
    yield "trailing bytes", original + b"\0\0\0\0"
    for field in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "seq_len"):
        yield f"{field} zero", with_header(**{field: 0})
        yield f"{field} negative", with_header(**{field: -5})
        yield f"{field} absurd", with_header(**{field: 2**31 - 1})
    yield "vocab_size zero", with_header(vocab_size=0)
    yield "vocab_size absurd", with_header(vocab_size=-(2**31) + 1)
    yield "separate classifier missing", with_header(vocab_size=-512)
    yield "heads do not divide dim", with_header(n_heads=7)
    yield "kv heads do not divide heads", with_header(n_kv_heads=3)
    yield "more kv heads than heads", with_header(n_kv_heads=16)
    yield "odd head_dim", with_header(n_heads=32, n_kv_heads=32)
    yield "version 2 magic", struct.pack("<Ii", 0x616B3432, 2) + original[8:]
    rng = np.random.default_rng(0)
    for i in range(30):
        yield f"random header {i}", rng.bytes(28) + body
    nan = bytearray(original)
    nan[28 + 4 * 1000:28 + 4 * 1001] = struct.pack("<f", float("nan"))
    yield "NaN weight", bytes(nan)


def test_corrupt_checkpoints_are_value_errors_naming_the_file(ckpt, tmp_path):
    labels = []
    for label, data in corruptions(ckpt.read_bytes()):
        path = tmp_path / "bad.bin"
        path.write_bytes(data)
        with pytest.raises(ValueError) as info:
            from_llama2c(path)
        message = str(info.value)
        assert str(path) in message and "\n" not in message, (label, message)
        labels.append(label)
    assert len(labels) > 50


def test_corrupt_checkpoints_are_one_line_cli_errors_writing_nothing(ckpt, tok_path, tmp_path,
                                                                    capsys):
    for label, data in corruptions(ckpt.read_bytes()):
        path = tmp_path / "bad.bin"
        path.write_bytes(data)
        out = tmp_path / "out.safetensors"
        code = main(["convert", "--from-llama2c", str(path), "--tokenizer", str(tok_path),
                     "--out", str(out)])
        captured = capsys.readouterr()
        assert code == 2, label
        assert captured.out == ""
        assert captured.err.startswith("glassllm convert: error: ") and \
            captured.err.count("\n") == 1 and str(path) in captured.err, (label, captured.err)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.bin"], label


def test_an_absurd_header_allocates_nothing(tmp_path):
    """dim 2**30 x 2**30 matrices: refused from the 28 header bytes and the file size."""
    path = tmp_path / "huge.bin"
    path.write_bytes(struct.pack("<7i", 2**30, 2**30, 2**20, 2**10, 2**10, 2**30, 2**30))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="truncated"):
            from_llama2c(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_cli_from_llama2c_without_a_tokenizer_writes_weights_only(ckpt, tok_path, tmp_path,
                                                                  capsys):
    """No --tokenizer: a weights-only file and a note; generate then needs --tokenizer, and
    with llama2.c's tok512.bin it tells the same story."""
    out = tmp_path / "o.safetensors"
    assert main(["convert", "--from-llama2c", str(ckpt), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "weights only" in captured.err and "tokenizer none" in captured.out
    assert files.load_tokenizer(out) is None
    assert main(["generate", "--model", str(out), "--prompt", ""]) == 2
    assert "--tokenizer" in capsys.readouterr().err
    assert main(["generate", "--model", str(out), "--tokenizer", str(tok_path), "--prompt", "",
                 "--temperature", "0", "--max-new-tokens", "200"]) == 0
    assert capsys.readouterr().out == GOLDEN + "\n"


def test_missing_file(tmp_path, capsys):
    with pytest.raises(FileNotFoundError):
        from_llama2c(tmp_path / "nope.bin")
    assert main(["convert", "--from-llama2c", str(tmp_path / "nope.bin"), "--tokenizer",
                 str(tmp_path / "t.bin"), "--out", str(tmp_path / "o.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "nope.bin" in err and err.count("\n") == 1


def tokenizer_corruptions(original: bytes):
    yield "empty", b""
    yield "short header", original[:3]
    yield "no pieces", original[:4]
    yield "record cut short", original[:4 + 5]
    yield "piece cut short", original[:len(original) - 2]
    yield "negative length", original[:8] + struct.pack("<i", -1) + original[12:]
    yield "absurd length", original[:8] + struct.pack("<i", 2**31 - 1) + original[12:]
    pieces, scores = read_tokenizer_bin_bytes(original)
    yield "byte pieces moved", pack_tokenizer(pieces[:3] + pieces[4:] + pieces[3:4], scores)
    yield "duplicate piece", pack_tokenizer(pieces[:-1] + [pieces[300]], scores)
    yield "not UTF-8", pack_tokenizer(pieces[:-1] + [b"\xff\xfe"], scores)
    yield "NaN score", pack_tokenizer(pieces, scores[:-1] + [float("nan")])
    yield "max_token_length too small", struct.pack("<I", 2) + original[4:]


def read_tokenizer_bin_bytes(data: bytes):
    pieces, scores, offset = [], [], 4
    while offset < len(data):
        score, n = struct.unpack_from("<fi", data, offset)
        pieces.append(data[offset + 8:offset + 8 + n])
        scores.append(score)
        offset += 8 + n
    return pieces, scores


def pack_tokenizer(pieces, scores, max_len=7) -> bytes:
    return struct.pack("<I", max_len) + b"".join(
        struct.pack("<fi", s, len(p)) + p for p, s in zip(pieces, scores))


def test_corrupt_tokenizers_are_value_errors_and_cli_errors(ckpt, tok_path, tmp_path, capsys):
    original = tok_path.read_bytes()
    assert pack_tokenizer(*read_tokenizer_bin_bytes(original)) == original  # the packer is right
    for label, data in tokenizer_corruptions(original):
        path = tmp_path / "bad_tok.bin"
        path.write_bytes(data)
        with pytest.raises(ValueError) as info:
            tokenizer_from_llama2c(path)
        assert str(path) in str(info.value), (label, str(info.value))
        out = tmp_path / "out.safetensors"
        code = main(["convert", "--from-llama2c", str(ckpt), "--tokenizer", str(path),
                     "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and str(path) in err, (label, err)
        assert not out.exists(), label


def test_a_tokenizer_of_another_size_is_refused(ckpt, tok_path, tmp_path, capsys):
    pieces, scores = read_tokenizer_bin_bytes(tok_path.read_bytes())
    small = tmp_path / "tok500.bin"
    small.write_bytes(pack_tokenizer(pieces[:500], scores[:500]))  # keeps " " (id 410)
    assert tokenizer_from_llama2c(small).vocab_size == 500
    out = tmp_path / "out.safetensors"
    assert main(["convert", "--from-llama2c", str(ckpt), "--tokenizer", str(small),
                 "--out", str(out)]) == 2
    assert "500 pieces" in capsys.readouterr().err and not out.exists()


# --------------------------------------------------------------------------- the tokenizer
TEXTS = [
    "hello world!", "abcdefgh", "0123456789", "Once upon a time, there was a little girl.",
    "Lets try ö & 株式会社", "𒎗𓐍", "[INST]\n<<<SYS>>>test<<</SYS>>>\nhello[/INST]\n",
    "café, naïve, résumé, Ångström, São Paulo", "日本語のテキストと中文",
    "emoji 😀👍🏽🎉 end",
    "", " ", "  two leading", "tabs\tand\nnewlines\n\n", "<s> </s> <unk> <0x41>", "a" * 40,
    "the there then ver over her herd heard ended outed",
]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_equals_run_c_encode(tok, tok_path, text):
    pieces, scores = read_tokenizer_bin(tok_path)
    ids = tok.encode(text)
    assert ids.dtype == np.uint16
    assert ids.tolist() == runc_encode(pieces, scores, text)
    assert tok.decode(ids) == text


def test_byte_fallback_ids(tok):
    # 株 is not a piece of tok512: its three UTF-8 bytes become ids byte + 3
    ids = tok.encode("株").tolist()
    assert ids[1:] == [0xE6 + 3, 0xA0 + 3, 0xAA + 3] and tok.pieces[ids[0]] == " "
    assert tok.decode(ids) == "株"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=" thervdkanoustTLy.,!\n'éö株😀", max_size=30))
def test_encode_equals_run_c_encode_on_generated_text(tok, tok_path, text):
    pieces, scores = read_tokenizer_bin(tok_path)
    assert tok.encode(text).tolist() == runc_encode(pieces, scores, text)
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("name", ["utf8-emoji-cjk.txt", "utf8-sample.txt"])
def test_round_trip_on_real_utf8_files(tok, name):
    text = shared_data_path(name).read_text(encoding="utf-8")
    assert tok.decode(tok.encode(text)) == text


def test_protocol_and_special_ids(tok):
    assert (tok.vocab_size, tok.bos_id, tok.eot_id, tok.max_token_length) == (512, 1, 2, 7)
    assert tok.stop_ids == (2, 1)  # EOS, and BOS as run.c
    assert tok.pieces[1] == "\n<s>\n" and tok.pieces[2] == "\n</s>\n"
    assert tok.decode_bytes([1, 2]) == b""  # BOS/EOS print nothing
    # run.c decode: the leading space goes after BOS (and at the start), not elsewhere
    once = int(tok.encode("Once")[0])
    assert tok.pieces[once] == " Once"
    assert tok.piece_bytes(once, prev_id=1) == b"Once"
    assert tok.piece_bytes(once, prev_id=once) == b" Once"
    assert tok.decode([once, once, 1, once]) == "Once OnceOnce"
    assert tok.piece_bytes(3 + 0x41) == b"A"  # <0x41>
    with pytest.raises(ValueError):
        tok.decode([512])
    with pytest.raises(ValueError, match="surrogate"):
        tok.encode("a\udcff")


def test_stream_decoder_equals_decode(model, tok):
    ids = generate(model, [1], 60, Sampling(temperature=0.0)) + tok.encode("😀 株").tolist()
    decoder = StreamDecoder(tok, prev_id=1)
    chunks = [decoder.push(i) for i in ids] + [decoder.flush()]
    assert "".join(chunks) == tok.decode(ids)
    assert all("\ufffd" not in c for c in chunks)  # a character split over byte pieces waits


def test_json_round_trip_and_model_file(tok, model, tmp_path):
    again = tokenizer_from_json(tok.to_json())
    assert isinstance(again, SentencePieceTokenizer)
    assert again.pieces == tok.pieces and np.array_equal(again.scores, tok.scores)
    path = tmp_path / "m.safetensors"
    files.save(model, path, tok)
    stored = files.load_tokenizer(path)
    for text in TEXTS:
        assert stored.encode(text).tolist() == tok.encode(text).tolist()


def test_ties_between_mergeable_pieces_are_refused():
    pieces = ["<unk>", "\n<s>\n", "\n</s>\n"] + [f"<0x{b:02X}>" for b in range(256)] + \
        [" ", "a", "b", "ab", "ba"]
    scores = [0.0] * 259 + [-1.0, -2.0, -3.0, -10.0, -10.0]
    with pytest.raises(ValueError, match="same score"):
        SentencePieceTokenizer(pieces, scores)
    ok = SentencePieceTokenizer(pieces, scores[:-1] + [-11.0])
    assert [ok.pieces[i] for i in ok.encode("aba")] == [" ", "ab", "a"]


# --------------------------------------------------------------------------- the CLI
def test_cli_convert_and_generate_prints_the_story(ckpt, tok_path, tmp_path, capsys):
    out = tmp_path / "stories260K.safetensors"
    assert main(["convert", "--from-llama2c", str(ckpt), "--tokenizer", str(tok_path),
                 "--out", str(out)]) == 0
    assert "260,032 parameters; tokenizer sentencepiece" in capsys.readouterr().out
    code = main(["generate", "--model", str(out), "--prompt", "", "--temperature", "0",
                 "--max-new-tokens", "200"])
    captured = capsys.readouterr()
    assert code == 0 and captured.out == GOLDEN + "\n"
    # a prompt is BOS + its ids (run.c's encode with bos=1): its greedy continuation is the
    # same story, since the story begins with these words
    code = main(["generate", "--model", str(out), "--prompt", "Once upon a time",
                 "--temperature", "0", "--max-new-tokens", "30"])
    text = capsys.readouterr().out
    assert code == 0 and len(text) > 100 and GOLDEN.startswith(text[:-1])


def test_cli_export_to_llama2c(ckpt, tok_path, tmp_path, capsys):
    glass = tmp_path / "m.safetensors"
    assert main(["convert", "--from-llama2c", str(ckpt), "--tokenizer", str(tok_path),
                 "--out", str(glass)]) == 0
    back = tmp_path / "back.bin"
    assert main(["convert", "--model", str(glass), "--to-llama2c", str(back)]) == 0
    captured = capsys.readouterr()  # the .bin holds no tokenizer, and the summary says so
    assert captured.out.rstrip().endswith("tokenizer none"), captured.out
    assert captured.err.startswith("note:") and "tokenizer.bin" in captured.err
    assert back.read_bytes()[:-4 * 2 * 512 * 4] == ckpt.read_bytes()[:-4 * 2 * 512 * 4]
    # refused: writing over the source, a gpt2 model, mixed flags
    assert main(["convert", "--model", str(glass), "--to-llama2c", str(glass)]) == 2
    gpt2 = tmp_path / "gpt2.safetensors"
    files.save(GlassLM(Config(family="gpt2", d_model=16, n_layers=1, n_heads=2, max_len=8)),
               gpt2)
    assert main(["convert", "--model", str(gpt2), "--to-llama2c", str(tmp_path / "g.bin")]) == 2
    assert not (tmp_path / "g.bin").exists()
    assert main(["convert", "--from-llama2c", str(ckpt), "--to-llama2c", str(back)]) == 2
    assert main(["convert", "--model", str(glass), "--to-llama2c", str(back), "--force"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 4 and all(e.startswith("glassllm convert: error: ") for e in errors)
    assert "gpt2" in errors[1]


def test_cli_generation_stops_where_the_model_starts_a_new_story(ckpt, tok_path, tmp_path,
                                                               capsys, model, tok):
    """run.c's stop rule: the story ends when the model emits BOS (id 1), which the
    TinyStories models learnt as the separator (they never saw EOS)."""
    new = generate(model, [1], 400, Sampling(temperature=0.0))
    end = new.index(tok.bos_id)  # 345 for stories260K
    assert 200 < end < 400 and tok.eot_id not in new[:end]
    out = tmp_path / "m.safetensors"
    assert main(["convert", "--from-llama2c", str(ckpt), "--tokenizer", str(tok_path),
                 "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["generate", "--model", str(out), "--prompt", "", "--temperature", "0",
                 "--max-new-tokens", "400"]) == 0
    text = capsys.readouterr().out
    assert text == tok.decode(new[:end]) + "\n" and text.startswith(GOLDEN)
