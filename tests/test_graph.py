"""glassllm.lens.graph: the drawn graph is the graph backward() walks, with the real gradients."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from glassllm import Tensor
from glassllm.lens.graph import draw_dot, op_name
from glassllm.model import Config, GlassLM


def tiny():
    model = GlassLM(Config(vocab_size=11, d_model=16, n_layers=2, n_heads=2, max_len=8))
    x = np.arange(8)[None] % 11
    return model, x


def test_small_expression_like_micrograd():
    a = Tensor(np.array([1.0, -2.0, 3.0]), requires_grad=True)
    b = Tensor(np.array([0.5, 0.5, 0.5]), requires_grad=True)
    loss = ((a * b) + a).sum()
    g = draw_dot(loss, backward=True)
    ops = [n.op for n in g.nodes]
    assert ops.count("input") == 2 and {"mul", "add", "sum"} <= set(ops)
    assert not g.collapsed and g.dot.startswith("digraph")
    root = next(n for n in g.nodes if n.key == g.root)
    assert root.value_stats[0] == pytest.approx(2.0 * 0.5 + 2.0)  # (1-2+3)*.5 + (1-2+3)
    np.testing.assert_allclose(a.grad, b.data + 1)  # the backward really ran
    leaf_a = next(n for n in g.nodes if n.key == id(a))
    assert leaf_a.grad_stats[0] == pytest.approx(1.5) and leaf_a.grad_stats[1] == 0
    # every edge of the DOT is an input -> result pair of the graph
    edges = {line.strip().rstrip(";") for line in g.dot.splitlines() if "->" in line}
    assert edges == {f"n{p} -> n{n.key}" for n in g.nodes for p in n.parents}


def test_model_graph_names_ops_and_gradients_equal_plain_backward():
    model, x = tiny()
    g = draw_dot(model.loss(x, x), model=model, backward=True, collapse=False)
    drawn = {n: p.grad.copy() for n, p in model.named_parameters()}
    model.zero_grad()
    model.loss(x, x).backward()
    for n, p in model.named_parameters():
        np.testing.assert_array_equal(drawn[n], p.grad, err_msg=n)
    ops = {n.op for n in g.nodes}
    assert {"embedding", "rms_norm", "linear", "rope", "causal_attention", "swiglu", "unembed",
            "cross_entropy", "parameter"} <= ops
    params = [n for n in g.nodes if n.op == "parameter"]
    assert sorted(n.name for n in params) == sorted(n for n, _ in model.named_parameters())
    # the loss node's gradient is 1; a parameter node's grad stats are its .grad's
    root = next(n for n in g.nodes if n.key == g.root)
    assert root.grad_stats[:2] == (1.0, 0.0)
    q = next(n for n in params if n.name == "blocks.0.attention.query.weight")
    grad = model.blocks[0].attention.query.weight.grad
    assert q.grad_stats[0] == pytest.approx(float(grad.mean()), rel=1e-6)
    assert "blocks.0.attention.query.weight" in g.dot


def test_big_graphs_collapse_by_module():
    model, x = tiny()
    g = draw_dot(model.loss(x, x), model=model, max_nodes=10)
    assert g.collapsed
    groups = {line.split("label=")[1].split("\\n")[0].strip('"')
              for line in g.dot.splitlines() if "label=" in line and "->" not in line}
    assert groups == {"token_embedding", "blocks.0", "blocks.1", "final_norm", "lm_head", "loss"}
    assert "blocks.0\\n19 ops" in g.dot
    small = draw_dot(model.loss(x, x), model=model, max_nodes=1000)
    assert not small.collapsed


def test_op_names_and_save(tmp_path):
    t = Tensor(np.ones(3), requires_grad=True)
    assert op_name(t) == "leaf" and op_name(t.reshape(3, 1)) == "reshape"
    model, x = tiny()
    g = draw_dot(model.loss(x, x), model=model)
    path = g.save(tmp_path / "g.dot")
    assert open(path).read() == g.dot
    with pytest.raises(ValueError, match="suffix|.svg"):
        g.save(tmp_path / "g.png")


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` not installed")
def test_svg_rendered_by_graphviz(tmp_path):
    model, x = tiny()
    g = draw_dot(model.loss(x, x), model=model, collapse=False)
    svg = g.save(tmp_path / "g.svg")
    text = open(svg).read()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    assert text.count("<g id=\"node") == len(g.nodes)
