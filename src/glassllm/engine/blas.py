"""Matrix products through a BLAS: NumPy's `np.matmul` (the reference) or Intel MKL's SGEMM.

Every matrix product of glassllm goes through `glassllm.kernels.matmul` (with autocast's
rounding, `glassllm.amp`), and from there through `matmul` below, which the engine registers
as the library's GEMM. Two backends compute it:

- ``"numpy"``: `np.matmul`, i.e. the BLAS NumPy was built with (OpenBLAS in NumPy's PyPI
  wheels). The reference, always there, and what every product the other backend does not
  take runs on.
- ``"mkl"``: Intel oneMKL's `cblas_sgemm` and `cblas_sgemm_batch_strided`, called through
  ctypes from the `mkl` wheel (the optional extra: ``pip install "glassllm[mkl]"``). On the
  AVX-512 Xeon the benches run on, MKL's single-thread SGEMM reaches 150-165 GFLOP/s on a
  small transformer's shapes where OpenBLAS 0.3.31 reaches 115-140 (`bench/blas_speed.py`),
  and products are about 70% of a training step. PyTorch's CPU wheels use MKL too.

MKL runs *sequential* (one thread per call): glassllm's own pool cuts the products into row
slices (`glassllm.engine.parallel`), and it needs each output row to come out the same bits whichever
slice, batch or thread computes it, so that training gives the same numbers on any thread count.
MKL promises that only in its *strict* conditional-numerical-reproducibility mode
(`MKL_CBWR_Set(branch | MKL_CBWR_STRICT)`, supported for ?gemm on its AVX2 and AVX-512 code
branches): without it, a row's result depends on how many rows the call has and on the
alignment of the data (measured here: up to 1e-4 apart). glassllm sets it when it loads MKL
and refuses MKL where it cannot be set. `tests/test_blas.py` checks the property directly.

Choosing the backend:
    GLASSLLM_BLAS=auto (default)  MKL when the `mkl` package is installed and loads, else NumPy
    GLASSLLM_BLAS=mkl             MKL or a `BlasError` at the first product, saying why not
    GLASSLLM_BLAS=numpy           NumPy only; MKL is never loaded
    set_backend(name)             the same from Python ("auto", "mkl", "numpy")
`backend()` says which one is in use and `describe()` says it in words (with the reason MKL is
not used, under "auto"). MKL is loaded at the first product, not at import. GLASSLLM_BLAS is
read once, when glassllm.engine.blas is imported: changing os.environ afterwards changes nothing,
set_backend does.

What the MKL path takes -- everything else goes to `np.matmul`, which then also raises NumPy's
errors for shapes that do not fit:
- float32 operands of two or more axes, the last two (rows, k) and (k, columns);
- at least MIN_ROWS rows and two columns and a depth of two (smaller products, as decoding's
  one-row ones, are faster through NumPy's GEMV and tiny calls);
- each matrix in a layout BLAS reads directly: one of its two axes of unit stride, the other a
  positive multiple of 4 bytes spanning at least a row (a transposed view is fine: `x.T`,
  `swapaxes`, a slice of rows or columns); batch axes that broadcast against each other, whose
  strides (broadcast ones 0) a strided batch can walk -- what cannot be folded into one batch
  axis is looped over in Python;
- `out`, if given, float32 with unit stride along its rows and not overlapping either operand.
"""
from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

ENV_VAR = "GLASSLLM_BLAS"
CHOICES = ("auto", "mkl", "numpy")
# Fewer output rows than this: NumPy (a vector-matrix product is faster there, and MKL's strict
# CNR mode costs most on tiny calls). A row count, so a product split into row slices of at
# least this many rows (glassllm.engine.ops._matmul's are >= 16) never changes backend.
MIN_ROWS = 8

_INT_MAX = 2 ** 31 - 1  # MKL_INT in the LP64 interface glassllm selects

# cblas.h / mkl_cbwr.h constants
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_THREADING_SEQUENTIAL, _INTERFACE_LP64 = 1, 0
_CBWR_STRICT = 0x10000
_CBWR_BRANCHES = (("AVX-512", 12), ("AVX2", 10))  # strict mode exists on these two only
_CBWR_SUCCESS = 0


class BlasError(RuntimeError):
    """The MKL backend was asked for and cannot be used (not installed, does not load, no
    strict reproducible mode on this CPU), or MKL rejected a call's parameters."""


_requested = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
_mkl = None            # the loaded _MKL, once loaded
_mkl_problem = None    # why MKL is not used (a BlasError), once tried and failed
_UNRESOLVED = object()
_use = _UNRESOLVED     # what `matmul` calls: the loaded MKL or None (NumPy), once resolved
_lock = threading.Lock()


def _check_choice(name: str) -> str:
    if name not in CHOICES:
        raise ValueError(f"{ENV_VAR} / set_backend: expected one of {CHOICES}, got {name!r}")
    return name


