"""glassllm.formats.gguf_write and gguf_quantize without llama.cpp: the Q8_0/Q4_0 quantizers
equal the `gguf` package's byte for byte (both forms), which tensors keep float32, the keys and
tensors a file holds (read back with gguf's own GGUFReader), the refusals (one line, nothing
written) and `glassllm convert --to-gguf`. llama.cpp running the files: test_gguf_llamacpp.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import shared_data_path
from glassllm import Config, GlassLM
from glassllm.formats import gguf_quantize as q
from glassllm.formats import gguf_write
from glassllm.formats.atomic import leftover_temporaries

gguf = pytest.importorskip("gguf")

QTYPES = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}


def awkward_rows(rng) -> list[np.ndarray]:
    """Blocks that test the rounding: normal, all zero, halves exactly on .5 after scaling,
    ties for the largest magnitude of either sign, tiny and huge scales, one spike."""
    normal = rng.standard_normal((6, 96)).astype(np.float32)
    halves = (rng.integers(-16, 17, (3, 64)) * 0.5).astype(np.float32)
    ties = np.tile(np.array([2.0, -2.0] + [0.5] * 30, np.float32), (2, 1))
    spike = np.full((1, 32), 1e-3, np.float32)
    spike[0, 7] = -40.0
    return [normal, np.zeros((2, 32), np.float32), halves, ties, -ties, spike,
            (normal * 1e-6).astype(np.float32), (normal * 1e4).astype(np.float32)]


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
def test_quantizers_equal_ggufs_byte_for_byte_in_both_forms(kind):
    block = {"q8_0": q.quantize_block_q8_0, "q4_0": q.quantize_block_q4_0}[kind]
    for rows in awkward_rows(np.random.default_rng(0)):
        theirs = gguf.quants.quantize(rows, QTYPES[kind])
        fast = q.QUANTIZERS[kind](rows)
        reference = np.frombuffer(b"".join(block(b) for b in rows.reshape(-1, 32)),
                                  np.uint8).reshape(theirs.shape)
        assert fast.dtype == np.uint8 and np.array_equal(fast, theirs)
        assert np.array_equal(reference, theirs)


def test_quantized_blocks_hold_the_documented_layout():
    x = np.arange(32, dtype=np.float32) - 16.0  # largest magnitude: -16 at index 0
    b8 = q.quantize_block_q8_0(x)
    assert len(b8) == q.Q8_0_BYTES == 34
    assert np.frombuffer(b8[:2], np.float16)[0] == np.float16(16 / 127)
    assert np.frombuffer(b8[2:], np.int8)[0] == -127
    b4 = q.quantize_block_q4_0(x)
    assert len(b4) == q.Q4_0_BYTES == 18
    d = np.frombuffer(b4[:2], np.float16)[0]
    assert d == np.float16(-16 / -8)  # the signed extreme keeps its sign: d = max / -8
    low, high = b4[2] & 0xF, b4[2] >> 4  # weight 0 in the low nibble, weight 16 the high
    assert (low, high) == (0, 8)  # -16 -> q 0 (d * (0 - 8)); 0 -> q 8


def test_a_row_not_a_whole_number_of_blocks_is_refused():
    with pytest.raises(ValueError, match="not a whole number of 32-weight blocks"):
        q.quantize_q8_0(np.zeros((2, 48), np.float32))


@pytest.mark.parametrize("name, shape, requested, stored", [
    ("blk.0.attn_q.weight", (64, 64), "q4_0", "q4_0"),
    ("token_embd.weight", (512, 64), "q8_0", "q8_0"),
    ("output.weight", (512, 64), "f16", "f16"),
    ("blk.0.attn_norm.weight", (64,), "q8_0", "f32"),
    ("blk.0.attn_q_norm.weight", (16,), "f16", "f32"),
    ("blk.0.attn_qkv.bias", (192,), "q8_0", "f32"),
    ("position_embd.weight", (64, 64), "q8_0", "f32"),
    ("blk.0.ffn_down.weight", (64, 48), "q8_0", "f16"),  # 48-wide rows: no whole blocks
    ("blk.0.ffn_down.weight", (64, 48), "f32", "f32"),
])
def test_which_tensors_keep_float32(name, shape, requested, stored):
    assert gguf_write.tensor_type(name, np.zeros(shape, np.float32), requested) == stored


def tiny(family: str, **overrides) -> GlassLM:
    sizes = dict(vocab_size=300, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=32)
    cfg = Config.preset(family, **{**sizes, **overrides})
    model = GlassLM(cfg)
    rng = np.random.default_rng(0)
    for _, p in model.named_parameters():
        p.data[...] = 0.1 * rng.standard_normal(p.data.shape)
    return model


def read(path) -> tuple[dict, dict]:
    """(key -> value, tensor name -> (type name, numpy shape)) through gguf's GGUFReader."""
    reader = gguf.GGUFReader(path)
    keys = {}
    for name, field in reader.fields.items():
        keys[name] = field.contents()
    tensors = {t.name: (t.tensor_type.name, tuple(int(n) for n in reversed(t.shape)))
               for t in reader.tensors}
    return keys, tensors


