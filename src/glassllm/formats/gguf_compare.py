"""What quantization did to a model: a GGUF file against its float original.

    report = compare("model-q4_0.gguf", "model.safetensors", ids)

Per tensor, the error of the GGUF's dequantized weights against the original's (relative RMS
||q - f|| / ||f|| and the largest |q - f|), and over a sample of token ids, how far the two
models' next-token predictions agree: the fraction of positions whose top-1 token is the same,
the mean KL divergence KL(p_original || p_gguf) in nats, and the largest logit difference.
`glassllm inspect --compare A.gguf B` prints it.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import gguf_names as names
from .gguf_read import GGUFFile, config_from_keys, model_from_gguf


@dataclasses.dataclass(frozen=True)
class TensorError:
    """One parameter's quantization error. rel_rms: ||q - f||_2 / ||f||_2 (0 when equal;
    inf when f is all zeros and q is not); max_abs: max |q - f|; type: the GGUF tensor type."""

    name: str
    gguf_name: str
    type: str
    rel_rms: float
    max_abs: float


@dataclasses.dataclass(frozen=True)
class Agreement:
    """Next-token agreement of two models over `positions` positions: top1 the fraction with
    the same argmax, mean_kl the mean KL(p_a || p_b) (nats), max_logit_diff the largest
    |logit_a - logit_b| and max_logit the largest |logit_a| (its scale)."""

    positions: int
    top1: float
    mean_kl: float
    max_logit_diff: float
    max_logit: float


@dataclasses.dataclass(frozen=True)
class Report:
    tensors: list[TensorError]
    agreement: Agreement | None
    overall_rel_rms: float  # over every weight of the model at once


def tensor_errors(quantized, original, types: dict[str, tuple[str, str]]) -> list[TensorError]:
    """Per parameter of `quantized` (a GlassLM): its error against `original`'s parameter of
    the same name. `types`: glassllm name -> (GGUF name, GGUF type name).

    Raises:
        ValueError: the two models' parameters differ in names or shapes (one line).
    """
    q, f = dict(quantized.named_parameters()), dict(original.named_parameters())
    if set(q) != set(f) or any(q[n].shape != f[n].shape for n in q):
        diff = sorted(set(q) ^ set(f)) or [n for n in q if q[n].shape != f[n].shape]
        raise ValueError(f"the models differ in their parameters (first: {diff[0]!r}); "
                         f"compare a GGUF with the float model it was made from")
    rows = []
    for name in q:
        a, b = q[name].data.astype(np.float64), f[name].data.astype(np.float64)
        err, ref = np.linalg.norm(a - b), np.linalg.norm(b)
        rel = 0.0 if err == 0 else (float(err / ref) if ref else float("inf"))
        rows.append(TensorError(name, *types[name], rel, float(np.abs(a - b).max())))
    return rows


def logit_agreement(a, b, ids, window: int | None = None) -> Agreement:
    """Next-token agreement of models `a` (the reference) and `b` on token ids (1-D), run in
    windows of at most `window` (default: a's max_len) tokens.

    Raises:
        ValueError: fewer than 1 id, or an id outside either model's vocabulary.
    """
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size < 1:
        raise ValueError("the sample holds no token ids")
    window = min(window or a.cfg.max_len, a.cfg.max_len, b.cfg.max_len)
    same, kl, worst, scale, n = 0, 0.0, 0.0, 0.0, 0
    for start in range(0, ids.size, window):
        chunk = ids[start:start + window][None]
        za, zb = a(chunk).data[0].astype(np.float64), b(chunk).data[0].astype(np.float64)
        same += int((za.argmax(-1) == zb.argmax(-1)).sum())
        la, lb = _log_softmax(za), _log_softmax(zb)
        kl += float((np.exp(la) * (la - lb)).sum())
        worst = max(worst, float(np.abs(za - zb).max()))
        scale = max(scale, float(np.abs(za).max()))
        n += chunk.shape[1]
    return Agreement(n, same / n, kl / n, worst, scale)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def compare(gguf_path, original, ids=None) -> Report:
    """The quantization report of GGUF file `gguf_path` against `original` (a GlassLM: the
    float model it was made from), with the agreement over `ids` when given.

    Raises:
        FileNotFoundError / ValueError: as `gguf_read.read_gguf`; ValueError as
            `tensor_errors` and `logit_agreement`.
    """
    f = GGUFFile(gguf_path)
    cfg = config_from_keys(f)
    model = model_from_gguf(f, cfg)
    fused = names.fused_qkv_name(0, "weight") in f.tensors
    types = {ours: (theirs, f.tensors[theirs].tensor_type.name)
             for ours, theirs in names.tensor_names(cfg, fused=fused).items()}
    rows = tensor_errors(model, original, types)
    ours, theirs = dict(model.named_parameters()), dict(original.named_parameters())
    q = np.concatenate([ours[n].data.ravel() for n in ours]).astype(np.float64)
    o = np.concatenate([theirs[n].data.ravel() for n in ours]).astype(np.float64)
    overall = float(np.linalg.norm(q - o) / max(np.linalg.norm(o), 1e-300))
    agreement = None if ids is None else logit_agreement(original, model, ids)
    return Report(rows, agreement, overall)
