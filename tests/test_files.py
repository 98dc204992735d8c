"""glassllm.formats.files: safetensors save/load/export_float16, and every way a file can be broken."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from glassllm import Config, GlassLM, no_grad
from glassllm.formats import files, safetensors_io
from glassllm.tokenizers import ByteTokenizer

CONFIGS = {
    "llama": Config(d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, max_len=12),
    "llama_untied": Config(d_model=16, n_layers=1, n_heads=2, max_len=8, tie_embeddings=False),
    "gpt2": Config(d_model=16, n_layers=2, n_heads=2, max_len=12, family="gpt2"),
}
PROBE = np.array([[1, 200, 3, 65, 66, 256, 0, 7]])


def tiny(name="llama", seed=0) -> GlassLM:
    return GlassLM(CONFIGS[name], seed=seed)


def logits(model, ids=PROBE):
    with no_grad():
        return model(ids).data


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "model.safetensors"
    files.save(tiny(), path, tokenizer=ByteTokenizer())
    return path


def leftovers(directory):
    """Files other than the expected ones: temporaries an interrupted write would leave."""
    return sorted(p for p in os.listdir(directory) if p.endswith(".tmp"))


# --------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_save_load_round_trip_is_exact(tmp_path, name):
    model = tiny(name, seed=3)
    path = tmp_path / "m.safetensors"
    files.save(model, path)
    loaded = files.load(path)
    assert loaded.cfg == model.cfg
    original, restored = model.state_dict(), loaded.state_dict()
    assert list(restored) == list(original)
    for key in original:
        assert restored[key].dtype == np.float32
        np.testing.assert_array_equal(restored[key], original[key], err_msg=key)
    np.testing.assert_array_equal(logits(loaded), logits(model))


def test_file_layout_names_dtypes_and_metadata(saved):
    model = tiny()
    with safe_open(saved, framework="numpy") as f:
        meta = f.metadata()
        keys = set(f.keys())
        dtypes = {f.get_slice(k).get_dtype() for k in keys}
    assert keys == {name for name, _ in model.named_parameters()}
    assert "blocks.0.attention.query.weight" in keys
    assert dtypes == {"F32"}
    assert meta["format"] == "glassllm"
    assert json.loads(meta["config"]) == model.cfg.to_dict()
    assert json.loads(meta["tokenizer"]) == {"type": "byte"}


def test_load_tokenizer_stored_and_absent(tmp_path, saved):
    assert isinstance(files.load_tokenizer(saved), ByteTokenizer)
    # A glassllm file whose metadata has no tokenizer entry is weights-only: None.
    model = tiny()
    path = tmp_path / "no_tok.safetensors"
    save_file(model.state_dict(), path, metadata={"format": "glassllm",
                                                  "config": json.dumps(model.cfg.to_dict())})
    assert files.load_tokenizer(path) is None
    assert files.load(path).cfg == model.cfg


# The vocabularies of no known tokenizer: the README's smallest example model has vocab_size 8.
@pytest.mark.parametrize("cfg", [
    Config(vocab_size=8, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, max_len=4),
    Config(vocab_size=2, d_model=8, n_layers=1, n_heads=2, max_len=1, family="gpt2"),
    Config(vocab_size=257, d_model=8, n_layers=1, n_heads=2, max_len=4),
    Config(vocab_size=3000, d_model=8, n_layers=1, n_heads=2, max_len=4,
           tie_embeddings=False),
], ids=["spec001_vocab8", "gpt2_vocab2", "vocab257", "vocab3000_untied"])
def test_save_without_tokenizer_writes_weights_only_for_any_vocab(tmp_path, cfg):
    model = GlassLM(cfg, seed=1)
    path, half = tmp_path / "m.safetensors", tmp_path / "h.safetensors"
    files.save(model, path)
    files.export_float16(model, half)
    for p in (path, half):
        with safe_open(p, framework="numpy") as f:
            assert "tokenizer" not in f.metadata()  # no tokenizer metadata at all
        assert files.load_tokenizer(p) is None
    ids = np.arange(cfg.max_len)[None, :] % cfg.vocab_size
    np.testing.assert_array_equal(logits(files.load(path), ids), logits(model, ids))
    assert files.load(half).cfg == cfg
    # A tokenizer that fits is stored; one with more ids than the model is still refused.
    if cfg.vocab_size >= 257:
        files.save(model, path, tokenizer=ByteTokenizer())
        assert isinstance(files.load_tokenizer(path), ByteTokenizer)
    else:
        before = path.read_bytes()
        for save in (files.save, files.export_float16):
            with pytest.raises(ValueError, match=f"257 ids but the model's vocab_size is "
                                                 f"{cfg.vocab_size}"):
                save(model, path, tokenizer=ByteTokenizer())
        assert path.read_bytes() == before


def test_load_tokenizer_corrupt_description(tmp_path):
    model = tiny()
    path = tmp_path / "bad_tok.safetensors"
    meta = {"format": "glassllm", "config": json.dumps(model.cfg.to_dict()),
            "tokenizer": "{not json"}
    save_file(model.state_dict(), path, metadata=meta)
    with pytest.raises(ValueError, match="tokenizer") as e:
        files.load_tokenizer(path)
    assert str(path) in str(e.value)


class BigTokenizer(ByteTokenizer):
    vocab_size = 1000


def test_save_refuses_tokenizer_larger_than_vocab(tmp_path):
    path = tmp_path / "m.safetensors"
    with pytest.raises(ValueError, match="1000 ids"):
        files.save(tiny(), path, tokenizer=BigTokenizer())
    assert not path.exists() and leftovers(tmp_path) == []
    # load_tokenizer refuses one written around save's check (a vocab-8 model, 257 ids).
    model = GlassLM(Config(vocab_size=8, d_model=8, n_layers=1, n_heads=2, max_len=4))
    meta = {"format": "glassllm", "config": json.dumps(model.cfg.to_dict()),
            "tokenizer": ByteTokenizer().to_json()}
    save_file(model.state_dict(), path, metadata=meta)
    with pytest.raises(ValueError, match="257 ids but the model's vocab_size is 8") as e:
        files.load_tokenizer(path)
    assert str(path) in str(e.value)


# --------------------------------------------------------------------------- atomic writes
def test_save_replaces_existing_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "m.safetensors"
    files.save(tiny(seed=1), path)
    files.save(tiny(seed=2), path)
    np.testing.assert_array_equal(logits(files.load(path)), logits(tiny(seed=2)))
    assert os.listdir(tmp_path) == ["m.safetensors"]


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_failed_write_keeps_old_file_and_removes_temporary(tmp_path, monkeypatch, error):
    path = tmp_path / "m.safetensors"
    files.save(tiny(seed=1), path)
    before = path.read_bytes()

    def half_write(tensors, filename, metadata=None):  # writes some bytes, then fails
        with open(filename, "wb") as f:
            f.write(b"\x10\x00\x00\x00partial")
        raise error

    monkeypatch.setattr(safetensors_io, "save_file", half_write)  # the one signed writer
    with pytest.raises(type(error)):
        files.save(tiny(seed=2), path)
    assert path.read_bytes() == before
    assert leftovers(tmp_path) == []


def test_save_nan_model_writes_nothing(tmp_path):
    model = tiny()
    model.blocks[0].mlp.up.weight.data[0, 0] = np.nan
    path = tmp_path / "m.safetensors"
    with pytest.raises(ValueError, match="blocks.0.mlp.up.weight"):
        files.save(model, path)
    assert os.listdir(tmp_path) == []


def test_save_into_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        files.save(tiny(), tmp_path / "nope" / "m.safetensors")


def test_saved_file_gets_ordinary_permissions(tmp_path, saved):
    probe = tmp_path / "probe"
    probe.write_bytes(b"")  # a file created the ordinary way, under the current umask
    assert (saved.stat().st_mode & 0o777) == (probe.stat().st_mode & 0o777)


# --------------------------------------------------------------------------- broken files
def assert_clear_error(path, match):
    """load and load_tokenizer raise ValueError naming the file and the problem."""
    for fn in (files.load, files.load_tokenizer):
        with pytest.raises(ValueError, match=match) as e:
            fn(path)
        assert str(path) in str(e.value)


def test_missing_file(tmp_path):
    for fn in (files.load, files.load_tokenizer):
        with pytest.raises(FileNotFoundError, match="no such model file"):
            fn(tmp_path / "absent.safetensors")


def test_directory(tmp_path):
    with pytest.raises(IsADirectoryError):
        files.load(tmp_path)


@pytest.mark.parametrize("keep", [0, 3, 8, 20, -100, -1])
def test_truncated_file(tmp_path, saved, keep):
    data = saved.read_bytes()
    path = tmp_path / "cut.safetensors"
    path.write_bytes(data[:keep] if keep >= 0 else data[:len(data) + keep])
    assert_clear_error(path, "not a readable safetensors file")


def test_random_bytes(tmp_path):
    path = tmp_path / "random.safetensors"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    assert_clear_error(path, "not a readable safetensors file")


def test_text_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("just some text, not a model\n" * 20)
    assert_clear_error(path, "not a readable safetensors file")


def header_span(data: bytes) -> tuple[int, int]:
    n = int.from_bytes(data[:8], "little")
    return 8, 8 + n


@pytest.mark.parametrize("where", ["size", "open_brace", "tensor_name", "dtype", "offsets"])
def test_flipped_header_byte(tmp_path, saved, where):
    data = bytearray(saved.read_bytes())
    start, end = header_span(bytes(data))
    header = bytes(data[start:end])
    at = {
        "size": 1,  # the header length itself: now points far past the end
        "open_brace": start,
        "tensor_name": start + header.index(b"blocks.0.attention.key.weight") + 3,
        "dtype": start + header.index(b'"F32"') + 1,
        "offsets": start + header.index(b"data_offsets") + len(b'data_offsets":[') + 1,
    }[where]
    data[at] ^= 0x5A
    path = tmp_path / "flipped.safetensors"
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError) as e:
        files.load(path)
    assert str(path) in str(e.value)


def test_any_header_byte_flip_gives_value_error_or_the_same_model(tmp_path, saved):
    """Fuzz every 3rd header byte: the only outcomes are ValueError naming the file or (when
    the flip lands in a harmless spot) exactly the saved model -- never a raw library error,
    never a changed model: the digest covers the config, so a flipped config digit that used
    to load as another model is refused now (tests/test_fuzz_files.py goes further)."""
    data = saved.read_bytes()
    original = files.load(saved).state_dict()
    start, end = header_span(data)
    path = tmp_path / "fuzz.safetensors"
    outcomes = {"ValueError": 0, "loaded": 0}
    for at in range(0, end, 3):
        broken = bytearray(data)
        broken[at] ^= 0x01 if at >= start else 0x40
        path.write_bytes(bytes(broken))
        try:
            model = files.load(path)
        except ValueError as e:
            assert str(path) in str(e)
            outcomes["ValueError"] += 1
        else:
            outcomes["loaded"] += 1
            assert model.cfg == tiny().cfg
            for name, w in model.state_dict().items():
                np.testing.assert_array_equal(w, original[name])
    assert outcomes["ValueError"] > 100


def test_torch_style_safetensors_is_foreign(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as torch_save_file
    path = tmp_path / "torch.safetensors"
    torch_save_file({"weight": torch.zeros(3, 4)}, str(path), metadata={"format": "pt"})
    assert_clear_error(path, "not a glassllm model.*'pt'")


def test_safetensors_without_metadata_is_foreign(tmp_path):
    path = tmp_path / "plain.safetensors"
    save_file(tiny().state_dict(), path)
    assert_clear_error(path, "not a glassllm model.*None")


def write_glassllm(path, state, config_text, **extra):
    save_file(state, path, metadata={"format": "glassllm", "config": config_text, **extra})
    return path


@pytest.mark.parametrize("config_text,match", [
    ('{"vocab_size": 257, "d_model": 16,', "not valid JSON"),
    ("[1, 2, 3]", "must be a JSON object"),
    ('{"d_model": 16, "n_heads": 3}', "invalid model config.*divisible"),
    ('{"d_model": 16, "n_heads": 4, "colour": "blue"}', "invalid model config.*colour"),
    ('{"d_model": 16, "n_heads": 4, "rope_theta": "big"}', "invalid model config"),
])
def test_corrupt_config(tmp_path, config_text, match):
    path = write_glassllm(tmp_path / "m.safetensors", tiny().state_dict(), config_text)
    assert_clear_error(path, match)


def test_missing_config(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file(tiny().state_dict(), path, metadata={"format": "glassllm"})
    assert_clear_error(path, "no model config")


def test_huge_config_fails_fast_without_allocating(tmp_path):
    cfg = dict(CONFIGS["llama"].to_dict(), d_model=2 ** 20, d_ff=2 ** 20, n_heads=4)
    path = write_glassllm(tmp_path / "m.safetensors", tiny().state_dict(), json.dumps(cfg))
    with pytest.raises(ValueError, match="token_embedding.weight.*shape"):
        files.load(path)


def state_and_config(name="llama"):
    model = tiny(name)
    return model.state_dict(), json.dumps(model.cfg.to_dict())


def test_missing_tensor(tmp_path):
    state, config = state_and_config()
    del state["blocks.1.mlp.down.weight"]
    path = write_glassllm(tmp_path / "m.safetensors", state, config)
    with pytest.raises(ValueError, match="missing tensor.*blocks.1.mlp.down.weight"):
        files.load(path)


def test_unexpected_and_renamed_tensors(tmp_path):
    state, config = state_and_config()
    state["blocks.0.attention.qkv.weight"] = state.pop("blocks.0.attention.query.weight")
    path = write_glassllm(tmp_path / "m.safetensors", state, config)
    with pytest.raises(ValueError, match=r"missing tensor.*attention.query.weight.*"
                                         r"unexpected tensor.*attention.qkv.weight"):
        files.load(path)


def test_wrong_shape(tmp_path):
    state, config = state_and_config()
    state["blocks.0.mlp.up.weight"] = state["blocks.0.mlp.up.weight"][:, :-1].copy()
    path = write_glassllm(tmp_path / "m.safetensors", state, config)
    with pytest.raises(ValueError, match=r"'blocks.0.mlp.up.weight' has shape \(16, 63\)"):
        files.load(path)


def test_tensors_of_another_config(tmp_path):
    # gpt2 tensors under a llama config: many names differ, and the error lists a few.
    state, _ = state_and_config("gpt2")
    _, llama_config = state_and_config("llama")
    path = write_glassllm(tmp_path / "m.safetensors", state, llama_config)
    with pytest.raises(ValueError, match=r"missing tensor.*mlp.gate.weight.*"
                                         r"unexpected tensor.*and \d+ more"):
        files.load(path)


@pytest.mark.parametrize("dtype,match", [(np.int32, "dtype I32"), (np.float64, "dtype F64")])
def test_unsupported_dtype(tmp_path, dtype, match):
    state, config = state_and_config()
    state["final_norm.weight"] = state["final_norm.weight"].astype(dtype)
    path = write_glassllm(tmp_path / "m.safetensors", state, config)
    with pytest.raises(ValueError, match=f"final_norm.weight.*{match}"):
        files.load(path)


def test_non_finite_weight_in_file(tmp_path):
    state, config = state_and_config()
    state["blocks.1.attention.value.weight"][2, 3] = np.inf
    path = write_glassllm(tmp_path / "m.safetensors", state, config)
    with pytest.raises(ValueError, match="blocks.1.attention.value.weight.*NaN or inf"):
        files.load(path)


# --------------------------------------------------------------------------- float16 export
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_export_float16_writes_f16_and_loads_as_rounded_float32(tmp_path, name):
    model = tiny(name, seed=5)
    path = tmp_path / "m16.safetensors"
    report = files.export_float16(model, path)
    assert report["max_abs_logit_diff"] <= report["tolerance"]
    assert report["max_abs_logit_diff"] > 0  # rounding did change something: a real check
    with safe_open(path, framework="numpy") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F16"}
        assert f.metadata()["format"] == "glassllm"
    n_params = sum(p.size for p in model.parameters())
    assert report["float16_bytes"] == 2 * n_params
    loaded = files.load(path)
    for (key, p), q in zip(model.named_parameters(), loaded.parameters()):
        assert q.dtype == np.float32
        np.testing.assert_array_equal(q.data, p.data.astype(np.float16).astype(np.float32),
                                      err_msg=key)
    # The reported difference is the one a user gets on the default probe batch.
    probe = np.random.default_rng(0).integers(0, model.cfg.vocab_size,
                                              size=(2, min(model.cfg.max_len, 32)))
    diff = np.max(np.abs(logits(loaded, probe).astype(np.float64) - logits(model, probe)))
    assert diff == pytest.approx(report["max_abs_logit_diff"], rel=1e-6)
    assert leftovers(tmp_path) == []


def test_export_float16_tolerance_rule_is_relative_to_max_logit(tmp_path):
    model = tiny("gpt2", seed=1)
    model.token_embedding.weight.data *= 40  # logits of tens: the relative rule matters
    probe = PROBE
    report = files.export_float16(model, tmp_path / "m16.safetensors", probe_ids=probe,
                                  tolerance=0.02)
    max_logit = float(np.max(np.abs(logits(model, probe))))
    assert max_logit > 1
    assert report["max_abs_logit"] == pytest.approx(max_logit, rel=1e-6)
    assert report["tolerance"] == pytest.approx(0.02 * max_logit, rel=1e-6)
    assert report["relative_tolerance"] == 0.02
    assert report["probe_shape"] == probe.shape
    # Small logits: the floor of 1 applies.
    small = files.export_float16(tiny(), tmp_path / "s16.safetensors", tolerance=0.02)
    assert small["max_abs_logit"] < 1 and small["tolerance"] == 0.02


def test_export_float16_failing_logit_check_writes_nothing(tmp_path):
    path = tmp_path / "m16.safetensors"
    path.write_bytes(b"old content")
    with pytest.raises(ValueError, match="float16 logits differ") as e:
        files.export_float16(tiny(), path, tolerance=1e-9)
    assert "nothing written" in str(e.value)
    assert path.read_bytes() == b"old content"
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("value", [70000.0, -65600.0])
def test_export_float16_overflow_names_the_tensor(tmp_path, value):
    model = tiny()
    model.blocks[1].attention.output.weight.data[0, 1] = value
    path = tmp_path / "m16.safetensors"
    with pytest.raises(ValueError, match="blocks.1.attention.output.weight.*overflows float16"):
        files.export_float16(model, path)
    assert os.listdir(tmp_path) == []


def test_export_float16_accepts_the_largest_float16(tmp_path):
    model = tiny("llama_untied")
    # An unused-ish weight at exactly float16's max: in range, so the range check passes.
    model.lm_head.weight.data[0, 5] = 65504.0
    with pytest.raises(ValueError, match="float16 logits differ|nothing written") as e:
        files.export_float16(model, tmp_path / "m.safetensors", tolerance=1e-12)
    assert "overflows" not in str(e.value)


def test_export_float16_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="tolerance"):
        files.export_float16(tiny(), tmp_path / "m.safetensors", tolerance=0)
    with pytest.raises(ValueError, match="probe_ids"):
        files.export_float16(tiny(), tmp_path / "m.safetensors", probe_ids=[[1, 999]])
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("field,value", [("n_layers", 10 ** 9), ("d_ff", 10 ** 9),
                                         ("vocab_size", 10 ** 9), ("n_kv_heads", 1)])
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_whole_config_is_checked_against_the_header_before_building(tmp_path, name, field,
                                                                    value):
    import time
    state, config = state_and_config(name)
    fields = dict(json.loads(config), **{field: value})
    path = write_glassllm(tmp_path / "m.safetensors", state, json.dumps(fields))
    start = time.perf_counter()
    # gpt2 has no grouped KV heads: that config is refused before its tensors are looked at
    expected = "invalid model config.*grouped-query" if (name, field) == ("gpt2", "n_kv_heads") \
        else "tensors do not match|has shape"
    with pytest.raises(ValueError, match=expected) as e:
        files.load(path)
    assert time.perf_counter() - start < 1.0  # no walk over 10**9 layers, no allocation
    assert str(path) in str(e.value)
    if field == "n_layers":  # counted, not listed
        assert re.search(r"missing tensor.*blocks\.2\..*and \d{9,} more", str(e.value))


@pytest.mark.parametrize("field,value", [("rope_theta", "x"), ("norm_eps", float("inf")),
                                         ("tie_embeddings", "no"), ("rope_theta", True)])
def test_config_metadata_of_a_wrong_type_is_a_value_error(tmp_path, field, value):
    state, config = state_and_config()
    fields = dict(json.loads(config), **{field: value})
    path = write_glassllm(tmp_path / "m.safetensors", state, json.dumps(fields))
    with pytest.raises(ValueError, match=f"invalid model config.*{field}"):
        files.load(path)


def test_save_to_an_empty_path_is_a_clear_value_error():
    with pytest.raises(ValueError, match="empty"):
        files.save(tiny(), "")


def test_directory_error_explains_what_a_hugging_face_directory_needs(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(IsADirectoryError, match="config.json \\+ model.safetensors.*neither"):
        files.load(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(IsADirectoryError, match="has model.safetensors\\)"):
        files.load(tmp_path)


# --------------------------------------------------------------------------- digest (issue 9)
def test_a_flipped_bit_in_the_data_names_the_file_and_the_tensor(tmp_path, saved):
    """A weight of 0.0025 with one exponent bit flipped is still finite (8.6e35-like): only
    the digest sees it."""
    data = bytearray(saved.read_bytes())
    start, end = header_span(bytes(data))
    with safe_open(str(saved), framework="numpy") as f:
        name = "blocks.1.mlp.down.weight"
        lo = json.loads(bytes(data[start:end]))[name]["data_offsets"][0]
    data[end + lo + 3] ^= 0x20  # the exponent's top bit of the first float32 (little-endian)
    path = tmp_path / "flipped.safetensors"
    path.write_bytes(bytes(data))
    with safe_open(str(path), framework="numpy") as f:
        w = f.get_tensor(name)
    assert np.all(np.isfinite(w))  # finiteness alone would have let it through
    with pytest.raises(ValueError, match=re.escape(f"{path}: tensor '{name}' is damaged")):
        files.load(path)


def test_the_digest_is_in_the_metadata_and_covers_every_tensor(saved):
    from glassllm.formats import integrity
    with safe_open(str(saved), framework="numpy") as f:
        meta = f.metadata()
        tensors = {n: f.get_tensor(n) for n in f.keys()}
    assert meta["version"] == files.VERSION == "2"
    digest = json.loads(meta["digest"])
    assert digest["algorithm"] == "sha256" and set(digest["tensors"]) == set(tensors)
    for name, array in tensors.items():
        assert digest["tensors"][name] == integrity.tensor_sha256(array)
    assert digest["metadata"] == integrity.metadata_sha256(meta)


def test_version_1_files_without_a_digest_still_load(tmp_path):
    model = tiny(seed=5)
    path = write_glassllm(tmp_path / "old.safetensors", model.state_dict(),
                          json.dumps(model.cfg.to_dict()), tokenizer=ByteTokenizer().to_json())
    loaded = files.load(path)
    for name, w in model.state_dict().items():
        np.testing.assert_array_equal(loaded.state_dict()[name], w)
    assert files.load_tokenizer(path).vocab_size == 257


@pytest.mark.parametrize("version, digest, match", [
    ("2", None, "must carry a digest"),
    ("3", None, "version '3'"),
    ("3", "keep", "version '3'"),
    (None, "keep", "version '1'"),  # a digest on a file that says nothing of its version
])
def test_a_missing_digest_or_an_unknown_version_is_refused(tmp_path, saved, version, digest,
                                                          match):
    from glassllm.formats import integrity
    with safe_open(str(saved), framework="numpy") as f:
        meta = f.metadata()
        tensors = {n: f.get_tensor(n) for n in f.keys()}
    meta = {k: v for k, v in meta.items() if k not in ("version", "digest")}
    if version is not None:
        meta["version"] = version
    if digest == "keep":
        meta = integrity.sign(tensors, meta)
    path = tmp_path / "v.safetensors"
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + re.escape(match)):
        files.load(path)
    with pytest.raises(ValueError, match=re.escape(match)):
        files.load_tokenizer(path)


def test_an_edited_config_or_tokenizer_is_refused(tmp_path, saved):
    with safe_open(str(saved), framework="numpy") as f:
        meta = f.metadata()
        tensors = {n: f.get_tensor(n) for n in f.keys()}
    cfg = json.loads(meta["config"])
    cfg["norm_eps"] = cfg["norm_eps"] * 10  # a valid config of the same shapes: another model
    path = tmp_path / "edited.safetensors"
    save_file(tensors, str(path), metadata={**meta, "config": json.dumps(cfg)})
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*metadata.*not what was"):
        files.load(path)


def test_a_device_or_fifo_is_a_value_error_naming_it_without_blocking(tmp_path):
    """/dev/null gave safetensors' bare "No such device (os error 19)" naming no file, and a
    FIFO blocked load() forever waiting for a writer: neither is a model file."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path in ("/dev/null", str(fifo)):
        for read in (files.load, files.load_tokenizer):
            with pytest.raises(ValueError, match=f"{path}: not a regular file"):
                read(path)


def test_an_os_error_from_the_reader_keeps_its_type_and_names_the_file(tmp_path, saved,
                                                                        monkeypatch):
    """A permission or I/O error stays an OSError of its type (the CLI reports it as one),
    saying what failed and naming the user's file -- for model files and checkpoints alike,
    since both go through `safetensors_io`."""
    from glassllm.formats.checkpoint import load_checkpoint

    def denied(path, framework):
        raise PermissionError(13, "Permission denied", path)
    monkeypatch.setattr(safetensors_io, "safe_open", denied)
    for load, what in ((files.load, "the model file"), (files.load_tokenizer, "the model file"),
                       (load_checkpoint, "the checkpoint")):
        with pytest.raises(PermissionError, match=f"cannot read {what}: Permission denied") \
                as e:
            load(saved)
        assert e.value.filename == str(saved) and e.value.errno == 13
