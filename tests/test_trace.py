"""glassllm.lens.trace: frozen names, values recomputed by hand, gradients against float64 finite
differences, the scores/pattern the fused op never shows, filters, stop_at, size estimate."""
from __future__ import annotations

import numpy as np
import pytest

from glassllm import functional as F
from glassllm import taps
from glassllm.model import Config, GlassLM
from glassllm.tensor import Tensor
from glassllm.lens.trace import (NAMES, Edit, Trace, TraceTooLarge, estimate_bytes, mix_op,
                            names_for, run_with_cache, scores_op, select_names, softmax_op)
from test_model import perturbed_model, to_float64

# The frozen table. Changing a row here is an API break: every user's analysis code names
# these values. Add new names at the end of a section; never rename.
FROZEN = [
    ("token_embedding", "B T C", "always"),
    ("position_embedding", "T C", "learned positions"),
    ("blocks.{layer}.residual_in", "B T C", "always"),
    ("blocks.{layer}.attention.input", "B T C", "always"),
    ("blocks.{layer}.attention.q_normed", "B T H D", "qk_norm"),
    ("blocks.{layer}.attention.k_normed", "B T K D", "qk_norm"),
    ("blocks.{layer}.attention.q", "B T H D", "always"),
    ("blocks.{layer}.attention.k", "B T K D", "always"),
    ("blocks.{layer}.attention.v", "B T K D", "always"),
    ("blocks.{layer}.attention.scores", "B H T T", "always"),
    ("blocks.{layer}.attention.pattern", "B H T T", "always"),
    ("blocks.{layer}.attention.head_output", "B T H D", "always"),
    ("blocks.{layer}.attention.output", "B T C", "always"),
    ("blocks.{layer}.attention.output_normed", "B T C", "post-norms"),
    ("blocks.{layer}.residual_mid", "B T C", "always"),
    ("blocks.{layer}.mlp.input", "B T C", "always"),
    ("blocks.{layer}.mlp.hidden_pre", "B T F", "always"),
    ("blocks.{layer}.mlp.up", "B T F", "gated MLP"),
    ("blocks.{layer}.mlp.hidden_post", "B T F", "always"),
    ("blocks.{layer}.mlp.output", "B T C", "always"),
    ("blocks.{layer}.mlp.output_normed", "B T C", "post-norms"),
    ("blocks.{layer}.residual_out", "B T C", "always"),
    ("final_norm", "B T C", "always"),
    ("logits_pre_softcap", "B T V", "final_softcap"),
    ("logits", "B T V", "always"),
]
# the two original families keep exactly their names
FROZEN_FAMILIES = {"llama": [n for n, _, w in FROZEN if w in ("always", "gated MLP")],
                   "gpt2": [n for n, _, w in FROZEN if w in ("always", "learned positions")]}


CONFIGS = {
    "llama": dict(family="llama", vocab_size=13, d_model=16, n_layers=2, n_heads=4,
                  n_kv_heads=2, max_len=12),
    "llama_untied": dict(family="llama", vocab_size=13, d_model=16, n_layers=2, n_heads=2,
                         n_kv_heads=1, max_len=12, tie_embeddings=False),
    "gpt2": dict(family="gpt2", vocab_size=13, d_model=16, n_layers=2, n_heads=4, max_len=12),
}


def model_for(name, seed=0) -> GlassLM:
    return perturbed_model(Config(**CONFIGS[name]), seed=seed)


def batch(cfg, B=2, T=9, seed=1):
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab_size, (B, T)), rng.integers(0, cfg.vocab_size, (B, T))


def test_names_are_frozen():
    assert [(n.template, n.shape, n.when) for n in NAMES] == FROZEN
    assert all(n.doc for n in NAMES)
    for family, names in FROZEN_FAMILIES.items():
        assert [n.template for n in NAMES if family in n.families] == names


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_full_trace_has_every_name_and_the_models_logits(name):
    model = model_for(name)
    x, _ = batch(model.cfg)
    logits, cache = run_with_cache(model, x)
    assert list(cache) == names_for(model.cfg)
    assert len(cache) == model.cfg.n_layers * (15 + (name != "gpt2")) + 3 + (name == "gpt2")
    np.testing.assert_array_equal(logits, model(x).numpy())  # bit-identical: same fused ops
    np.testing.assert_array_equal(cache["logits"], logits)
    assert taps.hook_for(model) is None
    for n in cache:
        shape = tuple(dict(B=2, T=9, C=16, H=model.cfg.n_heads, K=model.cfg.n_kv_heads,
                           D=model.cfg.head_dim, F=model.cfg.d_ff, V=13)[c]
                      for c in dict((r.template, r.shape) for r in NAMES)[
                          n if not n.startswith("blocks") else
                          "blocks.{layer}." + n.split(".", 2)[2]].split())
        assert cache[n].shape == shape, n


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _ln(x, w, b, eps):
    xc = x - x.mean(-1, keepdims=True)
    return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + eps) * w + b


