"""Reading GGUF (glassllm.formats.gguf_read): files written with the `gguf` package's own
GGUFWriter (tests/gguf_files.py) from glassllm models of every family llama.cpp names, read
back by `glassllm.load`; stories260K through GGUF against the llama2.c loader; GPT-2's BPE
vocabulary through GGUF; the CLI on a .gguf; damaged files one line, exit 2, nothing written.

Bounds: F32 files give the original's logits within 1e-5 x max|logit| (in practice equal or a
few ulps: Gemma's stored norms are 1 + w and lose the 1 again). Q8_0 files: every matrix equal
to gguf's dequantization of its bytes (layouts undone), each within 1% relative RMS of the
original, and logits within 0.1 x max|logit| on these tiny random models (whose logits are
O(1) with near ties, the hardest case for quantization).
"""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

import glassllm  # noqa: E402
from conftest import shared_data_path  # noqa: E402
from gguf_files import QT, random_blocks, tiny_model, write_gguf  # noqa: E402
from glassllm.cli import main  # noqa: E402
from glassllm.formats import files, gguf_names, gguf_quants  # noqa: E402
from glassllm.formats.gguf_compare import compare  # noqa: E402
from glassllm.formats.gguf_read import read_gguf  # noqa: E402
from glassllm.formats.llama2c import from_llama2c, tokenizer_from_llama2c  # noqa: E402
from glassllm.tokenizers.bpe import BPETokenizer  # noqa: E402

