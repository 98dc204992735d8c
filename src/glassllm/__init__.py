"""glassllm: a small language-model library whose every part is visible.

Root exports: `Tensor`, `no_grad`, `Config`, `GlassLM`, and `load` (a model with its tokenizer
from local files, ready to generate: `glassllm.formats.lm`, imported on first use). The package is laid out as the library
is built:

- the glass, at the top: `tensor` (autograd), `functional` (every op's reference forward and
  backward), `nn`, `config` (`Config`), `model`, `taps` (where a trace listens), `amp` (mixed
  precision), `optim`, `train` (get_batch, evaluate, the training loop), `generate` (sampling), `kernels` (the
  switch between references and the engine);
- `glassllm.engine`: the fast forms of the ops, the thread pool, BLAS, CPU;
- `glassllm.lens`: trace, interpret, graph, health, report;
- `glassllm.tokenizers`: byte, BPE, SentencePiece and tokenizer.json tokenizers;
- `glassllm.formats`: model files, checkpoints, token files, Hugging Face, llama2.c;
- `glassllm.training`: the Trainer, its safety belts, data, MPI, locks;
- `glassllm.cli`: the `glassllm` command.
"""
# First thing, before NumPy: in the `glassllm` command a Ctrl-C during these imports is one line
# and exit 130, not Python's traceback (glassllm._startup; glassllm.cli.main takes over).
from . import _startup
_startup.guard()
from . import _moved  # noqa: E402
from .model import Config, GlassLM
from .tensor import Tensor, no_grad
# After the glass: autocast installs its rounding into `kernels.matmul`, and the engine
# registers its BLAS backend and the fast forms of the ops (GLASSLLM_KERNELS picks the forms).
from . import amp, engine  # noqa: E402,F401  (imported for their registrations)

_moved.install()

# Imported on first use: `import glassllm` stays cheap (no safetensors, tokenizers, ...).
_LAZY = {"load": ("glassllm.formats.lm", "load"), "LM": ("glassllm.formats.lm", "LM")}


def __getattr__(name: str):
    """`glassllm.load` / `glassllm.LM` on first use; `glassllm.<old module name>` (0.1 loaded a
    few modules as a side effect of the import) through `_moved.package_attribute`."""
    if name in _LAZY:
        import importlib
        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value
        return value
    return _moved.package_attribute(name, stacklevel=3)


__all__ = ["Tensor", "no_grad", "Config", "GlassLM", "load", "LM"]
__version__ = "0.1.0"