def _rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, None] + rotated * sin[:, None]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_values_recomputed_by_hand(name):
    """Each named value from the previous ones and the weights, in float64 NumPy."""
    model = model_for(name)
    cfg = model.cfg
    gpt2 = cfg.family == "gpt2"
    x, _ = batch(cfg)
    T = x.shape[1]
    _, c = run_with_cache(model, x)
    w = {n: p.numpy().astype(np.float64) for n, p in model.named_parameters()}

    def close(name, want, tol=2e-5):
        np.testing.assert_allclose(c[name], want, rtol=tol, atol=tol, err_msg=name)

    emb = w["token_embedding.weight"][x]
    close("token_embedding", emb)
    resid = emb + (w["position_embedding.weight"][:T] if gpt2 else 0)
    close("blocks.0.residual_in", resid)

    def norm(prefix, v):
        return (_ln(v, w[prefix + ".weight"], w[prefix + ".bias"], cfg.norm_eps) if gpt2
                else _rms(v, w[prefix + ".weight"], cfg.norm_eps))

    def lin(prefix, v):
        return v @ w[prefix + ".weight"] + (w[prefix + ".bias"] if gpt2 else 0)

    H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    cos, sin = (F.rope_tables(cfg.max_len, D, cfg.rope_theta, np.float64) if not gpt2
                else (None, None))
    for layer in range(cfg.n_layers):
        b = f"blocks.{layer}."
        close(b + "residual_in", resid)
        a_in = norm(b + "attention_norm", resid)
        close(b + "attention.input", a_in)
        q = lin(b + "attention.query", a_in).reshape(2, T, H, D)
        k = lin(b + "attention.key", a_in).reshape(2, T, K, D)
        v = lin(b + "attention.value", a_in).reshape(2, T, K, D)
        if not gpt2:
            q, k = _rope(q, cos[:T], sin[:T]), _rope(k, cos[:T], sin[:T])
        close(b + "attention.q", q)
        close(b + "attention.k", k)
        close(b + "attention.v", v)
        pattern = np.zeros((2, H, T, T))
        heads = np.zeros((2, T, H, D))
        for h in range(H):
            kv = h // (H // K)  # query head h reads KV head h // G
            s = q[:, :, h] @ k[:, :, kv].transpose(0, 2, 1) / np.sqrt(D)
            s[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] = -np.inf
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            pattern[:, h] = p
            heads[:, :, h] = p @ v[:, :, kv]
            np.testing.assert_allclose(c[b + "attention.scores"][:, h], s, rtol=1e-4,
                                       atol=1e-4)
        close(b + "attention.pattern", pattern)
        assert np.all(c[b + "attention.pattern"][..., np.triu_indices(T, 1)[0],
                                                  np.triu_indices(T, 1)[1]] == 0)
        close(b + "attention.head_output", heads)
        attn = lin(b + "attention.output", heads.reshape(2, T, H * D))
        close(b + "attention.output", attn)
        resid = resid + attn
        close(b + "residual_mid", resid)
        m_in = norm(b + "mlp_norm", resid)
        close(b + "mlp.input", m_in)
        if gpt2:
            pre = lin(b + "mlp.up", m_in)
            post = 0.5 * pre * (1 + np.tanh(np.sqrt(2 / np.pi) * (pre + 0.044715 * pre ** 3)))
        else:
            pre, up = lin(b + "mlp.gate", m_in), lin(b + "mlp.up", m_in)
            close(b + "mlp.up", up)
            post = pre / (1 + np.exp(-pre)) * up
        close(b + "mlp.hidden_pre", pre)
        close(b + "mlp.hidden_post", post)
        out = lin(b + "mlp.down", post)
        close(b + "mlp.output", out)
        resid = resid + out
        close(b + "residual_out", resid)
    final = norm("final_norm", resid)
    close("final_norm", final)
    head = w["lm_head.weight"] if "lm_head.weight" in w else w["token_embedding.weight"].T
    close("logits", final @ head, tol=1e-4)


