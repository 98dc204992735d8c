"""Parity of glassllm.formats.hf against transformers: GPT-2 and Llama checkpoints in and out.

Every model is built locally from a config with random weights (nothing is downloaded), then
scaled so logits reach magnitudes above 50, where a wrong op cannot hide in rounding. The
reference is transformers itself: eager attention (float32-exact), eval mode (dropout off).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.numpy import load_file, save_file  # noqa: E402

from glassllm import Config, GlassLM# noqa: E402
from glassllm.formats import hf, safetensors_io  # noqa: E402
from glassllm.generate import Generator, Sampling  # noqa: E402
from glassllm.model import KVCache  # noqa: E402

V, T_PROMPT, N_NEW = 300, 8, 20


def tolerance(logits: np.ndarray) -> float:
    """The issue's bound: 1e-4 of the largest logit (at least 1e-4)."""
    return 1e-4 * max(1.0, float(np.abs(logits).max()))


def batch(seed: int = 0, shape=(2, 32)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, size=shape)


def scale_weights(named_params, seed: int, std: float = 0.3):
    """Overwrite parameters in place: N(0, std) matrices, norm gains near 2 (final norm near
    8), small biases.

    named_params: (name, numpy view) pairs; a name containing "norm"/"ln" is a norm.
    """
    rng = np.random.default_rng(seed)
    for name, array in named_params:
        is_norm = any(k in name for k in ("norm", "ln_"))
        is_final = any(k in name for k in ("ln_f.", "model.norm.", "final_norm."))
        if is_norm and name.endswith("weight"):  # a large final gain makes large logits
            array[...] = (8.0 if is_final else 2.0) + 0.2 * rng.standard_normal(array.shape)
        elif name.endswith("bias"):
            array[...] = 0.1 * rng.standard_normal(array.shape)
        else:
            array[...] = std * rng.standard_normal(array.shape)


def make_hf(kind: str, seed: int = 0, std: float = 0.3):
    """A tiny random transformers model in eval mode with eager attention."""
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=V, n_positions=64, n_embd=64, n_layer=2,
                                         n_head=4, bos_token_id=None, eos_token_id=None)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(
            vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-5, rope_theta=50000.0 if kind == "llama_untied" else 10000.0,
            tie_word_embeddings=(kind == "llama_tied"), bos_token_id=None, eos_token_id=None)
        model = transformers.LlamaForCausalLM(config)
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        scale_weights([(n, p.numpy()) for n, p in model.named_parameters()], seed, std)
    return model.eval()


def hf_logits(model, idx: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(idx)).logits.numpy()


