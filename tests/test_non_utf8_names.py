"""File names that are not UTF-8 (valid on Linux; lone surrogates in Python, PEP 383) in the
pages' inline JSON and in what the CLI prints."""
from __future__ import annotations

import io
import json
import os
import sys

from glassllm.formats.inline_json import displayable, inline_json

NOT_UTF8 = os.fsdecode(b"run\xff")  # a valid Linux file name; U+DCFF in Python (PEP 383)


def test_inline_json_escapes_lone_surrogates_so_the_page_encodes():
    text = inline_json({"title": NOT_UTF8})
    assert "\\udcff" in text
    text.encode("utf-8")  # raw, U+DCFF made the report's UTF-8 write fail
    assert json.loads(text) == {"title": NOT_UTF8}


def test_displayable_replaces_lone_surrogates_only():
    assert displayable(NOT_UTF8 + " \u00e9\u2028<") == "run\ufffd \u00e9\u2028<"


def test_cli_prints_a_non_utf8_path_on_a_strict_stdout(monkeypatch, tmp_path, capsys):
    """With errors="strict" on stdout (a UTF-8 locale other than C, PYTHONIOENCODING=utf-8),
    the first line naming a non-UTF-8 path made `glassllm train` fail with exit 2."""
    from glassllm import cli
    raw = io.BytesIO()
    strict = io.TextIOWrapper(raw, encoding="utf-8", errors="strict")
    monkeypatch.setattr(sys, "stdout", strict)
    cli._print_paths_as_given()
    print(f"model: {tmp_path / NOT_UTF8}")
    strict.flush()
    assert raw.getvalue().endswith(b"/run\xff\n")
