"""Fuzz the two file kinds glassllm reads back: model files and checkpoints (issue 9, point 6).

Each kind gets several hundred damaged variants of one real file, built deterministically:
truncations, bit flips in the 8-byte size, the JSON header and the tensor data, dtype swaps
(with and without a shape that keeps the byte count), and edits of the JSON inside the
metadata (the model config, the tokenizer, a checkpoint's state; values of another type,
swapped, deleted or added fields). Every variant must either load to exactly the original (a
harmless change) or raise a clean error: a ValueError or OSError whose message names the file.
Never another exception type, never a changed model or state.

A second family rewrites the JSON consistently, with a fresh digest, as a tool that edits a
file and re-signs it would: there the digest cannot help, and every field given a value of an
impossible type must be refused by the readers' own validation.
"""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from safetensors import safe_open

from glassllm import Config, GlassLM
from glassllm.formats import files, integrity
from glassllm.formats.checkpoint import load_checkpoint
from glassllm.training.data import ArrayBatches
from glassllm.tokenizers import ByteTokenizer
from glassllm.training import Trainer, TrainSettings

MIN_VARIANTS = 200


# --------------------------------------------------------------------------- the originals
@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "model.safetensors"
    files.save(GlassLM(Config(d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, max_len=8,
                              tie_embeddings=False), seed=3), path, tokenizer=ByteTokenizer())
    return path