def hf_greedy(model, prompt: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = model.generate(torch.tensor(prompt), max_new_tokens=N_NEW, do_sample=False,
                             min_new_tokens=N_NEW, eos_token_id=None, pad_token_id=0)
    return out[:, prompt.shape[1]:].numpy()


def greedy_no_cache(model: GlassLM, prompt: np.ndarray) -> np.ndarray:
    """Argmax of a full re-forward at every step: no KV cache involved."""
    idx = prompt.copy()
    for _ in range(N_NEW):
        nxt = model(idx).data[:, -1].argmax(-1)
        idx = np.concatenate([idx, nxt[:, None]], axis=1)
    return idx[:, prompt.shape[1]:]


def greedy_kv_cache(model: GlassLM, prompt: np.ndarray) -> np.ndarray:
    """Prefill the prompt once, then feed one token at a time against the KV cache."""
    cache = KVCache(model.cfg, batch_size=prompt.shape[0])
    logits = model(prompt, cache).data[:, -1]
    out = []
    for _ in range(N_NEW):
        nxt = logits.argmax(-1)
        out.append(nxt)
        logits = model(nxt[:, None], cache).data[:, -1]
    return np.stack(out, axis=1)


KINDS = ["gpt2", "llama_tied", "llama_untied"]


_SAVED: dict = {}


def saved_checkpoint(kind: str, tmp_path_factory):
    """(kind, transformers model, saved directory, glassllm model loaded from it), built once."""
    if kind not in _SAVED:
        model = make_hf(kind)
        directory = tmp_path_factory.mktemp(kind)
        model.save_pretrained(directory)
        _SAVED[kind] = kind, model, directory, hf.from_hf(directory)
    return _SAVED[kind]


@pytest.fixture(params=KINDS)
def hf_checkpoint(request, tmp_path_factory):
    return saved_checkpoint(request.param, tmp_path_factory)


@pytest.fixture
def gpt2_checkpoint(tmp_path_factory):
    return saved_checkpoint("gpt2", tmp_path_factory)


# --------------------------------------------------------------------------- import parity
def test_config_is_read(hf_checkpoint):
    kind, model, _, glass = hf_checkpoint
    cfg = glass.cfg
    assert (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.max_len) == \
        (V, 64, 2, 4, 64)
    if kind == "gpt2":
        assert (cfg.family, cfg.n_kv_heads, cfg.d_ff, cfg.norm_eps) == ("gpt2", 4, 256, 1e-5)
    else:
        assert (cfg.family, cfg.n_kv_heads, cfg.d_ff) == ("llama", 2, 96)
        assert cfg.tie_embeddings == (kind == "llama_tied")
        assert cfg.rope_theta == (50000.0 if kind == "llama_untied" else 10000.0)


def test_logits_match_transformers(hf_checkpoint):
    _, model, _, glass = hf_checkpoint
    idx = batch(1)
    want = hf_logits(model, idx)
    got = glass(idx).data
    assert np.abs(want).max() > 50, "weights are not scaled enough to make the test sharp"
    assert got.shape == want.shape == (2, 32, V)
    assert np.abs(got - want).max() <= tolerance(want)


def test_greedy_tokens_match_transformers(hf_checkpoint):
    _, model, _, glass = hf_checkpoint
    prompt = batch(2, shape=(2, T_PROMPT))
    want = hf_greedy(model, prompt)
    assert want.shape == (2, N_NEW)
    np.testing.assert_array_equal(greedy_no_cache(glass, prompt), want)
    np.testing.assert_array_equal(greedy_kv_cache(glass, prompt), want)


def test_greedy_tokens_with_generator(hf_checkpoint):
    _, model, _, glass = hf_checkpoint
    prompt = batch(3, shape=(1, T_PROMPT))
    want = hf_greedy(model, prompt)[0]
    gen = Generator(glass, prompt[0])  # prefill, then one cached position per token
    greedy = Sampling(temperature=0.0)
    got = [gen.next_token(greedy) for _ in range(N_NEW)]
    np.testing.assert_array_equal(got, want)


def _gpt2_gradients(tmp_path):
    """(glassllm grads in HF names, torch grads by HF name) for one cross-entropy step.

    Weights N(0, 0.15): logits still reach ~40, but the loss (~28 nats) is not so extreme
    that float32 rounding of the two libraries' different summation orders dominates (at
    std 0.3 the relative difference grows to ~4e-5; in float64 it is ~5e-8 at either scale).
    """
    model = make_hf("gpt2", seed=5, std=0.15)
    model.save_pretrained(tmp_path)
    glass = hf.from_hf(tmp_path)
    idx, targets = batch(6), batch(7)

    glass.loss(idx, targets).backward()
    glass_grads = hf._state_to_hf(glass.cfg, {n: p.grad for n, p in glass.named_parameters()})

    logits = model(torch.tensor(idx)).logits
    torch.nn.functional.cross_entropy(logits.reshape(-1, V),
                                      torch.tensor(targets).reshape(-1)).backward()
    torch_grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
    return glass_grads, torch_grads


def test_imported_gpt2_gradients_match_torch(tmp_path):
    glass_grads, torch_grads = _gpt2_gradients(tmp_path)
    assert sorted(glass_grads) == sorted(torch_grads)  # tied lm_head appears once, as wte
    scale = max(np.abs(g).max() for g in torch_grads.values())
    worst = max(np.abs(glass_grads[n] - torch_grads[n]).max() for n in torch_grads)
    assert scale > 0 and worst <= 1e-5 * scale, (worst, scale)


# --------------------------------------------------------------------------- export parity
def glass_model(family: str, tie: bool = True, seed: int = 0) -> GlassLM:
    cfg = Config(family=family, vocab_size=V, d_model=64, n_layers=2, n_heads=4,
                 n_kv_heads=4 if family == "gpt2" else 2, max_len=64,
                 d_ff=160 if family == "gpt2" else 96, norm_eps=1e-5,
                 rope_theta=10000.0 if family == "gpt2" else 20000.0,  # gpt2 has no rope
                 tie_embeddings=tie)
    model = GlassLM(cfg, seed=seed)
    scale_weights([(n, p.data) for n, p in model.named_parameters()], seed + 1)
    return model


@pytest.mark.parametrize("family,tie", [("gpt2", True), ("llama", True), ("llama", False)])
def test_round_trip_through_transformers(tmp_path, family, tie):
    model = glass_model(family, tie)
    hf.to_hf(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]

    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation="eager").eval()
    want_class = "GPT2LMHeadModel" if family == "gpt2" else "LlamaForCausalLM"
    assert type(loaded).__name__ == want_class
    idx = batch(8)
    got = model(idx).data
    theirs = hf_logits(loaded, idx)
    assert np.abs(got).max() > 50
    assert np.abs(theirs - got).max() <= tolerance(got)

    back = hf.from_hf(tmp_path)
    assert back.cfg == model.cfg
    before, after = model.state_dict(), back.state_dict()
    assert sorted(before) == sorted(after)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)

    # transformers' own save of what it loaded also comes back identical
    resaved = tmp_path / "resaved"
    loaded.save_pretrained(resaved)
    again = hf.from_hf(resaved).state_dict()
    for name in before:
        np.testing.assert_array_equal(again[name], before[name], err_msg=name)