def _fused_pattern(q, k):
    """The probabilities inside the engine's blocked attention
    (glassllm.engine.attention.causal_attention_forward), as (B, H, T, T)."""
    from glassllm.engine import attention
    _, saved = attention.causal_attention_forward(q, k, k, 0)
    probs = saved[3]
    B, T, H, _ = q.shape
    K = k.shape[2]
    G = H // K
    full = np.zeros((B, K, T, G, T), dtype=q.dtype)
    for (first, end, keys), p in zip(attention._query_blocks(T, 0), probs):
        full[:, :, first:end, :, :keys] = p.reshape(B, K, end - first, G, keys)
    return full.transpose(0, 1, 3, 2, 4).reshape(B, H, T, T)


@pytest.mark.parametrize("T", [9, 150])  # 150 > 2 query blocks of the fused op
def test_traced_pattern_equals_the_fused_ops_probabilities(T, monkeypatch):
    cfg = Config(vocab_size=13, d_model=16, n_layers=1, n_heads=4, n_kv_heads=2, max_len=160)
    model = perturbed_model(cfg)
    x = np.random.default_rng(3).integers(0, 13, (2, T))
    _, c = run_with_cache(model, x, names=["blocks.0.attention.*"])
    fused = _fused_pattern(c["blocks.0.attention.q"], c["blocks.0.attention.k"])
    np.testing.assert_allclose(c["blocks.0.attention.pattern"], fused, rtol=1e-5, atol=1e-6)
    mixed = np.einsum("bhij,bjhd->bihd", c["blocks.0.attention.pattern"],
                      np.repeat(c["blocks.0.attention.v"], 2, axis=2))
    np.testing.assert_allclose(c["blocks.0.attention.head_output"], mixed, atol=1e-6)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_explicit_attention_path_equals_the_fused_one(name):
    """With gradients of the pattern asked for, attention runs as scores -> softmax -> @ v on
    the graph; its logits and parameter gradients equal the fused path's."""
    model = model_for(name)
    x, y = batch(model.cfg)
    fused_logits, fused = run_with_cache(model, x, y, grads=["*.residual_out"])
    explicit_logits, explicit = run_with_cache(model, x, y, grads=True)
    np.testing.assert_allclose(explicit_logits, fused_logits, atol=2e-6)
    for n in fused.grads:
        np.testing.assert_allclose(explicit.grads[n], fused.grads[n], atol=2e-6, err_msg=n)
    assert explicit.loss == pytest.approx(fused.loss, abs=1e-6)
    assert fused.loss == pytest.approx(model.loss(x, y).item(), abs=1e-6)


def test_explicit_attention_ops_gradcheck(gradcheck):
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(2, 5, 4, 3)), rng.normal(size=(2, 5, 2, 3)), \
        rng.normal(size=(2, 5, 2, 3))
    gradcheck(lambda a, b: softmax_op(scores_op(a, b)) * 1.0, q, k)
    gradcheck(lambda p, w: mix_op(softmax_op(p), w), rng.normal(size=(2, 4, 5, 5)), v)
    # decoding shape: 2 new queries after 3 cached positions
    gradcheck(lambda a, b: softmax_op(scores_op(a, b, q_start=3)), q[:, :2], k)


GRAD_NAMES = ["token_embedding", "blocks.0.attention.q", "blocks.0.attention.k",
              "blocks.0.attention.scores", "blocks.0.attention.pattern",
              "blocks.1.attention.head_output", "blocks.0.mlp.hidden_pre",
              "blocks.0.residual_mid", "blocks.1.residual_out", "final_norm", "logits"]


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_gradients_of_traced_values_match_float64_finite_differences(name):
    """d loss / d value at a few elements of each value: nudge the value itself (an Edit) by
    +-h and difference the loss, in float64."""
    model = to_float64(model_for(name))
    x, y = batch(model.cfg, B=1, T=6)
    _, cache = run_with_cache(model, x, y, grads=GRAD_NAMES)
    rng = np.random.default_rng(0)
    h = 1e-6
    checked = 0
    for n in GRAD_NAMES:
        value, grad = cache[n], cache.grads[n]
        assert grad.shape == value.shape and grad.dtype == np.float64
        candidates = np.argwhere(np.isfinite(value) & ((value != 0) | ("pattern" not in n)))
        for flat in rng.choice(len(candidates), size=3, replace=False):
            where = tuple(int(i) for i in candidates[flat])
            losses = []
            for sign in (1, -1):
                edit = Edit(n, where, value[where] + sign * h)
                with Trace(model, names=[n], edits=[edit]):
                    losses.append(model.loss(x, y).item())
            numeric = (losses[0] - losses[1]) / (2 * h)
            assert grad[where] == pytest.approx(numeric, rel=1e-5, abs=1e-8), (n, where)
            checked += 1
    assert checked == 3 * len(GRAD_NAMES)
    assert np.abs(cache.grads["blocks.0.attention.pattern"]).max() > 1e-3


