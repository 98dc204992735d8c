"""Digests of glassllm's safetensors files: a damaged byte is an error naming the file and tensor.

A model file (`glassllm.formats.files`) or a checkpoint (`glassllm.formats.checkpoint`) carries, in its
safetensors metadata, one more string under the key "digest":

    {"algorithm": "sha256",
     "metadata":  SHA-256 of every other metadata entry (JSON, keys sorted),
     "tensors":   {name: SHA-256 of "<kind><itemsize>|<shape>|" + the tensor's bytes}}

SHA-256 (FIPS 180-4, Python's `hashlib`) per tensor, so a flipped bit is reported with the tensor
it hit; dtype and shape are hashed with the bytes, so data relabelled F32 -> I32 (same bytes) or
a changed shape is caught too; the metadata digest covers the config, the tokenizer, a
checkpoint's JSON state and the format version, so an edited field is caught as well. The
digest only proves the file is the one that was written: a file written by other means with a
fresh digest is checked by each reader's own validation (names, shapes, dtypes, finiteness).

Cost: reading a tensor hashes each of its bytes once, SHA-256 through OpenSSL (x86 SHA
extensions). Measured on the 2-core machine of this project (`bench/digest_cost.py`): 0.95 s
per GB hashed with the machine nearly idle (load 0.8), 1.7 s/GB while other jobs kept it busy
(load 7). `files.load` itself takes about 12 s/GB there (it builds and initialises the model
before filling it), so the check adds 10-15% to loading a model; for the default 3 MB model,
3-5 ms.

This module imports nothing from glassllm, so every module may use it.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

DIGEST_KEY = "digest"
ALGORITHM = "sha256"


def tensor_sha256(array: np.ndarray) -> str:
    """Hex SHA-256 of an array's dtype (kind and size), shape and little-endian bytes."""
    array = np.asarray(array)
    little = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    data = np.ascontiguousarray(array, dtype=little)
    h = hashlib.sha256(f"{array.dtype.kind}{array.dtype.itemsize}|{list(array.shape)}|".encode())
    if data.size:
        h.update(memoryview(data.reshape(-1)).cast("B"))
    return h.hexdigest()


def metadata_sha256(metadata: dict) -> str:
    """Hex SHA-256 of the metadata entries other than the digest itself (JSON, keys sorted)."""
    rest = {k: v for k, v in metadata.items() if k != DIGEST_KEY}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode("utf-8")).hexdigest()


def sign(tensors: dict, metadata: dict) -> dict:
    """`metadata` plus its "digest" entry for these tensors (name -> array) and entries."""
    digest = {"algorithm": ALGORITHM, "metadata": metadata_sha256(metadata),
              "tensors": {name: tensor_sha256(array) for name, array in tensors.items()}}
    return {**metadata, DIGEST_KEY: json.dumps(digest, sort_keys=True)}


def verify_metadata(metadata: dict, path: str) -> dict | None:
    """Check the metadata against its digest; return {tensor name: hex digest}, or None when
    the file has no digest (the caller decides whether that is allowed).

    Raises:
        ValueError: naming `path`: a malformed digest entry, an unknown algorithm, or other
            metadata than was written (a damaged or edited header).
    """
    text = metadata.get(DIGEST_KEY)
    if text is None:
        return None
    try:
        digest = json.loads(text)
    except (ValueError, TypeError):  # JSONDecodeError, an integer past the digit limit
        raise ValueError(f"{path}: the digest in the metadata is not valid JSON; the header "
                         f"is damaged") from None
    if not isinstance(digest, dict) or set(digest) != {"algorithm", "metadata", "tensors"}:
        raise ValueError(f"{path}: the digest in the metadata is malformed; the header is "
                         f"damaged")
    if digest["algorithm"] != ALGORITHM:
        raise ValueError(f"{path}: digest algorithm {digest['algorithm']!r} is not "
                         f"{ALGORITHM!r}; the header is damaged or from another writer")
    tensors = digest["tensors"]
    if not isinstance(tensors, dict) or not all(
            isinstance(k, str) and _is_hex_digest(v) for k, v in tensors.items()) or \
            not _is_hex_digest(digest["metadata"]):
        raise ValueError(f"{path}: the digest in the metadata is malformed; the header is "
                         f"damaged")
    if metadata_sha256(metadata) != digest["metadata"]:
        raise ValueError(f"{path}: the metadata (config, state, tokenizer) is not what was "
                         f"written: its SHA-256 differs from the recorded one; the file is "
                         f"damaged or was edited")
    return tensors


def verify_names(names, digests: dict, path: str) -> None:
    """The file holds exactly the tensors the digest was made for.

    Raises:
        ValueError: naming `path` and a few of the odd names.
    """
    names = set(names)
    extra, missing = sorted(names - set(digests)), sorted(set(digests) - names)
    if extra or missing:
        parts = ([f"tensor(s) {extra[:3]} not in its digest"] if extra else []) + \
            ([f"tensor(s) {missing[:3]} of its digest missing"] if missing else [])
        raise ValueError(f"{path}: " + " and ".join(parts) + "; the header is damaged")


def verify_tensor(name: str, array: np.ndarray, digests: dict, path: str) -> None:
    """Raises ValueError naming `path` and `name` when the tensor is not the one written."""
    if tensor_sha256(array) != digests.get(name):
        raise ValueError(f"{path}: tensor {name!r} is damaged: its SHA-256 differs from the "
                         f"one recorded when the file was written (a flipped bit, a partial "
                         f"overwrite or a changed dtype/shape)")


def _is_hex_digest(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and \
        all(c in "0123456789abcdef" for c in value)