def test_to_hf_writes_shards_with_an_index_that_transformers_loads(tmp_path):
    """max_shard_size as transformers' save_pretrained: shards model-0000i-of-0000n plus the
    index, split as huggingface_hub splits (tensors in order, a new shard when the next
    would pass the limit, an oversized tensor alone); transformers loads the directory with
    the same logits, from_hf gets every tensor back bit for bit, and a re-export as one file
    removes the shards and the index (no stale weights left for a reader to prefer)."""
    model = glass_model("llama", tie=False)
    limit = 100_000  # the 300 x 64 float32 embedding (76.8 kB) fits; two of them do not
    hf.to_hf(model, tmp_path, max_shard_size="100KB")
    index = json.loads((tmp_path / hf.INDEX_FILE).read_text())
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) >= 3 and shards == sorted(set(index["weight_map"].values()))
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert not (tmp_path / hf.WEIGHTS_FILE).exists()
    tensors = hf._state_to_hf(model.cfg, model.state_dict())
    assert sorted(index["weight_map"]) == sorted(tensors)
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in tensors.values())
    order = list(tensors)  # the shards hold consecutive runs of the tensors, each under limit
    for name in shards:
        held = load_file(tmp_path / name)
        assert sum(t.nbytes for t in held.values()) <= limit
        positions = sorted(order.index(t) for t in held)
        assert positions == list(range(positions[0], positions[0] + len(positions)))
    # huggingface_hub's own split of the same tensors gives the same shards
    from huggingface_hub import split_state_dict_into_shards_factory
    theirs = split_state_dict_into_shards_factory(
        tensors, get_storage_size=lambda t: t.nbytes, max_shard_size="100KB",
        filename_pattern="model{suffix}.safetensors")
    assert theirs.tensor_to_filename == index["weight_map"]

    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation="eager").eval()
    idx = batch(8)
    got = model(idx).data
    assert np.abs(hf_logits(loaded, idx) - got).max() <= tolerance(got)
    back = hf.from_hf(tmp_path).state_dict()
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)

    with pytest.raises(FileExistsError, match="already holds"):
        hf.to_hf(model, tmp_path)  # an index counts as a checkpoint already there
    hf.to_hf(model, tmp_path, overwrite=True)  # default size: one file again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    hf.to_hf(model, tmp_path, overwrite=True, max_shard_size=limit)
    assert sorted(p.name for p in tmp_path.glob("model*")) == sorted(shards + [hf.INDEX_FILE])


@pytest.mark.parametrize("size", [0, -5, "0KB", "5XB", "lots", "", True, 1.5])
def test_bad_max_shard_size_is_refused_before_writing(tmp_path, size):
    with pytest.raises(ValueError, match="max_shard_size"):
        hf.to_hf(glass_model("gpt2"), tmp_path / "out", max_shard_size=size)
    assert not (tmp_path / "out").exists()


def test_cli_to_hf_max_shard_size(tmp_path, capsys):
    from glassllm.formats import files
    from glassllm.cli import main
    model_file = tmp_path / "m.safetensors"
    files.save(glass_model("gpt2"), model_file)
    assert main(["convert", "--model", str(model_file), "--to-hf", str(tmp_path / "hf"),
                 "--max-shard-size", "60KB"]) == 0
    assert (tmp_path / "hf" / hf.INDEX_FILE).is_file()
    assert len(list((tmp_path / "hf").glob("model-*-of-*.safetensors"))) > 1
    assert main(["convert", "--model", str(model_file), "--to-hf", str(tmp_path / "b"),
                 "--max-shard-size", "big"]) == 2
    assert "--max-shard-size" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_float64_gpt2_logits_agree_with_transformers_to_1e_12(tmp_path, gpt2_checkpoint):
    """The README's claim: with float64 on both sides the imported GPT-2's logits agree with
    transformers' to ~7e-13 (max |logit| ~70), so the float32 gaps above are summation order,
    not a wrong op. Bound 1e-12 absolute; float32 arithmetic on either side would miss it by
    eight orders of magnitude."""
    _, model, directory, _ = gpt2_checkpoint
    glass = hf.from_hf(directory)
    for p in glass.parameters():
        p.data = p.data.astype(np.float64)
    reference = transformers.GPT2LMHeadModel.from_pretrained(
        directory, attn_implementation="eager", dtype=torch.float64).eval()
    idx = batch(1)
    got = glass(idx).data
    want = hf_logits(reference, idx)
    assert got.dtype == want.dtype == np.float64
    assert np.abs(want).max() > 50
    worst = np.abs(got - want).max()
    assert worst <= 1e-12, worst


def test_to_hf_bos_token_id_is_the_tokenizers_start_id(tmp_path):
    """A tokenizer with a BOS (SentencePiece/Llama: bos 1, eos 2) exports bos_token_id 1, so
    transformers' generate() starts where glassllm's unconditional sample does."""
    from glassllm.tokenizers import ByteTokenizer

    class WithBos(ByteTokenizer):
        bos_id = 1

        def to_json(self):
            return json.dumps({"type": "test-with-bos"})  # not a BPE: no tokenizer.json

    hf.to_hf(glass_model("llama"), tmp_path, WithBos())
    written = json.loads((tmp_path / "config.json").read_text())
    assert (written["bos_token_id"], written["eos_token_id"]) == (1, 256)


def test_gpt2_with_grouped_kv_heads_is_not_a_valid_config(tmp_path):
    # GPT-2 has no grouped KV heads: such a model could never be exported, so it is refused
    # when the config is made, and to_hf's own check stays as a second line.
    with pytest.raises(ValueError, match="n_kv_heads=2 must equal n_heads=4"):
        Config(family="gpt2", vocab_size=V, d_model=64, n_layers=1, n_heads=4, n_kv_heads=2,
               max_len=16)
    cfg = Config(family="gpt2", vocab_size=V, d_model=64, n_layers=1, n_heads=4, max_len=16)
    cfg.n_kv_heads = 2  # dataclasses do not re-validate on assignment
    with pytest.raises(ValueError, match="n_kv_heads"):
        hf.config_to_hf(cfg)