def test_names_filter_patterns_and_errors():
    cfg = Config(**CONFIGS["llama"])
    assert select_names(cfg, ["blocks.*.residual_out", "logits"]) == \
        ["blocks.0.residual_out", "blocks.1.residual_out", "logits"]
    assert select_names(cfg, "blocks.1.attention.[qk]") == \
        ["blocks.1.attention.q", "blocks.1.attention.k"]
    with pytest.raises(ValueError, match="did you mean blocks.0.residual_out"):
        select_names(cfg, ["blocks.0.resid_out"])
    with pytest.raises(ValueError, match="matches no value"):
        select_names(cfg, ["blocks.5.residual_out"])
    with pytest.raises(ValueError, match="matches no value"):
        select_names(cfg, ["position_embedding"])  # llama has none
    model = GlassLM(cfg)
    x, _ = batch(cfg)
    _, cache = run_with_cache(model, x, names=["*.pattern"])
    assert list(cache) == ["blocks.0.attention.pattern", "blocks.1.attention.pattern"]


class _Spy:
    def __init__(self, block):
        self.block, self.calls = block, 0

    def __call__(self, *args):
        self.calls += 1
        return self.block(*args)


def test_stop_at_skips_the_rest_of_the_forward():
    model = GlassLM(Config(**CONFIGS["llama"]))
    spy = model.blocks[1] = _Spy(model.blocks[1])
    x, _ = batch(model.cfg)
    logits, cache = run_with_cache(model, x, stop_at="blocks.0.attention.pattern")
    assert logits is None and spy.calls == 0
    assert list(cache)[-1] == "blocks.0.attention.pattern"
    assert "blocks.0.attention.head_output" not in cache
    with Trace(model, names=["token_embedding"], stop_at="blocks.0.residual_out") as tr:
        model(x)
        raise AssertionError("the with block ends at stop_at")
    assert spy.calls == 0 and list(tr.cache) == ["token_embedding", "blocks.0.residual_out"]
    assert taps.hook_for(model) is None
    with pytest.raises(ValueError, match="stop_at"):
        Trace(model, grads=True, stop_at="logits")
    model(x)
    assert spy.calls == 1


def test_memory_estimate_is_exact_and_refuses_before_running():
    model = GlassLM(Config(**CONFIGS["gpt2"]))
    spy = model.blocks[0] = _Spy(model.blocks[0])
    x, y = batch(model.cfg)
    _, cache = run_with_cache(model, x, y, grads=True)
    assert {a.dtype for a in [*cache.values.values(), *cache.grads.values()]} == {np.dtype(np.float32)}
    assert cache.nbytes() == estimate_bytes(model.cfg, names_for(model.cfg), 2, 9,
                                            grads=names_for(model.cfg))
    need = estimate_bytes(model.cfg, names_for(model.cfg), 2, 9)
    spy.calls = 0
    with pytest.raises(TraceTooLarge, match="MiB"):
        run_with_cache(model, x, max_bytes=need - 1)
    assert spy.calls == 0
    run_with_cache(model, x, max_bytes=need)


def test_edits_ablate_and_block_gradients():
    model = model_for("llama")
    x, y = batch(model.cfg)
    index = (slice(None), slice(None), 1)
    edit = Edit("blocks.0.attention.head_output", index, 0.0)
    clean_logits, _ = run_with_cache(model, x)
    logits, cache = run_with_cache(model, x, y, grads=["blocks.0.attention.q"],
                                   names=["blocks.0.attention.head_output"], edits=[edit])
    assert np.all(cache["blocks.0.attention.head_output"][index] == 0)
    assert np.abs(cache["blocks.0.attention.head_output"][:, :, 0]).max() > 0
    assert np.abs(logits - clean_logits).max() > 1e-3
    # head 1 (query head, KV group 0) no longer reaches the loss through its q
    dq = cache.grads["blocks.0.attention.q"]
    assert np.all(dq[:, :, 1] == 0) and np.abs(dq[:, :, 0]).max() > 0


