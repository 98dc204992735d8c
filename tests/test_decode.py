"""glassllm.engine.decode: one decoding step over plain arrays gives the engine's GlassLM.forward
logits exactly. Every test here is about the engine's forms, so the module runs in engine mode
whatever GLASSLLM_KERNELS says (tests/test_kernels.py compares step with the reference forward)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import shared_data_path

from glassllm import amp, generate, kernels
from glassllm.engine import decode
from glassllm.model import Config, GlassLM, KVCache
from glassllm.tensor import no_grad


@pytest.fixture(autouse=True)
def engine_mode():
    with kernels.use("engine"):
        yield


def perturbed(cfg: Config, seed: int = 0) -> GlassLM:
    model = GlassLM(cfg, seed=seed)
    rng = np.random.default_rng(seed + 1)
    for p in model.parameters():  # weights that make every path matter, gains not 1
        p.data = (p.data + rng.normal(0.0, 0.3, p.shape)).astype(np.float32)
    return model


CONFIGS = {
    "gqa_tied": dict(n_heads=4, n_kv_heads=2),
    "mqa_untied": dict(n_heads=4, n_kv_heads=1, tie_embeddings=False),
    "mha": dict(n_heads=2, n_kv_heads=2),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_step_gives_forward_logits_and_cache_bit_for_bit(name):
    cfg = Config(vocab_size=40, d_model=32, n_layers=3, max_len=80, **CONFIGS[name])
    model = perturbed(cfg)
    ids = np.random.default_rng(2).integers(0, 40, 75)  # past one 64-query block
    slow, fast = KVCache(cfg), KVCache(cfg)
    with no_grad():
        model(ids[None, :5], cache=slow)
        model(ids[None, :5], cache=fast)
        for token in ids[5:]:
            expected = model(np.array([[token]]), cache=slow).data[0, -1]
            got = decode.step(model, fast, int(token))
            np.testing.assert_array_equal(got, expected)
    assert fast.length == slow.length == 75
    np.testing.assert_array_equal(fast.k, slow.k)
    np.testing.assert_array_equal(fast.v, slow.v)


def test_generate_takes_the_fast_path_and_the_same_tokens(monkeypatch):
    model = perturbed(Config(vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                             max_len=64))
    from glassllm.engine import fast_decode  # the compiled step, where numba loads
    calls = []
    step, compiled_step = decode.step, fast_decode.step
    monkeypatch.setattr(decode, "step", lambda *a: calls.append(1) or step(*a))
    monkeypatch.setattr(fast_decode, "step", lambda *a: calls.append(1) or compiled_step(*a))
    prompt = [3, 1, 4, 1, 5]
    fast = generate.generate(model, prompt, 40, generate.Sampling(temperature=0.8), rng=7)
    assert len(calls) == 39  # every token after the prompt's
    monkeypatch.setattr(decode, "supports", lambda model, cache: False)
    slow = generate.generate(model, prompt, 40, generate.Sampling(temperature=0.8), rng=7)
    assert fast == slow


def test_supports_only_what_step_computes():
    llama = GlassLM(Config(vocab_size=20, d_model=16, n_layers=1, n_heads=2, max_len=8))
    gpt2 = GlassLM(Config(vocab_size=20, d_model=16, n_layers=1, n_heads=2, max_len=8,
                          family="gpt2"))
    assert decode.supports(llama, KVCache(llama.cfg))
    assert not decode.supports(gpt2, KVCache(gpt2.cfg))
    assert not decode.supports(llama, KVCache(llama.cfg, batch_size=2))
    with amp.autocast("bfloat16"):  # rounded products: forward does those
        assert not decode.supports(llama, KVCache(llama.cfg))


def test_step_refuses_a_full_cache():
    model = GlassLM(Config(vocab_size=20, d_model=16, n_layers=1, n_heads=2, max_len=4))
    cache = KVCache(model.cfg)
    for t in range(4):
        decode.step(model, cache, t)
    with pytest.raises(ValueError, match="full"):
        decode.step(model, cache, 0)


def test_stories260k_greedy_story_is_the_same_on_both_paths(monkeypatch):
    from glassllm.formats.llama2c import from_llama2c
    model = from_llama2c(shared_data_path("llama2c", "stories260K.bin"))
    fast = generate.generate(model, [1], 120, generate.Sampling(temperature=0))
    monkeypatch.setattr(decode, "supports", lambda model, cache: False)
    assert generate.generate(model, [1], 120, generate.Sampling(temperature=0)) == fast
