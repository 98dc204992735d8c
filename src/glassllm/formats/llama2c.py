"""llama2.c files in and out: legacy (version 0) checkpoints <-> `GlassLM`, and `tokenizer.bin`.

llama2.c (Karpathy 2023) is the field's reference for Llama inference in plain C: `run.c` reads
a checkpoint, `export.py` writes one. Its formats are raw little-endian arrays with no
container, so there is no library to read them with: NumPy reads the arrays, `struct` the
tokenizer's records, as llama2.c's own Python does.

Checkpoint, version 0 (export.py `legacy_export`, run.c `read_checkpoint`):

    7 x int32   dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
                (vocab_size < 0: a separate classifier follows; > 0: it is the embedding)
    float32     tok_embeddings (V, dim)
                attention_norm (L, dim); wq (L, dim, dim); wk (L, kv, dim); wv (L, kv, dim);
                wo (L, dim, dim); ffn_norm (L, dim); w1 (L, hidden, dim); w2 (L, dim, hidden);
                w3 (L, hidden, dim); norm (dim,)
                freq_cis_real, freq_cis_imag (seq_len, head_dim / 2)   [RoPE tables]
                [output (V, dim)   only when vocab_size < 0]

with kv = n_kv_heads * head_dim, head_dim = dim / n_heads, every matrix in PyTorch's
`nn.Linear.weight` layout (out, in), the file ending right after the last array. The model
is Llama's: RMSNorm (eps 1e-5), RoPE with theta 10000, grouped-query attention, SwiGLU
w2(silu(w1 x) * w3 x), no biases -- run.c hard-codes all of it, so it is not in the header.
Versions 1 and 2 (a 256-byte header starting with the magic "ak42"; version 2 is int8
quantised) are not read.

Layouts. glassllm's `Linear` stores (in, out): every matrix is transposed. run.c rotates
adjacent pairs (2i, 2i+1) of each head (Meta's complex-number RoPE); `functional.rope` rotates
the halves (i, i + head_dim/2), as Hugging Face's Llama. The two are the same rotation of
re-ordered coordinates, so permuting the rows of wq and wk -- per head, even rows first, then
odd rows, export.py's `permute_original` (for wk with n_kv_heads) -- gives identical attention
scores: the conversion is exact, and `to_llama2c` applies the inverse permutation.

Every problem with a file -- too short for the header, a header whose sizes are not positive,
not consistent (heads not dividing dim, ...) or not matching the file's size, non-finite
weights, another llama2.c version -- is a ValueError naming the file. The header is checked
against the file's size before anything but the 28 header bytes is read, so a corrupt header
never allocates.

tokenizer.bin (export of llama2.c's tokenizer.py, run.c `build_tokenizer`): a uint32
max_token_length, then for each id a float32 score, an int32 byte length and that many bytes
of the piece (UTF-8; " " stands for SentencePiece's "▁"). The file has no count: the pieces
run to its end. `tokenizer_from_llama2c` returns a `glassllm.tokenizers.SentencePieceTokenizer`.
"""
from __future__ import annotations

import dataclasses
import math
import os
import struct

import numpy as np

from .atomic import atomic_write
from ..checks import check_int
from ..config import PRESETS
from ..model import Config, GlassLM
from ..tokenizers import SentencePieceTokenizer

