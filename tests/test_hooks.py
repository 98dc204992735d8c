"""Hooks on named values (glassllm.lens.trace.run_with_hooks, Trace(hooks=...)), TransformerLens'
hook names, to_str_tokens: each against what the library already computes another way."""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from glassllm import Tensor
from glassllm.tokenizers import ByteTokenizer
from glassllm.generate import Sampling, generate
from glassllm.lens.trace import (NAMES, TRANSFORMER_LENS_NAMES, Edit, Trace, run_with_cache,
                                 run_with_hooks, to_str_tokens)
from test_trace import batch, model_for

GREEDY = Sampling(temperature=0)


def zero_at(index):
    """A hook that does what Edit(name, index, 0.0) does."""
    def hook(value, name):
        new = value.copy()
        new[index] = 0.0
        return new
    return hook


# --------------------------------------------------------------------------- forward hooks
@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("name, index", [
    ("blocks.0.mlp.output", (slice(None), 2)),                      # one position
    ("blocks.1.attention.head_output", (slice(None), slice(None), 1)),  # one head
    ("blocks.0.attention.pattern", (slice(None), 0, 3)),            # one query row
    ("blocks.*.residual_mid", ...),                                  # a pattern: every layer
])
def test_run_with_hooks_reproduces_an_edit_exactly(family, name, index):
    model = model_for(family)
    x, _ = batch(model.cfg)
    edited, _ = run_with_cache(model, x, names=["logits"], edits=[Edit(name, index, 0.0)])
    hooked = run_with_hooks(model, x, hooks=[(name, zero_at(index))])
    assert hooked.dtype == np.float32 and hooked.shape == (2, 9, model.cfg.vocab_size)
    np.testing.assert_array_equal(hooked, edited)
    assert np.abs(hooked - model(x).data).max() > 1e-4  # the edit does something


def test_a_hook_sees_the_value_and_its_name_and_none_leaves_it():
    model = model_for("llama")
    x, _ = batch(model.cfg)
    _, cache = run_with_cache(model, x)
    seen = {}

    def look(value, name):
        seen[name] = value.copy()
        return None

    logits = run_with_hooks(model, x, hooks=[("*.attention.[qkv]", look), ("logits", look)])
    np.testing.assert_array_equal(logits, model(x).data)
    assert sorted(seen) == sorted([f"blocks.{i}.attention.{p}" for i in (0, 1)
                                   for p in "qkv"] + ["logits"])
    for name, value in seen.items():
        np.testing.assert_array_equal(value, cache[name])


def test_hooks_apply_in_order_after_the_edits_and_the_trace_records_the_result():
    model = model_for("gpt2")
    x, _ = batch(model.cfg)
    name = "blocks.0.residual_out"
    with Trace(model, names=[name], edits=[Edit(name, ..., 1.0)],
               hooks=[(name, lambda v, n: v * 3), (name, lambda v, n: v + 1)]) as tr:
        out = model(x).data
    # the edit set every element to 1, then *3, then +1: the trace holds what the forward used
    assert np.all(tr.cache[name] == 4.0)
    want, _ = run_with_cache(model, x, names=["logits"], edits=[Edit(name, ..., 4.0)])
    np.testing.assert_array_equal(out, want)


def test_a_hook_cannot_write_into_the_forward_and_must_keep_the_shape():
    model = model_for("llama")
    x, _ = batch(model.cfg)

    def in_place(value, name):
        value[...] = 0
    with pytest.raises(ValueError, match="read-only"):
        run_with_hooks(model, x, hooks=[("blocks.0.mlp.output", in_place)])
    with pytest.raises(ValueError, match=r"'blocks.0.mlp.output' returned shape \(16,\); the "
                                         r"value it replaces has shape \(2, 9, 16\)"):
        run_with_hooks(model, x, hooks=[("blocks.0.mlp.output", lambda v, n: v[0, 0])])
    for bad in ([("blocks.0.mlp.output",)], [("blocks.0.mlp.output", 3)], [(0, print)]):
        with pytest.raises(ValueError, match=r"hooks must be \(name_or_pattern, fn\) pairs"):
            run_with_hooks(model, x, hooks=bad)
    with pytest.raises(ValueError, match="matches no value"):
        run_with_hooks(model, x, hooks=[("blocks.0.mlp.outptu", print)])
    with pytest.raises(ValueError, match="backward hooks need targets"):
        run_with_hooks(model, x, backward_hooks=[("logits", print)])
    np.testing.assert_array_equal(  # one pair given bare works as a list of one
        run_with_hooks(model, x, hooks=("logits", lambda v, n: v * 0)), 0 * model(x).data)


@pytest.mark.parametrize("result, kind", [
    (lambda v: v.astype(np.complex64), "an array of dtype complex64"),  # never a silent cast
    (lambda v: "zero", "a str"),
    (lambda v: {"value": v}, "a dict"),
    (lambda v: Tensor(v.copy()), "a Tensor"),
    (lambda v: np.full(v.shape, None), "an array of dtype object"),
])
def test_a_hook_returning_no_real_array_is_one_clear_error(result, kind):
    model = model_for("llama")
    x, _ = batch(model.cfg)
    with pytest.raises(ValueError, match=re.escape(
            f"trace: the value hook on 'blocks.0.mlp.output' returned {kind}; it must return a "
            f"NumPy array of real numbers (a Tensor's .data) or None")):
        run_with_hooks(model, x, hooks=[("blocks.0.mlp.output", lambda v, n: result(v))])