def test_a_llama_file_holds_the_keys_and_tensors_llamacpp_reads(tmp_path):
    from glassllm.formats import llama2c
    tok = llama2c.tokenizer_from_llama2c(shared_data_path("llama2c", "tok512.bin"))
    model = tiny("llama", n_kv_heads=2, rope_theta=5e5, norm_eps=1e-6, vocab_size=512)
    kinds = gguf_write.write_gguf(model, tmp_path / "m.gguf", tok, type="q8_0")
    keys, tensors = read(tmp_path / "m.gguf")
    assert keys["general.architecture"] == "llama"
    assert keys["general.file_type"] == 7
    assert (keys["llama.context_length"], keys["llama.embedding_length"],
            keys["llama.block_count"], keys["llama.feed_forward_length"],
            keys["llama.attention.head_count"], keys["llama.attention.head_count_kv"],
            keys["llama.rope.dimension_count"]) == (32, 64, 2, 128, 4, 2, 16)
    assert keys["llama.rope.freq_base"] == 5e5
    assert keys["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    assert keys["tokenizer.ggml.model"] == "llama"
    assert len(keys["tokenizer.ggml.tokens"]) == 512
    assert keys["tokenizer.ggml.tokens"][300] == tok.pieces[300].replace(" ", "\u2581")
    assert keys["tokenizer.ggml.token_type"][:4] == [2, 3, 3, 6]
    assert tensors["token_embd.weight"] == ("Q8_0", (512, 64))
    assert tensors["blk.1.attn_k.weight"] == ("Q8_0", (32, 64))
    assert tensors["blk.1.ffn_norm.weight"] == ("F32", (64,))
    assert "output.weight" not in tensors  # tied: llama.cpp reuses token_embd
    assert kinds == {name: kind.lower() for name, (kind, _) in tensors.items()}


def test_gpt2_and_neox_hold_a_fused_qkv_and_gemma_its_norms_plus_one(tmp_path):
    from glassllm.formats import gguf_names
    neox = tiny("neox")
    gguf_write.write_gguf(neox, tmp_path / "n.gguf")
    keys, tensors = read(tmp_path / "n.gguf")
    assert tensors["blk.0.attn_qkv.weight"] == ("F32", (192, 64))
    assert "blk.0.attn_q.weight" not in tensors
    assert keys["gptneox.use_parallel_residual"] is True
    assert keys["gptneox.rope.dimension_count"] == 4  # rotary_pct 0.25 of head_dim 16
    assert keys["tokenizer.ggml.model"] == "none"
    gemma = tiny("gemma2", attn_softcap=5.0)
    stored = gguf_write.gguf_tensors(gemma, "gemma2")
    name = gguf_names.gguf_name("blocks.0.attention_norm.weight")
    state = dict(gemma.named_parameters())
    np.testing.assert_array_equal(stored[name], state["blocks.0.attention_norm.weight"].data + 1)


@pytest.mark.parametrize("family, overrides, message", [
    ("gptneo", {}, "Config.family 'gptneo' has no llama.cpp architecture"),
    ("gemma2", dict(attn_scale=0.3), "Config.attn_scale = 0.3: llama.cpp's gemma2 graph"),
    ("gemma", dict(tie_embeddings=False), "Config.tie_embeddings = False"),
    ("llama", dict(norm="layer"), "Config.norm = 'layer': llama.cpp's llama graph has no"),
    ("qwen3", dict(qk_norm=None), "Config.qk_norm = None"),
])
def test_what_llamacpp_cannot_run_is_refused_in_one_line(family, overrides, message, tmp_path):
    with pytest.raises(ValueError, match=message) as e:
        gguf_write.write_gguf(tiny(family, **overrides), tmp_path / "x.gguf")
    assert "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_nothing_is_left_when_writing_fails(tmp_path):
    model = tiny("llama")
    dict(model.named_parameters())["blocks.1.mlp.up.weight"].data[3, 4] = np.nan
    with pytest.raises(ValueError, match="blk.1.ffn_up.weight holds NaN"):
        gguf_write.write_gguf(model, tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="GGUF type 'q5_0' is not one of"):
        gguf_write.write_gguf(tiny("llama"), tmp_path / "x.gguf", type="q5_0")
    old = tmp_path / "old.gguf"
    old.write_bytes(b"previous")
    with pytest.raises(ValueError):
        gguf_write.write_gguf(model, old)
    assert old.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.gguf"]
    assert leftover_temporaries(old) == []


def test_cli_convert_to_gguf(tmp_path, capsys):
    from glassllm.cli import main
    from glassllm.formats import files
    files.save(tiny("qwen2", n_kv_heads=2), tmp_path / "m.safetensors")
    assert main(["convert", "--model", str(tmp_path / "m.safetensors"), "--to-gguf",
                 str(tmp_path / "m.gguf"), "--type", "q4_0"]) == 0
    keys, tensors = read(tmp_path / "m.gguf")
    assert keys["general.architecture"] == "qwen2" and keys["general.file_type"] == 2
    assert tensors["blk.0.ffn_up.weight"][0] == "Q4_0"
    assert "holds no tokenizer" in capsys.readouterr().err
    files.save(tiny("gptneo"), tmp_path / "neo.safetensors")
    assert main(["convert", "--model", str(tmp_path / "neo.safetensors"), "--to-gguf",
                 str(tmp_path / "neo.gguf")]) == 2
    assert not (tmp_path / "neo.gguf").exists()
    assert "gptneo" in capsys.readouterr().err


def as_stored(model: GlassLM, kind: str) -> GlassLM:
    """A copy of `model` whose weights are what a `kind` GGUF file holds: each tensor through
    `gguf_write.tensor_type`'s choice, quantized and dequantized by the `gguf` package.
    (Quantization blocks run along GGUF's rows, glassllm's Linear input axis; the q/k
    permutation and the qkv join move whole rows, so they commute with it.)"""
    import copy
    from glassllm.formats.gguf_names import gguf_name
    twin = copy.deepcopy(model)
    for name, p in twin.named_parameters():
        linear = p.data.ndim == 2 and "embedding" not in name
        rows = np.ascontiguousarray(p.data.T if linear else p.data)
        stored = gguf_write.tensor_type(gguf_name(name), rows, kind)
        if stored == "f32":
            continue
        qtype = getattr(gguf.GGMLQuantizationType, stored.upper())
        back = gguf.quants.dequantize(gguf.quants.quantize(rows, qtype), qtype)
        p.data[...] = back.T if linear else back
    return twin


ROUND_TRIP = {"llama": dict(n_kv_heads=2), "qwen2": dict(n_kv_heads=2),
              "qwen3": dict(n_kv_heads=2, head_dim=32), "gemma": dict(head_dim=32),
              "gemma2": dict(n_kv_heads=2, sliding_window=8, attn_softcap=5.0,
                             final_softcap=20.0),
              "gemma3": dict(sliding_window=8, rope_local_theta=100.0,
                             layer_types=("sliding_attention", "full_attention")),
              "phi": {}, "neox": {}, "gpt2": {}, "olmo2": dict(n_kv_heads=2)}


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
@pytest.mark.parametrize("family", sorted(ROUND_TRIP))
def test_glassllm_reads_back_what_it_wrote(family, kind, tmp_path):
    """glassllm.load of an exported file: the same config and, weight for weight, what the
    file holds (the float weights for f32; gguf's dequantization of the quantized ones)."""
    from glassllm.formats.gguf_read import read_gguf
    model = tiny(family, **ROUND_TRIP[family])
    gguf_write.write_gguf(model, tmp_path / "m.gguf", type=kind)
    back, tokenizer = read_gguf(tmp_path / "m.gguf")
    assert tokenizer is None  # tokenizer model "none"
    # GGUF keeps float keys as float32; the reader gives back the decimal they were written
    # from (norm_eps 1e-5, not 9.99999975e-06)
    assert back.cfg.to_dict() == model.cfg.to_dict()
    expected = dict(as_stored(model, kind).named_parameters())
    for name, p in back.named_parameters():
        np.testing.assert_allclose(p.data, expected[name].data, rtol=0, atol=1e-6,
                                   err_msg=name)


@pytest.mark.parametrize("kind", ["sp", "bpe"])
def test_the_tokenizer_reads_back_with_the_same_ids(kind, tmp_path):
    import glassllm
    from glassllm.formats import llama2c
    from glassllm.formats.gguf_read import read_gguf
    from glassllm.tokenizers.bpe import BPETokenizer
    if kind == "sp":
        tok = llama2c.tokenizer_from_llama2c(shared_data_path("llama2c", "tok512.bin"))
    else:
        tok = BPETokenizer.from_gpt2_files(shared_data_path("gpt2", "vocab.json"),
                                           shared_data_path("gpt2", "merges.txt"))
    model = tiny("llama" if kind == "sp" else "gpt2", vocab_size=tok.vocab_size + 3)
    gguf_write.write_gguf(model, tmp_path / "m.gguf", tok)  # 3 "[PAD<i>]" ids at the end
    read, back = read_gguf(tmp_path / "m.gguf")
    text = "Once upon a time,  Lily said: \"don't!\"\n\nCaf\u00e9 \u6771\u4eac 42."
    assert back.encode(text).tolist() == tok.encode(text).tolist()
    assert back.decode(tok.encode(text)) == text
    assert read.cfg.vocab_size == tok.vocab_size + 3
    # the model keeps the padded rows; the tokenizer its own ids, the "[PAD<i>]" ones dropped
    # (as llama.cpp's converter pads a vocabulary: tokens of type UNUSED at the end)
    assert back.vocab_size == tok.vocab_size
    lm = glassllm.load(str(tmp_path / "m.gguf"))
    assert (lm.tokenizer.vocab_size, lm.model.cfg.vocab_size) == (tok.vocab_size, tok.vocab_size + 3)


def test_a_gguf_file_is_read_by_its_magic_and_requantized_by_convert(tmp_path, capsys):
    # a GGUF without the suffix (Ollama's blobs are named by their digest) was read as
    # safetensors ("header too large"), and `convert --model X.gguf --to-gguf Y --type q4_0`
    # refused the GGUF it could have read
    import shutil
    from glassllm.cli import main
    from glassllm.formats.gguf_read import read_gguf
    from glassllm.formats.lm import load_model_and_tokenizer
    model = tiny("llama", n_kv_heads=2)
    gguf_write.write_gguf(model, tmp_path / "m.gguf", type="f16")
    shutil.copy(tmp_path / "m.gguf", tmp_path / "sha256-0123abcd")
    blob, _ = load_model_and_tokenizer(tmp_path / "sha256-0123abcd")
    ids = np.arange(6)[None]
    np.testing.assert_array_equal(blob(ids).numpy(), read_gguf(tmp_path / "m.gguf")[0](ids)
                                  .numpy())
    assert main(["convert", "--model", str(tmp_path / "m.gguf"), "--to-gguf",
                 str(tmp_path / "q.gguf"), "--type", "q4_0"]) == 0
    keys, tensors = read(tmp_path / "q.gguf")
    assert keys["general.file_type"] == 2 and tensors["blk.0.ffn_up.weight"][0] == "Q4_0"
    capsys.readouterr()


def test_a_model_on_the_strict_device_is_written_from_the_host(tmp_path):
    # write_gguf read p.data, an array_api_strict array: "Can't convert array on the
    # 'array_api_strict.Device('device1')' device to a NumPy array" (files.save and to_hf
    # already wrote from the host)
    pytest.importorskip("array_api_strict")
    from glassllm.formats.gguf_read import read_gguf
    model = tiny("llama", n_kv_heads=2)
    on_cpu = gguf_write.gguf_tensors(model, "llama")
    model.to("strict")
    gguf_write.write_gguf(model, tmp_path / "m.gguf", type="f32")
    back, _ = read_gguf(tmp_path / "m.gguf")
    ids = np.arange(6)[None]
    np.testing.assert_allclose(back(ids).numpy(), model(ids).numpy(), rtol=1e-5, atol=1e-6)
    for name, array in gguf_write.gguf_tensors(model, "llama").items():
        np.testing.assert_array_equal(array, on_cpu[name])


def test_cli_convert_to_gguf_of_a_byte_tokenizer_model_writes_ids_only_with_a_note(tmp_path,
                                                                                    capsys):
    # the default model of `glassllm train` (byte tokenizer) could not be exported at all:
    # "a ByteTokenizer cannot be written as GGUF tokenizer keys"
    from glassllm.cli import main
    from glassllm.formats import files
    from glassllm.formats.gguf_read import read_gguf
    from glassllm.tokenizers import ByteTokenizer
    model = tiny("llama", vocab_size=257, n_kv_heads=2)
    files.save(model, tmp_path / "m.safetensors", ByteTokenizer())
    assert main(["convert", "--model", str(tmp_path / "m.safetensors"), "--to-gguf",
                 str(tmp_path / "m.gguf")]) == 0
    err = capsys.readouterr().err
    assert "not this byte tokenizer (it stays in" in err
    keys, _ = read(tmp_path / "m.gguf")
    assert keys["tokenizer.ggml.model"] == "none"
    back, tokenizer = read_gguf(tmp_path / "m.gguf")
    ids = np.arange(8)[None]
    assert tokenizer is None
    np.testing.assert_allclose(back(ids).numpy(), model(ids).numpy(), rtol=1e-5, atol=1e-6)
    assert not gguf_write.stores_tokenizer(ByteTokenizer())
