"""The autograd graph of any Tensor, drawn as Graphviz DOT (after micrograd's `draw_dot`).

    g = draw_dot(model.loss(x, y), model=model, backward=True)   # runs the backward pass
    g.save("loss.dot"); g.save("loss.svg")                        # SVG needs Graphviz's `dot`

Each node is one value: the op that made it (`linear`, `rms_norm`, `causal_attention`, `add`,
...; leaves are parameters, by name, or inputs), its shape and dtype, and statistics of its
value (mean, std, min, max) and, with backward=True, of its gradient (d root / d value, caught
as the real backward pass runs; see `draw_dot`). Arrows go from inputs to results, as in
micrograd. Big graphs collapse by module: every op is assigned to the module whose parameter
it reads (or else to the module of its latest input), and one box per module (e.g.
`blocks.0`) stands for its ops, with their count and sizes.

The op name comes from the backward closure the op recorded (`linear.<locals>.backward` ->
"linear"): the graph is read, not re-traced, so it shows exactly what backward() will walk.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess

import numpy as np

from ..devices import to_host
from ..formats.atomic import atomic_write
from ..tensor import Tensor, topological_order


@dataclasses.dataclass
class Node:
    """One value of the graph. `parents`: ids of its inputs (Node.key); `module`: dotted
    module it belongs to ("" when unknown); stats: mean, std, min, max (None for empty)."""
    key: int
    op: str
    shape: tuple
    dtype: str
    parents: list[int]
    name: str = ""
    module: str = ""
    value_stats: tuple | None = None
    grad_stats: tuple | None = None


def _stats(a: np.ndarray) -> tuple | None:
    a = np.asarray(to_host(a))  # measured on the host, from any device
    if a.size == 0 or a.dtype.kind not in "fiu":
        return None
    with np.errstate(all="ignore"):
        a64 = a.astype(np.float64, copy=False)
        return (float(a64.mean()), float(a64.std()), float(a64.min()), float(a64.max()))


def op_name(t: Tensor) -> str:
    """The op that made `t`, from the qualified name of its backward closure; "leaf" for
    leaves. Wrappers (amp's keep_autocast, functional's graph node calling the op's picked
    backward `<op>_backward`) are looked through."""
    fn = t._backward
    if fn is None:
        return "leaf"
    for _ in range(3):  # unwrap closures that only forward to another backward
        qual = getattr(fn, "__qualname__", "")
        if not qual.startswith(("keep_autocast", "_node")):
            break
        inner = [c.cell_contents for c in (fn.__closure__ or ()) if callable(c.cell_contents)]
        if not inner:
            break
        fn = inner[0]
    parts = [p for p in qual.split(".") if p != "<locals>"]
    if not parts:
        return "op"
    if parts[0] == "Tensor" and len(parts) > 1:
        return parts[1].strip("_")  # Tensor.__add__ -> "add"
    if parts[0] == "Trace" and "_catch_grad" in parts:
        return "trace"
    if parts[0] == "Edit":
        return "edit"
    return parts[0].removesuffix("_backward")  # functional's rms_norm_backward -> "rms_norm"


@dataclasses.dataclass
class Graph:
    """A drawn graph: `nodes` (parents before children), `root` key, `collapsed` (whether
    `dot` shows modules instead of ops), `dot` (the DOT source)."""
    nodes: list[Node]
    root: int
    collapsed: bool
    dot: str

    def svg(self) -> str:
        """The graph rendered to SVG by Graphviz's `dot`.

        Raises:
            FileNotFoundError: `dot` is not on PATH (install Graphviz, or use `.dot`).
            RuntimeError: dot failed (its message).
        """
        exe = shutil.which("dot")
        if exe is None:
            raise FileNotFoundError("Graphviz's `dot` is not installed: save the .dot source "
                                    "instead, or install graphviz")
        out = subprocess.run([exe, "-Tsvg"], input=self.dot.encode(), capture_output=True,
                             check=False)
        if out.returncode:
            raise RuntimeError(f"dot failed: {out.stderr.decode(errors='replace').strip()}")
        return out.stdout.decode()

    def save(self, path) -> str:
        """Write the DOT source (".dot"/".gv") or the SVG (".svg"), atomically; returns path."""
        path = os.fspath(path)
        suffix = os.path.splitext(path)[1].lower()
        if suffix not in (".dot", ".gv", ".svg"):
            raise ValueError(f"graph: save to .dot, .gv or .svg, not {suffix or 'no suffix'!r}")
        text = self.svg() if suffix == ".svg" else self.dot
        with atomic_write(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path


def draw_dot(root: Tensor, model=None, backward: bool = False, collapse="auto",
             max_nodes: int = 120, depth: int = 2, rankdir: str = "LR") -> Graph:
    """The graph that made `root`, as DOT.

    Args:
        root: any Tensor (typically a loss). Leaves are labelled by parameter name when
            `model` (a Module) is given.
        backward: run `root.backward()` (root must be a single element) and show each
            node's gradient statistics. The graph is then consumed, as after any backward;
            parameters' .grad are filled exactly as a plain backward() would.
        collapse: True, False, or "auto" (collapse when there are more than max_nodes).
        depth: collapsed modules are the first `depth` components of the dotted name
            ("blocks.0" for depth 2).
        rankdir: Graphviz layout direction ("LR" left to right, "TB" top to bottom).
    """
    tensors = topological_order(root)  # parents before children
    names = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
    nodes, by_key = [], {}
    for t in tensors:
        op = op_name(t)
        node = Node(id(t), op if op != "leaf" else ("parameter" if id(t) in names else "input"),
                    tuple(t.shape), str(t.dtype), [id(p) for p in t._parents],
                    name=names.get(id(t), ""), value_stats=_stats(t.data))
        node.module = _module_of(node, by_key)
        nodes.append(node)
        by_key[node.key] = node
    if backward:
        _catch_gradients(root, tensors, by_key)
    if collapse == "auto":
        collapse = len(nodes) > max_nodes
    dot = _collapsed_dot(nodes, id(root), depth, rankdir) if collapse else \
        _dot(nodes, id(root), rankdir)
    return Graph(nodes, id(root), bool(collapse), dot)


def _module_of(node: Node, by_key: dict) -> str:
    """The module an op belongs to: a parameter's module for a leaf (name minus
    .weight/.bias); for an op, the module of the parameter it reads, else its latest input's."""
    if node.name:
        return node.name.rsplit(".", 1)[0]
    if node.op == "cross_entropy":
        return "loss"
    if node.op == "unembed":  # reads the tied token embedding, but is the output head
        return "lm_head"
    parents = [by_key[k] for k in node.parents if k in by_key]
    for p in parents:
        if p.name:
            return p.module
    modules = [p.module for p in parents if p.module]
    return modules[-1] if modules else ""


