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
"""
from __future__ import annotations

import json

ESCAPED = "<>&\u2028\u2029"
_TABLE = {ord(c): f"\\u{ord(c):04x}" for c in ESCAPED}


def inline_json(value) -> str:
    """`value` as JSON text safe inside a <script type="application/json"> element.

    value: anything `json.dumps` takes (str keys; finite floats). Non-ASCII characters stay as
    they are (the page is UTF-8), except U+2028/U+2029; "<", ">", "&" become \\u003c, \\u003e,
    \\u0026 -- the same string to JSON.parse (and to `json.loads`).

    Raises:
        ValueError: a float that is NaN or infinite (not JSON; `allow_nan=False`), a circular
            reference.
        TypeError: a value JSON cannot hold.
    """
    return json.dumps(value, ensure_ascii=False, allow_nan=False).translate(_TABLE)