def set_backend(name: str) -> None:
    """Use `name` for the products from now on: "auto", "mkl" or "numpy" (see module doc).

    Raises:
        ValueError: another name.
        BlasError: "mkl", and MKL cannot be loaded (the message says why).
    """
    global _requested, _use
    _check_choice(name)
    if name == "mkl":
        _load_mkl(required=True)  # raises before anything changes: the old backend stays
    _requested, _use = name, _UNRESOLVED


def _resolve():
    global _use
    _use = _active()  # raises, leaving _use unresolved, where "mkl" cannot be had
    return _use


def backend() -> str:
    """The backend products run on now: "mkl" or "numpy" (loads MKL under "auto" to tell).

    Raises:
        BlasError: GLASSLLM_BLAS=mkl and MKL cannot be loaded.
        ValueError: GLASSLLM_BLAS is none of CHOICES.
    """
    return "numpy" if _active() is None else "mkl"


def describe() -> str:
    """One line for logs and bench reports: the backend, its version and mode, or why MKL is
    not used."""
    try:
        lib = _active()
    except BlasError as error:
        return f"matrix products: MKL unusable ({error})"
    if lib is not None:
        return f"matrix products: {lib.version} (sequential, strict CNR {lib.branch})"
    if _requested == "numpy":
        return f"matrix products: NumPy's BLAS ({ENV_VAR}=numpy)"
    return f"matrix products: NumPy's BLAS (MKL not used: {_mkl_problem})"


def _active():
    """The loaded MKL if products should use it, else None."""
    _check_choice(_requested)  # a mistyped GLASSLLM_BLAS fails at the first product
    if _requested == "numpy":
        return None
    if _mkl is not None:
        return _mkl
    return _load_mkl(required=_requested == "mkl")


def _load_mkl(required: bool):
    global _mkl, _mkl_problem
    with _lock:
        if _mkl is None and _mkl_problem is None:
            try:
                _mkl = _MKL(*_find_mkl_rt())
            except BlasError as error:
                _mkl_problem = error
    if _mkl is None and required:
        raise BlasError(f"{ENV_VAR}=mkl, but MKL cannot be used: {_mkl_problem}")
    return _mkl


def _find_mkl_rt() -> tuple[str, str]:
    """(path of libmkl_rt, version) of the installed `mkl` distribution (its RECORD lists
    the file)."""
    from importlib import metadata
    try:
        dist = metadata.distribution("mkl")
    except metadata.PackageNotFoundError:
        raise BlasError("the 'mkl' package is not installed "
                        "(pip install \"glassllm[mkl]\")") from None
    for file in dist.files or ():
        if file.name.startswith("libmkl_rt.so"):
            return str(dist.locate_file(file)), dist.version
    raise BlasError(f"the installed 'mkl' {dist.version} has no libmkl_rt.so (glassllm loads "
                    f"MKL on Linux only)")


class _MKL:
    """libmkl_rt loaded with ctypes, set to sequential, LP64 and strict CNR mode."""

    def __init__(self, path: str, version: str):
        try:
            lib = ctypes.CDLL(path)
        except OSError as error:
            raise BlasError(f"cannot load {path}: {error}") from None
        # The layer settings must come before any other MKL call (MKL's rule).
        lib.MKL_Set_Interface_Layer(_INTERFACE_LP64)
        lib.MKL_Set_Threading_Layer(_THREADING_SEQUENTIAL)
        for name, branch in _CBWR_BRANCHES:
            if lib.MKL_CBWR_Set(branch | _CBWR_STRICT) == _CBWR_SUCCESS:
                self.branch = name
                break
        else:
            raise BlasError("MKL has no strict reproducible mode on this CPU (AVX2 or AVX-512 "
                            "needed): its results would depend on how products are split")
        self.lib, self.version = lib, f"Intel MKL {version}"
        I, F, P = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
        self.gemm = lib.cblas_sgemm
        self.gemm.restype = None
        self.gemm.argtypes = [I, I, I, I, I, I, F, P, I, P, I, F, P, I]
        self.gemm_batch = lib.cblas_sgemm_batch_strided
        self.gemm_batch.restype = None
        self.gemm_batch.argtypes = [I, I, I, I, I, I, F, P, I, I, P, I, I, F, P, I, I, I]
        # MKL reports a bad parameter through xerbla, by default a message on stdout and a
        # return without computing anything. glassllm checks the parameters before each call;
        # this handler turns a miss into an exception instead of a silently unwritten result.
        self.errors = []
        XERBLA = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), I)
        self._xerbla = XERBLA(lambda name, info, _len: self.errors.append(
            (name.decode(errors="replace"), info[0])))
        lib.mkl_set_xerbla.restype = ctypes.c_void_p
        lib.mkl_set_xerbla(self._xerbla)

    def check(self) -> None:
        if self.errors:
            name, parameter = self.errors.pop()
            raise BlasError(f"MKL rejected parameter {parameter} of {name}")


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """a @ b with np.matmul's shapes, broadcasting and `out=`; float32 products on the active
    backend (module doc), anything else through np.matmul. Returns the result (`out` if given).

    Raises:
        ValueError: np.matmul's, for shapes that do not fit; GLASSLLM_BLAS none of CHOICES.
        BlasError: GLASSLLM_BLAS=mkl and MKL cannot be loaded, or MKL rejected a call.
    """
    lib = _use
    if lib is _UNRESOLVED:
        lib = _resolve()
    if lib is not None:
        result = _mkl_product(lib, a, b, out)
        if result is not None:
            return result
    return np.matmul(a, b, out=out)