def test_hooks_as_a_dict_or_none():
    model = model_for("llama")
    x, _ = batch(model.cfg)
    np.testing.assert_array_equal(run_with_hooks(model, x, hooks=None), model(x).data)
    np.testing.assert_array_equal(
        run_with_hooks(model, x, hooks={"logits": lambda v, n: v * 0}), 0 * model(x).data)


def test_hooks_act_on_their_model_in_their_thread_only():
    import threading
    a, b = model_for("llama", seed=0), model_for("llama", seed=1)
    x, _ = batch(a.cfg)
    clean_a, clean_b = a(x).data, b(x).data
    calls = []

    def zero(value, name):
        calls.append(threading.get_ident())
        return np.zeros_like(value)

    other = {}
    worker = threading.Thread(target=lambda: other.update(logits=a(x).data))
    with Trace(a, names=[], hooks=[("blocks.*.mlp.output", zero)]):
        np.testing.assert_array_equal(b(x).data, clean_b)  # another model: untouched
        worker.start()
        worker.join()
        hooked = a(x).data
    np.testing.assert_array_equal(other["logits"], clean_a)  # another thread: untouched
    assert calls == [threading.get_ident()] * a.cfg.n_layers
    assert np.abs(hooked - clean_a).max() > 1e-3


# --------------------------------------------------------------------------- steering
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_steering_vector_steers_every_step_of_a_generation(family):
    """A vector added to blocks.1.residual_out changes what is generated, and the steered
    generation (prefill + KV-cached steps) is the greedy decoding of run_with_hooks on the
    whole sequence at each step."""
    from glassllm.lens.interpret import unembedding_matrix
    model = model_for(family)
    direction = unembedding_matrix(model)[:, 7]  # towards token 7's logit
    vector = (10 * direction / np.linalg.norm(direction)).astype(np.float32)
    steer = [("blocks.1.residual_out", lambda value, name: value + vector)]
    prompt = [1, 2, 3]
    plain = generate(model, prompt, 6, GREEDY)
    with Trace(model, names=[], hooks=steer):
        steered = generate(model, prompt, 6, GREEDY)
    assert steered != plain and steered.count(7) > plain.count(7)
    by_hand = list(prompt)
    for _ in range(6):
        logits = run_with_hooks(model, [by_hand], hooks=steer)
        by_hand.append(int(np.argmax(logits[0, -1])))
    assert steered == by_hand[len(prompt):]
    assert generate(model, prompt, 6, GREEDY) == plain  # nothing left behind


# --------------------------------------------------------------------------- backward hooks
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_backward_hook_sees_the_gradient_run_with_cache_gives(family):
    model = model_for(family)
    x, y = batch(model.cfg)
    names = ["blocks.0.residual_out", "blocks.1.attention.pattern", "final_norm"]
    _, cache = run_with_cache(model, x, y, grads=names)
    model.zero_grad()
    seen = {}

    def record(grad, name):
        seen[name] = grad.copy()

    logits = run_with_hooks(model, x, targets=y, backward_hooks=[(n, record) for n in names])
    model.zero_grad()
    np.testing.assert_array_equal(logits, model(x).data)
    assert sorted(seen) == sorted(names)
    for name in names:
        assert seen[name].shape == cache[name].shape
        np.testing.assert_allclose(seen[name], cache.grads[name], rtol=1e-6, atol=1e-9)
        assert np.abs(seen[name]).max() > 0


def test_a_backward_hook_replaces_the_gradient_passed_on():
    """Zero the gradient at blocks.0.residual_in: the token embedding (llama, untied: nothing
    else reaches it) gets none, while a hook that returns None leaves it as it was;
    cache.grads keeps what arrived, before the hook."""
    model = model_for("llama_untied")
    x, y = batch(model.cfg)
    name = "blocks.0.residual_in"
    model.zero_grad()
    run_with_hooks(model, x, targets=y, backward_hooks=[(name, lambda g, n: None)])
    plain = model.token_embedding.weight.grad.copy()
    assert np.abs(plain).max() > 0
    model.zero_grad()
    with Trace(model, grads=[name], backward_hooks=[(name, lambda g, n: np.zeros_like(g))]) as tr:
        from glassllm import functional as F
        F.cross_entropy(model(x), y).backward()
    assert not np.any(model.token_embedding.weight.grad)
    assert np.abs(tr.cache.grads[name]).max() > 0
    model.zero_grad()


# --------------------------------------------------------------------------- TransformerLens names
def test_the_transformer_lens_table_covers_every_name():
    assert list(TRANSFORMER_LENS_NAMES) == [n.template for n in NAMES]