FAMILIES = [f for f in gguf_names.ARCH_OF_FAMILY]
IDS = np.random.default_rng(1).integers(0, 300, (1, 24))
SAMPLE = ("Once upon a time, Lily's dog ran to the park. \"Hello!\" she said; 12 apples, "
          "3.5 km -- naïve café, ünïcödé, 日本語, emoji 🙂 and\ttabs\n\nnew  lines.")


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("family", FAMILIES)
def test_f32_gguf_of_every_family_gives_the_original_logits(family, tmp_path):
    model = tiny_model(family)
    path = tmp_path / f"{family}.gguf"
    write_gguf(path, model)
    loaded, tokenizer = read_gguf(path)
    assert tokenizer is None
    expected_family = "llama" if family == "mistral" else family
    assert loaded.cfg.family == expected_family
    for field in ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff",
                  "vocab_size", "max_len", "rope_theta", "norm_eps", "tie_embeddings",
                  "attn_bias", "mlp_bias", "rotary_pct", "attn_softcap", "final_softcap"):
        assert getattr(loaded.cfg, field) == getattr(model.cfg, field), field
    if family != "mistral":  # llama.cpp runs Mistral as llama: full attention
        assert loaded.cfg.layer_types == model.cfg.layer_types
    ref = model(IDS).data
    assert np.abs(loaded(IDS).data - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("family", FAMILIES)
def test_q8_0_gguf_of_every_family(family, tmp_path):
    model = tiny_model(family)
    path = tmp_path / f"{family}-q8_0.gguf"
    write_gguf(path, model, qtype=QT.Q8_0)
    loaded, _ = read_gguf(path)
    reader = gguf.GGUFReader(str(path))
    stored = {t.name: t for t in reader.tensors}
    names = gguf_names.tensor_names(loaded.cfg)
    quantized = 0
    for ours, p in loaded.named_parameters():
        t = stored[names[ours]]
        if t.tensor_type != QT.Q8_0 or ".attn_qkv." in names[ours]:
            continue
        theirs = gguf.quants.dequantize(t.data, t.tensor_type)
        assert np.array_equal(p.data, gguf_names.from_gguf(loaded.cfg, ours, theirs)), ours
        quantized += 1
    assert quantized >= 4 * loaded.cfg.n_layers - 4
    report = compare(path, model)
    assert all(t.rel_rms < 0.01 for t in report.tensors), report.tensors
    ref = model(IDS).data
    assert np.abs(loaded(IDS).data - ref).max() <= 0.1 * np.abs(ref).max()


def test_quantized_types_load_and_report(tmp_path):
    """Q4_0 / Q4_1 / Q5_0 / Q5_1 files load; the report ranks them as their bits do."""
    model = tiny_model("llama")
    errors = {}
    for qtype in (QT.Q8_0, QT.Q5_1, QT.Q5_0, QT.Q4_1, QT.Q4_0):
        path = tmp_path / f"{qtype.name}.gguf"
        write_gguf(path, model, qtype=qtype)
        report = compare(path, model, IDS[0])
        errors[qtype.name] = report.overall_rel_rms
        assert report.agreement.positions == IDS.shape[1] and 0 <= report.agreement.top1 <= 1
    assert errors["Q8_0"] < errors["Q5_1"] < errors["Q4_1"] and errors["Q5_0"] < errors["Q4_0"]
    assert errors["Q8_0"] < 0.01 and errors["Q4_0"] < 0.15


# --------------------------------------------------------------------------- stories260K
@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    model = from_llama2c(shared_data_path("llama2c", "stories260K.bin"))
    tok = tokenizer_from_llama2c(shared_data_path("llama2c", "tok512.bin"))
    path = tmp_path_factory.mktemp("gguf") / "stories260K.gguf"
    write_gguf(path, model, tok)
    return model, tok, path


def test_stories260k_through_gguf_is_the_llama2c_model_and_tokenizer(stories):
    model, tok, path = stories
    lm = glassllm.load(path)
    ids = np.array([1] + [int(i) for i in tok.encode(SAMPLE)])
    assert np.array_equal(lm.model(ids).data, model(ids).data)  # the permutation is exact
    assert lm.tokenizer.pieces == tok.pieces
    assert lm.tokenizer.encode(SAMPLE).tolist() == tok.encode(SAMPLE).tolist()
    assert lm.encode(SAMPLE) == ids.tolist()
    reader = gguf.GGUFReader(str(path))  # stored as llama.cpp's vocab: "▁" for the space
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert tokens[tok.pieces.index(" the")] == "\u2581the"
    story = lm.generate("Once upon a time", max_new_tokens=30, temperature=0.0)
    assert story.startswith(", there was a little girl named Lily.")


def test_cli_on_a_gguf(stories, tmp_path, capsys):
    model, tok, path = stories
    out = tmp_path / "stories.safetensors"
    code, text, err = cli(capsys, "convert", "--from-gguf", path, "--out", out)
    assert code == 0 and "llama model" in text and "tokenizer sentencepiece" in text, err
    converted = files.load(out)
    ids = np.arange(1, 40)
    assert np.array_equal(converted(ids).data, model(ids).data)
    assert files.load_tokenizer(out).encode(SAMPLE).tolist() == tok.encode(SAMPLE).tolist()
    runs = [cli(capsys, "generate", "--model", m, "--prompt", "Once upon a time",
                "--max-new-tokens", 20, "--seed", 3) for m in (path, out)]
    assert runs[0][0] == 0 and runs[0][1] == runs[1][1] and runs[0][1].startswith("Once")
    report = tmp_path / "r.html"
    code, text, err = cli(capsys, "inspect", "--model", path, "--prompt", "Once upon a time",
                          "--out", report)
    assert code == 0 and report.is_file(), err


def test_inspect_compare_prints_the_quantization_report(stories, tmp_path, capsys):
    model, tok, _ = stories
    original = tmp_path / "stories.safetensors"
    files.save(model, original, tok)
    q8 = tmp_path / "q8.gguf"
    write_gguf(q8, model, tok, QT.Q8_0)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Once upon a time there was a little girl. " * 20)
    code, text, err = cli(capsys, "inspect", "--compare", q8, original, "--corpus", corpus,
                          "--tokens", 100)
    assert code == 0, err
    lines = text.splitlines()
    assert lines[0].split() == ["tensor", "type", "rel", "RMS", "max", "|err|"]
    row = next(line.split() for line in lines if line.startswith("blk.0.attn_q.weight"))
    assert row[1] == "Q8_0" and 0 < float(row[2]) < 0.01
    assert "next-token agreement" in lines[-1] and "over 100 positions" in lines[-1]
    assert float(lines[-1].split("agreement ")[1].split("%")[0]) >= 90


@pytest.mark.parametrize("extra, says", [
    (["--out", "r.html"], "--out: not with --compare"),
    (["--features", "d", "--device", "strict"], "--features, --device: not with --compare"),
    (["--prompt", ""], "--prompt holds no tokens"),
    (["--corpus", "EMPTY"], "holds no tokens")])
def test_inspect_compare_refuses_what_it_would_ignore(stories, tmp_path, capsys, extra, says):
    # --out/--features/--device were silently ignored (no report written, nothing moved), and
    # an empty sample printed the weights' table without its agreement line or a word
    model, tok, _ = stories
    original = tmp_path / "stories.safetensors"
    files.save(model, original, tok)
    q8 = tmp_path / "q8.gguf"
    write_gguf(q8, model, tok, QT.Q8_0)
    (tmp_path / "empty.txt").write_text("")
    extra = [str(tmp_path / "empty.txt") if a == "EMPTY" else a for a in extra]
    code, text, err = cli(capsys, "inspect", "--compare", q8, original, *extra)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.html").exists()
    code, text, err = cli(capsys, "inspect", "--model", original, "--prompt", "Once upon",
                          "--corpus", tmp_path / "empty.txt", "--out", tmp_path / "r.html")
    assert code == 2 and "--corpus is for --compare only" in err


# --------------------------------------------------------------------------- GPT-2's BPE
def test_gpt2_bpe_vocabulary_through_gguf(tmp_path):
    tok = BPETokenizer.from_gpt2_files(shared_data_path("gpt2", "vocab.json"),
                                       shared_data_path("gpt2", "merges.txt"))
    model = tiny_model("gpt2", vocab_size=tok.vocab_size, d_model=32, n_layers=1)
    path = tmp_path / "gpt2.gguf"
    write_gguf(path, model, tok)
    lm = glassllm.load(path)
    assert isinstance(lm.tokenizer, BPETokenizer) and lm.tokenizer.eot_id == 50256
    text = shared_data_path("utf8-sample.txt").read_text()[:3000] + SAMPLE
    assert lm.tokenizer.encode(text).tolist() == tok.encode(text).tolist()
    refs = json.loads(shared_data_path("gpt2", "reference_encodings.json").read_text())
    checked = 0
    for case in refs:  # tiktoken's / OpenAI's / HF's own ids (special tokens: ordinary text)
        if not case.get("allowed_special"):
            assert lm.tokenizer.encode(case["text"]).tolist() == case["ids"], case["source"]
            checked += 1
    assert checked >= 30


def gpt2_vocab_gguf(path, pre: str) -> None:
    """A tiny gpt2 model with GPT-2's vocabulary, its text split as `pre` says."""
    tok = BPETokenizer.from_gpt2_files(shared_data_path("gpt2", "vocab.json"),
                                       shared_data_path("gpt2", "merges.txt"))
    model = tiny_model("gpt2", vocab_size=tok.vocab_size, d_model=32, n_layers=1)

    def vocab(w):
        from gguf_files import _vocab
        _vocab(w, tok, pre)
    path.mkdir(exist_ok=True)
    return _rewritten(path, vocab, model)


@pytest.mark.parametrize("pre, pieces", [("llama-bpe", [" ", "123", "45"]),
                                         ("qwen2", [" ", "1", "2", "3", "4", "5"]),
                                         ("gpt-2", [" 123", "45"])])
def test_bpe_pre_tokenizers_split_as_llama_cpp_s(tmp_path, pre, pieces):
    """Llama 3 splits digits from the space and in runs of 3, Qwen2 one by one, GPT-2 keeps
    the space and the run (BPE then merges what it can); the split survives a glassllm
    model file."""
    lm = glassllm.load(gpt2_vocab_gguf(tmp_path, pre))
    ids = lm.tokenizer.encode(" 12345").tolist()
    assert [lm.tokenizer.decode([i]) for i in ids] == pieces
    out = tmp_path / "m.safetensors"
    files.save(lm.model, out, lm.tokenizer)
    assert files.load_tokenizer(out).encode(SAMPLE).tolist() == lm.tokenizer.encode(SAMPLE).tolist()


# --------------------------------------------------------------------------- refusals
def _tensor_info(data: bytes, name: str) -> int:
    """Offset of tensor `name`'s n_dims in the header (its name's bytes end there)."""
    return data.index(struct.pack("<Q", len(name)) + name.encode()) + 8 + len(name)


def _set_type(data: bytes, name: str, qtype: int) -> bytes:
    at = _tensor_info(data, name)
    at += 4 + 8 * struct.unpack_from("<I", data, at)[0]
    return data[:at] + struct.pack("<I", qtype) + data[at + 4:]


def _set_ne0(data: bytes, name: str, value: int) -> bytes:
    at = _tensor_info(data, name) + 4
    return data[:at] + struct.pack("<Q", value) + data[at + 8:]


def damaged(data: bytes) -> dict[str, tuple[bytes, str]]:
    """label -> (file bytes, what the one line says)."""
    return {
        "truncated header": (data[:100], "truncated or damaged"),
        "truncated data": (data[:-700], "truncated or damaged"),
        "empty": (b"", "wrong magic"),
        "wrong magic": (b"GGML" + data[4:], "wrong magic"),
        "unknown type": (_set_type(data, "blk.0.attn_q.weight", 200), "unknown tensor type 200"),
        "unsupported type": (_set_type(data, "blk.0.ffn_gate.weight", int(QT.Q2_K)), "Q2_K"),
        "size mismatch": (_set_ne0(data, "blk.1.ffn_up.weight", 1 << 40),
                          "truncated or damaged"),
    }


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("good") / "llama.gguf"
    write_gguf(path, tiny_model("llama", d_model=256, d_ff=256, n_heads=4), qtype=QT.F32)
    return path.read_bytes()


def test_damaged_files_are_one_line_naming_the_file(small_file, tmp_path):
    for label, (data, says) in damaged(small_file).items():
        path = tmp_path / "bad.gguf"
        path.write_bytes(data)
        with pytest.raises(ValueError) as info:
            glassllm.load(path)
        message = str(info.value)
        assert str(path) in message and "\n" not in message and says in message, \
            (label, message)


def test_damaged_files_exit_2_and_write_nothing(small_file, tmp_path, capsys):
    for label, (data, says) in damaged(small_file).items():
        path = tmp_path / "bad.gguf"
        path.write_bytes(data)
        out = tmp_path / "out.safetensors"
        code, text, err = cli(capsys, "convert", "--from-gguf", path, "--out", out)
        assert code == 2 and text == "", label
        assert err.startswith("glassllm convert: error: ") and err.count("\n") == 1 \
            and str(path) in err and says in err, (label, err)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"], label
        for command in (["generate", "--prompt", "x"], ["inspect", "--prompt", "xy"]):
            code, _, err = cli(capsys, command[0], "--model", path, *command[1:],
                               "--out" if command[0] == "inspect" else "--seed",
                               tmp_path / "r.html" if command[0] == "inspect" else 0)
            assert code == 2 and err.count("\n") == 1 and str(path) in err, (label, err)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"], label


def _rewritten(tmp_path, edit, model=None) -> str:
    """An F32 file of `model` (default: a tiny llama) written with `edit(writer)` applied
    before the tensors."""
    model = model or tiny_model("llama")
    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), gguf_names.ARCH_OF_FAMILY[model.cfg.family])
    from gguf_files import _keys, _tensors
    _keys(w, model.cfg)
    edit(w)
    _tensors(w, model, QT.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(tmp_path / "x.gguf")


@pytest.mark.parametrize("edit, says", [
    (lambda w: w.add_rope_scaling_factor(4.0), "key 'llama.rope.scaling.factor' (= 4.0) is not "
                                               "implemented"),
    (lambda w: w.add_expert_count(8), "key 'llama.expert_count'"),
    (lambda w: w.add_tensor("rope_freqs.weight", np.ones(8, np.float32)),
     "tensor 'rope_freqs.weight' is not part of a glassllm llama model"),
    (lambda w: w.add_tokenizer_model("bert"), "tokenizer.ggml.model 'bert' is not supported"),
    (lambda w: (w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre("deepseek-llm"),
                w.add_token_list(["a"])), "tokenizer.ggml.pre 'deepseek-llm' is not supported"),
])
def test_what_glassllm_does_not_compute_is_refused_naming_it(tmp_path, edit, says):
    path = _rewritten(tmp_path, edit)
    with pytest.raises(ValueError) as info:
        read_gguf(path)
    assert path in str(info.value) and says in str(info.value) and "\n" not in str(info.value)


def test_an_unsupported_architecture_is_refused_naming_it(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "mamba")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"m\.gguf: general\.architecture 'mamba' is not "
                                         r"supported by glassllm \(supported: \['gemma'"):
        glassllm.load(tmp_path / "m.gguf")


