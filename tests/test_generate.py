"""glassllm.generate: Sampling, the sampler's exact kept sets and frequencies, and the cached
Generator against a plain no-cache loop (nanoGPT's generate) token for token."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from glassllm import Config, GlassLM, no_grad
from glassllm.engine import decode
from glassllm.tensor import is_grad_enabled
from glassllm.generate import Generator, Sampling, generate, sample_next, sampling_distribution

MODELS = {
    "llama": Config(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_len=16),
    "gpt2": Config(d_model=32, n_layers=2, n_heads=4, max_len=16, family="gpt2"),
}


def tiny(family, seed=0) -> GlassLM:
    model = GlassLM(MODELS[family], seed=seed)
    # Sharper-than-init logits (a spread of a few nats), so greedy and top-k/top-p choices are
    # decided by real margins rather than by near-ties of an untrained model.
    model.token_embedding.weight.data *= 6
    return model


# --------------------------------------------------------------------------- Sampling
@pytest.mark.parametrize("kwargs", [
    dict(temperature=-0.1), dict(temperature=float("nan")), dict(temperature=float("inf")),
    dict(temperature="hot"), dict(top_k=0), dict(top_k=-3), dict(top_k=2.5), dict(top_k=True),
    dict(top_p=0.0), dict(top_p=-0.5), dict(top_p=1.01), dict(top_p=float("nan")),
])
def test_sampling_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        Sampling(**kwargs)


def test_sampling_accepts_edges_and_they_mean_what_they_say():
    """Each edge value is accepted, kept, and acts at its limit: temperature 0 is a one-hot
    at the argmax (lowest id on a tie), top_k 1 keeps only the argmax even at temperature 5,
    top_p 1e-9 keeps just the most probable token, top_p 1.0 keeps every token, and a NumPy
    integer top_k counts like an int."""
    logits = np.array([0.5, 2.0, -1.0, 2.0, 1.0])
    greedy = Sampling(temperature=0, top_k=1, top_p=1.0)
    assert (greedy.temperature, greedy.top_k, greedy.top_p) == (0, 1, 1.0)
    np.testing.assert_array_equal(sampling_distribution(logits, greedy), [0, 1, 0, 0, 0])
    wide = Sampling(temperature=5, top_k=np.int64(3), top_p=1e-9)
    assert wide.top_k == 3 and wide.top_p == 1e-9
    np.testing.assert_array_equal(sampling_distribution(logits, wide), [0, 1, 0, 0, 0])
    np.testing.assert_array_equal(sampling_distribution(logits, Sampling(5, top_k=1)),
                                  [0, 1, 0, 0, 0])
    everything = sampling_distribution(logits, Sampling(temperature=5, top_p=1.0))
    np.testing.assert_allclose(everything, softmax64(list(logits), 5), rtol=1e-12)
    three = sampling_distribution(logits, Sampling(temperature=5, top_k=np.int64(3)))
    assert np.count_nonzero(three) == 3 and three[[1, 3, 4]].sum() == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    assert {sample_next(logits, wide, rng) for _ in range(50)} == {1}


# --------------------------------------------------------------------------- the sampler
def softmax64(logits, temperature):
    z = [x / temperature for x in logits]
    m = max(z)
    e = [math.exp(x - m) for x in z]
    s = math.fsum(e)
    return [x / s for x in e]


def reference_kept(probs, top_k, top_p):
    """Brute force by definition. Rank ids by probability (ties: lower id first). top-k keeps
    ranks < k. top-p keeps the smallest set of most probable ids whose mass reaches p: the
    size is found by trying every subset (V is small), the smallest size for which SOME
    subset reaches p -- that size's best subset is the top ranks."""
    V = len(probs)
    ranked = sorted(range(V), key=lambda i: (-probs[i], i))
    size = V
    if top_k is not None:
        size = min(size, top_k)
    if top_p is not None:
        best = V
        for n in range(1, V + 1):
            if any(math.fsum(probs[i] for i in subset) >= top_p
                   for subset in itertools.combinations(range(V), n)):
                best = n
                break
        size = min(size, best)
    return set(ranked[:size])


