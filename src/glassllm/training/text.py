"""UTF-8 text files read in chunks that encode as the whole text would, for `prepare` and
`load_corpus`: which files an input names, where a chunk may end, where a file's validation
tail starts."""
from __future__ import annotations

import os
from typing import Iterable, Iterator

from ..formats.paths import regular_file_size


class NoInputFiles(ValueError):
    """`list_text_files` found no file at all."""


def list_text_files(inputs: Iterable) -> list[str]:
    """Files named by `inputs`, in order; a directory contributes every file below it whose
    name does not start with ".", in sorted path order. Every file is checked to be a regular
    file (after symbolic links) before anyone reads it (`regular_file_size`).

    Raises:
        FileNotFoundError: an input does not exist.
        ValueError: no files at all, or one that is not a regular file (a FIFO would hang the
            reader, /dev/zero never ends), naming it.
    """
    files = []
    for item in inputs:
        item = os.fspath(item)
        if os.path.isdir(item):
            found = []
            for root, dirs, names in os.walk(item):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                found += [os.path.join(root, n) for n in names if not n.startswith(".")]
            files += sorted(found)
        elif os.path.lexists(item):
            files.append(item)
        else:
            raise FileNotFoundError(f"input not found: {item}")
    for path in files:
        regular_file_size(path, "data file")
    if not files:
        raise NoInputFiles("no input text files")
    return files


def _char_before(buf: bytes, i: int) -> str:
    """The character ending at byte i of buf ("" if none or incomplete)."""
    return buf[max(0, i - 4):i].decode("utf-8", errors="ignore")[-1:]


def _char_after(buf: bytes, i: int) -> str:
    """The character starting at byte i of buf ("" if none or cut off by the end)."""
    return buf[i:i + 4].decode("utf-8", errors="ignore")[:1]


def _cut(buf: bytes) -> int:
    """A safe place to end a chunk inside `buf`, or 0 if there is none ("read more").

    Safe means that encoding the chunks one by one gives the ids of encoding the whole text.
    GPT-2's pre-tokenizer (regex `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+|
    ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`) has no look-behind, so a cut is safe where a
    pre-token starts in the whole text and the pre-token before it ends there even when the
    text stops. Two such places, searched from the end:
      - just after a lone "\\n" between two non-space characters (the newline is its own
        pre-token; a longer whitespace run is not safe: at the end of a chunk "\\n\\n\\n" is
        one pre-token, inside the text it is "\\n\\n" + "\\n");
      - just before a lone " " between two non-space characters (the space starts the next
        pre-token, " word").
    Either place also lies between two whole UTF-8 characters.
    """
    i = len(buf)
    while True:
        i = buf.rfind(b"\n", 0, i)
        if i < 0:
            break
        before, after = _char_before(buf, i), _char_after(buf, i + 1)
        if before and after and not before.isspace() and not after.isspace():
            return i + 1
    i = len(buf)
    while True:
        i = buf.rfind(b" ", 0, i)
        if i <= 0:
            return 0
        before, after = _char_before(buf, i), _char_after(buf, i + 1)
        if before and after and not before.isspace() and not after.isspace():
            return i


def _char_boundary(buf: bytes) -> int:
    """The last position in buf that does not split a UTF-8 character (last resort for text
    with no safe cut over many chunks: tokens may differ from whole-text encoding there)."""
    i = len(buf)
    while i > 0 and 0x80 <= buf[i - 1] < 0xC0:  # back over continuation bytes
        i -= 1
    return i - 1 if i > 0 and buf[i - 1] >= 0xC0 else i


def text_chunks(path: str, start: int, end: int,
                 chunk_bytes: int) -> Iterator[tuple[str, int]]:
    """(text, n_bytes) pieces of bytes [start, end) of a UTF-8 file, about chunk_bytes each,
    cut by `_cut`. Holds at most about 4 * chunk_bytes of text: a stretch that long with no
    safe cut is split at a character boundary (`_char_boundary`) instead.

    Raises:
        ValueError: the bytes are not valid UTF-8 (naming the file and offset).
    """
    with open(path, "rb") as f:
        f.seek(start)
        pos, carry = start, b""
        while pos < end:
            block = f.read(min(chunk_bytes, end - pos))
            if not block:  # the file shrank while we read it
                break
            pos += len(block)
            buf = carry + block
            if pos >= end:
                cut = len(buf)
            else:
                cut = _cut(buf) or (_char_boundary(buf) if len(buf) >= 4 * chunk_bytes else 0)
            if cut == 0:
                carry = buf
                continue
            carry = buf[cut:]
            yield decode_utf8(path, buf[:cut], pos - len(buf)), cut
        if carry:
            yield decode_utf8(path, carry, pos - len(carry)), len(carry)


def decode_utf8(path: str, piece: bytes, offset: int) -> str:
    """`piece` (bytes from `offset` of the file at `path`) as text.

    Raises:
        ValueError: "PATH: not UTF-8 text (invalid byte at offset N)", N in the file.
    """
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (invalid byte at offset "
                         f"{offset + e.start})") from None


def split_offset(path: str, val_fraction: float) -> int:
    """Byte offset where a file's validation tail starts: the first line start at or after
    (1 - val_fraction) of its size (or the end, if there is none). Reads only from there on."""
    size = os.path.getsize(path)
    if val_fraction <= 0:
        return size
    target = int(size * (1.0 - val_fraction))
    if target == 0:
        return 0
    with open(path, "rb") as f:
        f.seek(target - 1)
        pos = target - 1
        while True:
            block = f.read(1 << 16)
            if not block:
                return size
            i = block.find(b"\n")
            if i >= 0:
                return pos + i + 1
            pos += len(block)