def test_a_missing_or_misshapen_tensor_is_refused(tmp_path):
    model = tiny_model("qwen2")
    path = tmp_path / "q.gguf"
    write_gguf(path, model)
    data = path.read_bytes()
    # a bias row shorter than the keys say: attn_k.bias ne0 32 -> 16 (bytes still there)
    (tmp_path / "short.gguf").write_bytes(_set_ne0(data, "blk.0.attn_k.bias", 16))
    with pytest.raises(ValueError, match=r"tensor 'blk\.0\.attn_k\.bias' has shape \(16,\), "
                                         r"the keys imply \(32,\)"):
        read_gguf(tmp_path / "short.gguf")


# --------------------------------------------------------------------------- llama.cpp itself
def _llama_cpp():
    from conftest import skip_or_fail
    try:
        import llama_cpp
    except ImportError as e:
        skip_or_fail(f"llama-cpp-python is not installed ({e}); the test extra builds it")
    return llama_cpp


def test_llama_cpp_reads_the_same_tokens_and_logits(stories, tmp_path):
    """What glassllm reads from a GGUF is what llama.cpp runs: stories260K's ids (with BOS)
    and logits (llama.cpp with a float32 KV cache: 1e-4 x max|logit|), and GPT-2's BPE ids
    on text with accents, CJK, emoji, digits and runs of spaces."""
    llama_cpp = _llama_cpp()
    _, _, path = stories
    lm = glassllm.load(path)
    llm = llama_cpp.Llama(model_path=str(path), logits_all=True, verbose=False, n_ctx=256,
                          n_batch=256, n_threads=1, type_k=0, type_v=0)  # 0: GGML_TYPE_F32
    ids = lm.encode(SAMPLE)
    assert llm.tokenize(SAMPLE.encode(), add_bos=True, special=False) == ids
    llm.eval(ids)
    theirs, ours = np.array(llm.scores[:len(ids)]), lm.model(np.array(ids)).data[0]
    assert np.abs(theirs - ours).max() <= 1e-4 * np.abs(ours).max()
    tok = BPETokenizer.from_gpt2_files(shared_data_path("gpt2", "vocab.json"),
                                       shared_data_path("gpt2", "merges.txt"))
    gpt2 = tmp_path / "gpt2.gguf"
    write_gguf(gpt2, tiny_model("gpt2", vocab_size=tok.vocab_size, d_model=32, n_layers=1), tok)
    text = shared_data_path("utf8-sample.txt").read_text()[:4000] + SAMPLE + \
        " I'M HE'LL 12345678  x\n\n\n \t\ty \r\n z's  "
    for pre in ("gpt-2", "llama-bpe", "qwen2"):
        path = gpt2_vocab_gguf(tmp_path / pre, pre) if pre != "gpt-2" else gpt2
        vocab = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        assert vocab.tokenize(text.encode(), add_bos=False, special=False) == \
            glassllm.load(path).tokenizer.encode(text).tolist(), pre


