"""The documentation site builds in strict mode (`mkdocs build --strict`, as .ci/run does): a
broken link or anchor, a page missing from the nav in mkdocs.yml, or a docstring that
mkdocstrings' parser (griffe, Google style) cannot read fails here, naming it."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from conftest import REPO, skip_or_fail


def test_mkdocs_build_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or \
            importlib.util.find_spec("mkdocstrings_handlers") is None:
        skip_or_fail("mkdocs / mkdocstrings are not installed (pip install -e '.[docs]')")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--site-dir", str(tmp_path / "site")], cwd=REPO,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                          capture_output=True, text=True, timeout=600)
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert done.returncode == 0 and not warnings, "\n".join(warnings) or done.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "glass" / "index.html").exists()
