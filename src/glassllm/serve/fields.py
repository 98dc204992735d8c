"""Reading an API request: its JSON body and each field of it, checked before any work starts.

Every problem is a `RequestError` whose message is one line naming the field, answered as a
4xx with `{"error": message}` (`glassllm.serve.app`). Numbers go through `glassllm.checks`
(the library's one number check: a bool is not an integer, NaN is not a number).
"""
from __future__ import annotations

import json
import math

from ..checks import check_int, check_real


class RequestError(ValueError):
    """A request the server refuses: `status` (a 4xx) and a one-line message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(" ".join(str(message).split()))
        self.status = status


_MISSING = object()


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def json_body(raw: bytes, allowed: tuple[str, ...]) -> dict:
    """The request body as a JSON object whose keys are all in `allowed`.

    Raises:
        RequestError: not UTF-8, not JSON (NaN and Infinity are not JSON), nested too deep, an
            integer too long, not an object, or an unknown field (named, with the known ones).
    """
    try:
        body = json.loads(raw.decode("utf-8") if raw else "{}", parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise RequestError("the body is not UTF-8 text") from None
    except RecursionError:
        raise RequestError("the body's JSON is nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, NaN/Infinity, an integer past the digit limit
        raise RequestError(f"the body is not valid JSON: {str(e)[:120]}") from None
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(k for k in body if k not in allowed)
    if unknown:
        raise RequestError(f"unknown field {unknown[0][:40]!r} (this call takes: "
                           f"{', '.join(allowed)})")
    return body


def get_int(body: dict, name: str, low: int | None = None, high: int | None = None,
            default=_MISSING):
    """body[name] as an int in [low, high]; `default` when absent or null (required when no
    default is given)."""
    value = body.get(name)
    if value is None:
        return _absent(name, default)
    try:
        return check_int(value, name, low, high)
    except ValueError as e:
        raise RequestError(str(e)) from None


def get_real(body: dict, name: str, low: float | None = None, high: float | None = None,
             positive: bool = False, default=_MISSING):
    """body[name] as a finite float in [low, high] (> 0 with positive)."""
    value = body.get(name)
    if value is None:
        return _absent(name, default)
    try:
        return check_real(value, name, low, high, positive=positive)
    except ValueError as e:
        raise RequestError(str(e)) from None


def get_str(body: dict, name: str, max_bytes: int, default=_MISSING) -> str:
    """body[name] as a str of at most `max_bytes` UTF-8 bytes (no lone surrogates)."""
    value = body.get(name)
    if value is None:
        return _absent(name, default)
    if not isinstance(value, str):
        raise RequestError(f"{name} must be a string, got {type(value).__name__}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise RequestError(f"{name} is not valid Unicode text (a lone surrogate)") from None
    if size > max_bytes:
        raise RequestError(f"{name} is {size:,} bytes, over the server's limit of "
                           f"{max_bytes:,}", status=413)
    return value


def get_choice(body: dict, name: str, choices: tuple[str, ...], default=_MISSING) -> str:
    value = body.get(name)
    if value is None:
        return _absent(name, default)
    if not isinstance(value, str) or value not in choices:
        raise RequestError(f"{name} must be one of {', '.join(choices)}, got "
                           f"{_short(value)}")
    return value


def get_list(body: dict, name: str, max_items: int, default=_MISSING) -> list:
    value = body.get(name)
    if value is None:
        return _absent(name, default)
    if not isinstance(value, list):
        raise RequestError(f"{name} must be a list, got {type(value).__name__}")
    if len(value) > max_items:
        raise RequestError(f"{name} has {len(value)} items, at most {max_items}")
    return value


def _absent(name: str, default):
    if default is _MISSING:
        raise RequestError(f"{name} is required")
    return default


def _short(value, limit: int = 40) -> str:
    text = json.dumps(value)[:limit] if not isinstance(value, float) or math.isfinite(value) \
        else repr(value)
    return text