def test_a_bidirectional_model_and_user_defined_tokens_are_refused(tmp_path):
    path = _rewritten(tmp_path, lambda w: w.add_causal_attention(False))
    with pytest.raises(ValueError, match=r"key 'llama\.attention\.causal' is false"):
        read_gguf(path)
    tok = tokenizer_from_llama2c(shared_data_path("llama2c", "tok512.bin"))
    path = _rewritten(tmp_path, lambda w: _vocab_with_types(w, tok))
    with pytest.raises(ValueError, match=r"marks 512 user-defined token\(s\)"):
        read_gguf(path)


def _vocab_with_types(w, tok, pad_to: int = 0) -> None:
    """tok512 as a `llama` vocabulary: every token USER_DEFINED, or (pad_to) NORMAL and padded
    with UNUSED "[PAD<i>]" tokens to `pad_to` ids, as llama.cpp's converter pads."""
    w.add_tokenizer_model("llama")
    pad = range(tok.vocab_size, pad_to)
    w.add_token_list([gguf_names.sp_piece_to_gguf(p) for p in tok.pieces]
                     + [f"[PAD{i}]" for i in pad])
    w.add_token_scores([float(s) for s in tok.scores] + [-1000.0] * len(pad))
    kind = gguf_names.TOKEN_NORMAL if pad_to else gguf_names.TOKEN_USER_DEFINED
    w.add_token_types([kind] * tok.vocab_size + [gguf_names.TOKEN_UNUSED] * len(pad))