CASES = [
    # (logits, temperature, top_k, top_p)
    (np.log([0.5, 0.2, 0.15, 0.1, 0.05]), 1.0, None, 0.6),
    (np.log([0.5, 0.2, 0.15, 0.1, 0.05]), 1.0, None, 0.9),
    (np.log([0.5, 0.2, 0.15, 0.1, 0.05]), 1.0, 2, 0.9),
    (np.log([0.5, 0.2, 0.15, 0.1, 0.05]), 1.0, 4, 0.4),
    (np.log([0.05, 0.1, 0.15, 0.2, 0.5]), 2.0, None, 0.7),  # order reversed, flatter
    (np.log([0.05, 0.1, 0.15, 0.2, 0.5]), 0.5, 3, None),
    (np.array([1.0, 1.0, 1.0, 0.0, -np.inf, 2.0]), 1.0, 2, None),  # ties and a banned id
    (np.array([3.0, -1.0, 0.5, 0.5, 2.0, -np.inf, 0.0]), 0.7, None, 0.95),
]


@pytest.mark.parametrize("logits,temperature,top_k,top_p", CASES)
def test_kept_set_and_renormalisation_match_brute_force(logits, temperature, top_k, top_p):
    probs = softmax64(list(logits), temperature)
    kept = reference_kept(probs, top_k, top_p)
    got = sampling_distribution(logits, Sampling(temperature, top_k, top_p))
    assert got.dtype == np.float64
    assert set(np.flatnonzero(got)) == kept
    total = math.fsum(probs[i] for i in kept)
    for i in kept:
        assert got[i] == pytest.approx(probs[i] / total, rel=1e-12)
    assert got.sum() == pytest.approx(1.0, abs=1e-12)