def _catch_gradients(root: Tensor, tensors: list[Tensor], by_key: dict) -> None:
    """Run root.backward() with each op's backward wrapped to record its incoming gradient
    (the graph keeps no intermediate gradients otherwise); leaves' .grad afterwards."""
    for t in tensors:
        if t._backward is None:
            continue
        original, node = t._backward, by_key[id(t)]

        def recording(g, original=original, node=node):
            node.grad_stats = _stats(g)
            return original(g)

        t._backward = recording
    root.backward()
    for t in tensors:
        if t._backward is None and t.grad is not None:
            by_key[id(t)].grad_stats = _stats(t.grad)


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _stats_text(prefix: str, s: tuple | None) -> str:
    if s is None:
        return ""
    return f"{prefix} mean {_fmt(s[0])} std {_fmt(s[1])}\\n[{_fmt(s[2])}, {_fmt(s[3])}]"


def _quote(text: str) -> str:
    """A DOT string; the two characters backslash-n inside are DOT's line break, kept."""
    return '"' + text.replace('"', '\\"') + '"'


def _record_field(text: str) -> str:
    """Text safe inside a record label, whose syntax uses { } | < >."""
    for a, b in (("{", "("), ("}", ")"), ("|", "/"), ("<", "("), (">", ")")):
        text = text.replace(a, b)
    return text


def _dot(nodes: list[Node], root: int, rankdir: str) -> str:
    lines = [f"digraph autograd {{", f"  rankdir={rankdir};",
             '  node [shape=record, fontname="Helvetica", fontsize=10];']
    for n in nodes:
        title = n.name or n.op
        fields = [title, f"{n.shape} {n.dtype}"]
        for prefix, s in (("value", n.value_stats), ("grad", n.grad_stats)):
            text = _stats_text(prefix, s)
            if text:
                fields.append(text)
        label = "{" + " | ".join(_record_field(f) for f in fields) + "}"
        style = ", style=filled, fillcolor=lightblue" if n.op == "parameter" else \
            ", style=filled, fillcolor=gold" if n.key == root else ""
        lines.append(f"  n{n.key} [label={_quote(label)}{style}];")
    for n in nodes:
        for p in n.parents:
            lines.append(f"  n{p} -> n{n.key};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _collapsed_dot(nodes: list[Node], root: int, depth: int, rankdir: str) -> str:
    group_of = {n.key: ".".join(n.module.split(".")[:depth]) or "(inputs)" for n in nodes}
    groups: dict[str, list[Node]] = {}
    for n in nodes:
        groups.setdefault(group_of[n.key], []).append(n)
    lines = [f"digraph autograd_modules {{", f"  rankdir={rankdir};",
             '  node [shape=box, style=rounded, fontname="Helvetica", fontsize=10];']
    ids = {g: f"g{i}" for i, g in enumerate(groups)}
    for g, members in groups.items():
        ops = [m for m in members if m.op not in ("parameter", "input")]
        params = [m for m in members if m.op == "parameter"]
        n_params = sum(int(np.prod(m.shape)) for m in params)
        kinds = sorted({m.op for m in ops})
        label = f"{g}\\n{len(ops)} ops ({', '.join(kinds[:6])}{', ...' if len(kinds) > 6 else ''})"
        if params:
            label += f"\\n{len(params)} parameters, {n_params:,} values"
        grads = [m.grad_stats for m in members if m.grad_stats]
        if grads:
            label += f"\\nlargest |grad| {_fmt(max(max(abs(s[2]), abs(s[3])) for s in grads))}"
        is_root = any(m.key == root for m in members)
        fill = ', style="rounded,filled", fillcolor=gold' if is_root else ""
        lines.append(f"  {ids[g]} [label={_quote(label)}{fill}];")
    edges = set()
    for n in nodes:
        for p in n.parents:
            a, b = group_of.get(p), group_of[n.key]
            if a is not None and a != b:
                edges.add((ids[a], ids[b]))
    lines += [f"  {a} -> {b};" for a, b in sorted(edges)]
    lines.append("}")
    return "\n".join(lines) + "\n"
