"""GlassLM and Config: parity with an independent PyTorch model, validation, parameters, KV cache.

The parity tests load the same weights into `tests/torch_reference.py` (written from the
papers / Hugging Face conventions, not from glassllm) and compare the loss and every
parameter gradient.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from glassllm import Config, GlassLM, devices
from glassllm.config import PRESETS
from glassllm import functional as F
from glassllm.model import KVCache

TOL = 1e-5  # the acceptance bound of issue 2 (float32, small config)

PARITY_CONFIGS = {
    "llama_gqa_tied": dict(family="llama", n_heads=4, n_kv_heads=2, tie_embeddings=True),
    "llama_gqa_untied": dict(family="llama", n_heads=4, n_kv_heads=1, tie_embeddings=False),
    "llama_mha_untied": dict(family="llama", n_heads=2, n_kv_heads=2, tie_embeddings=False),
    "gpt2": dict(family="gpt2", n_heads=4),
}


def small_config(**overrides) -> Config:
    fields = dict(vocab_size=13, d_model=16, n_layers=2, n_heads=4, max_len=12)
    fields.update(overrides)
    return Config(**fields)


def perturbed_model(cfg: Config, seed: int = 0) -> GlassLM:
    """A model whose norm gains and biases are not their init values 1 and 0, and whose weights
    are large enough that every path (attention pattern, residual) matters to the loss."""
    model = GlassLM(cfg, seed=seed, device="cpu")
    rng = np.random.default_rng(seed + 100)
    for p in model.parameters():
        p.data = (p.data + rng.normal(0.0, 0.2, p.shape)).astype(p.dtype)
    return model.to(devices.default_device())  # GLASSLLM_DEVICE=strict: the .ci/run pass


def ids(cfg: Config, shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, size=shape)


@pytest.fixture
def reference(torch):
    import torch_reference
    return torch_reference


def to_float64(model: GlassLM) -> GlassLM:
    device = model.device  # converted on the host, then moved back
    model.to("cpu")
    for p in model.parameters():
        p.data = p.data.astype(np.float64)
    if model.cfg.family == "llama":  # rope tables rounded to float32 would cap the precision
        model.rope_cos, model.rope_sin = F.rope_tables(model.cfg.max_len, model.cfg.head_dim,
                                                       model.cfg.rope_theta, dtype=np.float64)
    return model.to(device)


def loss_and_grads_diff(model, reference, torch_dtype):
    cfg = model.cfg
    x, y = ids(cfg, (3, cfg.max_len), 1), ids(cfg, (3, cfg.max_len), 2)
    twin = reference.TorchLM(cfg.to_dict(), dtype=torch_dtype)
    reference.load_glassllm_state(twin, model.state_dict())
    loss = model.loss(x, y)
    loss.backward()
    twin_loss = twin.loss(x, y)
    twin_loss.backward()
    twin_grads = reference.glassllm_gradients(twin)
    names = [n for n, _ in model.named_parameters()]
    assert sorted(names) == sorted(twin_grads)
    grad_diffs = {}
    for name, p in model.named_parameters():
        assert p.grad is not None and twin_grads[name] is not None, name
        assert p.grad.shape == p.shape
        grad = devices.to_host(p.grad)
        assert np.abs(grad).max() > 0, f"{name} got an all-zero gradient"
        grad_diffs[name] = float(np.abs(grad - twin_grads[name]).max())
    logits_diff = float(np.abs(model(x).numpy() - twin(x).detach().numpy()).max())
    return abs(loss.item() - twin_loss.item()), grad_diffs, logits_diff


# "The full model's loss and all parameter gradients match an independent PyTorch
# implementation of the same architecture with the same weights (max abs diff <= 1e-5 on a
# small config) for both families."
@pytest.mark.parametrize("name", sorted(PARITY_CONFIGS))
def test_loss_and_all_gradients_match_torch_float32(name, reference, torch):
    model = perturbed_model(small_config(**PARITY_CONFIGS[name]))
    loss_diff, grad_diffs, logits_diff = loss_and_grads_diff(model, reference, torch.float32)
    assert loss_diff <= TOL
    assert logits_diff <= TOL
    worst = max(grad_diffs, key=grad_diffs.get)
    assert grad_diffs[worst] <= TOL, f"{worst}: {grad_diffs[worst]}"


@pytest.mark.parametrize("name", ["llama_gqa_tied", "llama_gqa_untied", "gpt2"])
def test_loss_and_all_gradients_match_torch_float64(name, reference, torch):
    model = to_float64(perturbed_model(small_config(**PARITY_CONFIGS[name])))
    loss_diff, grad_diffs, logits_diff = loss_and_grads_diff(model, reference, torch.float64)
    assert loss_diff <= 1e-11
    assert logits_diff <= 1e-11
    assert max(grad_diffs.values()) <= 1e-11


def test_reference_sees_a_wrong_weight(reference, torch):
    # The parity test must be able to fail: one transposed-wrong weight changes the loss.
    model = perturbed_model(small_config(**PARITY_CONFIGS["llama_gqa_tied"]))
    state = model.state_dict()
    state["blocks.1.attention.query.weight"] = state["blocks.1.attention.query.weight"].T.copy()
    twin = reference.TorchLM(model.cfg.to_dict())
    reference.load_glassllm_state(twin, state)
    x, y = ids(model.cfg, (2, 8), 1), ids(model.cfg, (2, 8), 2)
    assert abs(model.loss(x, y).item() - twin.loss(x, y).item()) > 1e-4


# --------------------------------------------------------------------------- forward contract
def test_logits_shape_dtype_and_loss_is_mean_nats():
    cfg = small_config()
    model = perturbed_model(cfg)
    x, y = ids(cfg, (2, 5), 3), ids(cfg, (2, 5), 4)
    logits = model(x)
    assert logits.shape == (2, 5, cfg.vocab_size) and logits.numpy().dtype == np.float32
    z = logits.numpy().astype(np.float64)
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    expected = -np.take_along_axis(logp, y[..., None], -1).mean()
    loss = model.loss(x, y)
    assert loss.shape == () and loss.numpy().dtype == np.float32
    np.testing.assert_allclose(loss.item(), expected, rtol=1e-5)


def test_one_dimensional_idx_is_a_batch_of_one():
    cfg = small_config()
    model = perturbed_model(cfg)
    x = ids(cfg, (7,), 5)
    logits = model(x)
    assert logits.shape == (1, 7, cfg.vocab_size)
    np.testing.assert_array_equal(logits.numpy(), model(x[None]).numpy())
    np.testing.assert_array_equal(model.loss(x, x).numpy(), model.loss(x[None], x[None]).numpy())


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_no_dropout_no_mode_same_input_same_logits(family):
    """There is no train/eval mode because nothing would differ: no dropout (the same input
    gives the same logits on every call, with gradients on or off, before and after a
    backward pass) and no batch statistics (a row's logits do not depend on the other rows
    of its batch, so evaluating one sequence alone or inside a batch agrees to float32
    rounding of the batched matmuls)."""
    from glassllm import no_grad
    cfg = small_config(family=family)
    model = perturbed_model(cfg)
    x = ids(cfg, (3, 6), 6)
    first = model(x).numpy()
    np.testing.assert_array_equal(first, model(x).numpy())
    with no_grad():
        np.testing.assert_array_equal(first, model(x).numpy())
    model.loss(x[:, :-1], x[:, 1:]).backward()
    np.testing.assert_array_equal(first, model(x).numpy())
    scale = np.abs(first).max()
    for row in range(3):
        alone = model(x[row:row + 1]).numpy()[0]
        np.testing.assert_allclose(alone, first[row], rtol=0, atol=1e-5 * scale)
        other = x.copy()
        other[[r for r in range(3) if r != row]] = (other[[r for r in range(3) if r != row]]
                                                     + 1) % cfg.vocab_size
        np.testing.assert_allclose(model(other).numpy()[row], first[row], rtol=0,
                                   atol=1e-5 * scale)
    assert not hasattr(model, "eval") and not hasattr(model, "train")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_ids_outside_vocab_raise_value_error_saying_which(family):
    cfg = small_config(family=family)
    model = GlassLM(cfg)
    x = np.zeros((2, 4), dtype=np.int64)
    x[1, 2] = cfg.vocab_size
    with pytest.raises(ValueError, match=rf"token id {cfg.vocab_size} at position \(1, 2\)"):
        model(x)
    x[1, 2] = -1
    with pytest.raises(ValueError, match=r"token id -1"):
        model(x)
    good = np.zeros((2, 4), dtype=np.int64)
    with pytest.raises(ValueError, match="targets"):
        model.loss(good, x)


def test_sequence_longer_than_max_len_raises_value_error_naming_max_len():
    cfg = small_config()
    model = GlassLM(cfg)
    too_long = rf"sequence length {cfg.max_len + 1}.*max_len={cfg.max_len}"
    with pytest.raises(ValueError, match=too_long):
        model(np.zeros(cfg.max_len + 1, dtype=np.int64))
    model(np.zeros(cfg.max_len, dtype=np.int64))  # exactly max_len is fine


def test_other_bad_inputs_raise_value_error():
    cfg = small_config()
    model = GlassLM(cfg)
    with pytest.raises(ValueError, match="integer"):
        model(np.zeros((1, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        model(np.zeros((1, 1, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="empty"):
        model(np.zeros((1, 0), dtype=np.int64))
    with pytest.raises(ValueError, match="shape"):
        model.loss(np.zeros((2, 3), dtype=np.int64), np.zeros((2, 4), dtype=np.int64))


# --------------------------------------------------------------------------- KV cache
@pytest.mark.parametrize("overrides", [dict(family="llama", n_kv_heads=2), dict(family="gpt2")])
def test_kv_cache_logits_equal_full_forward(overrides):
    cfg = small_config(**overrides)
    model = perturbed_model(cfg)
    seq = ids(cfg, (2, cfg.max_len), 7)
    full = model(seq).numpy()
    cache = KVCache(cfg, batch_size=2)
    assert cache.k.shape == (cfg.n_layers, 2, cfg.max_len, cfg.n_kv_heads, cfg.head_dim)
    pieces = [model(seq[:, :5], cache=cache).numpy()]  # a prompt, then one token at a time
    assert cache.length == 5
    for t in range(5, cfg.max_len):
        pieces.append(model(seq[:, t:t + 1], cache=cache).numpy())
        assert cache.length == t + 1
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="max_len"):
        model(seq[:, :1], cache=cache)  # the cache is full


# --------------------------------------------------------------------------- Config
@pytest.mark.parametrize("fields, message", [
    (dict(d_model=10, n_heads=4), "d_model=10 is not divisible by n_heads=4"),
    (dict(n_heads=4, n_kv_heads=3), "n_heads=4 is not divisible by n_kv_heads=3"),
    (dict(d_model=12, n_heads=4), "even head_dim"),  # head_dim 3 with RoPE
    (dict(family="bert"), "family"),
    (dict(family="gpt2", tie_embeddings=False), "ties"),
    (dict(d_ff=0), "d_ff"),
    (dict(rope_theta=0.0), "rope_theta"),
    (dict(norm_eps=-1e-5), "norm_eps"),
])
def test_config_validation(fields, message):
    with pytest.raises(ValueError, match=message):
        small_config(**fields)


@pytest.mark.parametrize("field", ["vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
                                   "max_len"])
@pytest.mark.parametrize("value", [0, -1, 2.0, True])
def test_config_rejects_non_positive_or_non_integer_sizes(field, value):
    with pytest.raises(ValueError, match=field):
        small_config(**{field: value})


@pytest.mark.parametrize("field, value, message", [
    ("d_model", 0, "Config.d_model must be an integer >= 1, got 0"),
    ("n_kv_heads", True, "Config.n_kv_heads must be an integer >= 1, got True"),
    ("d_ff", 3.0, "Config.d_ff must be an integer >= 1, got 3.0"),
    ("norm_eps", float("nan"), "Config.norm_eps must be a finite positive number, got nan"),
    ("rope_theta", "1e4", "Config.rope_theta must be a finite positive number, got '1e4'"),
])
def test_config_number_errors_are_one_line_naming_the_field(field, value, message):
    with pytest.raises(ValueError) as error:
        small_config(**{field: value})
    assert str(error.value) == message


def test_config_llama_d_ff_is_exact_for_any_d_model():
    """8/3 d_model rounded up to a multiple of 32, in integers: a d_model past float's range
    once raised OverflowError (no field named), one past 2^53 got a rounded d_ff."""
    for d in range(1, 3000):
        assert Config(d_model=d, n_heads=1, family="gpt2").d_ff == 4 * d
        assert Config(d_model=2 * d, n_heads=1).d_ff == 32 * math.ceil(8 * 2 * d / 3 / 32)
    for d in (2**70 + 2, 10**400):
        d_ff = Config(d_model=d, n_heads=1).d_ff
        assert d_ff % 32 == 0 and 96 * d_ff >= 32 * 8 * d > 96 * (d_ff - 32)


def test_odd_head_dim_is_fine_without_rope():
    cfg = small_config(family="gpt2", d_model=12, n_heads=4)
    assert cfg.head_dim == 3
    assert GlassLM(cfg)(np.arange(3)).shape == (1, 3, cfg.vocab_size)


def test_config_defaults_and_round_trip():
    cfg = Config()
    assert (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.max_len) == \
        (257, 128, 4, 4, 256)
    assert cfg.n_kv_heads == cfg.n_heads and cfg.family == "llama" and cfg.tie_embeddings
    assert Config(family="gpt2", d_model=64).d_ff == 256
    for c in (cfg, small_config(family="gpt2"), small_config(n_kv_heads=1, d_ff=40,
                                                             tie_embeddings=False)):
        d = c.to_dict()
        assert isinstance(d, dict) and Config.from_dict(d) == c
    with pytest.raises(ValueError, match="unknown field"):
        Config.from_dict({**cfg.to_dict(), "dropout": 0.1})
    with pytest.raises(ValueError):
        Config.from_dict({**cfg.to_dict(), "n_heads": 0})


# --------------------------------------------------------------------------- parameters
def test_glasslm_is_deterministic_by_seed():
    cfg = small_config()
    a, b, c = GlassLM(cfg, seed=3).state_dict(), GlassLM(cfg, seed=3).state_dict(), \
        GlassLM(cfg, seed=4).state_dict()
    assert a.keys() == b.keys() == c.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert any(not np.array_equal(a[n], c[n]) for n in a)


def test_named_parameters_dotted_names_and_shapes():
    cfg = small_config(n_layers=1, n_heads=4, n_kv_heads=2, d_ff=24, tie_embeddings=False)
    shapes = {n: p.shape for n, p in GlassLM(cfg).named_parameters()}
    assert shapes == {
        "token_embedding.weight": (13, 16),
        "blocks.0.attention_norm.weight": (16,),
        "blocks.0.attention.query.weight": (16, 16),
        "blocks.0.attention.key.weight": (16, 8),  # [in, out]: 2 kv heads of 4
        "blocks.0.attention.value.weight": (16, 8),
        "blocks.0.attention.output.weight": (16, 16),
        "blocks.0.mlp_norm.weight": (16,),
        "blocks.0.mlp.gate.weight": (16, 24),
        "blocks.0.mlp.up.weight": (16, 24),
        "blocks.0.mlp.down.weight": (24, 16),
        "final_norm.weight": (16,),
        "lm_head.weight": (16, 13),
    }
    gpt2 = dict(GlassLM(small_config(family="gpt2", n_layers=2)).named_parameters())
    assert "position_embedding.weight" in gpt2 and "lm_head.weight" not in gpt2
    assert gpt2["blocks.1.mlp.up.bias"].shape == (64,)
    assert {"blocks.1.attention_norm.bias", "final_norm.bias",
            "blocks.1.attention.output.bias"} <= set(gpt2)
    assert not any(".gate." in n for n in gpt2)
    model = GlassLM(cfg)
    assert [p for _, p in model.named_parameters()] == model.parameters()


def test_state_dict_returns_copies():
    model = GlassLM(small_config())
    state = model.state_dict()
    weight = model.token_embedding.weight
    before = weight.numpy().copy()
    state["token_embedding.weight"][:] = 7.0
    np.testing.assert_array_equal(weight.numpy(), before)
    weight.data += 1.0
    np.testing.assert_array_equal(state["token_embedding.weight"], 7.0)


def test_load_state_dict_round_trip_copies():
    cfg = small_config()
    a, b = GlassLM(cfg, seed=1), GlassLM(cfg, seed=2)
    state = a.state_dict()
    b.load_state_dict(state)
    for name, p in b.named_parameters():
        np.testing.assert_array_equal(p.numpy(), state[name])
        assert devices.host_dtype(p.data) == np.float32
    state["final_norm.weight"][:] = 5.0
    assert not np.any(b.final_norm.weight.numpy() == 5.0)
    x = ids(cfg, (1, 6), 0)
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())


def test_load_state_dict_is_strict_and_names_the_tensor():
    cfg = small_config()
    model = GlassLM(cfg, seed=1)
    before = model.state_dict()
    state = GlassLM(cfg, seed=2).state_dict()
    missing = dict(state)
    del missing["blocks.1.mlp.up.weight"]
    with pytest.raises(KeyError, match="blocks.1.mlp.up.weight"):
        model.load_state_dict(missing)
    with pytest.raises(KeyError, match="extra.weight"):
        model.load_state_dict({**state, "extra.weight": np.zeros(3)})
    bad = dict(state)
    bad["blocks.0.attention.key.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match="blocks.0.attention.key.weight"):
        model.load_state_dict(bad)
    for name, p in model.named_parameters():  # a failed load changes nothing
        np.testing.assert_array_equal(p.numpy(), before[name])


# --------------------------------------------------------------------------- Config types
def test_config_numpy_integers_and_floats_become_python_numbers():
    import json
    cfg = small_config(vocab_size=np.int64(257), d_model=np.int32(32), d_ff=np.int64(40),
                       rope_theta=np.float32(500.0), norm_eps=np.float64(1e-6),
                       tie_embeddings=np.bool_(False))
    d = cfg.to_dict()
    assert type(d["vocab_size"]) is int and type(d["d_model"]) is int
    assert type(d["d_ff"]) is int and type(d["rope_theta"]) is float
    assert type(d["tie_embeddings"]) is bool and d["tie_embeddings"] is False
    assert Config.from_dict(json.loads(json.dumps(d))) == cfg  # JSON-saveable now


@pytest.mark.parametrize("field,value", [
    ("rope_theta", "x"), ("rope_theta", float("inf")), ("rope_theta", float("nan")),
    ("rope_theta", True), ("norm_eps", "1e-5"), ("norm_eps", float("nan")),
    ("norm_eps", -float("inf")), ("norm_eps", None),
    ("tie_embeddings", "no"), ("tie_embeddings", 0), ("tie_embeddings", None),
    ("family", ["llama"]), ("d_ff", 3.0), ("d_ff", "64"),
])
def test_config_rejects_wrong_types_with_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        small_config(**{field: value})


@pytest.mark.parametrize("overrides", [
    dict(), dict(family="gpt2"), dict(tie_embeddings=False), dict(n_kv_heads=2),
    dict(tie_embeddings=False, n_kv_heads=1, n_layers=3), dict(family="gpt2", d_ff=40)])
def test_parameter_shapes_lists_named_parameters_without_building(overrides):
    from glassllm.model import n_parameter_tensors, parameter_shape, parameter_shapes
    cfg = small_config(**overrides)
    real = [(n, tuple(p.shape)) for n, p in GlassLM(cfg).named_parameters()]
    assert list(parameter_shapes(cfg)) == real
    assert n_parameter_tensors(cfg) == len(real)
    assert cfg.n_params() == sum(p.size for p in GlassLM(cfg).parameters())
    for name, shape in real:
        assert parameter_shape(cfg, name) == shape
    for bogus in ("blocks.99.mlp.up.weight", "blocks.01.mlp.up.weight", "blocks.x.mlp.up.weight",
                  "blocks.0.qkv.weight", "blocks", "lm_head.bias", "final_norm.weight.x"):
        assert parameter_shape(cfg, bogus) is None, bogus
    huge = Config.from_dict({**cfg.to_dict(), "n_layers": 10 ** 12})  # lazy: nothing built
    assert n_parameter_tensors(huge) > 10 ** 12
    assert parameter_shape(huge, f"blocks.{10 ** 12 - 1}.mlp.up.weight") == (cfg.d_model,
                                                                             cfg.d_ff)
    assert parameter_shape(cfg, "blocks.\u0663.mlp.up.weight") is None  # a non-ASCII digit


@pytest.mark.parametrize("family", list(PRESETS))
@pytest.mark.parametrize("tied", [True, False])
def test_config_counts_the_parameters_of_every_family_without_the_model(family, tied,
                                                                       monkeypatch):
    """Config.n_params is a function of the config alone (no model registered into config):
    for every family preset, tied and untied, it equals the sizes of a built GlassLM's
    parameters, with grouped-query heads, biases and learned positions where the family has
    them. The model's own count (read off the layers) is switched off: nothing of the model
    helps the config."""
    from glassllm import config, model
    if family == "gpt2" and not tied:
        pytest.skip("the gpt2 family always ties its embeddings")
    overrides = dict(tie_embeddings=tied, lm_head_bias=PRESETS[family]["lm_head_bias"] and
                     not tied, n_kv_heads=1 if family != "gpt2" else None)
    cfg = Config.preset(family, vocab_size=37, d_model=32, n_layers=2, n_heads=2,
                        max_len=16, **overrides)
    built = sum(p.size for p in GlassLM(cfg).parameters())
    assert built == model.n_params(cfg)
    monkeypatch.setattr(model, "n_params", None)
    monkeypatch.setattr(model, "_layout", None)
    assert cfg.n_params() == config.parameter_count(cfg) == built
    assert not hasattr(config, "register_parameter_count")


def test_parameter_shapes_cost_nothing_whatever_the_sizes():
    """n_layers = 10**9 and a 2**40-row embedding: the shapes come from a one-block model built
    shapes only (zero-stride parameters), in well under a second and a megabyte."""
    import itertools
    import math
    import time
    import tracemalloc
    from glassllm.model import n_parameter_tensors, parameter_shape, parameter_shapes
    cfg = Config(vocab_size=2 ** 40, d_model=2 ** 14, n_layers=10 ** 9, n_heads=2 ** 7,
                 n_kv_heads=2 ** 5, max_len=2 ** 20, tie_embeddings=False)
    tracemalloc.start()
    t0 = time.perf_counter()
    last = f"blocks.{10 ** 9 - 1}.attention.key.weight"
    assert parameter_shape(cfg, last) == (2 ** 14, 2 ** 5 * 2 ** 7)
    assert parameter_shape(cfg, "lm_head.weight") == (2 ** 14, 2 ** 40)
    assert n_parameter_tensors(cfg) == 10 ** 9 * 9 + 3
    block = itertools.takewhile(lambda item: not item[0].startswith("blocks.1."),
                                parameter_shapes(cfg))
    assert cfg.n_params() == 2 * 2 ** 54 + 2 ** 14 + 10 ** 9 * sum(
        math.prod(shape) for name, shape in block if name.startswith("blocks.0."))
    elapsed = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert elapsed < 1.0 and peak < 2 ** 20, (elapsed, peak)
    with pytest.raises(MemoryError, match="parameters needs"):
        GlassLM(cfg)  # the same check, before anything is allocated


def test_parameter_shapes_are_read_off_the_layer_constructors(monkeypatch):
    """Described once: a parameter added to a layer appears in the shapes with no other edit."""
    from glassllm import model as model_module
    from glassllm.nn import Linear
    built = model_module.MLP.__init__

    def with_extra(self, cfg, rng):
        built(self, cfg, rng)
        self.extra = Linear(cfg.d_ff, 3, rng)

    monkeypatch.setattr(model_module.MLP, "__init__", with_extra)
    model_module._layout_of.cache_clear()
    cfg = small_config(n_layers=3)
    try:
        real = [(n, tuple(p.shape)) for n, p in GlassLM(cfg).named_parameters()]
        assert ("blocks.2.mlp.extra.weight", (cfg.d_ff, 3)) in real
        assert list(model_module.parameter_shapes(cfg)) == real
        assert model_module.parameter_shape(cfg, "blocks.1.mlp.extra.weight") == (cfg.d_ff, 3)
    finally:
        model_module._layout_of.cache_clear()


def test_a_model_bigger_than_the_machine_is_a_memory_error_before_allocating(monkeypatch):
    """`glassllm train --d-model 4096 --n-layers 1024` (189e9 parameters, 705 GiB of float32)
    allocated layer after layer -- each array fits, so NumPy never raised MemoryError under
    Linux's overcommit -- until the kernel's OOM killer ended the process (or another one)
    without a word. The weights alone exceeding the machine's memory is a MemoryError at once.
    Here the machine is made to look like it has 64 MiB, and a 100 MB model must not build."""
    import os
    real = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda name: (64 << 20) // real("SC_PAGE_SIZE")
                        if name == "SC_PHYS_PAGES" else real(name))
    cfg = Config(vocab_size=257, d_model=512, n_layers=8, n_heads=8, max_len=16)
    assert cfg.n_params() * 4 > 64 << 20
    with pytest.raises(MemoryError, match=f"{cfg.n_params():,} parameters"):
        GlassLM(cfg)
    GlassLM(Config(vocab_size=257, d_model=64, n_layers=2, n_heads=4, max_len=16))  # 0.5 MB