def test_known_sets_by_hand():
    logits = np.log([0.5, 0.2, 0.15, 0.1, 0.05])

    def kept(**kw):
        return list(np.flatnonzero(sampling_distribution(logits, Sampling(**kw))))

    assert kept(top_p=0.4) == [0]            # 0.5 already reaches 0.4
    assert kept(top_p=0.6) == [0, 1]         # 0.5 < 0.6 <= 0.7
    assert kept(top_p=0.9) == [0, 1, 2, 3]   # 0.85 < 0.9 <= 0.95
    assert kept(top_k=3) == [0, 1, 2]
    assert kept(top_k=2, top_p=0.9) == [0, 1]  # the smaller cut-off wins
    assert kept(top_k=4, top_p=0.6) == [0, 1]
    # 004 measures top-p on the full distribution: 0.5 < 0.65 <= 0.7 keeps 2 ids. (Hugging
    # Face recomputes it on the renormalised top-2, where 0.5/0.7 >= 0.65 would keep 1.)
    assert kept(top_k=2, top_p=0.65) == [0, 1]
    assert kept(top_p=1.0) == [0, 1, 2, 3, 4]
    two = sampling_distribution(logits, Sampling(top_k=2))
    np.testing.assert_allclose(two[:2], [0.5 / 0.7, 0.2 / 0.7], rtol=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_random_distributions_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    V = int(rng.integers(2, 9))
    logits = rng.normal(0, 2, V)
    temperature = float(rng.choice([0.3, 1.0, 1.7]))
    top_k = None if seed % 3 == 0 else int(rng.integers(1, V + 1))
    top_p = None if seed % 4 == 1 else float(rng.uniform(0.05, 1.0))
    probs = softmax64(list(logits), temperature)
    got = sampling_distribution(logits, Sampling(temperature, top_k, top_p))
    assert set(np.flatnonzero(got)) == reference_kept(probs, top_k, top_p)


def test_temperature_scales_logits():
    logits = np.array([2.0, 1.0, 0.0, -1.0])
    for t in (0.25, 1.0, 3.0):
        np.testing.assert_allclose(sampling_distribution(logits, Sampling(t)),
                                   softmax64(list(logits), t), rtol=1e-12)


def test_temperature_zero_is_argmax():
    rng = np.random.default_rng(1)
    for _ in range(50):
        logits = rng.normal(0, 1, 300).astype(np.float32)
        assert sample_next(logits, Sampling(temperature=0)) == int(np.argmax(logits))
        # top-k/top-p do not change the argmax, and no rng is needed or consumed.
        state = rng.bit_generator.state
        assert sample_next(logits, Sampling(0, top_k=5, top_p=0.1), rng) == np.argmax(logits)
        assert rng.bit_generator.state == state


def test_one_uniform_draw_per_token_by_inverse_cdf():
    logits = np.array([0.1, 2.0, -1.0, 1.5, 0.0])
    sampling = Sampling(0.9, top_k=3)
    probs = sampling_distribution(logits, sampling)
    draws = np.random.default_rng(7)
    mirror = np.random.default_rng(7)
    for _ in range(200):
        u = mirror.random()
        expected = int(np.searchsorted(np.cumsum(probs), u, side="right"))
        assert sample_next(logits, sampling, draws) == expected


def test_sampling_frequencies_follow_probabilities():
    """Chi-square goodness of fit, seeded: 20,000 draws from a top-k=4 filtered distribution.
    With 3 degrees of freedom the 0.1% critical value is 16.27; banned ids never appear."""
    logits = np.array([1.2, 0.3, -0.4, 2.0, -2.0, 0.9])
    sampling = Sampling(temperature=1.3, top_k=4)
    probs = sampling_distribution(logits, sampling)
    rng = np.random.default_rng(12345)
    n = 20_000
    counts = np.bincount([sample_next(logits, sampling, rng) for _ in range(n)], minlength=6)
    kept = probs > 0
    assert set(np.flatnonzero(counts)) == set(np.flatnonzero(kept))
    expected = n * probs[kept]
    chi2 = float(np.sum((counts[kept] - expected) ** 2 / expected))
    assert chi2 < 16.27, (counts, expected)
    # The test has teeth: the same counts fail it against temperature 1 instead of 1.3.
    other = sampling_distribution(logits, Sampling(temperature=1.0, top_k=4))[kept] * n
    assert float(np.sum((counts[kept] - other) ** 2 / other)) > 16.27 * 5


@pytest.mark.parametrize("logits", [np.array([0.0, np.nan]), np.array([np.inf, 0.0]),
                                    np.array([-np.inf, -np.inf]), np.zeros((2, 3)),
                                    np.zeros(0)])
def test_sampler_rejects_bad_logits(logits):
    with pytest.raises(ValueError):
        sample_next(logits, Sampling(), np.random.default_rng(0))


def test_sampler_needs_rng_when_not_greedy():
    with pytest.raises(ValueError, match="rng"):
        sample_next(np.zeros(4), Sampling(temperature=1.0), None)


# --------------------------------------------------------------------------- Generator
def reference_generate(model, prompt, n, sampling, rng, forced=None):
    """nanoGPT's loop: forward the last max_len tokens with no cache, sample, append.
    `forced` maps a step to a token appended instead of sampling (as Generator.push)."""
    tokens = list(prompt)
    out = []
    for step in range(n):
        if forced and step in forced:
            tokens.append(forced[step])
            continue
        with no_grad():
            logits = model(np.array(tokens[-model.cfg.max_len:])[None]).numpy()[0, -1]
        token = sample_next(logits, sampling, rng)
        tokens.append(token)
        out.append(token)
    return out, tokens


SAMPLINGS = [Sampling(temperature=0), Sampling(temperature=1.0),
             Sampling(temperature=0.8, top_k=20, top_p=0.9)]


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "t1", "t0.8-k20-p0.9"])
@pytest.mark.parametrize("prompt_len", [1, 5, 20])  # 20 > max_len=16: cropped from the start
def test_cached_generation_equals_full_reforward(family, sampling, prompt_len):
    model = tiny(family, seed=prompt_len)
    prompt = list(np.random.default_rng(prompt_len).integers(0, 257, prompt_len))
    n = 24  # crosses max_len=16 for every prompt length
    got = generate(model, prompt, n, sampling, np.random.default_rng(99))
    want, _ = reference_generate(model, prompt, n, sampling, np.random.default_rng(99))
    assert got == want
    assert len(set(got)) > 1 or sampling.temperature == 0  # sampling really varied


@pytest.mark.parametrize("family", sorted(MODELS))
def test_generator_logits_match_full_forward_at_every_step(family):
    model = tiny(family)
    gen = Generator(model, [3, 1, 4, 1, 5])
    rng = np.random.default_rng(0)
    for _ in range(30):  # 5 + 30 > max_len: the last steps run cropped windows
        with no_grad():
            full = model(np.array(gen.tokens[-model.cfg.max_len:])[None]).numpy()[0, -1]
        np.testing.assert_allclose(gen.next_logits(), full, rtol=1e-5, atol=1e-5)
        gen.next_token(Sampling(), rng)
    assert len(gen.tokens) == 35


