"""The one safetensors reader (and signed writer) of glassllm's model files and checkpoints.

A safetensors file (Hugging Face's format: an 8-byte header size, a JSON header naming each
tensor's dtype, shape and byte offsets, then the raw bytes) is opened only through the
`safetensors` package's `safe_open`; nothing here parses the format by hand.

Three parts:

- `SafetensorsFile` (`open_file`): any safetensors file -- the metadata, the table of
  tensors (name -> shape, dtype, read from the header without touching the data), one tensor
  at a time. Every failure is one line naming the file: FileNotFoundError, IsADirectoryError,
  ValueError for a device or a pipe (opening one can block for ever), for a truncated or
  foreign file, for a tensor that cannot be read. `hf.read_tensors` reads Hugging Face
  checkpoints with it.
- `read` / `write`: a file of one of glassllm's kinds (`Kind`: a model file, a checkpoint),
  signed with SHA-256 digests (`glassllm.formats.integrity`). Reading checks, in this order,
  before any tensor's bytes are read: the "format" marker, the version and the metadata's
  digest, the caller's parse of the metadata (a config, a training state), the tensor names
  against the digest, the caller's check of the table (names, shapes, dtypes against the
  config); then every tensor against its digest and for NaN/inf, and the caller's per-tensor
  check. Version "1" files (written before digests existed) are read without the digest; a
  version "2" file without one, or a newer version, is refused.
- `check_finite`: the one NaN/inf check, used on write as well as on read.

The callers (`glassllm.formats.files`, `glassllm.formats.checkpoint`) keep what is theirs:
the metadata they write and how they parse and check it.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from . import integrity
from .atomic import atomic_replace

UNSIGNED_VERSIONS = ("1",)  # read without a digest; a file with no "version" entry is version 1


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of glassllm safetensors file.

    Fields:
        format: the metadata's "format" marker ("glassllm", "glassllm-checkpoint").
        version: the version this glassllm writes ("2": signed); "1" is still read.
        noun: what messages call such a file ("model file", "checkpoint").
        title: what a foreign file is not ("glassllm model", "glassllm checkpoint").
        directory_hint: path -> text added when the path is a directory (None: nothing).
    """

    format: str
    version: str
    noun: str
    title: str
    directory_hint: Callable[[str], str] | None = None


@dataclasses.dataclass
class Contents:
    """What `read` returns.

    Fields:
        metadata: the file's metadata (str -> str), digest entry included.
        parsed: what the caller's `parse(metadata)` returned (a Config, a training state).
        tensors: {name: array in the stored dtype}, in file order; empty with tensors=False.
        signed: True when the digest was checked (False: a version 1 file).
    """

    metadata: dict
    parsed: object
    tensors: dict
    signed: bool


# --------------------------------------------------------------------------- any safetensors file
def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