@pytest.mark.parametrize("family, ours, theirs", [
    ("llama", "blocks.1.residual_out", "blocks.1.hook_resid_post"),
    ("llama", "blocks.0.attention.q", "blocks.0.attn.hook_rot_q"),
    ("llama", "blocks.*.mlp.up", "blocks.*.mlp.hook_pre_linear"),
    ("gpt2", "position_embedding", "hook_pos_embed"),
    ("gpt2", "blocks.0.attention.k", "blocks.0.attn.hook_k"),
    ("gpt2", "blocks.*.attention.head_output", "blocks.*.attn.hook_z"),
    ("gpt2", "final_norm", "ln_final.hook_normalized"),
])
def test_run_with_hooks_accepts_transformer_lens_names(family, ours, theirs):
    model = model_for(family)
    x, _ = batch(model.cfg)
    def shift(value, name):  # varies along every axis: no norm or softmax undoes it
        return value + np.sin(np.arange(value.size, dtype=np.float32)).reshape(value.shape)

    want = run_with_hooks(model, x, hooks=[(ours, shift)])
    np.testing.assert_array_equal(run_with_hooks(model, x, hooks=[(theirs, shift)]), want)
    assert np.abs(want - model(x).data).max() > 1e-4
    _, cache = run_with_cache(model, x, names=[theirs])  # every trace name selection maps
    assert list(cache) == [n for n in cache] and all("hook_" not in n for n in cache)


@pytest.mark.parametrize("family, name, why", [
    ("llama", "blocks.0.attn.hook_q", "after RoPE: TransformerLens' blocks.0.attn.hook_rot_q"),
    ("gpt2", "blocks.0.attn.hook_rot_k", "no rotary embedding"),
    ("llama", "blocks.0.hook_nothing", "TRANSFORMER_LENS_NAMES"),
    ("llama", "hook_pos_embed", "matches no value of this llama model"),
])
def test_transformer_lens_names_without_a_glassllm_value_are_refused(family, name, why):
    model = model_for(family)
    x, _ = batch(model.cfg)
    with pytest.raises(ValueError, match=re.escape(why)):
        run_with_hooks(model, x, hooks=[(name, print)])


def test_the_names_page_lists_the_table():
    page = (Path(__file__).parent.parent / "docs" / "names-transformerlens.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| (?:`([^`]+)`|—)", page, flags=re.M)
    assert [ours for ours, _ in rows] == list(TRANSFORMER_LENS_NAMES)
    assert [theirs for _, theirs in rows] == list(TRANSFORMER_LENS_NAMES.values())


def test_the_names_page_code_runs(capsys):
    page = (Path(__file__).parent.parent / "docs" / "names-transformerlens.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], "docs/names-transformerlens.md", "exec"), {})
    assert capsys.readouterr().out == "(1, 4, 16, 16)\n['O', 'n', 'c', 'e']\n"


def test_run_with_hooks_through_the_old_path():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from glassllm.trace import run_with_hooks as old
    assert old is run_with_hooks


# --------------------------------------------------------------------------- to_str_tokens
class HoldsATokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer


def test_to_str_tokens():
    byte = ByteTokenizer()
    assert to_str_tokens(byte, "hé!") == ["h", "\\xc3", "\\xa9", "!"]
    assert to_str_tokens(HoldsATokenizer(byte), [104, 105]) == ["h", "i"]
    assert to_str_tokens(byte, np.array([[104, 105]])) == ["h", "i"]
    assert to_str_tokens(byte, np.array([[104, 105], [105, 104]])) == [["h", "i"], ["i", "h"]]
    assert to_str_tokens(byte, [256]) == ["<|eot|>"]
    assert to_str_tokens(byte, []) == [] and to_str_tokens(byte, np.zeros(0)) == []
    for bad in ([257], [-1], [1.5], [[[1]]]):
        with pytest.raises(ValueError, match=r"ids must be integers in \[0, 257\)"):
            to_str_tokens(byte, bad)
    with pytest.raises(ValueError, match="has no BOS token"):
        to_str_tokens(byte, "hi", prepend_bos=True)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        to_str_tokens(model_for("llama"), [1])


def test_to_str_tokens_on_llama2c_pieces():
    from conftest import shared_data_path
    from glassllm.formats.llama2c import tokenizer_from_llama2c
    tok = tokenizer_from_llama2c(shared_data_path("llama2c", "tok512.bin"))
    words = to_str_tokens(tok, "Once upon a time")
    assert words[0] == "<s>" and "".join(words[1:]) == " Once upon a time"
    assert to_str_tokens(tok, "Once upon a time", prepend_bos=False) == words[1:]
    assert to_str_tokens(tok, tok.encode("Once")) == words[1:1 + len(tok.encode("Once"))]


def test_backward_hooks_are_refused_where_no_backward_pass_can_reach_them():
    model = model_for("llama")
    x, y = batch(model.cfg)
    hook = [("logits", print)]
    with pytest.raises(ValueError, match="cannot have grads or backward hooks"):
        Trace(model, stop_at="blocks.0.residual_out", backward_hooks=hook)
    with pytest.raises(ValueError, match="grads=False and no backward_hooks"):
        with Trace(model, names=[], backward_hooks=hook):
            generate(model, [1, 2, 3], 3, GREEDY)  # steps continue the prefill's KV cache
