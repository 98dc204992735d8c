"""JSON inlined in an HTML page: the one function both pages use (`glassllm inspect`'s report,
`glassllm.lens.report`; `glassllm serve`'s page, `glassllm.serve.page`).

A `<script type="application/json">` element ends at the first "</script" in its text, and
a "<!--" followed by "<script" puts the HTML parser in the "script data double escaped" state,
where the element's own "</script>" no longer ends it (WHATWG HTML, 13.2.5.4 "Script data
less-than sign state" onwards): the rest of the page is swallowed. JSON lets any character of
a string be written as a \\u escape, which JSON.parse reads back as the same character, so
escaping "<", ">" and "&" leaves nothing in the text that HTML reads as markup. U+2028 and
U+2029 (line and paragraph separators) are escaped too: legal in JSON strings, they ended a
line in JavaScript before ES2019, so a block later evaluated as script (or copied into one)
would break. The same set as Django's `json_script` and Jinja's `htmlsafe_json_dumps`.

Lone surrogates (U+D800-U+DFFF) are escaped as well: Python decodes a file name that is not
UTF-8 with "surrogateescape" (PEP 383), so b"\\xff" becomes U+DCFF, which no UTF-8 page can
hold -- written raw, the page would fail to encode. As a \\u escape it is valid JSON (RFC 8259,
section 7), and JSON.parse gives a string the browser shows with U+FFFD in its place.
"""
from __future__ import annotations

import json
import re
from importlib import resources

ESCAPED = "<>&\u2028\u2029"
_SURROGATES = range(0xD800, 0xE000)
_TABLE = {code: f"\\u{code:04x}" for code in (*map(ord, ESCAPED), *_SURROGATES)}


def inline_json(value) -> str:
    """`value` as JSON text safe inside a <script type="application/json"> element.

    value: anything `json.dumps` takes (str keys; finite floats). Non-ASCII characters stay as
    they are (the page is UTF-8), except U+2028/U+2029 and lone surrogates (module doc); "<",
    ">", "&" become \\u003c, \\u003e, \\u0026 -- the same string to JSON.parse (and to
    `json.loads`).

    Raises:
        ValueError: a float that is NaN or infinite (not JSON; `allow_nan=False`), a circular
            reference.
        TypeError: a value JSON cannot hold.
    """
    return json.dumps(value, ensure_ascii=False, allow_nan=False).translate(_TABLE)


def page_files(package: str, names: tuple[str, str, str], what: str) -> tuple[str, str, str]:
    """The (html, css, script) text of a page shipped as package data in `package`'s `page/`
    folder, the script after the pages' shared one (formats/page/common.js) and the CSS after
    theirs (formats/page/common.css), the CSS and script checked to be inlinable: neither may hold "</style" or
    "</script", which would end the element it is inlined in.

    Raises:
        RuntimeError: a file missing or not inlinable -- a broken installation, not a user
            error (`what` names the page in the message).
    """
    folder = resources.files(package) / "page"
    try:
        page, css, script = ((folder / name).read_text(encoding="utf-8") for name in names)
    except OSError as e:
        raise RuntimeError(f"the {what}'s files are missing from the installed glassllm "
                           f"({folder}): {e}") from None
    shared = resources.files("glassllm.formats") / "page"
    try:  # what both pages share, inlined before each page's own script and CSS
        common_js, common_css = ((shared / name).read_text(encoding="utf-8")
                                 for name in ("common.js", "common.css"))
    except OSError as e:
        raise RuntimeError(f"the pages' shared script or CSS is missing from the installed "
                           f"glassllm: {e}") from None
    script, css = common_js + "\n" + script, common_css + "\n" + css
    if "</style" in css.lower() or "</script" in script.lower():
        raise RuntimeError(f"{folder}: {names[1]}, {names[2]}, common.css or common.js closes "
                           f"its own element")
    return page, css, script


def displayable(text: str) -> str:
    """`text` with every lone surrogate (a byte of a non-UTF-8 file name, module doc) replaced
    by U+FFFD, the replacement character: a str that can be written as UTF-8 (a page's title,
    a terminal line)."""
    return _LONE_SURROGATE.sub("\ufffd", text)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