class SafetensorsFile:
    """One safetensors file, open for reading (a context manager; use `open_file`).

    Attributes:
        path: the file (str).
        where: how messages name it (default: the path).
        metadata: the header's "__metadata__" (str -> str; {} when it has none).
    """

    def __init__(self, path, noun: str = "safetensors file", where: str | None = None,
                 directory_hint: Callable[[str], str] | None = None):
        self.path = os.fspath(path)
        self.where = self.path if where is None else where
        _check_is_a_file(self.path, noun, directory_hint)
        try:
            self._file = safe_open(self.path, framework="numpy")  # parses the header
            self.metadata = self._file.metadata() or {}
        except (SafetensorError, UnicodeDecodeError, ValueError) as e:
            if starts_with_gguf_magic(self.path):  # llama.cpp's format, read by glassllm.load
                raise ValueError(f"{self.where}: a GGUF file, not safetensors: open it with "
                                 f"glassllm.load (or `glassllm convert --from-gguf`)") from None
            raise ValueError(f"{self.where}: not a readable safetensors file "
                             f"({_size(self.path)} bytes; truncated, corrupt or another "
                             f"format): {_one_line(e)}") from None
        except OSError as e:  # a permission, an I/O error: the same type, naming the file
            raise _naming(e, f"cannot read the {noun}", self.path) from None

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc) -> None:
        self._file.__exit__(*exc)  # releases the file's memory map

    def table(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """{name: (shape, safetensors dtype such as "F32")} from the header, in file order;
        no tensor data is read."""
        found = {}
        for name in self._file.keys():
            piece = self._call(name, self._file.get_slice, name)
            found[name] = (tuple(piece.get_shape()), piece.get_dtype())
        return found

    def tensor(self, name: str) -> np.ndarray:
        """The tensor `name` as a NumPy array of its stored dtype.

        Raises:
            ValueError: naming the file and the tensor, when its bytes cannot become an array
                (damaged offsets; a dtype NumPy has no type for, such as float8: safetensors'
                NumPy backend raises AttributeError). A MemoryError, Ctrl-C or any other
                error propagates as itself.
        """
        return self._call(name, self._file.get_tensor, name)

    def _call(self, name: str, method, *args):
        try:
            return method(*args)
        except AttributeError as e:
            raise ValueError(f"{self.where}: not a readable safetensors file (a tensor dtype "
                             f"NumPy cannot hold: tensor {name!r}: {_one_line(e)})") from None
        except (SafetensorError, TypeError, ValueError) as e:
            raise ValueError(f"{self.where}: not a readable safetensors file (tensor "
                             f"{name!r} cannot be read: {_one_line(e)})") from None
        except OSError as e:
            raise _naming(e, f"cannot read tensor {name!r}", self.path) from None


def open_file(path, noun: str = "safetensors file", where: str | None = None,
              directory_hint: Callable[[str], str] | None = None) -> SafetensorsFile:
    """Open `path` with `safe_open` (see `SafetensorsFile`); use it in a `with` block.

    Args:
        noun: what messages call the file ("model file", "checkpoint").
        where: how messages name the file (default: its path).
        directory_hint: path -> text added to the message when `path` is a directory.

    Raises:
        FileNotFoundError: nothing at `path`. IsADirectoryError: a directory.
        ValueError: not a regular file (a device, a pipe), or not a readable safetensors file
            (truncated, corrupt, another format); one line naming the file.
        OSError (its subclass kept): the file cannot be read (permissions), naming it.
    """
    return SafetensorsFile(path, noun, where, directory_hint)


def _check_is_a_file(path: str, noun: str, directory_hint) -> None:
    if not os.path.exists(path):
        if os.path.islink(path):
            raise FileNotFoundError(f"no such {noun}: {path} is a symbolic link to "
                                    f"{os.readlink(path)}, which does not exist")
        raise FileNotFoundError(f"no such {noun}: {path} (the path does not exist)")
    if os.path.isdir(path):
        hint = directory_hint(path) if directory_hint is not None else ""
        raise IsADirectoryError(f"{path} is a directory, not a {noun}{hint}")
    if not os.path.isfile(path):  # a device or FIFO: opening one can block for ever
        raise ValueError(f"{path}: not a regular file (a device, pipe or socket), so not a "
                         f"{noun}")


def _naming(error: OSError, doing: str, path: str) -> OSError:
    """The same type of OSError (errno kept), saying what failed and naming `path`."""
    if error.errno is None:
        return type(error)(f"{path}: {doing}: {_one_line(error)}")
    return type(error)(error.errno, f"{doing}: {error.strerror}", path)


GGUF_MAGIC = b"GGUF"  # the first 4 bytes of every GGUF file (gguf.GGUF_MAGIC, as bytes)


def starts_with_gguf_magic(path) -> bool:
    """Whether the file `path` begins with GGUF's magic; False when it cannot be read (a
    directory, no such file: the readers say which). Beside the safetensors readers, which
    name a GGUF given to them, as lm.is_gguf routes one to the GGUF reader."""
    try:
        with open(path, "rb") as f:
            return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


# --------------------------------------------------------------------------- glassllm's kinds
def read(path, kind: Kind, parse: Callable[[dict], object],
         check_table: Callable[[object, dict], None] | None = None,
         check_tensor: Callable[[str, np.ndarray], None] | None = None,
         tensors: bool = True, where: str | None = None) -> Contents:
    """Read and check a signed glassllm file of `kind` (module docstring: the order).

    Args:
        parse: metadata -> what the caller needs (a Config, a state); raises ValueError
            naming the file for a bad entry. Called after the marker, version and metadata
            digest are checked.
        check_table: (parsed, {name: (shape, dtype)}) -> None; raises ValueError for names,
            shapes or dtypes the file must not hold. Called before any tensor is read.
        check_tensor: (name, array) -> None, a check beyond finiteness (e.g. v >= 0).
        tensors: False reads the metadata only (the metadata digest is still checked).
        where: how messages name the file (default: its path).

    Returns:
        Contents (metadata, parsed, tensors, signed).

    Raises:
        OSError: the errors of `open_file`.
        ValueError: one line naming the file: a foreign marker, an unknown version, a
            version 2 file without a digest, a tensor or metadata entry that differs from its
            digest, what `parse` / `check_table` / `check_tensor` raise, a NaN or inf.
    """
    with open_file(path, kind.noun, where, kind.directory_hint) as f:
        where = f.where
        _check_marker(f.metadata, kind, where)
        digests = signed_digests(f.metadata, kind, where)
        parsed = parse(f.metadata)
        arrays = {}
        if tensors:
            table = f.table()
            if digests is not None:
                integrity.verify_names(table, digests, where)
            if check_table is not None:
                check_table(parsed, table)
            for name in table:
                array = f.tensor(name)
                if digests is not None:
                    integrity.verify_tensor(name, array, digests, where)
                check_finite(name, array, where)
                if check_tensor is not None:
                    check_tensor(name, array)
                arrays[name] = array
    return Contents(f.metadata, parsed, arrays, digests is not None)


def _check_marker(metadata: dict, kind: Kind, where: str) -> None:
    found = metadata.get("format")
    if found != kind.format:
        origin = "" if str(found).startswith("glassllm") else "; a file saved by another library?"
        raise ValueError(f"{where}: a safetensors file but not a {kind.title} (metadata "
                         f"format is {found!r}, expected {kind.format!r}{origin})")


def signed_digests(metadata: dict, kind: Kind, where: str) -> dict | None:
    """The per-tensor digests, after checking the version and the metadata's own digest;
    None for a version 1 file (no digest to check).

    Raises:
        ValueError: naming `where`: a version other than 1 and `kind.version`, a version 2
            file without a digest, a malformed digest, other metadata than was signed.
    """
    version = metadata.get("version", "1")
    digests = integrity.verify_metadata(metadata, where)  # None: the file has no digest
    if digests is None and version in UNSIGNED_VERSIONS:
        return None
    if version != kind.version:
        raise ValueError(f"{where} has version {version!r} of the {kind.format} format; this "
                         f"glassllm reads versions {' and '.join(UNSIGNED_VERSIONS)} (unsigned) "
                         f"and {kind.version} (a file from a newer glassllm, or a damaged "
                         f"header)")
    if digests is None:
        raise ValueError(f"{where}: a version {kind.version} {kind.noun} must carry a digest "
                         f"and this one has none; the header is damaged or was edited")
    return digests


def write(path, kind: Kind, tensors: dict, metadata: dict, *, doing: str = "cannot write",
          make_parents: bool = False) -> None:
    """Write `tensors` with `metadata` plus the kind's marker, version and digest to `path`,
    atomically (`glassllm.formats.atomic.atomic_replace`).

    Args:
        tensors: {name: contiguous array}; metadata: {str: str} of the caller's entries.
        doing: as `atomic_replace`.
        make_parents: as `atomic_replace`.

    Raises:
        OSError: naming `path` (see `atomic_replace`).
    """
    metadata = integrity.sign(tensors, {"format": kind.format, **metadata,
                                        "version": kind.version})
    atomic_replace(path, lambda tmp: save_file(tensors, tmp, metadata=metadata), doing=doing,
                   make_parents=make_parents)


def check_finite(name: str, array: np.ndarray, where: str) -> None:
    """Raises ValueError "<where>: tensor '<name>' holds NaN or inf" when it does."""
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{where}: tensor {name!r} holds NaN or inf")
