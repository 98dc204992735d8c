"""Elementwise NumPy work on all cores.

NumPy's BLAS runs a matrix product on every core, but its ufuncs (exp, multiply, ...) run on
one. In a transformer step those passes -- activations, norms, softmax, the optimizer -- are a
quarter to a half of the time once the matrix products are parallel. The fused ops therefore
do their elementwise passes on slices of rows, and `for_slices` runs those slices in a small
pool of threads: NumPy releases the GIL inside a ufunc loop, so the threads truly run at the
same time. Slices of about 256K elements also keep the passes over a slice in cache.

Matrix products, by default, run on BLAS's own threads. In *split mode*
(`set_split_matmuls(True)`, which `glassllm.cpu.use_threads` turns on) BLAS runs on one
thread and the fused ops cut their products into row slices that this pool runs instead
(`for_thread_slices`), attention per slice of batch rows. Then one set of threads does all
the work: OpenBLAS's own workers spin for a while after each product, and when they share
the cores with this pool, every elementwise pass that follows waits for a thread that the
scheduler has parked behind a spinning one (on a busy machine a step became 13x slower).
Each output row of a product is computed the same way whichever slice it is in, so the
results are the same bits on any thread count.

The work function must only write to its own slice of preallocated outputs. Calls from
inside a worker run serially (no nested pools, no deadlock). The caller's autocast state
(per thread, `glassllm.amp`) is carried into the workers, so a matrix product in a work
function rounds as it would on the calling thread.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from . import amp

# Elements per slice: big enough that handing it to a thread and taking the GIL back between
# NumPy calls is cheap next to the work (64K-element slices were measurably slower on two
# threads), small enough (1 MiB of float32, a core's L2 here) that a slice's passes mostly
# stay in cache.
SLICE_ELEMENTS = 1 << 18
# Work smaller than this runs on the calling thread alone; from here up it is split evenly
# over the threads (half of a 64K-element softmax still outweighs the hand-off).
MIN_PARALLEL_ELEMENTS = 1 << 16

_num_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
    else (os.cpu_count() or 1)
_split_matmuls = False
_pool: ThreadPoolExecutor | None = None
_pool_pid = None
_in_worker = threading.local()


def get_num_threads() -> int:
    """Threads used for elementwise work (default: the CPUs this process may run on)."""
    return _num_threads


def set_num_threads(n: int) -> None:
    """Use n threads for elementwise work (1 = everything on the calling thread).

    Raises:
        ValueError: n < 1.
    """
    global _num_threads, _pool
    if int(n) < 1:
        raise ValueError(f"set_num_threads: need n >= 1, got {n}")
    _num_threads = int(n)
    if _pool is not None:
        _pool.shutdown(wait=True)
        _pool = None


def split_matmuls() -> bool:
    """True in split mode: the fused ops split their matrix products over this pool."""
    return _split_matmuls


def set_split_matmuls(on: bool) -> None:
    """Turn split mode on or off (see the module doc). BLAS should then run on one thread,
    which `glassllm.cpu.use_threads` arranges; on its own this only changes who splits."""
    global _split_matmuls
    _split_matmuls = bool(on)


def _get_pool() -> ThreadPoolExecutor:
    global _pool, _pool_pid
    if _pool is None or _pool_pid != os.getpid():  # threads do not survive fork()
        _pool = ThreadPoolExecutor(_num_threads - 1, thread_name_prefix="glassllm")
        _pool_pid = os.getpid()
    return _pool


def _run_as_worker(fn, part, low=None):
    _in_worker.active = True
    previous = amp.matmul_dtype()
    amp.set_matmul_dtype(low)  # the caller's autocast dtype: the state is per thread
    try:
        fn(part)
    finally:
        amp.set_matmul_dtype(previous)
        _in_worker.active = False


def row_slices(n_rows: int, row_size: int, n_threads: int = 1) -> list[slice]:
    """Consecutive slices covering range(n_rows): about SLICE_ELEMENTS elements each, and, for
    work of at least MIN_PARALLEL_ELEMENTS, a multiple of n_threads slices of equal size, so
    every thread gets the same share."""
    if n_rows <= 0:
        return []
    total = n_rows * row_size
    n_slices = max(1, -(-total // SLICE_ELEMENTS))
    if n_threads > 1 and total >= MIN_PARALLEL_ELEMENTS:
        n_slices = -(-n_slices // n_threads) * n_threads
    n_slices = min(n_slices, max(1, n_rows))
    rows = -(-n_rows // n_slices)
    return [slice(start, min(start + rows, n_rows)) for start in range(0, n_rows, rows)]


def for_slices(fn: Callable[[slice], None], n_rows: int, row_size: int,
               balanced: bool = True) -> None:
    """Call fn(rows) for row slices covering range(n_rows) (see `row_slices`), in parallel.

    Runs serially when one thread is configured, when the work is small, or when called from
    inside a worker. Exceptions raised by fn propagate to the caller. balanced=False cuts the
    slices by SLICE_ELEMENTS alone, the same on any thread count: for per-slice partial sums,
    whose total must not depend on how many threads there are.
    """
    total = n_rows * row_size
    parallel = (_num_threads > 1 and total >= MIN_PARALLEL_ELEMENTS
                and not getattr(_in_worker, "active", False))
    if not parallel and total <= SLICE_ELEMENTS:  # one slice: skip the bookkeeping (decoding)
        if n_rows:
            fn(slice(0, n_rows))
        return
    parts = row_slices(n_rows, row_size, _num_threads if parallel and balanced else 1)
    if not parallel or len(parts) == 1:
        for part in parts:
            fn(part)
        return
    pool = _get_pool()
    # The calling thread takes every n-th slice itself instead of idling.
    n = _num_threads
    low = amp.matmul_dtype()
    futures = [pool.submit(_run_as_worker, fn, part, low)
               for i, part in enumerate(parts) if i % n]
    for part in parts[::n]:
        _run_as_worker(fn, part, low)
    for future in futures:
        future.result()


def even_slices(n_rows: int, n_parts: int) -> list[slice]:
    """n_parts consecutive slices covering range(n_rows), their sizes differing by at most one
    (so none is much smaller than n_rows / n_parts: a product's backend choice in
    `glassllm.blas` depends on its row count)."""
    base, extra = divmod(n_rows, n_parts)
    bounds = [0]
    for i in range(n_parts):
        bounds.append(bounds[-1] + base + (i < extra))
    return [slice(start, stop) for start, stop in zip(bounds[:-1], bounds[1:])]


def for_thread_slices(fn: Callable[[slice], None], n_rows: int) -> None:
    """Call fn(rows) for one contiguous slice of range(n_rows) per thread, in parallel (for
    matrix products, whose BLAS calls want big pieces). Serial on one thread or in a worker.
    """
    n = _num_threads
    if n == 1 or n_rows < 2 or getattr(_in_worker, "active", False):
        if n_rows:
            fn(slice(0, n_rows))
        return
    parts = even_slices(n_rows, min(n, n_rows))
    pool = _get_pool()
    low = amp.matmul_dtype()
    futures = [pool.submit(_run_as_worker, fn, part, low) for part in parts[1:]]
    _run_as_worker(fn, parts[0], low)
    for future in futures:
        future.result()
