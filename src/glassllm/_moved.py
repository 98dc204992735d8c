"""Import paths of glassllm 0.1 that moved in 0.2, kept working with a DeprecationWarning.

`import glassllm.files` (or `from glassllm import files`) gives the module now at
`glassllm.formats.files`: the same module object, so a monkeypatch or an isinstance check
through the old name acts on the new module. The old names go in a later release.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    **{f"glassllm.{m}": f"glassllm.engine.{m}" for m in ("parallel", "blas", "cpu", "decode")},
    **{f"glassllm.{m}": f"glassllm.lens.{m}"
       for m in ("trace", "interpret", "graph", "health", "report", "plots")},
    **{f"glassllm.{m}": f"glassllm.formats.{m}"
       for m in ("files", "checkpoint", "tokenizer", "hf", "llama2c", "integrity", "atomic")},
    **{f"glassllm.{m}": f"glassllm.training.{m}"
       for m in ("safety", "data", "distributed", "launch", "lock", "runfiles")},
}


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A finder on `sys.meta_path` that answers the old names with the moved modules."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old path goes in "
                      f"a later release)", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module):
        # the import system wrote the old name's spec onto the module: give it back its own
        module.__spec__ = self._own_spec


def install() -> None:
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