def test_what_llama_cpp_s_converter_writes_besides_is_read(tmp_path):
    """A vocabulary padded to the model's size with "[PAD<i>]" tokens of type UNUSED (the
    tokenizer keeps its own ids), tokenizer model "none" (no tokenizer), a final soft-cap of 0
    (none)."""
    tok = tokenizer_from_llama2c(shared_data_path("llama2c", "tok512.bin"))

    def padded(w):
        _vocab_with_types(w, tok, pad_to=600)
    path = _rewritten(tmp_path, padded, tiny_model("llama", vocab_size=600))
    model, tokenizer = read_gguf(path)
    assert model.cfg.vocab_size == 600 and tokenizer.vocab_size == 512
    assert tokenizer.encode(SAMPLE).tolist() == tok.encode(SAMPLE).tolist()
    path = _rewritten(tmp_path, lambda w: w.add_tokenizer_model("none"))
    assert read_gguf(path)[1] is None
    gemma2 = tiny_model("gemma2", final_softcap=None)
    path = _rewritten(tmp_path, lambda w: w.add_final_logit_softcapping(0.0), gemma2)
    assert read_gguf(path)[0].cfg.final_softcap is None


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.BF16, QT.F16])
def test_k_quant_and_half_tensors_load_as_their_dequantization(tmp_path, qtype):
    """A file whose matrices are K-quants (random blocks: gguf has no K-quantizer) or 16-bit
    floats: the model's weights are gguf's dequantization of the bytes, layouts undone."""
    model = tiny_model("llama", d_model=256, d_ff=256, n_heads=4, n_layers=1)
    w = gguf.GGUFWriter(str(tmp_path / "k.gguf"), "llama")
    from gguf_files import _keys
    _keys(w, model.cfg)
    state = dict(model.named_parameters())
    stored = {}
    for ours, theirs in gguf_names.tensor_names(model.cfg).items():
        value = gguf_names.to_gguf(model.cfg, ours, state[ours].data)
        if value.ndim == 2 and qtype in (QT.F16, QT.BF16):
            raw = gguf.quants.quantize(value, qtype)
        elif value.ndim == 2:
            raw = random_blocks(qtype, value.size // gguf.GGML_QUANT_SIZES[qtype][0],
                                seed=len(stored))
            blocks = raw.reshape(-1).view(gguf_quants.BLOCKS[qtype])
            for field in ("d", "dmin"):  # scaled: random weights of O(0.1)
                if field in blocks.dtype.names:
                    blocks[field] = (blocks[field].astype(np.float32) * 1e-3).astype(np.float16)
            raw = raw.reshape(value.shape[0], -1)  # whole blocks per row
        else:
            w.add_tensor(theirs, value)
            continue
        w.add_tensor(theirs, raw, raw_dtype=qtype)
        stored[ours] = (raw, theirs)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    loaded, _ = read_gguf(tmp_path / "k.gguf")
    params = dict(loaded.named_parameters())
    for ours, (raw, theirs) in stored.items():
        expected = gguf_names.from_gguf(loaded.cfg, ours, gguf.quants.dequantize(raw, qtype))
        assert np.array_equal(params[ours].data, expected), (ours, theirs)
    assert np.isfinite(loaded(np.arange(10)).data).all()


