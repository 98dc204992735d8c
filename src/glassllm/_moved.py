"""Import paths that moved (0.1's in 0.2; the tokenizers' since), kept working with a
DeprecationWarning.

`import glassllm.files` (or `from glassllm import files`) gives the module now at
`glassllm.formats.files`: the same module object, so a monkeypatch or an isinstance check
through the old name acts on the new module. `python -m glassllm.launch` runs the new module
as the program, and `import glassllm; glassllm.blas` (0.1 loaded a few modules as a side
effect) reaches the new module through the package's `__getattr__`. The old names go in a later
release.
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
       for m in ("files", "checkpoint", "hf", "llama2c", "integrity", "atomic")},
    # the tokenizers left formats for their own package (glassllm.tokenizers)
    "glassllm.tokenizer": "glassllm.tokenizers",
    "glassllm.formats.tokenizer": "glassllm.tokenizers",
    "glassllm.formats.tokenizer_json": "glassllm.tokenizers.tokenizer_json",
    "glassllm.formats.hf_tokenizer": "glassllm.tokenizers.hf",
    **{f"glassllm.{m}": f"glassllm.training.{m}"
       for m in ("safety", "data", "distributed", "launch", "lock", "runfiles")},
}


def message(old: str) -> str:
    return (f"{old} moved to {MOVED[old]}; import it from there (the old path goes in a later "
            f"release)")


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A finder on `sys.meta_path` that answers the old names with the moved modules."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        warnings.warn(message(spec.name), DeprecationWarning, stacklevel=2)
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # on this import's own spec: threads import apart
        return module

    def exec_module(self, module):
        # the import system wrote the old name's spec onto the module: give it back its own
        module.__spec__ = module.__spec__.loader_state

    def get_code(self, fullname):
        """`python -m OLD ARGS`: runpy asks for the old name's code; this code warns and runs
        the new module as `__main__` (its own name, package and file, as `-m NEW` would)."""
        source = (f"import runpy, warnings\n"
                  f"warnings.warn({message(fullname)!r}, DeprecationWarning)\n"
                  f"runpy.run_module({MOVED[fullname]!r}, run_name='__main__', alter_sys=True)\n")
        return compile(source, f"<{fullname}: moved to {MOVED[fullname]}>", "exec")


def package_attribute(name: str, stacklevel: int = 2):
    """`glassllm.<old name>` as an attribute of the package (its module `__getattr__`): the
    moved module, with the DeprecationWarning, once (the attribute is set on the package).
    `stacklevel` as `warnings.warn`'s: 2 when this is the package's `__getattr__` itself, one
    more for each function between (the warning points at the user's line)."""
    old = f"glassllm.{name}"
    if old not in MOVED:
        raise AttributeError(f"module 'glassllm' has no attribute {name!r}")
    warnings.warn(message(old), DeprecationWarning, stacklevel=stacklevel)
    module = importlib.import_module(MOVED[old])
    setattr(sys.modules["glassllm"], name, module)
    return module


def install() -> None:
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
