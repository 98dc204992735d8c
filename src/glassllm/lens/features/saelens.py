"""SAELens' on-disk format: a directory holding `cfg.json` and `sae_weights.safetensors`.

    save_saelens(sae, "dicts/blocks.2.residual_out")     # SAELens: SAE.load_from_disk(path)
    sae = load_saelens("dicts/blocks.2.residual_out")    # one SAELens saved (version 6)

The weights are SAELens' tensors as they are: `W_enc` (d_in, d_sae), `b_enc` (d_sae,), `W_dec`
(d_sae, d_in), `b_dec` (d_in,), `threshold` (d_sae,) for JumpReLU. `cfg.json` holds SAELens 6's
fields (`architecture`: "standard", "topk", "jumprelu", "transcoder", "jumprelu_transcoder";
`d_in`, `d_sae`, `d_out`, `k`, `apply_b_dec_to_input`, ...) and `metadata` (`hook_name`,
`hook_name_out`, and under `glassllm` the training options of `SAE.config`). Extra files of
glassllm beside them (`evaluation.json`: `evaluate_dictionary`'s report; `training.npz`: the
state to resume training) are ignored by SAELens.

Reading, every field that changes the arithmetic is either used (`apply_b_dec_to_input`, `k`)
or, with a value other than the plain one, refused with one line naming it: a normalisation of
the input (`normalize_activations`), a reshape (`reshape_activations`), TopK's
`rescale_acts_by_decoder_norm`, a head index, an older SAELens' `finetuning_scaling_factor` or
an activation other than the architecture's. The format is read from SAELens' own files
(`sae_lens/saes/*.py`, `sae_lens/loading/pretrained_sae_loaders.py`, version 6.54).
"""
from __future__ import annotations

import json
import os

import numpy as np

from ...formats.atomic import atomic_replace, atomic_write
from .sae import SAE, Transcoder

CFG_FILENAME = "cfg.json"
WEIGHTS_FILENAME = "sae_weights.safetensors"
EVALUATION_FILENAME = "evaluation.json"

# (SAELens architecture) <-> (glassllm class, kind)
ARCHITECTURES = {"standard": (SAE, "relu"), "topk": (SAE, "topk"), "jumprelu": (SAE, "jumprelu"),
                 "transcoder": (Transcoder, "relu"),
                 "jumprelu_transcoder": (Transcoder, "jumprelu")}

# cfg.json fields that change the arithmetic, with the only value glassllm reads
PLAIN_VALUES = {"normalize_activations": ("none", None, False),
                "reshape_activations": ("none", None),
                "rescale_acts_by_decoder_norm": (False, None),
                "hook_head_index": (None,), "hook_point_head_index": (None,),
                "finetuning_scaling_factor": (False, None),
                "use_error_term": (False, None)}
ACTIVATIONS = {"relu": ("relu", None), "topk": ("topk", "relu", None),
               "jumprelu": ("relu", "jumprelu", None)}


def architecture_of(sae: SAE) -> str:
    """SAELens' architecture name of a glassllm dictionary.

    Raises:
        ValueError: a TopK transcoder (SAELens 6 has none)."""
    for name, (cls, kind) in ARCHITECTURES.items():
        if type(sae) is cls and sae.kind == kind:
            return name
    raise ValueError(f"SAELens has no {sae.kind} {type(sae).__name__.lower()} architecture "
                     f"(its transcoders are relu and jumprelu)")


def saelens_config(sae: SAE, metadata: dict | None = None) -> dict:
    """The cfg.json dict of `sae` (SAELens 6's `SAEConfig.to_dict()` fields)."""
    meta = {"hook_name": sae.hook_name, "sae_lens_version": "6.0.0",
            "sae_lens_training_version": None, "glassllm": sae.config(), **(metadata or {})}
    cfg = {"architecture": architecture_of(sae), "d_in": sae.d_in, "d_sae": sae.d_sae,
           "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": sae.apply_b_dec_to_input,
           "normalize_activations": "none", "reshape_activations": "none", "metadata": meta}
    if sae.kind == "topk":
        cfg.update(k=sae.k, rescale_acts_by_decoder_norm=False)
    if isinstance(sae, Transcoder):
        cfg["d_out"] = sae.d_out
        meta["hook_name_out"] = sae.out_name
    return cfg