def test_push_forces_tokens_and_keeps_equivalence():
    model = tiny("llama")
    prompt = [10, 20, 30]
    forced = {0: 65, 3: 66, 4: 67, 9: 256}  # several pushes in a row: fed in one forward
    gen = Generator(model, prompt)
    rng = np.random.default_rng(5)
    drawn = []
    for step in range(20):
        if step in forced:
            gen.push(forced[step])
        else:
            drawn.append(gen.next_token(Sampling(0.9, top_k=30), rng))
    want, tokens = reference_generate(model, prompt, 20, Sampling(0.9, top_k=30),
                                      np.random.default_rng(5), forced)
    assert drawn == want
    assert gen.tokens == tokens
    assert gen.tokens[:3] == prompt and gen.tokens[3] == 65


def test_resume_from_tokens_continues_the_same_way():
    model = tiny("gpt2")
    first = Generator(model, [1, 2, 3])
    for _ in range(4):
        first.next_token(Sampling(temperature=0))
    resumed = Generator(model, first.tokens)
    assert [resumed.next_token(Sampling(0)) for _ in range(5)] == \
           [first.next_token(Sampling(0)) for _ in range(5)]


def test_generate_returns_new_tokens_only_and_stops_at_stop_id():
    model = tiny("llama")
    prompt = np.array([72, 105], dtype=np.uint16)  # tokenizer output dtype
    greedy = generate(model, prompt, 12, Sampling(temperature=0))
    assert len(greedy) == 12 and all(isinstance(t, int) for t in greedy)
    stop = greedy[4]
    stopped = generate(model, prompt, 12, Sampling(temperature=0), stop_id=stop)
    assert stopped == greedy[:greedy.index(stop) + 1]
    assert generate(model, prompt, 0) == []


def test_generate_runs_the_model_under_no_grad(monkeypatch):
    model = tiny("llama")
    grad_modes = []
    forward = model.forward

    def spy(*args, **kwargs):
        grad_modes.append(is_grad_enabled())
        out = forward(*args, **kwargs)
        assert not out.requires_grad  # no graph kept alive by the cache or the logits
        return out

    monkeypatch.setattr(model, "forward", spy)
    # every token through forward (glassllm.engine.decode.step, the one-token path, makes no Tensors)
    monkeypatch.setattr(decode, "supports", lambda model, cache: False)
    gen = Generator(model, [1, 2])
    for _ in range(20):  # 2 + 20 > max_len: cached and cropped paths both run
        gen.next_token(Sampling(0))
    assert is_grad_enabled() and len(grad_modes) == 20 and not any(grad_modes)
    assert isinstance(gen.next_logits(), np.ndarray)
    # Generating does not change the model.
    before = model.state_dict()
    generate(model, [5], 20, Sampling(), np.random.default_rng(0))
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[name])


@pytest.mark.parametrize("prompt,match", [
    ([], "empty.*start_id"), (np.zeros((1, 0), dtype=int), "empty"), ([1.5, 2.0], "integer"),
    ([1, 257], "257.*outside"), ([-1], "outside"), (np.zeros((2, 3), dtype=int), "1-D"),
])
def test_bad_prompts(prompt, match):
    with pytest.raises(ValueError, match=match):
        Generator(tiny("llama"), prompt)
    with pytest.raises(ValueError, match=match):
        generate(tiny("llama"), prompt, 3)


def test_empty_prompt_starts_from_start_id():
    """Unconditional generation: [] with start_id is the prompt [start_id] (transformers'
    generate() without input_ids starts from bos_token_id; it refuses when there is none, and
    so does this API without start_id); the start id is not in the result."""
    model = tiny("gpt2")
    for start in (256, 1):
        gen = Generator(model, [], start_id=start)
        assert gen.tokens == [start]
        want = generate(model, [start], 10, Sampling(0.9), rng=3)
        assert generate(model, [], 10, Sampling(0.9), rng=3, start_id=start) == want
        assert generate(model, np.zeros(0, dtype=np.uint16), 10, Sampling(0.9), rng=3,
                        start_id=np.int64(start)) == want
    assert generate(model, [], 10, Sampling(0), start_id=256) != \
        generate(model, [], 10, Sampling(0), start_id=1)  # the start really matters here
    # start_id is for empty prompts only: a non-empty prompt is used as given
    assert generate(model, [7], 5, Sampling(0), start_id=256) == generate(model, [7], 5,
                                                                          Sampling(0))
    with pytest.raises(ValueError, match="start_id"):
        generate(model, [], 3)
    for bad, match in ((257, "outside"), (-1, "outside"), (1.0, "integer"), (True, "integer")):
        with pytest.raises(ValueError, match=match):
            Generator(model, [], start_id=bad)