# --------------------------------------------------------------------------- other checkpoints
def test_sharded_checkpoint(tmp_path, gpt2_checkpoint):
    _, model, _, glass = gpt2_checkpoint
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / hf.INDEX_FILE).is_file()
    assert not (tmp_path / hf.WEIGHTS_FILE).exists()
    sharded = hf.from_hf(tmp_path).state_dict()
    for name, value in glass.state_dict().items():
        np.testing.assert_array_equal(sharded[name], value, err_msg=name)
    (tmp_path / shards[-1]).unlink()
    with pytest.raises(FileNotFoundError, match=shards[-1]):
        hf.from_hf(tmp_path)


def test_bfloat16_checkpoint_is_upcast(tmp_path):
    model = make_hf("llama_tied").to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    glass = hf.from_hf(tmp_path)
    want = model.model.layers[0].self_attn.q_proj.weight.detach().float().numpy().T
    got = glass.blocks[0].attention.query.weight.data
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_original_gpt2_names_without_prefix(tmp_path, gpt2_checkpoint):
    """OpenAI's upload names tensors h.0.attn... (no "transformer.") and keeps mask buffers."""
    _, _, directory, glass = gpt2_checkpoint
    tensors = {k.removeprefix("transformer."): v
               for k, v in load_file(directory / "model.safetensors").items()}
    tensors["h.0.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), dtype=np.float32))
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    loaded = hf.from_hf(tmp_path).state_dict()
    for name, value in glass.state_dict().items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)


def test_max_len_override(hf_checkpoint):
    kind, _, directory, glass = hf_checkpoint
    short = hf.from_hf(directory, max_len=16)
    assert short.cfg.max_len == 16
    idx = batch(9, shape=(2, 16))
    np.testing.assert_allclose(short(idx).data, glass(idx).data, rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="max_len"):
        hf.from_hf(directory, max_len=65)


# --------------------------------------------------------------------------- errors
def copy_checkpoint(src, dst, edit_config=None, edit_tensors=None):
    config = json.loads((src / "config.json").read_text())
    tensors = load_file(src / "model.safetensors")
    if edit_config:
        edit_config(config)
    if edit_tensors:
        edit_tensors(tensors)
    dst.mkdir(exist_ok=True)
    (dst / "config.json").write_text(json.dumps(config))
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("dtype,value", [(np.int8, 3), (np.bool_, True), (np.int32, 1)])
def test_an_integer_or_bool_tensor_is_refused_naming_file_and_tensor(tmp_path, gpt2_checkpoint,
                                                                      dtype, value):
    """A quantised (int8) or damaged (bool) tensor where weights are expected is not cast."""
    _, _, directory, _ = gpt2_checkpoint
    name = "transformer.h.0.mlp.c_fc.weight"
    bad = copy_checkpoint(directory, tmp_path / "m", edit_tensors=lambda t: t.update(
        {name: np.full(t[name].shape, value, dtype=dtype)}))
    # the name as stored in the file, prefix and all
    with pytest.raises(ValueError,
                       match=rf"{bad}: tensor 'transformer\.h\.0\.mlp\.c_fc\.weight' has dtype"):
        hf.from_hf(bad)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_weights_are_refused_naming_file_and_tensor(tmp_path, hf_checkpoint, value):
    kind, _, directory, _ = hf_checkpoint
    name = "transformer.ln_f.weight" if kind == "gpt2" else "model.norm.weight"

    def poison(tensors):
        tensors[name] = tensors[name].copy()
        tensors[name][3] = value
    bad = copy_checkpoint(directory, tmp_path / "m", edit_tensors=poison)
    with pytest.raises(ValueError,
                       match=r"'(transformer\.ln_f|model\.norm)\.weight' holds 1 NaN or inf"):
        hf.from_hf(bad)


def test_directory_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        hf.from_hf(tmp_path)
    with pytest.raises(FileNotFoundError, match="not found"):
        hf.from_hf(tmp_path / "nowhere")


def test_config_without_weights(tmp_path, gpt2_checkpoint):
    _, _, directory, _ = gpt2_checkpoint
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        hf.from_hf(tmp_path)


def test_unknown_model_type(tmp_path, gpt2_checkpoint):
    _, _, directory, _ = gpt2_checkpoint
    bad = copy_checkpoint(directory, tmp_path / "m",
                          edit_config=lambda c: c.update(model_type="mixtral"))
    with pytest.raises(ValueError, match="model_type 'mixtral'"):
        hf.from_hf(bad)


def test_shape_mismatch_names_the_tensor(tmp_path, hf_checkpoint):
    kind, _, directory, _ = hf_checkpoint
    field, tensor = ("n_inner", "transformer.h.0.mlp.c_fc.weight") if kind == "gpt2" else \
        ("intermediate_size", "model.layers.0.mlp.gate_proj.weight")
    bad = copy_checkpoint(directory, tmp_path / "m", edit_config=lambda c: c.update({field: 80}))
    with pytest.raises(ValueError, match=f"tensor '{tensor}' has shape"):
        hf.from_hf(bad)


def test_missing_and_unexpected_tensors(tmp_path, hf_checkpoint):
    kind, _, directory, _ = hf_checkpoint
    name = "transformer.h.1.ln_2.bias" if kind == "gpt2" else "model.layers.1.mlp.up_proj.weight"
    missing = copy_checkpoint(directory, tmp_path / "a", edit_tensors=lambda t: t.pop(name))
    with pytest.raises(ValueError, match="missing"):
        hf.from_hf(missing)
    extra = copy_checkpoint(directory, tmp_path / "b",
                            edit_tensors=lambda t: t.update(stray=np.zeros(3, np.float32)))
    with pytest.raises(ValueError, match="unexpected tensor.*stray"):
        hf.from_hf(extra)


