"""Every family preset and every switch of `Config`: parity with the PyTorch twin
(tests/torch_reference.py, written from Hugging Face's modeling files), the engine against the
reference forms, decoding with a KV cache against the full forward, a few training steps,
the names table, and the config's checks.

Each tiny config makes its family's special features bind: a window shorter than the
sequence, soft-caps small enough to change the scores and logits, head_dim other than
d_model / n_heads, grouped KV heads, local and global layers.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from glassllm import Config, GlassLM, devices, kernels
from glassllm.config import FAMILIES, PRESETS
from glassllm.generate import next_token_logits
from glassllm.lens.trace import names_for, run_with_cache
from glassllm.model import KVCache
from glassllm.optim import AdamW

from test_model import ids, perturbed_model

T = 12
_SMALL = dict(vocab_size=13, d_model=16, n_layers=2, max_len=T)
_GQA = dict(n_heads=4, n_kv_heads=2, head_dim=8)  # H*D = 32 != d_model: projections C <-> H*D
_WINDOW = dict(sliding_window=3)
_LOCAL_GLOBAL = ("sliding_attention", "full_attention")
TINY = {  # family -> overrides of its preset
    "llama": dict(_GQA),
    "gpt2": dict(n_heads=2),
    "neox": dict(n_heads=2),                      # head_dim 8, rotary over 2 channels
    "gptneo": dict(n_heads=2, **_WINDOW),         # layer 1 local
    "mistral": dict(_GQA, **_WINDOW),
    "qwen2": dict(_GQA),
    "qwen3": dict(_GQA),
    "gemma": dict(_GQA),
    "gemma2": dict(_GQA, **_WINDOW, attn_softcap=1.0, final_softcap=2.0,
                   attn_scale=0.3),
    "gemma3": dict(_GQA, **_WINDOW, layer_types=_LOCAL_GLOBAL),
    "phi": dict(n_heads=2),                       # head_dim 8, rotary over 4 channels
    "olmo2": dict(_GQA),
}
# single switches on a llama base, each checked on its own too
SWITCHES = {
    "layer_norm_no_bias": dict(norm="layer", norm_bias=False),
    "rms_offset": dict(norm_offset=True),
    "sandwich": dict(norm_position="sandwich"),
    "post": dict(norm_position="post"),
    "qk_norm_head": dict(qk_norm="head"),
    "qk_norm_proj": dict(qk_norm="proj"),
    "learned_positions": dict(positions="learned"),
    "partial_rotary": dict(rotary_pct=0.5),
    "local_rope_base": dict(rope_local_theta=100.0, **_WINDOW, layer_types=_LOCAL_GLOBAL),
    "attn_bias_qkv": dict(attn_bias="qkv"),
    "attn_bias_out": dict(attn_bias="out"),
    "attn_bias_all": dict(attn_bias="all", mlp_bias=True),
    "lm_head_bias": dict(tie_embeddings=False, lm_head_bias=True),
    "attn_scale": dict(attn_scale=1.0),
    "attn_softcap": dict(attn_softcap=0.5),
    "sliding_window": dict(sliding_window=2, layer_types=("sliding_attention",) * 2),
    "parallel": dict(parallel_block=True),
    "parallel_shared": dict(parallel_block=True, shared_norm=True),
    "geglu": dict(mlp="geglu"),
    "gelu_exact": dict(mlp="gelu"),
    "gelu_tanh": dict(mlp="gelu_tanh"),
    "embed_scale": dict(embed_scale=True),
    "final_softcap": dict(final_softcap=1.0),
}
CASES = {**{f"family_{f}": (f, o) for f, o in TINY.items()},
         **{f"switch_{s}": ("llama", dict(_GQA, **o)) for s, o in SWITCHES.items()}}


def config_of(case: str) -> Config:
    family, overrides = CASES[case]
    return Config.preset(family, **_SMALL, **overrides)


def model_of(case: str, seed: int = 0) -> GlassLM:
    return perturbed_model(config_of(case), seed=seed)


def test_every_family_has_a_case():
    assert sorted(TINY) == sorted(FAMILIES)


@pytest.fixture
def twin_of(torch):
    import torch_reference

    def make(model, dtype=torch.float32):
        twin = torch_reference.TorchLM(model.cfg.to_dict(), dtype=dtype)
        torch_reference.load_glassllm_state(twin, model.state_dict())
        return twin, torch_reference
    return make


def _relative(a, b) -> float:
    a, b = devices.to_host(a), devices.to_host(b)  # GLASSLLM_DEVICE=strict: values of a device
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def _assert_grads_close(grads: dict, expected: dict) -> None:
    """Each gradient within 1e-4 of the expected one, relative to the tensor's largest
    element; a gradient that is 0 but for rounding (1e-6 of the largest of all) only small on
    both sides: a key bias under full RoPE shifts every score of a query's row alike, and
    softmax ignores a constant added to a row."""
    grads = {name: devices.to_host(g) for name, g in grads.items()}
    expected = {name: devices.to_host(g) for name, g in expected.items()}
    largest = max(np.abs(g).max() for g in expected.values())
    for name, g in grads.items():
        if np.abs(expected[name]).max() <= 1e-6 * largest:
            assert name.endswith("attention.key.bias"), f"{name}: a zero gradient"
            assert np.abs(g).max() <= 1e-6 * largest, name
        else:
            assert _relative(g, expected[name]) <= 1e-4, name


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_loss_and_every_gradient_match_torch(case, twin_of):
    model = model_of(case)
    twin, reference = twin_of(model)
    x, y = ids(model.cfg, (2, T), 1), ids(model.cfg, (2, T), 2)
    loss = model.loss(x, y)
    loss.backward()
    twin_loss = twin.loss(x, y)
    twin_loss.backward()
    assert abs(loss.item() - twin_loss.item()) <= 1e-5 * max(1.0, abs(twin_loss.item()))
    assert _relative(model(x).numpy(), twin(x).detach().numpy()) <= 1e-5
    twin_grads = reference.glassllm_gradients(twin)
    assert sorted(twin_grads) == sorted(n for n, _ in model.named_parameters())
    _assert_grads_close({n: p.grad for n, p in model.named_parameters()}, twin_grads)


def _to_float64(model: GlassLM) -> GlassLM:
    """The model in float64, its RoPE tables computed again in float64 (float32 tables would
    cap the precision)."""
    from glassllm import functional as F
    device = model.device  # converted on the host, then moved back
    model.to("cpu")
    for p in model.parameters():
        p.data = p.data.astype(np.float64)
    cfg = model.cfg
    for prefix, theta in (("rope", cfg.rope_theta), ("rope_local", cfg.rope_local_theta)):
        if getattr(model, f"{prefix}_cos") is not None:
            tables = F.rope_tables(cfg.max_len, cfg.rotary_dim, theta, dtype=np.float64)
            setattr(model, f"{prefix}_cos", tables[0])
            setattr(model, f"{prefix}_sin", tables[1])
    return model.to(device)


# the families, and the one switch no family uses
FLOAT64_CASES = sorted(c for c in CASES if c.startswith("family_")) + ["switch_layer_norm_no_bias"]


@pytest.mark.parametrize("case", FLOAT64_CASES)
def test_float64_logits_and_gradients_equal_torch_to_1e_10(case, twin_of, torch):
    # float64 leaves only the order of additions between the two: any formula that differs
    # (a rounding of the embedding scale aside, exact in float64 too) shows far above 1e-10
    model = _to_float64(model_of(case))
    twin, reference = twin_of(model, torch.float64)
    x, y = ids(model.cfg, (2, T), 1), ids(model.cfg, (2, T), 2)
    model.loss(x, y).backward()
    twin.loss(x, y).backward()
    assert _relative(model(x).numpy(), twin(x).detach().numpy()) <= 1e-10
    twin_grads = reference.glassllm_gradients(twin)
    largest = max(np.abs(g).max() for g in twin_grads.values())
    for name, p in model.named_parameters():
        assert np.abs(devices.to_host(p.grad) - twin_grads[name]).max() <= 1e-10 * largest, name


def test_parity_sees_a_missing_feature(twin_of):
    # The twin must disagree when one switch is off on one side only: the soft-cap binds.
    model = model_of("family_gemma2")
    twin, _ = twin_of(model)
    twin.cfg["final_softcap"] = None
    x = ids(model.cfg, (1, T), 1)
    assert _relative(model(x).numpy(), twin(x).detach().numpy()) > 1e-2


@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_forms_equal_the_reference_forms(case):
    model = model_of(case)
    x, y = ids(model.cfg, (2, T), 3), ids(model.cfg, (2, T), 4)
    results = {}
    for mode in kernels.MODES:
        with kernels.use(mode):
            model.zero_grad()
            loss = model.loss(x, y)
            loss.backward()
            results[mode] = (model(x).numpy(), {n: p.grad for n, p in model.named_parameters()})
    (z_engine, g_engine), (z_ref, g_ref) = results["engine"], results["reference"]
    assert _relative(z_engine, z_ref) <= 1e-5
    _assert_grads_close(g_engine, g_ref)


@pytest.mark.parametrize("case", sorted(CASES))
def test_decoding_with_a_kv_cache_equals_the_full_forward(case):
    model = model_of(case)
    x = ids(model.cfg, (1, T), 5)
    full = model(x).numpy()[0]
    cache = KVCache(model.cfg)
    prompt = 4  # a prompt in one call, then one token at a time (the generate path)
    rows = [model(x[:, :prompt], cache=cache).numpy()[0]]
    rows += [next_token_logits(model, cache, int(t))[None] for t in x[0, prompt:]]
    np.testing.assert_allclose(np.concatenate(rows), full, rtol=0, atol=2e-5 * np.abs(full).max())


@pytest.mark.parametrize("case", sorted(CASES))
def test_trace_gives_every_name_and_the_plain_logits(case):
    model = model_of(case)
    x = ids(model.cfg, (2, T), 6)
    logits, cache = run_with_cache(model, x)
    assert list(cache) == names_for(model.cfg)
    np.testing.assert_array_equal(logits, model(x).numpy())
    cfg = model.cfg
    if cfg.final_softcap is not None:
        c = cfg.final_softcap
        np.testing.assert_allclose(np.tanh(cache["logits_pre_softcap"] / c) * c, logits,
                                   atol=1e-6)
    if cfg.norm_position == "pre":
        np.testing.assert_allclose(cache["blocks.0.residual_mid"],
                                   cache["blocks.0.residual_in"]
                                   + cache["blocks.0.attention.output"], atol=1e-6)
    else:
        np.testing.assert_allclose(cache["blocks.0.residual_mid"],
                                   cache["blocks.0.residual_in"]
                                   + cache["blocks.0.attention.output_normed"], atol=1e-6)
    if cfg.layer_is_sliding(0):  # the pattern never reaches past the window
        pattern = cache["blocks.0.attention.pattern"]
        far = np.subtract.outer(np.arange(T), np.arange(T)) >= cfg.sliding_window
        assert (pattern[..., far] == 0).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_every_preset_trains(family):
    cfg = Config.preset(family, **_SMALL, **TINY[family])
    model = GlassLM(cfg, seed=0)
    opt = AdamW(model.parameters(), lr=1e-2)
    x = ids(cfg, (4, T), 7)
    losses = []
    for _ in range(8):  # memorise one batch
        loss = model.loss(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.2, losses


# --------------------------------------------------------------------------- the config
@pytest.mark.parametrize("family", FAMILIES)
def test_preset_round_trips_through_json(family):
    cfg = Config.preset(family, n_layers=7)
    assert cfg.family == family and cfg.n_layers == 7
    assert Config.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    for name, value in PRESETS[family].items():
        if name != "layer_types":
            assert getattr(cfg, name) == value, name


def test_preset_layer_pattern_is_cycled_and_overrides_win():
    assert Config.preset("gemma2", n_layers=3).layer_types == (
        "sliding_attention", "full_attention", "sliding_attention")
    assert Config.preset("gemma3", n_layers=7).layer_types == (
        ("sliding_attention",) * 5 + ("full_attention", "sliding_attention"))
    assert Config.preset("qwen3", qk_norm=None).qk_norm is None  # an explicit None overrides
    assert Config.preset("gemma2", layer_types=None).layer_types is None


def test_old_config_dicts_load_as_their_family():
    old_gpt2 = dict(vocab_size=50, d_model=16, n_layers=2, n_heads=2, n_kv_heads=2,
                    max_len=8, family="gpt2", d_ff=64, rope_theta=10000.0, norm_eps=1e-5,
                    tie_embeddings=True)
    cfg = Config.from_dict(old_gpt2)
    assert (cfg.norm, cfg.positions, cfg.mlp, cfg.attn_bias, cfg.head_dim) == \
        ("layer", "learned", "gelu_tanh", "all", 8)
    assert Config.from_dict({**old_gpt2, "family": "llama"}).norm == "rms"


def test_head_dim_is_derived_again_when_the_dict_changes_d_model():
    d = Config(d_model=16, n_heads=4).to_dict()
    assert d["head_dim"] is None  # derived, so an edited d_model derives it again
    assert Config.from_dict({**d, "d_model": 32}).head_dim == 8
    assert Config(d_model=16, n_heads=4, head_dim=8).to_dict()["head_dim"] == 8


@pytest.mark.parametrize("overrides, message", [
    (dict(norm="batch"), "Config.norm must be one of"),
    (dict(norm_position="middle"), "Config.norm_position must be one of"),
    (dict(qk_norm="layer"), "Config.qk_norm must be one of"),
    (dict(positions="alibi"), "Config.positions must be one of"),
    (dict(attn_bias=True), "Config.attn_bias must be one of"),
    (dict(mlp="relu"), "Config.mlp must be one of"),
    (dict(norm_bias="yes"), "Config.norm_bias must be True or False"),
    (dict(rotary_pct=0.0), "Config.rotary_pct must be a finite positive number"),
    (dict(rotary_pct=1.5), "Config.rotary_pct must be"),
    (dict(rotary_pct=0.1), "even head_dim x rotary_pct"),
    (dict(attn_softcap=-1.0), "Config.attn_softcap must be a finite positive number"),
    (dict(final_softcap=float("inf")), "Config.final_softcap must be"),
    (dict(attn_scale=0), "Config.attn_scale must be"),
    (dict(sliding_window=0), "Config.sliding_window must be an integer >= 1"),
    (dict(layer_types=("sliding_attention",) * 4), "sliding_window is None"),
    (dict(sliding_window=4, layer_types=("full_attention",)), "1 entries for n_layers=4"),
    (dict(sliding_window=4, layer_types=("local",) * 4), "'local' is not one of"),
    (dict(layer_types="full_attention"), "Config.layer_types must be a list"),
    (dict(head_dim=0), "Config.head_dim must be an integer >= 1"),
    (dict(norm_offset=True, norm="layer"), "Config.norm_offset"),
    (dict(norm_bias=True), "Config.norm_bias: RMSNorm has no bias"),
    (dict(shared_norm=True), "Config.shared_norm needs parallel_block"),
    (dict(parallel_block=True, norm_position="sandwich"), "Config.parallel_block"),
    (dict(lm_head_bias=True), "Config.lm_head_bias needs an untied head"),
    (dict(family="bert"), "Config.family must be one of"),
])
def test_bad_switches_are_one_line_errors_naming_the_field(overrides, message):
    with pytest.raises(ValueError, match=message) as info:
        Config(**overrides)
    assert "\n" not in str(info.value)


def test_head_dim_of_its_own_needs_no_divisible_d_model():
    cfg = Config(d_model=10, n_heads=4, head_dim=6)
    model = GlassLM(cfg)
    assert model.blocks[0].attention.query.weight.shape == (10, 24)
    assert model(np.arange(5)).shape == (1, 5, cfg.vocab_size)


def test_n_params_counts_every_switchs_parameters():
    for case in CASES:
        cfg = config_of(case)
        assert cfg.n_params() == sum(p.size for p in GlassLM(cfg).parameters()), case


@pytest.mark.parametrize("overrides", [dict(qk_norm="head"), dict(norm_offset=True),
                                       dict(head_dim=8)])
def test_llama2c_refuses_a_llama_with_other_switches(tmp_path, overrides):
    from glassllm.formats.llama2c import to_llama2c
    model = GlassLM(Config(**_SMALL, n_heads=4, **overrides))
    with pytest.raises(ValueError, match="run.c computes Llama exactly"):
        to_llama2c(model, tmp_path / "m.bin")
    assert not (tmp_path / "m.bin").exists()