def test_traced_loss_keeps_the_logits_and_traces_do_not_nest():
    model = model_for("llama")
    x, y = batch(model.cfg)
    with Trace(model, names=["logits"]) as tr:
        loss = model.loss(x, y)
        with pytest.raises(RuntimeError, match="already active"):
            Trace(model).__enter__()
    np.testing.assert_array_equal(tr.cache["logits"], model(x).numpy())
    assert loss.item() == pytest.approx(model.loss(x, y).item(), abs=1e-6)


def test_trace_with_a_kv_cache_matches_the_full_forward():
    from glassllm.model import KVCache
    model = model_for("llama")
    x, _ = batch(model.cfg, B=1)
    _, full = run_with_cache(model, x, names=["blocks.1.attention.pattern"])
    kv = KVCache(model.cfg)
    model(x[:, :5], cache=kv)
    _, step = run_with_cache_cached(model, x[:, 5:], kv)
    np.testing.assert_allclose(step["blocks.1.attention.pattern"],
                               full["blocks.1.attention.pattern"][:, :, 5:], atol=1e-6)


def run_with_cache_cached(model, ids, kv):
    with Trace(model, names=["blocks.1.attention.pattern"]) as tr:
        logits = model(ids, cache=kv)
    return logits, tr.cache


def test_untraced_forward_has_no_trace():
    model = model_for("gpt2")
    assert taps.hook_for(model) is None
    x, _ = batch(model.cfg)
    a = model(x).numpy()
    run_with_cache(model, x)
    np.testing.assert_array_equal(model(x).numpy(), a)
    assert isinstance(model(x), Tensor)


def test_stop_at_is_one_exact_name_and_edit_patterns_edit_every_match():
    # breakit11: stop_at="*.q" raised a bare KeyError, stop_at="blocks.*.attention.q" ran the
    # whole forward without stopping, and Edit("blocks.*.mlp.output", ...) edited nothing
    model = model_for("llama")
    x, _ = batch(model.cfg)
    for pattern in ("*.q", "blocks.*.attention.q", "blocks.[01].residual_in"):
        with pytest.raises(ValueError, match="stop_at takes one exact name"):
            run_with_cache(model, x, stop_at=pattern)
    clean, _ = run_with_cache(model, x, names=["logits"])
    by_pattern, _ = run_with_cache(model, x, names=["logits"],
                                   edits=[Edit("blocks.*.mlp.output", ..., 0.0)])
    one_by_one, _ = run_with_cache(model, x, names=["logits"], edits=[
        Edit(f"blocks.{i}.mlp.output", ..., 0.0) for i in range(model.cfg.n_layers)])
    assert np.abs(clean - one_by_one).max() > 1e-4
    np.testing.assert_array_equal(by_pattern, one_by_one)


# --------------------------------------------------------------------------- bound to one model
ZERO_MLP = Edit("blocks.*.mlp.output", ..., 0.0)


def test_a_trace_neither_records_nor_edits_another_model():
    a, b = model_for("llama", seed=0), model_for("llama", seed=1)
    x, _ = batch(a.cfg)
    clean_a, clean_b = a(x).numpy(), b(x).numpy()
    with Trace(a, names=["logits"], edits=[ZERO_MLP]) as tr:
        inside_b = b(x).numpy()
        assert len(tr.cache) == 0  # b's forward left no value in a's trace
        edited_a = a(x).numpy()
    np.testing.assert_array_equal(inside_b, clean_b)  # nor was it edited
    assert list(tr.cache) == ["logits"]
    np.testing.assert_array_equal(tr.cache["logits"], edited_a)
    assert np.abs(edited_a - clean_a).max() > 1e-3  # the edit acts on a's forward


def test_a_trace_neither_records_nor_edits_its_model_in_another_thread():
    import threading
    a = model_for("llama")
    x, _ = batch(a.cfg)
    clean = a(x).numpy()
    seen = {}

    def other_thread():
        try:
            seen["logits"] = a(x).numpy()
        except BaseException as e:  # handed to the test below
            seen["error"] = e

    with Trace(a, names=["logits"], edits=[ZERO_MLP]) as tr:
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        assert len(tr.cache) == 0
        edited = a(x).numpy()  # this thread's forward is traced
    assert "error" not in seen, seen.get("error")
    np.testing.assert_array_equal(seen["logits"], clean)
    assert np.abs(edited - clean).max() > 1e-3 and list(tr.cache) == ["logits"]