def test_a_float8_tensor_is_a_clear_error_and_memory_errors_are_not_hidden(
        tmp_path, gpt2_checkpoint, monkeypatch):
    """safetensors' NumPy backend cannot hold float8 (AttributeError inside the library): a
    ValueError naming the file. A MemoryError (or any error that is not about the file)
    propagates as itself instead of becoming "not a readable safetensors file"."""
    import struct
    _, _, directory, _ = gpt2_checkpoint
    header = json.dumps({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})
    (tmp_path / "f8.safetensors").write_bytes(struct.pack("<Q", len(header))
                                              + header.encode() + b"\0\0")
    with pytest.raises(ValueError, match=r"f8.safetensors: not a readable safetensors file "
                                         r"\(a tensor dtype NumPy cannot hold"):
        hf._read_safetensors(tmp_path / "f8.safetensors")

    def out_of_memory(*args, **kwargs):
        raise MemoryError("injected")
    monkeypatch.setattr(safetensors_io, "safe_open", out_of_memory)  # the one reader
    with pytest.raises(MemoryError, match="injected"):
        hf.from_hf(directory)


def test_corrupt_weights_file(tmp_path, gpt2_checkpoint):
    _, _, directory, _ = gpt2_checkpoint
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        hf.from_hf(tmp_path)


GPT2_BASE = {"model_type": "gpt2", "vocab_size": V, "n_embd": 64, "n_layer": 2, "n_head": 4,
             "n_positions": 64}
LLAMA_BASE = {"model_type": "llama", "vocab_size": V, "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 64, "intermediate_size": 96}


@pytest.mark.parametrize("base,field,value", [
    (GPT2_BASE, "activation_function", "relu"),
    (GPT2_BASE, "activation_function", "gelu"),  # the exact erf GELU is a different model
    (GPT2_BASE, "scale_attn_by_inverse_layer_idx", True),
    (GPT2_BASE, "reorder_and_upcast_attn", True),
    (GPT2_BASE, "scale_attn_weights", False),
    (GPT2_BASE, "tie_word_embeddings", False),
    (LLAMA_BASE, "rope_scaling", {"rope_type": "linear", "factor": 2.0}),
    (LLAMA_BASE, "rope_parameters", {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}),
    (LLAMA_BASE, "sliding_window", 16),
    (LLAMA_BASE, "num_local_experts", 8),  # a field glassllm does not know: never ignored
    (LLAMA_BASE, "pretraining_tp", 2),
    (LLAMA_BASE, "mlp_bias", True),
    (LLAMA_BASE, "hidden_act", "gelu"),
    (LLAMA_BASE, "rope_parameters", {"rope_type": "default", "rope_theta": 1e4,
                                     "partial_rotary_factor": 0.5}),
])
def test_unsupported_config_names_the_field(base, field, value):
    hf.config_from_hf(base)  # the base itself is fine
    with pytest.raises(ValueError, match=field):
        hf.config_from_hf({**base, field: value})


def test_config_defaults_and_rope_theta_sources():
    assert hf.config_from_hf(LLAMA_BASE).rope_theta == 10000.0
    assert hf.config_from_hf({**LLAMA_BASE, "rope_theta": 5e5}).rope_theta == 5e5
    new_style = {**LLAMA_BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 3e4}}
    assert hf.config_from_hf(new_style).rope_theta == 3e4
    with pytest.raises(ValueError, match="disagree"):
        hf.config_from_hf({**new_style, "rope_theta": 1e4})
    with pytest.raises(ValueError, match="'n_embd' is missing"):
        hf.config_from_hf({k: v for k, v in GPT2_BASE.items() if k != "n_embd"})
    cfg = hf.config_from_hf(GPT2_BASE)
    assert (cfg.d_ff, cfg.norm_eps, cfg.tie_embeddings) == (256, 1e-5, True)
    assert hf.config_from_hf({**GPT2_BASE, "activation_function": "gelu_pytorch_tanh"}) == cfg


# --------------------------------------------------------------------------- tokenizer and CLI
WORDS = ("the model reads tokens and predicts the next one; attention mixes positions, "
         "layers stack blocks, gradients flow backward through every fused operation while "
         "weights load from checkpoints quickly").split()
TEXT = " ".join(np.random.default_rng(0).choice(WORDS, 3000)) + "\n"
PROMPT = "the model reads"


@pytest.fixture(scope="module")
def bpe():
    from glassllm.tokenizers import BPETokenizer
    tok = BPETokenizer.train([TEXT], V)
    assert tok.vocab_size == V
    return tok