def _layout(rows: int, cols: int, row_stride: int, col_stride: int):
    """(transpose flag, leading dimension in elements) of a rows x cols float32 matrix with
    these byte strides, as row-major CBLAS sees it, or None if BLAS cannot read it in place."""
    if col_stride == 4 and row_stride % 4 == 0 and row_stride >= 4 * cols:
        return _NO_TRANS, row_stride // 4   # rows of contiguous values, ld apart
    if row_stride == 4 and col_stride % 4 == 0 and col_stride >= 4 * rows:
        return _TRANS, col_stride // 4      # the transpose of such a matrix
    return None


def _batch_axes(shape, strides_of):
    """The batch axes of `shape` folded where every array's strides allow: a list of (size,
    [stride of each array]) from outer to inner, axes of size 1 dropped. Axis i folds into the
    axis i+1 after it when each array's stride of i is its stride of i+1 times that size."""
    axes = []
    for i, size in enumerate(shape):
        if size == 1:
            continue
        strides = [s[i] for s in strides_of]
        if axes and all(outer == inner * size for outer, inner in zip(axes[-1][1], strides)):
            axes[-1] = (axes[-1][0] * size, strides)
        else:
            axes.append((size, strides))
    return axes


def _mkl_product(lib, a, b, out):
    """a @ b computed by MKL if it takes this product (module doc), else None: np.matmul's."""
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
            and a.dtype == np.float32 and b.dtype == np.float32 and a.ndim >= 2 and b.ndim >= 2):
        return None
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2 or m < MIN_ROWS or n < 2 or k < 2 or max(m, n, k) > _INT_MAX:
        return None
    if a.ndim == 2 and b.ndim == 2:
        batch = ()
    else:
        try:
            batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ValueError:
            return None
    la = _layout(m, k, *a.strides[-2:])
    lb = _layout(k, n, *b.strides[-2:])
    if la is None or lb is None:
        return None
    if out is None:
        c = np.empty(batch + (m, n), dtype=np.float32)
    else:
        if not (isinstance(out, np.ndarray) and out.dtype == np.float32
                and out.shape == batch + (m, n) and out.flags.writeable
                and not np.may_share_memory(out, a) and not np.may_share_memory(out, b)):
            return None
        c = out
    lc = _layout(m, n, *c.strides[-2:])
    if lc is None or lc[0] != _NO_TRANS:
        return None
    (ta, lda), (tb, ldb), ldc = la, lb, lc[1]
    if max(lda, ldb, ldc) > _INT_MAX:
        return None
    pa, pb, pc = a.ctypes.data, b.ctypes.data, c.ctypes.data
    if not batch:
        lib.gemm(_ROW_MAJOR, ta, tb, m, n, k, 1.0, pa, lda, pb, ldb, 0.0, pc, ldc)
    else:
        nb = len(batch)
        a_strides = _broadcast_strides(a, batch)
        b_strides = _broadcast_strides(b, batch)
        axes = _batch_axes(batch, (a_strides, b_strides, c.strides[:nb]))
        if any(s % 4 or s < 0 or s // 4 > _INT_MAX for _, strides in axes for s in strides):
            return None
        if not axes:  # every batch axis has size 1: one matrix
            lib.gemm(_ROW_MAJOR, ta, tb, m, n, k, 1.0, pa, lda, pb, ldb, 0.0, pc, ldc)
        else:
            size, (sa, sb, sc) = axes[-1]
            outer = axes[:-1]
            for index in np.ndindex(*(s for s, _ in outer)):
                oa = ob = oc = 0
                for i, (_, (xa, xb, xc)) in zip(index, outer):
                    oa, ob, oc = oa + i * xa, ob + i * xb, oc + i * xc
                lib.gemm_batch(_ROW_MAJOR, ta, tb, m, n, k, 1.0, pa + oa, lda, sa // 4,
                               pb + ob, ldb, sb // 4, 0.0, pc + oc, ldc, sc // 4, size)
    if lib.errors:
        lib.check()
    return c


def _broadcast_strides(x: np.ndarray, batch: tuple) -> tuple:
    """x's strides of the batch axes after broadcasting x to `batch` (0 where broadcast)."""
    lead = len(batch) - (x.ndim - 2)
    strides = (0,) * lead + x.strides[:-2]
    return tuple(0 if x_size == 1 and size != 1 else s
                 for s, x_size, size in zip(strides, (1,) * lead + x.shape[:-2], batch))