# --------------------------------------------------------------------------- generation
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_generation_under_a_trace_records_every_step_as_one_forward(name):
    """Prefill then one position per step (llama's one-token fast path is left for forward
    while traced): the trace holds what one forward of the whole sequence gives."""
    from glassllm.generate import Sampling, generate
    model = model_for(name)
    prompt, greedy = [1, 2, 3], Sampling(temperature=0)
    plain = generate(model, prompt, 6, greedy)
    with Trace(model) as tr:
        traced = generate(model, prompt, 6, greedy)
    assert traced == plain
    seq = np.array([prompt + traced[:-1]])  # the last token drawn is never forwarded
    np.testing.assert_array_equal(tr.cache.tokens, seq)
    _, full = run_with_cache(model, seq)
    assert list(tr.cache) == list(full)
    for n in full:
        assert tr.cache[n].shape == full[n].shape, n
        np.testing.assert_allclose(tr.cache[n], full[n], rtol=1e-5, atol=1e-5, err_msg=n)


def test_generation_under_a_trace_edits_every_step():
    from glassllm.generate import Sampling, generate
    model = model_for("llama")
    prompt = [1, 2, 3]
    with Trace(model, names=["logits"], edits=[ZERO_MLP]) as tr:
        traced = generate(model, prompt, 6, Sampling(temperature=0))
    seq = prompt + traced[:-1]
    edited, _ = run_with_cache(model, seq, names=["logits"], edits=[ZERO_MLP])
    np.testing.assert_allclose(tr.cache["logits"], edited, rtol=1e-5, atol=1e-5)
    assert traced == np.argmax(edited[0, len(prompt) - 1:], axis=-1).tolist()
    # every decoding step was edited, not the prompt only
    assert np.abs(edited - model(seq).numpy())[0, len(prompt):].max(axis=-1).min() > 1e-3


def test_generation_under_a_trace_refuses_what_it_cannot_record():
    from glassllm.generate import Sampling, generate
    from glassllm.model import KVCache
    model = model_for("gpt2")  # max_len 12
    with pytest.raises(RuntimeError, match="outgrew max_len=12"):
        with Trace(model, names=["logits"]):
            generate(model, [1] * 10, 5, Sampling(temperature=0))
    generate(model, [1] * 10, 5, Sampling(temperature=0))  # untraced: crops, as nanoGPT
    x, y = batch(model.cfg, B=1)
    kv = KVCache(model.cfg)
    with pytest.raises(ValueError, match="grads=False"):
        with Trace(model, grads=["logits"]):
            model(x[:, :4], cache=kv)
            model(x[:, 4:5], cache=kv)  # continues the record: one forward's gradients only
    need = estimate_bytes(model.cfg, names_for(model.cfg), 1, 4)
    kv = KVCache(model.cfg)
    with pytest.raises(TraceTooLarge, match=r"\(1, 5\) batch"):  # the steps count together
        with Trace(model, max_bytes=need):
            model(x[:, :4], cache=kv)
            model(x[:, 4:5], cache=kv)


def test_fresh_forwards_replace_the_record_and_a_trace_after_prefill_starts_there():
    from glassllm.model import KVCache
    model = model_for("llama")
    x, _ = batch(model.cfg)
    with Trace(model, names=["logits"]) as tr:
        model(x[:, :3])
        model(x[:, 3:7])  # from position 0 again: a new sequence (a micro-batch)
    np.testing.assert_array_equal(tr.cache.tokens, x[:, 3:7])
    np.testing.assert_array_equal(tr.cache["logits"], model(x[:, 3:7]).numpy())
    kv = KVCache(model.cfg, batch_size=2)
    model(x[:, :5], cache=kv)
    with Trace(model, names=["logits", "blocks.0.attention.pattern"]) as tr:
        model(x[:, 5:7], cache=kv)
        model(x[:, 7:8], cache=kv)
    assert tr.cache.start == 5 and tr.cache["logits"].shape == (2, 3, 13)
    _, full = run_with_cache(model, x[:, :8], names=["blocks.0.attention.pattern"])
    np.testing.assert_allclose(tr.cache["blocks.0.attention.pattern"],
                               full["blocks.0.attention.pattern"][:, :, 5:], atol=1e-6)