@pytest.fixture
def gpt2_dir_with_tokenizer(tmp_path, gpt2_checkpoint, bpe):
    """The saved tiny GPT-2 plus GPT-2-style vocab.json + merges.txt of a 300-id BPE."""
    _, model, _, glass = gpt2_checkpoint
    directory = tmp_path / "gpt2_tok"
    model.save_pretrained(directory)
    bpe._tok.model.save(str(directory))  # the tokenizers library writes vocab.json, merges.txt
    assert (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file()
    return directory


def run_cli(capsys, *argv):
    from glassllm.cli import main
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_tokenizer_from_hf_dir(gpt2_dir_with_tokenizer, bpe, tmp_path):
    tok = hf.tokenizer_from_hf(gpt2_dir_with_tokenizer, vocab_size=V)
    np.testing.assert_array_equal(tok.encode(TEXT), bpe.encode(TEXT))
    with pytest.raises(ValueError, match="more than"):
        hf.tokenizer_from_hf(gpt2_dir_with_tokenizer, vocab_size=V - 1)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert hf.tokenizer_from_hf(empty, vocab_size=V) is None  # weights only
    assert hf.tokenizer_from_hf(empty, vocab_size=257).vocab_size == 257  # byte tokenizer


def test_cli_convert_both_ways(tmp_path, capsys, gpt2_dir_with_tokenizer, gpt2_checkpoint, bpe):
    from glassllm.formats import files
    _, _, _, glass = gpt2_checkpoint
    out = tmp_path / "imported.safetensors"
    code, stdout, _ = run_cli(capsys, "convert", "--from-hf", gpt2_dir_with_tokenizer,
                              "--out", out)
    assert code == 0 and "gpt2 model" in stdout and "tokenizer bpe" in stdout
    loaded = files.load(out).state_dict()
    for name, value in glass.state_dict().items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    np.testing.assert_array_equal(files.load_tokenizer(out).encode(TEXT), bpe.encode(TEXT))

    exported = tmp_path / "exported"
    code, stdout, _ = run_cli(capsys, "convert", "--model", out, "--to-hf", exported)
    assert code == 0
    assert sorted(p.name for p in exported.iterdir()) == \
        ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert json.loads((exported / "config.json").read_text())["eos_token_id"] == bpe.eot_id
    np.testing.assert_array_equal(hf.tokenizer_from_hf(exported, V).encode(TEXT),
                                  bpe.encode(TEXT))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        exported, attn_implementation="eager").eval()
    idx = batch(10)
    want = glass(idx).data
    assert np.abs(hf_logits(theirs, idx) - want).max() <= tolerance(want)


def test_cli_generate_from_hf_directory(capsys, gpt2_dir_with_tokenizer, gpt2_checkpoint, bpe):
    _, model, _, _ = gpt2_checkpoint
    ids = [int(i) for i in bpe.encode(PROMPT)]
    new = []
    for _ in range(10):  # transformers' greedy choice, stopping at end-of-text as the CLI does
        token = int(hf_logits(model, np.array([ids + new]))[0, -1].argmax())
        if token == bpe.eot_id:
            break
        new.append(token)
    assert len(new) >= 3, "greedy hit end-of-text at once: the test would check little"
    code, stdout, _ = run_cli(capsys, "generate", "--model", gpt2_dir_with_tokenizer,
                              "--prompt", PROMPT, "--max-new-tokens", 10, "--temperature", 0)
    assert code == 0
    assert stdout == PROMPT + bpe.decode(new) + "\n"


def test_cli_byte_model_round_trip(tmp_path, capsys):
    """A byte-level glassllm model exported to HF carries its tokenizer.json (which
    AutoTokenizer reads: tests/test_hf_tokenizer.py) and generates as the file does; a
    directory without one still gets the byte tokenizer from vocab_size 257."""
    from glassllm.formats import files
    model = GlassLM(Config(vocab_size=257, d_model=32, n_layers=1, n_heads=2, max_len=32), 3)
    from glassllm.tokenizers import ByteTokenizer
    files.save(model, tmp_path / "m.safetensors", tokenizer=ByteTokenizer())
    code, _, _ = run_cli(capsys, "convert", "--model", tmp_path / "m.safetensors",
                         "--to-hf", tmp_path / "hf")
    assert code == 0 and (tmp_path / "hf" / "tokenizer.json").exists()
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written["eos_token_id"] == written["bos_token_id"] == 256  # no BOS: start at eot
    args = ("--prompt", "ab", "--max-new-tokens", 6, "--temperature", 0)
    code, from_file, _ = run_cli(capsys, "generate", "--model", tmp_path / "m.safetensors", *args)
    code2, from_dir, _ = run_cli(capsys, "generate", "--model", tmp_path / "hf", *args)
    assert code == code2 == 0 and from_dir == from_file and from_dir.startswith("ab")
    (tmp_path / "hf" / "tokenizer.json").unlink()  # an export of an earlier glassllm
    code3, without, _ = run_cli(capsys, "generate", "--model", tmp_path / "hf", *args)
    assert code3 == 0 and without == from_file


def test_cli_convert_errors(tmp_path, capsys, gpt2_checkpoint):
    _, _, directory, _ = gpt2_checkpoint
    code, _, err = run_cli(capsys, "convert", "--from-hf", directory)
    assert code == 2 and "either --from-hf DIR --out FILE" in err
    code, _, err = run_cli(capsys, "convert", "--from-hf", tmp_path, "--out", tmp_path / "x")
    assert code == 2 and "config.json" in err


