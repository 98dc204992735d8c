"""model.py reads like nanoGPT's: the layers come first, each forward fits on a screen, and a
traced value is one `tap(...)` line, not an `if` block around the computation."""
from __future__ import annotations

import ast
from pathlib import Path

MODEL = Path(__file__).resolve().parents[1] / "src" / "glassllm" / "model.py"
FORWARDS = {"__call__", "forward"}


def code_lines(function: ast.FunctionDef) -> int:
    """Lines from `def` to the end, the docstring left out."""
    body = function.body
    has_doc = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
        and isinstance(body[0].value.value, str)
    doc = body[0].end_lineno - body[0].lineno + 1 if has_doc else 0
    return function.end_lineno - function.lineno + 1 - doc


def layout_problems(source: str) -> list[str]:
    tree = ast.parse(source)
    problems = []
    first = min((node.lineno for node in tree.body if isinstance(node, ast.ClassDef)
                 and "Module" in map(ast.unparse, node.bases)), default=None)
    if first is None or first > 80:
        problems.append(f"first layer class at line {first}, not within 80 lines of the top")
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "_trace" in ast.unparse(node.test):
            problems.append(f"line {node.lineno}: an `if _trace` block")
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for f in cls.body:
            if isinstance(f, ast.FunctionDef) and f.name in FORWARDS and code_lines(f) > 12:
                problems.append(f"{cls.name}.{f.name}: {code_lines(f)} lines (> 12)")
    return problems


def test_model_py_reads_top_down():
    assert layout_problems(MODEL.read_text(encoding="utf-8")) == []


def test_the_rule_sees_a_bad_layout():
    """The old model.py's faults: Config and shape tables first, `if _trace` blocks, a 19-line MLP.__call__."""
    long_forward = "    def __call__(self, x):\n" + "        x = x + 1\n" * 12 + \
        "        return x\n"
    bad = "class Config:\n    x: int = 1\n" + "X = 1\n" * 79 + "class MLP(Module):\n" + \
        long_forward + \
        "def f(x):\n    if _trace is not None:\n        x = _trace.tap('x', x)\n    return x\n"
    problems = layout_problems(bad)
    assert problems == ["first layer class at line 82, not within 80 lines of the top",
                        "line 98: an `if _trace` block", "MLP.__call__: 14 lines (> 12)"]