HEADER_FIELDS = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                 "seq_len")
HEADER_BYTES = 4 * len(HEADER_FIELDS)
MAGIC = 0x616B3432  # "ak42" as a little-endian uint32: export.py's versions 1 and 2
ROPE_THETA = 10000.0  # run.c's RoPE base
NORM_EPS = 1e-5       # run.c's RMSNorm epsilon
INT32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class Header:
    """The 7 int32 of a version-0 checkpoint, with vocab_size made positive and its sign
    kept as `shared_classifier` (True: the classifier is the token embedding)."""

    dim: int
    hidden_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    shared_classifier: bool

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def arrays(self) -> list[tuple[str, tuple[int, ...]]]:
        """(llama2.c name, shape) of every float32 array, in file order."""
        L, D, kv = self.n_layers, self.dim, self.n_kv_heads * self.head_dim
        arrays = [("tok_embeddings", (self.vocab_size, D)), ("attention_norm", (L, D)),
                  ("wq", (L, D, D)), ("wk", (L, kv, D)), ("wv", (L, kv, D)), ("wo", (L, D, D)),
                  ("ffn_norm", (L, D)), ("w1", (L, self.hidden_dim, D)),
                  ("w2", (L, D, self.hidden_dim)), ("w3", (L, self.hidden_dim, D)),
                  ("norm", (D,)), ("freq_cis_real", (self.seq_len, self.head_dim // 2)),
                  ("freq_cis_imag", (self.seq_len, self.head_dim // 2))]
        if not self.shared_classifier:
            arrays.append(("output", (self.vocab_size, D)))
        return arrays

    def file_bytes(self) -> int:
        """Exact size of a file with this header (Python ints: no overflow)."""
        return HEADER_BYTES + 4 * sum(math.prod(shape) for _, shape in self.arrays())

    def to_bytes(self) -> bytes:
        vocab = self.vocab_size if self.shared_classifier else -self.vocab_size
        return struct.pack("<7i", self.dim, self.hidden_dim, self.n_layers, self.n_heads,
                           self.n_kv_heads, vocab, self.seq_len)


# --------------------------------------------------------------------------- reading
def read_header(path) -> Header:
    """The header of a version-0 checkpoint, checked against the file's size.

    Raises:
        FileNotFoundError / IsADirectoryError: no such file / a directory.
        ValueError (naming the file): shorter than the 28-byte header; a version-1/2 file;
            a size field <= 0 or vocab_size 0; dim not divisible by n_heads, n_heads not by
            n_kv_heads, an odd head_dim; a file size other than the header implies
            (truncated, or trailing bytes).
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        raw = f.read(HEADER_BYTES)
        size = os.fstat(f.fileno()).st_size
    where = f"{path}: not a llama2.c checkpoint (version 0)"
    if len(raw) < HEADER_BYTES:
        raise ValueError(f"{where}: {size} bytes, shorter than the {HEADER_BYTES}-byte header")
    values = struct.unpack("<7i", raw)
    if struct.unpack_from("<I", raw)[0] == MAGIC:
        raise ValueError(f"{path}: a llama2.c version-{values[1]} checkpoint (magic 'ak42'); "
                         f"only legacy version-0 files are read (version 2 is int8-quantised)")
    fields = dict(zip(HEADER_FIELDS, values))
    for name, value in fields.items():
        if value <= 0 and not (name == "vocab_size" and value < 0):
            raise ValueError(f"{where}: header field {name} = {value} must be positive")
    dim, n_heads, n_kv = fields["dim"], fields["n_heads"], fields["n_kv_heads"]
    if dim % n_heads:
        raise ValueError(f"{where}: header dim = {dim} is not divisible by n_heads = {n_heads}")
    if n_heads % n_kv:
        raise ValueError(f"{where}: header n_heads = {n_heads} is not divisible by "
                         f"n_kv_heads = {n_kv}")
    if (dim // n_heads) % 2:
        raise ValueError(f"{where}: head_dim = dim / n_heads = {dim // n_heads} is odd; RoPE "
                         f"rotates pairs")
    header = Header(**{**fields, "vocab_size": abs(fields["vocab_size"])},
                    shared_classifier=fields["vocab_size"] > 0)
    expected = header.file_bytes()
    if size != expected:
        what = "truncated" if size < expected else "longer than its header says"
        raise ValueError(f"{where}: {what}: {size:,} bytes, the header "
                         f"({', '.join(f'{k} {v}' for k, v in fields.items())}) implies "
                         f"{expected:,}")
    return header


def from_llama2c(path, *, max_len: int | None = None) -> GlassLM:
    """Load a llama2.c version-0 checkpoint as a float32 llama-family `GlassLM`.

    The config: d_model = dim, d_ff = hidden_dim (the file's own FFN width), n_heads,
    n_kv_heads, vocab_size, max_len = seq_len, rope_theta 10000, norm_eps 1e-5,
    tie_embeddings = (vocab_size > 0 in the header). wq/wk rows are permuted from adjacent
    pairs to halves (module docstring): the logits equal run.c's `forward` to float32
    rounding. The RoPE tables in the file are not read (run.c does not read them either).

    Args:
        path: the .bin file.
        max_len: optional shorter context than the file's seq_len (smaller RoPE tables and
            KV caches).

    Raises:
        FileNotFoundError / IsADirectoryError: as `open`.
        ValueError: see `read_header`; a non-finite weight (named); max_len not in
            [1, seq_len].
    """
    path = os.fspath(path)
    header = read_header(path)
    if max_len is not None:
        max_len = check_int(max_len, "from_llama2c: max_len (at most the checkpoint's "
                            "seq_len)", low=1, high=header.seq_len)
    cfg = Config(vocab_size=header.vocab_size, d_model=header.dim, n_layers=header.n_layers,
                 n_heads=header.n_heads, n_kv_heads=header.n_kv_heads,
                 max_len=header.seq_len if max_len is None else max_len, family="llama",
                 d_ff=header.hidden_dim, rope_theta=ROPE_THETA, norm_eps=NORM_EPS,
                 tie_embeddings=header.shared_classifier)
    flat = np.fromfile(path, dtype="<f4", offset=HEADER_BYTES)
    if flat.size * 4 + HEADER_BYTES != header.file_bytes():  # the file changed meanwhile
        raise ValueError(f"{path}: the file changed while it was read")
    arrays, offset = {}, 0
    for name, shape in header.arrays():
        n = math.prod(shape)
        arrays[name] = flat[offset:offset + n].reshape(shape)
        offset += n
        if name.startswith("freq_cis"):
            continue
        if not np.isfinite(arrays[name]).all():
            raise ValueError(f"{path}: array {name} holds NaN or infinite values")
    model = GlassLM(cfg)
    model.load_state_dict(_state_from_llama2c(header, arrays))
    return model


def _state_from_llama2c(h: Header, a: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    state = {"token_embedding.weight": a["tok_embeddings"], "final_norm.weight": a["norm"]}
    for i in range(h.n_layers):
        b = f"blocks.{i}."
        state |= {b + "attention_norm.weight": a["attention_norm"][i],
                  b + "attention.query.weight": _pairs_to_halves(a["wq"][i], h.n_heads).T,
                  b + "attention.key.weight": _pairs_to_halves(a["wk"][i], h.n_kv_heads).T,
                  b + "attention.value.weight": a["wv"][i].T,
                  b + "attention.output.weight": a["wo"][i].T,
                  b + "mlp_norm.weight": a["ffn_norm"][i],
                  b + "mlp.gate.weight": a["w1"][i].T,
                  b + "mlp.down.weight": a["w2"][i].T,
                  b + "mlp.up.weight": a["w3"][i].T}
    if not h.shared_classifier:
        state["lm_head.weight"] = a["output"].T
    return state


def _pairs_to_halves(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Rows (n_heads * head_dim, in) reordered per head from (x0, y0, x1, y1, ...) to
    (x0, x1, ..., y0, y1, ...): llama2.c export.py's `permute_original`."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(0, 2, 1, 3) \
        .reshape(rows, cols)


def _halves_to_pairs(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The inverse of `_pairs_to_halves`."""
    rows, cols = w.shape
    return w.reshape(n_heads, 2, rows // n_heads // 2, cols).transpose(0, 2, 1, 3) \
        .reshape(rows, cols)


# --------------------------------------------------------------------------- writing
def to_llama2c(model: GlassLM, path) -> None:
    """Write `model` as a llama2.c version-0 checkpoint that run.c runs, atomically.

    Header: dim, hidden_dim = d_ff, n_layers, n_heads, n_kv_heads, vocab_size (negative when
    the embeddings are not tied: the classifier is written after the RoPE tables), seq_len =
    max_len. A file read by `from_llama2c` and written back has the same header and the same
    bytes in every weight. The two RoPE tables, which run.c does not read, are recomputed as
    llama2.c's model.py does (float32 angles), with cos/sin rounded once from float64; they
    can differ from the PyTorch-written ones in the last bit.

    Raises:
        ValueError: not something run.c computes -- a gpt2-family model, a switch or
            head_dim other than Llama's (`glassllm.config.PRESETS`), rope_theta other than
            10000, norm_eps other than 1e-5 (run.c hard-codes both), a size beyond int32 --
            or a non-finite weight. Nothing is written then.
        OSError: the destination cannot be written (naming `path`).
    """
    path = os.fspath(path)
    cfg = model.cfg
    if cfg.family != "llama":
        raise ValueError(f"to_llama2c: llama2.c runs Llama models; this is a {cfg.family!r}-"
                         f"family model (LayerNorm, learned positions, GELU, biases)")
    differs = [name for name, value in PRESETS["llama"].items()
               if name not in ("rope_theta", "norm_eps", "tie_embeddings")
               and getattr(cfg, name) != value]
    if differs or cfg.head_dim * cfg.n_heads != cfg.d_model:
        raise ValueError(f"to_llama2c: run.c computes Llama exactly; this llama-family model "
                         f"sets {differs or ['head_dim']} otherwise")
    if cfg.rope_theta != ROPE_THETA:
        raise ValueError(f"to_llama2c: run.c hard-codes RoPE theta {ROPE_THETA:g}; this model "
                         f"has rope_theta {cfg.rope_theta:g}")
    if cfg.norm_eps != NORM_EPS:
        raise ValueError(f"to_llama2c: run.c hard-codes RMSNorm eps {NORM_EPS:g}; this model "
                         f"has norm_eps {cfg.norm_eps:g}")
    header = Header(dim=cfg.d_model, hidden_dim=cfg.d_ff, n_layers=cfg.n_layers,
                    n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, vocab_size=cfg.vocab_size,
                    seq_len=cfg.max_len, shared_classifier=cfg.tie_embeddings)
    too_big = [f for f in HEADER_FIELDS if getattr(header, f) > INT32_MAX]
    if too_big:
        raise ValueError(f"to_llama2c: {too_big} do not fit the header's int32")
    params = dict(model.named_parameters())
    for name, p in params.items():
        if not np.isfinite(p.numpy()).all():
            raise ValueError(f"to_llama2c {path}: tensor {name!r} holds NaN or infinite values; "
                             f"nothing written")
    arrays = _arrays_to_llama2c(header, {n: p.numpy() for n, p in params.items()})
    with atomic_write(path, "wb", doing="cannot write the llama2.c checkpoint") as f:
        f.write(header.to_bytes())
        for name, shape in header.arrays():
            for part in arrays[name]:
                f.write(np.ascontiguousarray(part, dtype="<f4").tobytes())


def _arrays_to_llama2c(h: Header, s: dict[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
    """Each llama2.c array as the list of pieces written one after the other."""
    layers = range(h.n_layers)

    def per_layer(name, convert=lambda w: w.T):
        return [convert(s[f"blocks.{i}.{name}.weight"]) for i in layers]

    cos, sin = _rope_tables(h.seq_len, h.head_dim)
    arrays = {"tok_embeddings": [s["token_embedding.weight"]],
              "attention_norm": per_layer("attention_norm", lambda w: w),
              "wq": per_layer("attention.query", lambda w: _halves_to_pairs(w.T, h.n_heads)),
              "wk": per_layer("attention.key", lambda w: _halves_to_pairs(w.T, h.n_kv_heads)),
              "wv": per_layer("attention.value"), "wo": per_layer("attention.output"),
              "ffn_norm": per_layer("mlp_norm", lambda w: w),
              "w1": per_layer("mlp.gate"), "w2": per_layer("mlp.down"), "w3": per_layer("mlp.up"),
              "norm": [s["final_norm.weight"]], "freq_cis_real": [cos], "freq_cis_imag": [sin]}
    if not h.shared_classifier:
        arrays["output"] = [s["lm_head.weight"].T]
    return arrays


def _rope_tables(seq_len: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin (seq_len, head_dim / 2), float32: llama2.c model.py's precompute_freqs_cis
    (angles t * theta^(-2i/head_dim) in float32), cos and sin rounded once from float64."""
    exponent = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    freqs = np.float32(1.0) / np.power(np.float32(ROPE_THETA), exponent)
    angles = np.outer(np.arange(seq_len, dtype=np.float32), freqs).astype(np.float64)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


# --------------------------------------------------------------------------- tokenizer
def tokenizer_from_llama2c(path) -> SentencePieceTokenizer:
    """Read llama2.c's `tokenizer.bin` (e.g. tok512.bin) as a `SentencePieceTokenizer`:
    encode gives run.c's `encode` ids (without BOS/EOS), decode follows run.c's `decode`.

    Raises:
        FileNotFoundError / IsADirectoryError: as `open`.
        ValueError (naming the file): shorter than its 4-byte header, a record cut short or
            with a negative length, no pieces, or a vocabulary `SentencePieceTokenizer`
            refuses (byte pieces not at ids 3..258, duplicate pieces, non-UTF-8 pieces, ...).
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    where = f"{path}: not a llama2.c tokenizer.bin"
    if len(data) < 4:
        raise ValueError(f"{where}: {len(data)} bytes, shorter than the 4-byte header")
    (max_token_length,) = struct.unpack_from("<I", data, 0)
    pieces, scores, offset = [], [], 4
    while offset < len(data):
        if len(data) - offset < 8:
            raise ValueError(f"{where}: piece {len(pieces)} is cut short at byte {offset}")
        score, length = struct.unpack_from("<fi", data, offset)
        offset += 8
        if length < 0 or length > len(data) - offset:
            raise ValueError(f"{where}: piece {len(pieces)} claims {length} bytes at byte "
                             f"{offset}, {len(data) - offset} remain")
        pieces.append(data[offset:offset + length])
        scores.append(score)
        offset += length
    if not pieces:
        raise ValueError(f"{where}: it holds no pieces")
    try:
        return SentencePieceTokenizer(pieces, scores, max_token_length)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
