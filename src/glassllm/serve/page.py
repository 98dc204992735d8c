"""The page of `glassllm serve`: page/index.html with page/app.css and page/app.js inlined,
read from the installed package (`importlib.resources`; pyproject.toml ships the three files
as package data), and the server's description as an inline JSON block.

The page loads nothing from anywhere: its policy (`CSP`, sent as a header) allows its own
inline style, its own script (by a per-response nonce) and calls to its own server only.
"""
from __future__ import annotations

import functools
import re
from importlib import resources

from ..formats.inline_json import inline_json, page_files

PAGE_FILES = ("index.html", "app.css", "app.js")
_SLOT = re.compile(r"__(NONCE|DATA)__")
# connect-src 'self': the API; img-src data: the favicon; nothing else, from anywhere
CSP = ("default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; "
       "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'")


@functools.lru_cache(maxsize=1)
def template() -> str:
    """index.html with app.css and app.js inlined, the NONCE and DATA slots left open.

    Raises:
        RuntimeError: a page file missing or malformed (a broken installation).
    """
    page, css, script = page_files("glassllm.serve", PAGE_FILES, "serve page")
    folder = resources.files("glassllm.serve") / "page"
    if any(f"__{slot}__" in css + script for slot in ("DATA", "NONCE")):
        raise RuntimeError(f"{folder}: app.css or app.js holds a slot")
    page = page.replace("__STYLE__", css).replace("__SCRIPT__", script)
    # the nonce twice: the policy's meta tag and the script element
    if page.count("__DATA__") != 1 or page.count("__NONCE__") != 2:
        raise RuntimeError(f"{folder}: index.html must hold __DATA__ once and __NONCE__ twice")
    return page


def render(data: dict, nonce: str) -> str:
    """The page with its data and this response's script nonce."""
    slots = {"NONCE": nonce, "DATA": inline_json(data)}
    return _SLOT.sub(lambda m: slots[m.group(1)], template())
