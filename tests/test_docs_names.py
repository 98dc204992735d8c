"""docs/names.md shows the trace's frozen names table exactly as `glassllm.lens.trace.NAMES`
holds it: a renamed, added or reworded row fails here until the page says the same."""
from __future__ import annotations

from conftest import REPO

from glassllm.lens.trace import NAMES

PAGE = REPO / "docs" / "names.md"
START = "<!-- names table: generated from glassllm.lens.trace.NAMES (tests/test_docs_names.py) -->"
END = "<!-- end of the names table -->"


def exists_when(name) -> str:
    """"every model", or the switch that adds the row and the family presets that have it."""
    if name.when == "always":
        return "every model"
    return f"{name.when} ({', '.join(name.families)})"


def names_table() -> str:
    """NAMES as a Markdown table: name, shape letters, when a model has it, meaning."""
    rows = ["| name | shape | exists in | what it is |", "|---|---|---|---|"]
    rows += [f"| `{n.template}` | {n.shape} | {exists_when(n)} | "
             f"{n.doc.replace('|', '&#124;')} |" for n in NAMES]
    return "\n".join(rows)


def test_the_names_page_shows_the_frozen_table():
    text = PAGE.read_text(encoding="utf-8")
    shown = text[text.index(START) + len(START):text.index(END)].strip()
    assert shown == names_table(), f"docs/names.md: replace the table with\n{names_table()}"
