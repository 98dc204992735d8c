"""The package's layering, checked by import-linter (contracts in pyproject.toml,
[tool.importlinter]): cli > training > lens > formats > tokenizers > engine > the glass, an
order inside the glass, and one inside the tokenizers. A violation -- say `glassllm.lens`
importing `glassllm.training` -- fails here, one line per offending import, before it can
become a cycle.

Also the source rule that keeps one safetensors reader: only `glassllm.formats.safetensors_io`
opens a safetensors file.
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def lint_imports() -> str:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not os.path.exists(exe):
        message = "import-linter is not installed (pip install -e '.[test]')"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (CI=true: this must run)")
        pytest.skip(message)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SRC)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    result = subprocess.run([exe, "--no-cache"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result.stdout


def test_the_layers_contracts_are_kept():
    out = lint_imports()
    # every contract of pyproject.toml, the tokenizers' own layers among them
    contracts = (ROOT / "pyproject.toml").read_text().count("[[tool.importlinter.contracts]]")
    assert contracts >= 4 and "the tokenizers: " in out, out[-2000:]
    assert f"Contracts: {contracts} kept, 0 broken." in out, out[-2000:]


def test_only_safetensors_io_opens_a_safetensors_file():
    """One reader: `safe_open` is called (or imported) nowhere else in the package."""
    users = []
    for path in sorted((SRC / "glassllm").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            named = (isinstance(node, ast.Name) and node.id == "safe_open") or \
                (isinstance(node, ast.Attribute) and node.attr == "safe_open") or \
                (isinstance(node, ast.ImportFrom) and any(a.name == "safe_open"
                                                          for a in node.names))
            if named:
                users.append(str(path.relative_to(SRC)))
    assert set(users) == {"glassllm/formats/safetensors_io.py"}, sorted(set(users))