def test_start_id_is_bos_or_else_eot():
    from glassllm.tokenizers import ByteTokenizer, start_id

    class SentencePieceLike:  # llama2.c's tokenizer: bos 1, eot (eos) 2
        vocab_size, bos_id, eot_id = 512, 1, 2

    class NoBosAttribute:
        vocab_size, eot_id = 10, 9

    assert ByteTokenizer.bos_id is None and start_id(ByteTokenizer()) == 256
    assert start_id(SentencePieceLike()) == 1 and start_id(NoBosAttribute()) == 9


@pytest.mark.parametrize("temperature", [1e-310, 5e-324, 1e-300, 1e-45])
def test_a_temperature_too_small_to_divide_by_is_greedy_never_nan(temperature):
    rng = np.random.default_rng(0)
    for trial in range(20):
        logits = rng.normal(0, 3, 50).astype(np.float32)
        if trial % 2:
            logits -= 100  # all negative: max / t is -inf, and -inf - -inf is NaN too
        if trial % 5 == 0:
            logits[::7] = -np.inf
        probs = sampling_distribution(logits, Sampling(temperature))
        assert not np.isnan(probs).any()
        expected = np.zeros(50)
        expected[int(np.argmax(logits))] = 1.0
        np.testing.assert_array_equal(probs, expected)
        for sampling in (Sampling(temperature), Sampling(temperature, top_k=3, top_p=0.5)):
            assert sample_next(logits, sampling, rng) == int(np.argmax(logits))
    # a small temperature that still divides is a real (sharp) softmax, not greedy
    sharp = sampling_distribution(np.array([0.0, 1e-3]), Sampling(1e-3))
    np.testing.assert_allclose(sharp, softmax64([0.0, 1e-3], 1e-3), rtol=1e-12)
    assert generate(tiny("llama"), [1, 2], 6, Sampling(1e-310), rng=0) == \
        generate(tiny("llama"), [1, 2], 6, Sampling(0))


def test_bad_push_and_max_new_tokens():
    gen = Generator(tiny("llama"), [1])
    for bad in (257, -1, 2.0, True):
        with pytest.raises(ValueError, match="push"):
            gen.push(bad)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(tiny("llama"), [1], -1)


def test_generate_accepts_an_int_seed_and_refuses_other_rngs():
    model = tiny("llama")
    by_seed = generate(model, [1, 2, 3], 8, Sampling(1.0), rng=42)
    assert by_seed == generate(model, [1, 2, 3], 8, Sampling(1.0), np.random.default_rng(42))
    assert by_seed == generate(model, [1, 2, 3], 8, Sampling(1.0), rng=np.int64(42))
    assert by_seed != generate(model, [1, 2, 3], 8, Sampling(1.0), rng=43)
    for bad in ("42", 4.2, True, np.random.RandomState(0)):
        with pytest.raises(TypeError, match="np.random.Generator"):
            generate(model, [1, 2, 3], 2, Sampling(1.0), rng=bad)
    with pytest.raises(ValueError, match="seed"):
        generate(model, [1, 2, 3], 2, Sampling(1.0), rng=-1)
    with pytest.raises(TypeError, match="default_rng"):
        sample_next(np.zeros(4), Sampling(1.0), 42)


def test_vocab_limit_never_draws_ids_a_smaller_tokenizer_lacks():
    """A model of 300 ids with a 257-id tokenizer (a padded vocabulary): with
    vocab_limit=257 no id >= 257 is ever drawn, greedy or sampled, even where those ids have
    the highest logits; the Generator's own logits stay the model's."""
    model = GlassLM(Config(vocab_size=300, d_model=16, n_layers=1, n_heads=2, max_len=8),
                    seed=0)
    model.token_embedding.weight.data[257:, ...] *= 50  # tied head: the padded ids dominate
    greedy = generate(model, [1, 2], 12, Sampling(0.0))
    assert max(greedy) >= 257  # the case the limit is for
    for sampling in (Sampling(0.0), Sampling(1.0), Sampling(5.0, top_k=290)):
        new = generate(model, [1, 2], 40, sampling, rng=0, vocab_limit=257)
        assert len(new) == 40 and max(new) < 257, (sampling, new)
    g = Generator(model, [1, 2], vocab_limit=257)
    full = g.next_logits()
    assert full.shape == (300,) and np.argmax(full) >= 257
    assert g.next_token(Sampling(0.0)) == int(np.argmax(full[:257]))
    for bad in (0, 301, 2.5, True):
        with pytest.raises(ValueError, match="vocab_limit"):
            Generator(model, [1], vocab_limit=bad)