@pytest.fixture(scope="module")
def checkpoint_file(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ckpt")
    ids = np.frombuffer(b"the cat sat on the mat. " * 30, dtype=np.uint8).astype(np.int64)
    settings = TrainSettings(steps=4, batch_size=2, seq_len=8, lr=1e-2, warmup=1,
                             eval_every=2, eval_batches=1, precision="fp16",
                             checkpoint_every=4)
    trainer = Trainer(settings, ArrayBatches(ids[:600]), ArrayBatches(ids[600:]),
                      checkpoint_path=directory / "run.ckpt", extra={"note": "fuzz"})
    trainer.run(GlassLM(Config(d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, max_len=8)))
    return directory / "run.ckpt"


# --------------------------------------------------------------------------- file surgery
def split(data: bytes) -> tuple[dict, bytes]:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def join(header: dict, body: bytes) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes with spaces
    return len(raw).to_bytes(8, "little") + raw + body


def leaf_paths(obj, prefix=()):
    """Paths to every value of a JSON object (containers included), depth first."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaf_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from leaf_paths(v, prefix + (i,))


def get(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def put(obj, path, value):
    get(obj, path[:-1])[path[-1]] = value


OTHER_TYPES = ["x", 1.5, -1, None, [], {}, True, 10**40]


def json_edits(obj, rng, n):
    """Up to n edited deep copies of a JSON object: a value of another type or sign, two
    values swapped, a field removed, a field added."""
    paths = [p for p in leaf_paths(obj) if p]
    edits = []
    for path in paths:
        for value in OTHER_TYPES:
            edits.append(("set", path, value))
        edits.append(("del", path, None))
    for _ in range(len(paths) if len(paths) > 1 else 0):
        a, b = rng.choice(len(paths), size=2, replace=False)
        edits.append(("swap", paths[a], paths[b]))
    edits.append(("add", ("surprise",), 1))
    for i in rng.permutation(len(edits))[:n]:
        kind, path, arg = edits[i]
        new = copy.deepcopy(obj)
        try:
            if kind == "set":
                put(new, path, arg)
            elif kind == "del":
                parent = get(new, path[:-1])
                parent.pop(path[-1]) if isinstance(parent, dict) else parent.pop(path[-1])
            elif kind == "swap":
                va, vb = copy.deepcopy(get(new, path)), copy.deepcopy(get(new, arg))
                put(new, path, vb)
                put(new, arg, va)
            else:
                new[path[0]] = arg
        except (KeyError, IndexError, TypeError):  # a swap whose paths nest in each other
            continue
        yield f"{kind} {'.'.join(map(str, path))}", new


def variants(data: bytes, json_keys: list[str], seed: int):
    """(description, bytes) of damaged copies of a safetensors file."""
    rng = np.random.default_rng(seed)
    header, body = split(data)
    n_header = len(data) - len(body)
    for cut in sorted({0, 1, 7, 8, 9, n_header - 1, n_header, n_header + 1, len(data) - 1,
                       *rng.integers(0, len(data), 40)}):
        yield f"truncated to {cut} bytes", data[:cut]
    for at in sorted(set(rng.integers(0, 8, 8)) | set(rng.integers(8, n_header, 100))):
        flipped = bytearray(data)
        flipped[at] ^= 1 << int(rng.integers(0, 8))
        yield f"bit flip in the header at {at}", bytes(flipped)
    for at in sorted(set(rng.integers(n_header, len(data), 80))):
        flipped = bytearray(data)
        flipped[at] ^= 1 << int(rng.integers(0, 8))
        yield f"bit flip in the data at {at}", bytes(flipped)
    names = [k for k in header if k != "__metadata__"]
    for name in [names[i] for i in rng.permutation(len(names))[:4]]:
        for dtype in ("F16", "BF16", "F64", "I32", "U32", "I64", "U8", "BOOL"):
            swapped = copy.deepcopy(header)
            swapped[name]["dtype"] = dtype
            yield f"{name} as {dtype}", join(swapped, body)
        # same byte count: F16 with twice the elements, I32 bytes as they are
        for dtype, factor in (("F16", 2), ("I32", 1), ("U8", 4)):
            swapped = copy.deepcopy(header)
            shape = swapped[name]["shape"]
            swapped[name]["dtype"], swapped[name]["shape"] = dtype, shape[:-1] + [
                shape[-1] * factor]
            yield f"{name} as {dtype} {swapped[name]['shape']}", join(swapped, body)
    meta = header["__metadata__"]
    for key in meta:  # the metadata strings themselves: dropped, emptied, swapped
        edited = copy.deepcopy(header)
        del edited["__metadata__"][key]
        yield f"metadata {key} removed", join(edited, body)
        edited = copy.deepcopy(header)
        edited["__metadata__"][key] = ""
        yield f"metadata {key} emptied", join(edited, body)
    for key in json_keys:  # JSON inside the metadata, edited without re-signing
        for what, new in json_edits(json.loads(meta[key]), rng, 60):
            edited = copy.deepcopy(header)
            edited["__metadata__"][key] = json.dumps(new)
            yield f"{key}: {what}", join(edited, body)


def resigned(data: bytes, key: str, typed_prefixes: tuple, seed: int):
    """(description, bytes): one typed field of the JSON under metadata `key` given a value of
    an impossible type, the digest recomputed."""
    rng = np.random.default_rng(seed)
    header, body = split(data)
    with_data = {}
    offset = 0
    for name, info in header.items():
        if name != "__metadata__":
            lo, hi = info["data_offsets"]
            with_data[name] = np.frombuffer(body[lo:hi], dtype=np.float32).reshape(
                info["shape"])
    obj = json.loads(header["__metadata__"][key])
    paths = [p for p in leaf_paths(obj) if p and str(p[0]).startswith(typed_prefixes)]
    for i in rng.permutation(len(paths))[:80]:
        path = paths[i]
        old = get(obj, path)
        for value in ("x", [], {}) if not isinstance(old, (list, dict)) else ("x", 7):
            new = copy.deepcopy(obj)
            put(new, path, value)
            meta = {k: v for k, v in header["__metadata__"].items() if k != "digest"}
            meta[key] = json.dumps(new)
            edited = {**header, "__metadata__": integrity.sign(with_data, meta)}
            offset += 1
            yield f"re-signed {key}: {'.'.join(map(str, path))} = {value!r}", \
                join(edited, body)


# --------------------------------------------------------------------------- comparing
def same_model(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return a.cfg == b.cfg and list(sa) == list(sb) and all(
        sa[k].dtype == sb[k].dtype and np.array_equal(sa[k], sb[k]) for k in sa)


def same_checkpoint(a, b) -> bool:
    def arrays_equal(x, y):
        return list(x) == list(y) and all(
            x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]) for k in x)
    scalars = ("step", "config", "rng_state", "settings", "best_val_loss", "best_step",
               "history", "scaler", "extra", "data")
    opt_a = {k: v for k, v in a.optimizer.items() if k not in ("m", "v")}
    opt_b = {k: v for k, v in b.optimizer.items() if k not in ("m", "v")}
    return all(getattr(a, k) == getattr(b, k) for k in scalars) and opt_a == opt_b and \
        arrays_equal(a.weights, b.weights) and \
        arrays_equal(a.optimizer["m"], b.optimizer["m"]) and \
        arrays_equal(a.optimizer["v"], b.optimizer["v"])


def outcome(load, same, path, original, description) -> str:
    """'loaded' (exactly the original) or 'refused' (a clean error); anything else fails."""
    try:
        result = load(path)
    except (ValueError, OSError) as e:
        assert str(path) in str(e), f"{description}: the error does not name the file: {e}"
        assert "\n" not in str(e), f"{description}: not one line: {e}"
        return "refused"
    except Exception as e:  # noqa: BLE001 -- exactly what the fuzz test is looking for
        pytest.fail(f"{description}: {type(e).__name__}: {e}")
    assert same(result, original), f"{description}: loaded as a CHANGED model/state"
    return "loaded"


def load_model_and_tokenizer(path):
    tokenizer = files.load_tokenizer(path)  # None: a weights-only file
    return files.load(path), None if tokenizer is None else tokenizer.to_json()


def same_model_and_tokenizer(a, b):
    return same_model(a[0], b[0]) and a[1] == b[1]


# --------------------------------------------------------------------------- the tests
def test_fuzzed_model_files_load_unchanged_or_fail_cleanly(tmp_path, model_file):
    data = model_file.read_bytes()
    original = load_model_and_tokenizer(model_file)
    path = tmp_path / "variant.safetensors"
    counts = {"loaded": 0, "refused": 0}
    for description, variant in variants(data, ["config", "tokenizer"], seed=0):
        path.write_bytes(variant)
        counts[outcome(load_model_and_tokenizer, same_model_and_tokenizer, path, original,
                       description)] += 1
    assert sum(counts.values()) >= MIN_VARIANTS, counts
    assert counts["refused"] >= MIN_VARIANTS - 20, counts  # the digest catches nearly all


def test_fuzzed_checkpoints_load_unchanged_or_fail_cleanly(tmp_path, checkpoint_file):
    data = checkpoint_file.read_bytes()
    original = load_checkpoint(checkpoint_file)
    assert original.scaler["scaler"] and original.history and original.data  # a full state
    path = tmp_path / "variant.ckpt"
    counts = {"loaded": 0, "refused": 0}
    for description, variant in variants(data, ["state"], seed=1):
        path.write_bytes(variant)
        counts[outcome(load_checkpoint, same_checkpoint, path, original, description)] += 1
    assert sum(counts.values()) >= MIN_VARIANTS, counts
    assert counts["refused"] >= MIN_VARIANTS - 20, counts


def test_resigned_model_configs_of_impossible_types_are_refused(tmp_path, model_file):
    data = model_file.read_bytes()
    path = tmp_path / "resigned.safetensors"
    n = 0
    for description, variant in resigned(data, "config", ("",), seed=2):
        path.write_bytes(variant)
        assert outcome(files.load, same_model, path, None, description) == "refused", \
            description
        n += 1
    assert n >= 20


def test_resigned_checkpoint_states_of_impossible_types_are_refused(tmp_path, checkpoint_file):
    """Every typed part of the state (all but the free-form `extra` and the settings' values,
    which the Trainer checks when it resumes): a value of an impossible type is refused."""
    data = checkpoint_file.read_bytes()
    path = tmp_path / "resigned.ckpt"
    typed = ("step", "config", "optimizer", "rng_state", "best_", "history", "scaler",
             "data")
    n = 0
    for description, variant in resigned(data, "state", typed, seed=3):
        path.write_bytes(variant)
        assert outcome(load_checkpoint, same_checkpoint, path, None, description) == \
            "refused", description
        n += 1
    assert n >= 100


def test_the_originals_load(model_file, checkpoint_file):
    """The fixtures themselves are valid (otherwise 'refused' would prove nothing)."""
    assert same_model(files.load(model_file), files.load(model_file))
    with safe_open(str(checkpoint_file), framework="numpy") as f:
        assert json.loads(f.metadata()["digest"])["algorithm"] == "sha256"
    assert load_checkpoint(checkpoint_file).step == 4