def save_saelens(sae: SAE, path, *, metadata: dict | None = None) -> str:
    """Write `sae` as SAELens' directory `path` (created; the two files replaced atomically):
    `sae_weights.safetensors` (float32) and `cfg.json`. metadata: more `metadata` fields (e.g.
    `model_name`). Returns the path.

    Raises:
        ValueError: a TopK transcoder (no SAELens architecture); OSError naming the file.
    """
    from safetensors.numpy import save_file
    path = os.fspath(path)
    text = json.dumps(saelens_config(sae, metadata), indent=1)  # before either file is written
    tensors = {name: np.ascontiguousarray(p.data, dtype=np.float32)
               for name, p in sae.named_parameters()}
    os.makedirs(path, exist_ok=True)
    atomic_replace(os.path.join(path, WEIGHTS_FILENAME), lambda tmp: save_file(tensors, tmp),
                   doing="cannot write the dictionary's weights")
    with atomic_write(os.path.join(path, CFG_FILENAME), "w",
                      doing="cannot write the dictionary's cfg.json") as f:
        f.write(text)
    return path


def read_config(path) -> dict:
    """cfg.json of the directory `path`, as a dict.

    Raises:
        FileNotFoundError / ValueError: missing, not JSON or not an object (naming the file)."""
    where = os.path.join(os.fspath(path), CFG_FILENAME)
    if not os.path.isfile(where):
        raise FileNotFoundError(f"{where}: not found (a SAELens dictionary is a directory with "
                                f"{CFG_FILENAME} and {WEIGHTS_FILENAME})")
    try:
        with open(where, encoding="utf-8") as f:
            cfg = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where}: not JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{where}: not a JSON object")
    return cfg


def load_saelens(path) -> SAE:
    """The dictionary SAELens (version 6, or glassllm's `save_saelens`) saved in directory `path`:
    an `SAE` or a `Transcoder`, float32, encoding and decoding as SAELens does.

    Raises:
        FileNotFoundError: no cfg.json or weights file.
        ValueError: one line naming the field: an unknown architecture, a field that changes
            the arithmetic in a way glassllm does not compute, a missing field, a tensor missing,
            unexpected, or of the wrong shape, or not finite.
    """
    path = os.fspath(path)
    cfg = read_config(path)
    where = os.path.join(path, CFG_FILENAME)
    cls, kind = _check_config(cfg, where)
    meta = _object(cfg, "metadata", where)
    hook_name = meta.get("hook_name") or cfg.get("hook_name") or ""
    if not isinstance(hook_name, str):
        raise ValueError(f"{where}: field 'hook_name' must be a string, got {hook_name!r}")
    options = {k: v for k, v in _object(meta, "glassllm", where, "metadata.").items()
               if k in ("l1_coefficient", "l0_coefficient", "bandwidth", "aux_coefficient",
                        "aux_k")}
    for name, value in options.items():
        if not (isinstance(value, (int, float)) and not isinstance(value, bool)) and \
                not (name == "aux_k" and value is None):
            raise ValueError(f"{where}: field 'metadata.glassllm.{name}' must be a number, got "
                             f"{value!r}")
    d_in, d_sae = _field(cfg, "d_in", where), _field(cfg, "d_sae", where)
    k = _field(cfg, "k", where) if kind == "topk" else None
    d_out = _field(cfg, "d_out", where) if cls is Transcoder else None
    weights = os.path.join(path, WEIGHTS_FILENAME)
    tensors = _read_weights(weights)
    if "W_enc" in tensors and tensors["W_enc"].shape != (d_in, d_sae):
        # before the dictionary is built: a damaged d_sae (1e12) would allocate its weights
        raise ValueError(f"{weights}: tensor 'W_enc' has shape {tensors['W_enc'].shape}; "
                         f"cfg.json's sizes give {(d_in, d_sae)}")
    try:  # sizes that disagree (k > d_sae): the constructor's line, naming the file
        if cls is Transcoder:
            sae = Transcoder(d_in, d_sae, d_out, kind=kind, hook_name=hook_name,
                             out_name=meta.get("hook_name_out") or "", **options)
        else:
            sae = SAE(d_in, d_sae, kind=kind, hook_name=hook_name, k=k,
                      apply_b_dec_to_input=cfg.get("apply_b_dec_to_input", True), **options)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    _load_weights(sae, tensors, weights)
    return sae


