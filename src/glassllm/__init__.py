"""glassllm: a small language-model library whose every part is visible.

Root exports: `Tensor`, `no_grad`, `Config`, `GlassLM`. Everything else lives in its module:
`glassllm.functional`, `.nn`, `.optim`, `.train`, `.amp`, `.files`, `.tokenizer`,
`.generate`, `.data`, `.hf`, `.distributed` (data parallelism over MPI), `.launch`, `.cli`.
"""
from .model import Config, GlassLM
from .tensor import Tensor, no_grad

__all__ = ["Tensor", "no_grad", "Config", "GlassLM"]
__version__ = "0.1.0"