def test_a_non_finite_weight_and_a_missing_tensor_are_refused(tmp_path):
    model = tiny_model("gpt2")
    model.blocks[0].attention.key.weight.data[0, 0] = np.nan  # lands in the fused attn_qkv
    path = tmp_path / "nan.gguf"
    write_gguf(path, model)
    with pytest.raises(ValueError, match=r"tensor 'blk\.0\.attn_qkv\.weight' holds NaN"):
        read_gguf(path)
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    from gguf_files import _keys
    _keys(w, tiny_model("llama").cfg)
    w.add_tensor("token_embd.weight", np.zeros((300, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match=r"m\.gguf: tensor 'blk\.0\.attn_norm\.weight' is "
                                         r"missing"):
        read_gguf(tmp_path / "m.gguf")


def test_an_absurd_context_length_is_refused_before_any_table_is_built(tmp_path):
    """A corrupt llama.context_length of 2^31 would build RoPE tables of 2^31 rows (tens of
    GB); it is refused in one line naming the file and the field."""
    path = _rewritten(tmp_path, lambda w: w.add_context_length(2 ** 31))  # overwrites the key
    with pytest.raises(ValueError) as info:
        read_gguf(path)
    message = str(info.value)
    assert path in message and "max_len" in message and "1048576" in message, message
    assert "\n" not in message


def _gguf_with_array(count: int, item_type: int = 5) -> bytes:
    """A GGUF v3 header of no tensor and one key, an array of `count` int32 (type 5) whose
    elements are not there: GGUFReader would loop over `count` empty reads."""
    key = b"tokenizer.ggml.token_type"
    return (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key +
            struct.pack("<IIQ", 9, item_type, count) + struct.pack("<i", 1))


@pytest.mark.parametrize("item_type", [5, 8])  # int32, string
def test_an_absurd_array_count_is_refused_before_the_reader_loops_over_it(tmp_path,
                                                                          item_type):
    # One flipped bit in a count (or in a string length, which shifts every later field onto
    # other bytes) used to grow the process until the machine ran out of memory.
    path = tmp_path / "count.gguf"
    path.write_bytes(_gguf_with_array(1 << 56, item_type))
    with pytest.raises(ValueError) as info:
        glassllm.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not a readable GGUF file (truncated or damaged): ")
    assert "run past the end of the file" in message and "\n" not in message


def test_a_string_length_grown_by_one_bit_is_refused_in_one_line(small_file, tmp_path):
    key = b"general.architecture"
    at = small_file.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4 + 1
    data = bytearray(small_file)
    data[at] ^= 1  # the architecture string's length + 256: every later field shifted
    path = tmp_path / "shifted.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError) as info:
        glassllm.load(path)
    assert str(info.value).startswith(f"{path}: not a readable GGUF file (truncated or "
                                      f"damaged): ") and "\n" not in str(info.value)


def test_glassllms_own_file_readers_say_a_gguf_is_one(small_file, tmp_path):
    # files.load / load_tokenizer said "not a readable safetensors file ... header too large"
    from glassllm.formats import files
    path = tmp_path / "m.gguf"
    path.write_bytes(small_file)
    for read in (files.load, files.load_tokenizer):
        with pytest.raises(ValueError) as info:
            read(path)
        assert str(info.value) == (f"{path}: a GGUF file, not safetensors: open it with "
                                   f"glassllm.load (or `glassllm convert --from-gguf`)")
