"""glassllm: a small language-model library whose every part is visible.

Root exports: `Tensor`, `no_grad`, `Config`, `GlassLM`. The package is laid out as the library
is built:

- the glass, at the top: `tensor` (autograd), `functional` (every op's reference forward and
  backward), `nn`, `config` (`Config`), `model`, `taps` (where a trace listens), `amp` (mixed
  precision), `optim`, `train` (get_batch, evaluate, the training loop), `generate` (sampling), `kernels` (the
  switch between references and the engine);
- `glassllm.engine`: the fast forms of the ops, the thread pool, BLAS, CPU;
- `glassllm.lens`: trace, interpret, graph, health, report;
- `glassllm.formats`: model files, checkpoints, tokenizers, Hugging Face, llama2.c;
- `glassllm.training`: the Trainer, its safety belts, data, MPI, locks;
- `glassllm.cli`: the `glassllm` command.
"""
from . import _moved
from .model import Config, GlassLM
from .tensor import Tensor, no_grad
# After the glass: autocast installs its rounding into `kernels.matmul`, and the engine
# registers its BLAS backend and the fast forms of the ops (GLASSLLM_KERNELS picks the forms).
from . import amp, engine  # noqa: E402,F401  (imported for their registrations)

_moved.install()
# `import glassllm; glassllm.blas`: 0.1 loaded a few modules as a side effect of the import
__getattr__ = _moved.package_attribute

__all__ = ["Tensor", "no_grad", "Config", "GlassLM"]
__version__ = "0.1.0"
