"""GGUF files written by glassllm (`formats.gguf_write`), run by llama.cpp itself.

llama.cpp comes through `llama-cpp-python` (the `test` extra builds it from its source
distribution, which vendors llama.cpp). Without it these tests skip, naming why; under CI=true
they fail instead.

For every family llama.cpp runs (a tiny random model each, with its special features binding:
grouped kv heads, a window shorter than the prompt, soft-caps, partial rotary, biases, norm
weights far from 1) plus stories260K, and every type (f32, f16, q8_0, q4_0):
- llama.cpp's logits on a prompt equal glassllm's on the same file: glassllm reads the GGUF
  back (`formats.gguf_read`, quantized tensors dequantized to float32). Bounds, relative to the largest logit: f32 1e-4, but 1e-3 for
  the GELU families (gpt2, neox, phi, gemma*: ggml's CPU GELU reads a float16 table,
  `GGML_GELU_FP16` in ggml-cpu/vec.h, so its input and output are float16-rounded); f16
  2e-3; q8_0 6e-2 and q4_0 2e-1, since llama.cpp's quantized dot products also round the
  activations to q8_0 blocks (and to float16 for f16 weights), which glassllm does not, and
  tiny random models amplify that (measured here: f32 ~1e-6 / ~4e-4 GELU, f16 ~4e-4,
  q8_0 1-4e-2, q4_0 1-18e-2). For q8_0 and q4_0 llama.cpp's logits must also be nearer the
  quantized weights' logits than the float model's: it ran what the file holds. That the
  file holds exactly those weights is exact elsewhere: the quantizers equal gguf's byte for
  byte (tests/test_gguf_write.py) and the f32 file's logits pin the layout;
- f32 and f16: 20 greedy tokens equal;
- the tokenizer: llama.cpp's ids on a sample text equal glassllm's (SentencePiece: tok512;
  byte-level BPE: GPT-2's own vocab.json + merges.txt, and a BPE trained here).
The KV cache is float32 (`type_k=type_v=0`): llama.cpp's default float16 cache alone moves
f32 logits by ~5e-4.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import shared_data_path, skip_or_fail
from glassllm import Config, GlassLM
from glassllm.formats import gguf_write, llama2c
from glassllm.formats.gguf_read import read_gguf

gguf = pytest.importorskip("gguf")

TYPES = ("f32", "f16", "q8_0", "q4_0")
TOLERANCE = {"f32": 1e-4, "f16": 2e-3, "q8_0": 6e-2, "q4_0": 2e-1}
GELU_F32_TOLERANCE = 1e-3  # ggml's float16 GELU table (module docstring)
GELU_FAMILIES = {"gpt2", "neox", "phi", "gemma", "gemma2", "gemma3"}
SAMPLE = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
          "in the park with her friends.")
_SIZES = dict(d_model=64, n_layers=2, n_heads=4, d_ff=128, max_len=64)
_GQA = dict(n_kv_heads=2)
_LOCAL = ("sliding_attention", "full_attention")
# family -> (overrides of its preset, tokenizer kind)
TINY = {
    "llama": (dict(_GQA), "sp"),
    "mistral": (dict(_GQA), "sp"),
    "qwen2": (dict(_GQA), "bpe"),
    "qwen3": (dict(_GQA, head_dim=32), "bpe"),
    "gemma": (dict(_GQA, head_dim=32), "sp"),
    "gemma2": (dict(_GQA, head_dim=32, sliding_window=8, attn_softcap=5.0,
                    final_softcap=20.0), "sp"),
    "gemma3": (dict(_GQA, head_dim=32, sliding_window=8, layer_types=_LOCAL,
                    rope_local_theta=100.0), "sp"),
    "phi": (dict(), "bpe"),
    "neox": (dict(), "bpe"),
    "gpt2": (dict(), "bpe"),
    "olmo2": (dict(_GQA), "bpe"),
}
MODELS = sorted(TINY) + ["stories260K"]


def llama_cpp():
    try:
        import llama_cpp as module
    except ImportError as e:  # noqa: PERF203
        skip_or_fail(f"llama_cpp (llama-cpp-python, the test extra) cannot be imported: {e}")
    return module


def open_llama(path, n_ctx: int = 64, **options):
    """llama.cpp on `path`: all logits kept, float32 KV cache, quiet."""
    return llama_cpp().Llama(str(path), logits_all=True, n_ctx=n_ctx, n_threads=1,
                             type_k=0, type_v=0, verbose=False, **options)


def randomise(model: GlassLM, seed: int) -> GlassLM:
    """Every parameter random: matrices N(0, 0.15), biases N(0, 0.1), norm weights N(1, 0.2)
    (N(0, 0.2) for Gemma's (1 + w) norms), so every tensor's layout matters."""
    rng = np.random.default_rng(seed)
    for name, p in model.named_parameters():
        a = p.data
        if "norm" in name and name.endswith("weight"):
            a[...] = (0.0 if model.cfg.norm_offset else 1.0) + 0.2 * rng.standard_normal(a.shape)
        elif name.endswith("bias"):
            a[...] = 0.1 * rng.standard_normal(a.shape)
        else:
            a[...] = 0.15 * rng.standard_normal(a.shape)
    return model


_TOKENIZERS: dict = {}


def tokenizer(kind: str):
    if kind not in _TOKENIZERS:
        if kind == "sp":
            _TOKENIZERS[kind] = llama2c.tokenizer_from_llama2c(
                shared_data_path("llama2c", "tok512.bin"))
        else:
            from glassllm.tokenizers.bpe import BPETokenizer
            text = shared_data_path("tinyshakespeare.txt").read_text()[:200_000]
            _TOKENIZERS[kind] = BPETokenizer.train(text, vocab_size=320)
    return _TOKENIZERS[kind]


_MODELS: dict = {}


def model_and_tokenizer(name: str):
    if name not in _MODELS:
        if name == "stories260K":
            model = llama2c.from_llama2c(shared_data_path("llama2c", "stories260K.bin"))
            tok = tokenizer("sp")
        else:
            overrides, kind = TINY[name]
            tok = tokenizer(kind)
            cfg = Config.preset(name, vocab_size=tok.vocab_size, **_SIZES, **overrides)
            model = randomise(GlassLM(cfg), seed=sorted(TINY).index(name))
        _MODELS[name] = model, tok
    return _MODELS[name]


def prompt_ids(tok, n: int = 24) -> list[int]:
    ids = tok.encode(SAMPLE).tolist()[:n]
    return ([tok.bos_id] if getattr(tok, "bos_id", None) is not None else []) + ids


def llama_logits(llm, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[:len(ids)], dtype=np.float32)


_FILES: dict = {}


def export(name: str, kind: str, tmp_path_factory):
    """(model name, type, glassllm model, tokenizer, .gguf path written by write_gguf)."""
    model, tok = model_and_tokenizer(name)
    if (name, kind) not in _FILES:
        path = tmp_path_factory.mktemp("gguf") / f"{name}-{kind}.gguf"
        gguf_write.write_gguf(model, path, tok, type=kind)
        _FILES[name, kind] = path
    return name, kind, model, tok, _FILES[name, kind]


@pytest.fixture(params=[(m, t) for m in MODELS for t in TYPES],
                ids=[f"{m}-{t}" for m in MODELS for t in TYPES])
def exported(request, tmp_path_factory):
    return export(*request.param, tmp_path_factory)


@pytest.fixture(params=[(m, t) for m in MODELS for t in ("f32", "f16")],
                ids=[f"{m}-{t}" for m in MODELS for t in ("f32", "f16")])
def exported_float(request, tmp_path_factory):
    return export(*request.param, tmp_path_factory)


def test_llamacpp_logits_equal_glassllms(exported):
    name, kind, model, tok, path = exported
    ids = prompt_ids(tok)
    theirs = llama_logits(open_llama(path), ids)
    ours = read_gguf(path)[0](np.array([ids])).data[0]
    scale = max(1.0, float(np.abs(ours).max()))
    err = float(np.abs(theirs - ours).max()) / scale
    bound = GELU_F32_TOLERANCE if kind == "f32" and name in GELU_FAMILIES else TOLERANCE[kind]
    assert err <= bound, f"{name} {kind}: max |diff| / max |logit| = {err:.3g} > {bound}"
    if kind == "f32":  # and the bound is tight enough: a wrong layout is far off
        assert (theirs.argmax(-1) == ours.argmax(-1)).all()
    if kind in ("q8_0", "q4_0"):
        unquantized = model(np.array([ids])).data[0]
        assert np.abs(theirs - ours).max() < np.abs(theirs - unquantized).max()


def greedy_glassllm(model: GlassLM, ids: list[int], n: int) -> list[int]:
    ids = list(ids)
    for _ in range(n):
        ids.append(int(model(np.array([ids])).data[0, -1].argmax()))
    return ids[-n:]


def greedy_llamacpp(llm, ids: list[int], n: int) -> list[int]:
    llm.reset()
    llm.eval(ids)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    return out


def test_greedy_20_tokens_equal(exported_float):
    name, kind, model, tok, path = exported_float
    ids = prompt_ids(tok, n=12)
    ours = greedy_glassllm(read_gguf(path)[0], ids, 20)
    assert greedy_llamacpp(open_llama(path), ids, 20) == ours


@pytest.mark.parametrize("kind", ["sp", "bpe", "gpt2"])
def test_llamacpp_tokenizer_ids_equal_glassllms(kind, tmp_path):
    """The tokenizer keys alone (a vocab-only load) give glassllm's ids on a sample with
    punctuation, digits, several spaces, newlines and non-ASCII text."""
    if kind == "gpt2":
        from glassllm.tokenizers.bpe import BPETokenizer
        tok = BPETokenizer.from_gpt2_files(shared_data_path("gpt2", "vocab.json"),
                                           shared_data_path("gpt2", "merges.txt"))
    else:
        tok = tokenizer(kind)
    cfg = Config.preset("llama" if kind == "sp" else "gpt2", vocab_size=tok.vocab_size,
                        d_model=32, n_layers=1, n_heads=1, d_ff=32, max_len=16)
    path = tmp_path / "tok.gguf"
    gguf_write.write_gguf(GlassLM(cfg), path, tok)
    llm = llama_cpp().Llama(str(path), vocab_only=True, verbose=False)
    text = SAMPLE + "  It cost $12.50,\n\nshe said: \"don't!\"  Café, naïve, 東京 🙂."
    assert llm.tokenize(text.encode(), add_bos=False, special=False) == tok.encode(text).tolist()
