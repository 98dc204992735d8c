"""Bounds of a GGUF header, checked before `gguf.GGUFReader` parses it.

GGUFReader trusts every length and count it reads: past the end of the file its reads come
back empty instead of failing, so one damaged array count (a flipped bit, or a string length
that shifts every later field onto other bytes) makes it loop over billions of empty elements,
keeping an array view for each, until the process runs out of memory (gguf-py's
`GGUFReader._get_field_parts`). This walk reads the same layout -- the header, each key's
string, type and value, each tensor's name, dimensions, type and offset (llama.cpp
docs/gguf.md, "File Structure", versions 2 and 3) -- with every count checked against the
bytes left, and says where the first impossible one is.
"""
from __future__ import annotations

import struct

# GGUF value type -> its size in bytes (gguf_type: uint8 0 ... float64 12); 8 string, 9 array
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MIN_KEY = 8 + 4 + 1      # the shortest key: an empty name, a type, a one-byte value
_MIN_TENSOR = 8 + 4 + 4 + 8  # the shortest tensor info: an empty name, no dimension


class Damaged(ValueError):
    """A length or count in the header that the file's size cannot hold (one line)."""


class _Walk:
    def __init__(self, data):
        self.data, self.at = data, 0

    def take(self, n: int, what: str) -> int:
        """Step over `n` bytes of `what`; Damaged when fewer are left."""
        left = len(self.data) - self.at
        if n > left:
            raise Damaged(f"{what} at byte {self.at} needs {n} bytes, {left} are left")
        start, self.at = self.at, self.at + n
        return start

    def number(self, fmt: str, what: str) -> int:
        return struct.unpack_from(fmt, self.data, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.number("<Q", f"{what} (its length)")
        start = self.take(n, what)
        return bytes(self.data[start:start + min(n, 60)]).decode("utf-8", "replace")

    def value(self, kind: int, what: str) -> None:
        """Step over one value of GGUF type `kind`; an unknown type ends the walk (GGUFReader
        then says so itself)."""
        if kind in _SCALAR:
            self.take(_SCALAR[kind], what)
        elif kind == _STRING:
            self.string(what)
        elif kind == _ARRAY:
            item = self.number("<I", f"{what} (its element type)")
            count = self.number("<Q", f"{what} (its length)")
            smallest = _SCALAR.get(item, 8 if item == _STRING else 12)
            if count * smallest > len(self.data) - self.at:  # before any loop over `count`
                raise Damaged(f"{what}: an array of {count} elements at byte {self.at} "
                              f"needs at least {count * smallest} bytes, "
                              f"{len(self.data) - self.at} are left")
            if item in _SCALAR:
                self.take(count * _SCALAR[item], what)
            else:
                for _ in range(count):
                    self.value(item, what)
        else:
            raise StopIteration


def check_header(data) -> None:
    """Walk the header of GGUF `data` (bytes or a memory map; the magic already checked).

    Raises:
        Damaged (a ValueError): the first count or length the file's size cannot hold, as
            "what at byte N needs M bytes, K are left".
    """
    walk = _Walk(data)
    walk.take(4, "the magic")
    if walk.number("<I", "the version") not in (2, 3):
        return  # version 1 (32-bit counts) or a damaged version: GGUFReader refuses it
    tensors = walk.number("<Q", "the tensor count")
    keys = walk.number("<Q", "the key count")
    if keys * _MIN_KEY + tensors * _MIN_TENSOR > len(data) - walk.at:
        raise Damaged(f"the header's {keys} keys and {tensors} tensors need more bytes than "
                      f"the file's {len(data)}")
    try:
        for _ in range(keys):
            name = walk.string("a key")
            kind = walk.number("<I", f"the type of key {name!r}")
            walk.value(kind, f"the value of key {name!r}")
    except StopIteration:
        return
    for _ in range(tensors):
        walk.string("a tensor's name")  # its dimension count, shape, type and offset next
        walk.take(8 * walk.number("<I", "a tensor's dimension count"), "a tensor's shape")
        walk.take(4 + 8, "a tensor's type and offset")