def test_cli_convert_directory_without_tokenizer(tmp_path, capsys, gpt2_checkpoint, bpe):
    """vocab 300 and no tokenizer files: the weights convert alone (never with a wrong
    tokenizer), stderr says so; generate asks for --tokenizer, then works with it."""
    from glassllm.formats import files
    _, _, directory, glass = gpt2_checkpoint
    out = tmp_path / "y.safetensors"
    code, stdout, err = run_cli(capsys, "convert", "--from-hf", directory, "--out", out)
    assert code == 0 and "tokenizer none" in stdout
    assert err.count("\n") == 1 and "has no tokenizer files" in err and str(out) in err
    assert files.load_tokenizer(out) is None
    loaded = files.load(out).state_dict()
    for name, value in glass.state_dict().items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    for model in (directory, out):
        code, stdout, err = run_cli(capsys, "generate", "--model", model, "--prompt", "a")
        assert code == 2 and stdout == "" and err.count("\n") == 1
        assert "has no tokenizer" in err and "--tokenizer PATH" in err
    tok_path = tmp_path / "bpe.json"
    bpe.save(tok_path)
    args = ("--prompt", PROMPT, "--max-new-tokens", 5, "--temperature", 0, "--tokenizer",
            tok_path)
    code, from_file, _ = run_cli(capsys, "generate", "--model", out, *args)
    code2, from_dir, _ = run_cli(capsys, "generate", "--model", directory, *args)
    assert code == code2 == 0 and from_file == from_dir and from_file.startswith(PROMPT)
    # a weights-only file exports to HF too, with no tokenizer file and no special ids
    code, stdout, err = run_cli(capsys, "convert", "--model", out, "--to-hf", tmp_path / "re")
    assert code == 0 and "tokenizer none" in stdout and err == ""
    assert not (tmp_path / "re" / "tokenizer.json").exists()
    assert json.loads((tmp_path / "re" / "config.json").read_text())["bos_token_id"] is None
    again = hf.from_hf(tmp_path / "re").state_dict()
    for name, value in glass.state_dict().items():
        np.testing.assert_array_equal(again[name], value, err_msg=name)
    # --tokenizer at conversion time stores it
    code, _, err = run_cli(capsys, "convert", "--from-hf", directory, "--out", out,
                           "--tokenizer", tok_path)
    assert code == 0 and err == ""
    assert files.load_tokenizer(out).encode(TEXT).tolist() == bpe.encode(TEXT).tolist()


# --------------------------------------------------------------------------- overwriting, types
def test_to_hf_refuses_an_existing_checkpoint_unless_overwrite(tmp_path):
    model = glass_model("llama")
    hf.to_hf(model, tmp_path)
    before = (tmp_path / "model.safetensors").read_bytes()
    other = glass_model("llama", seed=5)
    with pytest.raises(FileExistsError, match="already holds model.safetensors and config.json"):
        hf.to_hf(other, tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes() == before  # untouched
    (tmp_path / "model.safetensors").unlink()  # a config.json alone is refused too
    with pytest.raises(FileExistsError, match="already holds config.json"):
        hf.to_hf(other, tmp_path)
    hf.to_hf(other, tmp_path, overwrite=True)
    np.testing.assert_array_equal(hf.from_hf(tmp_path).state_dict()["final_norm.weight"],
                                  other.state_dict()["final_norm.weight"])


def test_to_hf_refuses_to_replace_a_tokenizer_of_ones_own(tmp_path):
    """tokenizer.json alone (a tokenizer kept beside, no checkpoint yet) is not replaced
    without overwrite; with no tokenizer to write, it is left as it is."""
    from glassllm.tokenizers import ByteTokenizer
    mine = '{"mine": true}\n'
    (tmp_path / "tokenizer.json").write_text(mine)
    with pytest.raises(FileExistsError, match=f"{tmp_path} already holds tokenizer.json;"):
        hf.to_hf(glass_model("llama"), tmp_path, ByteTokenizer())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json"]
    hf.to_hf(glass_model("llama"), tmp_path)  # weights only: the tokenizer is not touched
    assert (tmp_path / "tokenizer.json").read_text() == mine
    hf.to_hf(glass_model("llama"), tmp_path, ByteTokenizer(), overwrite=True)
    assert (tmp_path / "tokenizer.json").read_text() != mine


def test_cli_convert_never_overwrites_the_source_and_needs_force(tmp_path, capsys):
    from glassllm.formats import files
    model = GlassLM(Config(vocab_size=257, d_model=32, n_layers=1, n_heads=2, max_len=32), 3)
    source = tmp_path / "self" / "model.safetensors"
    source.parent.mkdir()
    files.save(model, source)
    before = source.read_bytes()
    for extra in ((), ("--force",)):  # the source itself: refused even with --force
        code, _, err = run_cli(capsys, "convert", "--model", source, "--to-hf", source.parent,
                               *extra)
        assert code == 2 and "--to-hf" in err and "being converted" in err, err
        assert source.read_bytes() == before and not (source.parent / "config.json").exists()
    run_dir = tmp_path / "run"  # another model in the target: refused without --force
    run_dir.mkdir()
    files.save(GlassLM(model.cfg, 9), run_dir / "model.safetensors")
    theirs = (run_dir / "model.safetensors").read_bytes()
    code, _, err = run_cli(capsys, "convert", "--model", source, "--to-hf", run_dir)
    assert code == 2 and "--force" in err and str(run_dir) in err
    assert (run_dir / "model.safetensors").read_bytes() == theirs
    code, _, _ = run_cli(capsys, "convert", "--model", source, "--to-hf", run_dir, "--force")
    assert code == 0 and hf.is_hf_dir(run_dir)


def test_cli_convert_from_hf_never_writes_over_the_checkpoints_own_files(tmp_path, capsys):
    model = GlassLM(Config(vocab_size=257, d_model=32, n_layers=1, n_heads=2, max_len=32), 3)
    hf.to_hf(model, tmp_path)
    weights = tmp_path / "model.safetensors"
    before = weights.read_bytes()
    code, _, err = run_cli(capsys, "convert", "--from-hf", tmp_path, "--out", weights)
    assert code == 2 and "--from-hf checkpoint" in err, err
    assert weights.read_bytes() == before
    code, _, _ = run_cli(capsys, "convert", "--from-hf", tmp_path, "--out",
                         tmp_path / "glass.safetensors")  # a new file beside them is fine
    assert code == 0 and (tmp_path / "glass.safetensors").exists()


@pytest.mark.parametrize("base,field,value,message", [
    (LLAMA_BASE, "rms_norm_eps", "x", "finite positive number"),
    (LLAMA_BASE, "rms_norm_eps", float("nan"), "finite positive number"),
    (LLAMA_BASE, "hidden_size", "128", "must be an integer >= 1"),
    (LLAMA_BASE, "num_hidden_layers", 2.0, "must be an integer >= 1"),
    (LLAMA_BASE, "num_key_value_heads", True, "must be an integer >= 1"),
    (LLAMA_BASE, "head_dim", "16", "must be an integer >= 1"),
    (LLAMA_BASE, "rope_theta", "1e4", "finite positive number"),
    (LLAMA_BASE, "tie_word_embeddings", "no", "true or false"),
    (LLAMA_BASE, "rope_parameters", "default", "must be an object"),
    (GPT2_BASE, "n_embd", -64, "must be an integer >= 1"),
    (GPT2_BASE, "n_inner", "256", "must be an integer >= 1"),
    (GPT2_BASE, "layer_norm_epsilon", [1e-5], "finite positive number"),
    (GPT2_BASE, "scale_attn_weights", 1, "not supported"),
])
def test_config_field_of_a_wrong_type_names_the_field_and_file(base, field, value, message):
    with pytest.raises(ValueError, match=f"^my/config.json: .*{field}.*{message}"):
        hf.config_from_hf({**base, field: value}, where="my/config.json")


def test_from_hf_config_errors_name_the_file(tmp_path, gpt2_checkpoint):
    _, _, directory, _ = gpt2_checkpoint
    bad = tmp_path / "bad"
    copy_checkpoint(directory, bad, edit_config=lambda c: c.update(n_head=5))
    with pytest.raises(ValueError, match=f"{bad / 'config.json'}: .*not divisible by n_heads=5"):
        hf.from_hf(bad)


def test_cli_generate_on_a_tokenizer_only_directory_explains_hf_layout(tmp_path, capsys):
    (tmp_path / "vocab.json").write_text("{}")
    (tmp_path / "merges.txt").write_text("")
    code, _, err = run_cli(capsys, "generate", "--model", tmp_path, "--prompt", "a")
    assert code == 2 and "config.json + model.safetensors" in err and "neither" in err


def test_to_hf_refuses_an_empty_directory_path(tmp_path, monkeypatch, capsys):
    """`--to-hf ""` wrote config.json and model.safetensors into the current directory
    (Path("") is "."), as `--out ""` once wrote to the default path."""
    monkeypatch.chdir(tmp_path)
    model = glass_model("llama")
    with pytest.raises(ValueError, match="empty"):
        hf.to_hf(model, "")
    from glassllm.formats import files
    files.save(model, tmp_path / "m.safetensors")
    code, _, err = run_cli(capsys, "convert", "--model", tmp_path / "m.safetensors", "--to-hf",
                           "")
    assert code == 2 and "empty" in err and err.count("\n") == 1, err
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]


