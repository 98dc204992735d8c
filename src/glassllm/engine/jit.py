"""numba, loaded on first use: `kernels()` is `glassllm.engine.numba_kernels`, or None where
numba cannot load (then the engine runs its NumPy forms, `glassllm.engine.ops`, and says so
once).

Why lazily: importing numba and llvmlite costs about 0.3 s, and `import glassllm` stays under
a second; a script that never runs an op (a tokenizer, a file check) never pays it. The first
op that wants a kernel imports numba; each kernel compiles on its first call for each dtype,
or loads from numba's on-disk cache (`cache=True`), which a fresh install fills once.

GLASSLLM_NUMBA=0 turns the kernels off (the NumPy forms run, without a warning); 1 (or unset)
leaves them on; any other value is a ValueError naming the variable (a mistyped "off" must not
silently leave them on).
"""
from __future__ import annotations

import os
import sys
import threading
import warnings

ENV_VAR = "GLASSLLM_NUMBA"

_lock = threading.Lock()
_loaded = False
_module = None


def kernels():
    """The compiled kernels module, or None (numba missing or failing to load, or turned off
    by GLASSLLM_NUMBA=0). Loads once per process; the first failure prints one warning line."""
    global _loaded, _module
    if _loaded:
        return _module
    with _lock:
        if not _loaded:
            _module = _load()
            _loaded = True
    return _module


def enabled_by_environment() -> bool:
    """GLASSLLM_NUMBA as a switch: "1" or unset -> True, "0" -> False.

    Raises:
        ValueError: any other value, naming the variable.
    """
    text = os.environ.get(ENV_VAR, "1").strip() or "1"
    if text not in ("0", "1"):
        raise ValueError(f"{ENV_VAR}: expected 0 (NumPy forms) or 1 (compiled kernels), "
                         f"got {text!r}")
    return text == "1"


_disk_cache = True


def disk_cache() -> bool:
    """Whether the kernels keep their machine code on disk (numba's `cache=True`)."""
    return _disk_cache


def _import_kernels():
    """`numba_kernels`, cached on disk where numba can write (next to the module, else
    NUMBA_CACHE_DIR or the user's cache directory); where it cannot (a read-only install run
    with a read-only home, as in some containers) numba refuses `cache=True` at decoration
    ("no locator available"): then the kernels compile in each process, said in one line."""
    global _disk_cache
    try:
        from . import numba_kernels
    except RuntimeError as error:
        if "no locator available" not in str(error):
            raise
        _disk_cache = False
        warnings.warn_explicit(
            "glassllm: numba has no writable cache directory (set NUMBA_CACHE_DIR); the "
            "kernels compile in each process", RuntimeWarning, __file__, 0)
        from . import numba_kernels
    _survive_broken_cache_files(numba_kernels)
    return numba_kernels


def _survive_broken_cache_files(module) -> None:
    """Each kernel's on-disk cache treats an unreadable file as a miss, not an error.

    numba reads its cache files (.nbi index, .nbc code: pickles) without a guard: one file
    truncated or corrupted (a disk filled up, a copied or half-synced install) made every op
    raise UnpicklingError. Here a failed load empties that function's index (`flush`, numba's
    own reset) and says so in one line; numba then compiles and writes fresh files."""
    warned = []
    for name, dispatcher in vars(module).items():
        cache = getattr(dispatcher, "_cache", None)  # numba's per-function Cache (or None)
        if cache is None or not hasattr(cache, "load_overload"):
            continue

        def load_overload(*args, _load=cache.load_overload, _cache=cache, _name=name):
            try:
                return _load(*args)
            except Exception as error:  # what a broken pickle raises varies with the damage
                if not warned:  # one line per process, however many files are broken
                    warned.append(_name)
                    warnings.warn_explicit(
                        f"glassllm: numba's cache in {_cache.cache_path} has unreadable files "
                        f"({_name}: {type(error).__name__}); compiling those kernels again",
                        RuntimeWarning, __file__, 0)
                _cache.flush()
                return None

        cache.load_overload = load_overload


def _load():
    if not enabled_by_environment():
        return None
    if os.environ.get("NUMBA_DISABLE_JIT", "0").strip() not in ("", "0"):
        # numba would run the kernels as the Python loops they are: a step 20x (tiny model)
        # to 1000x slower than NumPy's forms, for a variable often set for another project
        warnings.warn_explicit(
            "glassllm: NUMBA_DISABLE_JIT is set; running the NumPy forms of the ops",
            RuntimeWarning, __file__, 0)
        return None
    try:
        numba_kernels = _import_kernels()
    except Exception as error:  # ImportError, or llvmlite failing to load its library
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        warnings.warn_explicit(
            f"glassllm: numba cannot load ({reason}); running the NumPy forms of the ops",
            RuntimeWarning, __file__, 0)
        return None
    return numba_kernels


def reset() -> None:
    """Forget the load result (tests simulate a missing numba, then load again)."""
    global _loaded, _module, _disk_cache
    with _lock:
        _loaded, _module, _disk_cache = False, None, True
        sys.modules.pop(f"{__package__}.numba_kernels", None)
