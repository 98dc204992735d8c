"""The one check of a number given by a user: an integer (bool refused) or a real in a range.

Python counts `True` as the integer 1, so `isinstance(x, int)` lets `steps=True` through;
NumPy integers and floats are not Python ints and floats, yet `np.int64(3)` is a fine step
count. Every user-facing integer or real of the library is checked here, with one message form:
"<what> must be <an integer | a number> [in range], got <value>".
"""
from __future__ import annotations

import math

import numpy as np


def is_int(value) -> bool:
    """True for Python and NumPy integers; False for bools (Python's and NumPy's)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_real(value) -> bool:
    """True for Python and NumPy integers and floats (finite or not); False for bools."""
    return isinstance(value, (int, float, np.integer, np.floating)) and \
        not isinstance(value, (bool, np.bool_))


def _range_words(low, high) -> str:
    if low is not None and high is not None:
        return f" in [{low}, {high}]"
    if low is not None:
        return f" >= {low}"
    if high is not None:
        return f" <= {high}"
    return ""


def _shown(value, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters: a message stays one short line whatever it was
    given (a damaged file can put a megabyte-long list where a number belongs)."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit for str() (sys.set_int_max_str_digits)
        text = "an integer too long to print"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_int(value, what: str, low: int | None = None, high: int | None = None) -> int:
    """`value` as a Python int if it is an integer in [low, high] (None: unbounded).

    Raises:
        ValueError: "<what> must be an integer[ in [low, high]], got <value!r>".
    """
    if not is_int(value) or (low is not None and value < low) or \
            (high is not None and value > high):
        raise ValueError(f"{what} must be an integer{_range_words(low, high)}, "
                         f"got {_shown(value)}")
    return int(value)


def check_real(value, what: str, low: float | None = None, high: float | None = None,
               finite: bool = True, positive: bool = False) -> float:
    """`value` as a Python float if it is a real number in [low, high] (None: unbounded),
    finite unless finite=False, and > 0 when positive=True.

    Raises:
        ValueError: `"<what> must be a [finite ][positive ]number[ in range], got <value!r>"`.
    """
    try:  # an int beyond float's range (10**400) cannot be checked as a float: refused
        ok = is_real(value) and not (finite and not math.isfinite(value)) and \
            not (math.isnan(value)) and not (positive and value <= 0) and \
            (low is None or value >= low) and (high is None or value <= high)
    except OverflowError:
        ok = False
    if not ok:
        kind = ("finite " if finite else "") + ("positive " if positive else "")
        raise ValueError(f"{what} must be a {kind}number{_range_words(low, high)}, "
                         f"got {_shown(value)}")
    return float(value)