def test_every_glassllm_tokenizer_is_stored_by_to_hf(tmp_path, capsys, bpe):
    """`convert --model FILE --to-hf DIR` of a model with a SentencePiece tokenizer (a
    llama2.c import) once wrote none; now every kind is written (tokenizer.json, which
    AutoTokenizer reads: tests/test_hf_tokenizer.py) unless it does not fit the model."""
    from glassllm.formats import files
    from glassllm.tokenizers import ByteTokenizer, SentencePieceTokenizer
    pieces = ["<unk>", "\n<s>\n", "\n</s>\n"] + [f"<0x{b:02X}>" for b in range(256)] + \
        [" ", "a", "b", "ab"]
    sp = SentencePieceTokenizer(pieces, [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0])
    assert hf.stores_tokenizer(bpe, V) and hf.stores_tokenizer(ByteTokenizer(), 257)
    assert hf.stores_tokenizer(sp, 263) and hf.stores_tokenizer(ByteTokenizer(), 300)
    assert not hf.stores_tokenizer(sp, 262) and not hf.stores_tokenizer(object(), 10**6)
    model = GlassLM(Config(vocab_size=263, d_model=16, n_layers=1, n_heads=2, max_len=8))
    source = tmp_path / "sp.safetensors"
    files.save(model, source, sp)
    code, out, err = run_cli(capsys, "convert", "--model", source, "--to-hf", tmp_path / "d")
    assert (code, err) == (0, "") and out.rstrip().endswith("tokenizer sentencepiece"), out
    back = hf.tokenizer_from_hf(tmp_path / "d", 263)
    assert back.pieces == pieces and back.encode(" ab a").tolist() == sp.encode(" ab a").tolist()
    files.save(GlassLM(Config(vocab_size=V, d_model=16, n_layers=1, n_heads=2, max_len=8)),
               tmp_path / "bpe.safetensors", bpe)
    code, out, err = run_cli(capsys, "convert", "--model", tmp_path / "bpe.safetensors",
                             "--to-hf", tmp_path / "e")
    assert (code, err) == (0, "") and out.rstrip().endswith("tokenizer bpe")