def _object(cfg: dict, name: str, where: str, prefix: str = "") -> dict:
    """cfg[name] as a dict ({} when absent or null): a hand-edited cfg.json can hold any JSON
    there, and the fields read from it must stay one line naming it."""
    value = cfg.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where}: field '{prefix}{name}' must be a JSON object, got "
                         f"{type(value).__name__}")
    return value


def _field(cfg: dict, name: str, where: str) -> int:
    value = cfg.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{where}: field {name!r} must be a positive integer, got {value!r}")
    return value


def _check_config(cfg: dict, where: str):
    """(class, kind) of cfg's architecture, after refusing any field whose value would change
    the arithmetic in a way glassllm does not compute."""
    arch = cfg.get("architecture", "standard")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:  # a list is not hashable
        raise ValueError(f"{where}: field 'architecture' is {arch!r}; glassllm reads "
                         f"{', '.join(ARCHITECTURES)}")
    cls, kind = ARCHITECTURES[arch]
    for name, plain in PLAIN_VALUES.items():
        for source in (cfg, _object(cfg, "metadata", where)):
            if name in source and source[name] not in plain:
                raise ValueError(f"{where}: field {name!r} is {source[name]!r}, which changes "
                                 f"the arithmetic; glassllm reads {plain[0]!r} only")
    activation = cfg.get("activation_fn", cfg.get("activation_fn_str"))
    if activation not in ACTIVATIONS[kind]:
        raise ValueError(f"{where}: field 'activation_fn' is {activation!r}, not the "
                         f"{arch} architecture's")
    if not isinstance(cfg.get("apply_b_dec_to_input", False), bool):  # "false" is truthy
        raise ValueError(f"{where}: field 'apply_b_dec_to_input' must be true or false, got "
                         f"{cfg['apply_b_dec_to_input']!r}")
    if cls is Transcoder and cfg.get("apply_b_dec_to_input"):
        raise ValueError(f"{where}: field 'apply_b_dec_to_input' is true for a transcoder "
                         f"(SAELens refuses it too)")
    return cls, kind


def _read_weights(where: str) -> dict:
    import ml_dtypes  # noqa: F401  -- registers bfloat16 with NumPy: SAELens saves bf16 too
    from safetensors import SafetensorError
    from safetensors.numpy import load_file
    if not os.path.isfile(where):
        raise FileNotFoundError(f"{where}: not found")
    try:
        return load_file(where)
    except (SafetensorError, OSError, TypeError) as e:  # TypeError: a dtype NumPy lacks
        raise ValueError(f"{where}: not a readable safetensors file ({e})") from None


def _load_weights(sae: SAE, tensors: dict, where: str) -> None:
    params = dict(sae.named_parameters())
    for name in tensors:
        if name not in params:
            raise ValueError(f"{where}: tensor {name!r} is not one of a {sae.kind} "
                             f"{type(sae).__name__}'s ({', '.join(params)})")
    for name, p in params.items():
        if name not in tensors:
            raise ValueError(f"{where}: tensor {name!r} is missing")
        value = tensors[name]
        if value.shape != p.shape:
            raise ValueError(f"{where}: tensor {name!r} has shape {value.shape}; cfg.json's "
                             f"sizes give {p.shape}")
        if value.dtype.kind != "f" and value.dtype.name != "bfloat16":  # ints: not weights
            raise ValueError(f"{where}: tensor {name!r} holds {value.dtype}, not floating point")
        value = value.astype(np.float32)
        if not np.isfinite(value).all():
            raise ValueError(f"{where}: tensor {name!r} holds inf or NaN")
        p.data = value
