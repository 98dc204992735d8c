"""Elementwise NumPy work on all cores.

NumPy's BLAS runs a matrix product on every core, but its ufuncs (exp, multiply, ...) run on
one. In a transformer step those passes -- activations, norms, softmax, the optimizer -- are a
quarter to a half of the time once the matrix products are parallel. The fused ops therefore
do their elementwise passes on slices of rows, and `for_slices` runs those slices in a small
pool of threads: NumPy releases the GIL inside a ufunc loop, so the threads truly run at the
same time. Slices of about 256K elements also keep the passes over a slice in cache.

Matrix products, by default, run on BLAS's own threads. In *split mode*
(`set_split_matmuls(True)`, which `glassllm.engine.cpu.use_threads` turns on) BLAS runs on one
thread and the fused ops cut their products into row slices that this pool runs instead
(`for_thread_slices`), attention per slice of batch rows. Then one set of threads does all
the work: OpenBLAS's own workers spin for a while after each product, and when they share
the cores with this pool, every elementwise pass that follows waits for a thread that the
scheduler has parked behind a spinning one (on a busy machine a step became 13x slower).
Each output row of a product is computed whole, in one slice; on MKL's strict reproducible
mode (`glassllm.engine.blas`) it comes out the same bits whichever slice it is in, so the results are
the same bits on any thread count. NumPy's OpenBLAS does not promise that: on some shapes it
rounds a row 1 ulp differently when the product is cut elsewhere.

The thread count may change between any two ops (`set_num_threads` is safe at any time; the
process default follows the load through `on_revisit`, see `glassllm.engine.cpu`); an op reads
the count once, when it cuts its work.

The work function must only write to its own slice of preallocated outputs. Calls from
inside a worker run serially (no nested pools, no deadlock). The caller's autocast state
(per thread, `glassllm.amp`) is carried into the workers, so a matrix product in a work
function rounds as it would on the calling thread.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable

import numpy as np

from .. import amp

# Elements per slice: big enough that handing it to a thread and taking the GIL back between
# NumPy calls is cheap next to the work (64K-element slices were measurably slower on two
# threads), small enough (1 MiB of float32, a core's L2 here) that a slice's passes mostly
# stay in cache.
SLICE_ELEMENTS = 1 << 18
# Work smaller than this runs on the calling thread alone; from here up it is split evenly
# over the threads (half of a 64K-element softmax still outweighs the hand-off). For callers
# that do not say what their work costs (the NumPy forms).
MIN_PARALLEL_ELEMENTS = 1 << 16
# The same for callers that say what each element's work costs (`for_slices`' work_bytes:
# the compiled kernels, in bytes read and written, the passes bound by arithmetic -- exp,
# tanh, a division -- weighted by `engine.compiled.ARITHMETIC`): below this a call runs on the
# calling thread. Measured on bench/kernel_speed.py's kernels at 256 to 8192 rows on the
# project's 2-core EPYC, one and two threads interleaved, best of 30 rounds: a hand-off to
# the pool costs 15-25 us (an empty slice function: 1-4 us on the calling thread); at 8192
# rows the second thread gained 1.4x on the cross-entropy backward (bound by memory) and
# 1.5-1.6x on the exp-bound passes (cross-entropy forward, SwiGLU forward). So a call gains
# from the pool once its one-thread time passes ~60-70 us: the cross-entropy backward (a
# scale in place) took 45 us at 4 MiB and 89 us at 8 MiB touched, its forward 86 us at 1 MiB.
# (Another program used one core part of the time; best-of-30 keeps the quiet rounds.)
MIN_PARALLEL_BYTES = 8 << 20

_num_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
    else (os.cpu_count() or 1)
_split_matmuls = False
_pool: list | None = None  # the _Worker threads (n - 1: the calling thread is the n-th)
_pool_pid = None
_in_worker = threading.local()
# One caller at a time hands work to the pool; a second thread calling in meanwhile (a user's
# own threads) runs its slices itself rather than wait.
_dispatch = threading.Lock()


# Called once, before the first work this module splits or sizes (`glassllm.engine.cpu`
# sets it: the thread count the CLI would choose, for every caller of the library).
_first_use: Callable[[], None] | None = None


def on_first_use(fn: Callable[[], None] | None) -> None:
    """Run fn() once, at the first call that asks how to split work (None: nothing)."""
    global _first_use
    _first_use = fn


def first_use_pending() -> bool:
    """True until the first-use function has run (or was cleared)."""
    return _first_use is not None


# Called between ops, at most every `_revisit_every` seconds (`glassllm.engine.cpu` sets it when
# the process default was chosen from the load, so it follows the load; None while a count is
# pinned). The hot path pays one monotonic-clock read and a comparison.
_revisit: Callable[[], None] | None = None
_revisit_every = 1.0
_revisit_at = 0.0
_revisiting = threading.Lock()
_monotonic = time.monotonic


def on_revisit(fn: Callable[[], None] | None, every_s: float = 1.0):
    """Call fn() from an op at most every `every_s` seconds from now on (None: never).
    Returns the previous (fn, every_s), for a caller that pins a count for a block and puts
    the revisiting back after it."""
    global _revisit, _revisit_every, _revisit_at
    previous = (_revisit, _revisit_every)
    _revisit, _revisit_every = fn, float(every_s)
    _revisit_at = _monotonic() + _revisit_every
    return previous


def _maybe_revisit() -> None:
    """Run the revisit function if its time has come; one thread at a time, never waiting:
    a second thread arriving meanwhile goes on with the count as it stands."""
    global _revisit_at
    if not _revisiting.acquire(blocking=False):
        return
    try:
        fn, now = _revisit, _monotonic()
        if fn is None or now < _revisit_at:
            return
        _revisit_at = now + _revisit_every
        fn()
    finally:
        _revisiting.release()


def _check_first_use() -> None:
    global _first_use
    fn = _first_use
    if fn is not None:
        _first_use = None  # before the call: what fn calls back in here runs as configured
        try:
            fn()
        except BaseException:  # (a mistyped GLASSLLM_THREADS): every later op says so too,
            _first_use = fn    # rather than run unconfigured after the first one's error
            raise


def get_num_threads() -> int:
    """Threads used for elementwise work (default: the CPUs this process may run on)."""
    if _first_use is not None:
        _check_first_use()
    return _num_threads


def set_num_threads(n: int) -> None:
    """Use n threads for elementwise work (1 = everything on the calling thread). Safe to call
    while another thread computes: the pool resizes at its next hand-off, never during one.

    Raises:
        ValueError: n < 1.
    """
    global _num_threads
    if int(n) < 1:
        raise ValueError(f"set_num_threads: need n >= 1, got {n}")
    _num_threads = int(n)


def split_matmuls() -> bool:
    """True in split mode: the fused ops split their matrix products over this pool."""
    if _first_use is not None:
        _check_first_use()
    return _split_matmuls


def set_split_matmuls(on: bool) -> None:
    """Turn split mode on or off (see the module doc). BLAS should then run on one thread,
    which `glassllm.engine.cpu.use_threads` arranges; on its own this only changes who splits."""
    global _split_matmuls
    _split_matmuls = bool(on)


class _Task:
    """One hand-off: fn on a list of slices. The worker marks it `taken` when it starts and
    `done` (with `error`, the exception it raised, if any) when it has finished."""

    __slots__ = ("fn", "parts", "low", "taken", "done", "error")

    def __init__(self, fn, parts, low):
        self.fn, self.parts, self.low = fn, parts, low
        self.taken = self.done = False
        self.error = None


class _Worker:
    """A thread of the pool. It gets its work (a `_Task`) and gives it back through two locks,
    the cheapest hand-off between Python threads: 14 us per task here against 36 us through
    concurrent.futures' queue and Future, and an S training step hands out over a hundred
    tasks.

    Ctrl-C can land on the calling thread between any two bytecodes, also in the middle of
    this hand-off; so whether a task has run is read from the task (`done`), never from how
    often a lock was released, and `_done` is only a wake-up: the worker releases it unless it
    is already released (a wake-up an interrupted caller never took), and the caller re-checks
    `done` after every wake-up. A lost count can then cost a spurious wake-up, never a task
    reported done before it ran, a deadlock, or a "release unlocked lock"."""

    def __init__(self, name: str):
        self._go, self._done = threading.Lock(), threading.Lock()
        self._go.acquire()
        self._done.acquire()
        self._task = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            self._go.acquire()
            task = self._task
            if task is None:  # stop()
                return
            task.taken = True
            try:
                _run_as_worker(task.fn, task.parts, task.low)
            except BaseException as error:
                self.keep_for_caller(task, error)
            task.fn = task.parts = None  # no reference to the work's arrays while parked
            task.done = True
            del task
            if self._done.locked():  # only this thread releases it: no race with the check
                self._done.release()

    @staticmethod
    def keep_for_caller(task: _Task, error: BaseException) -> None:
        """A worker cannot raise into its caller: the task keeps the error and _run_in_pool
        re-raises it once every thread is done."""
        task.error = error

    def start(self, task: _Task) -> None:
        previous = self._task
        if previous is not None and not previous.done and self.will_run(previous):
            self.wait(previous)  # left running by an interrupted caller: one task at a time
        self._task = task
        self._go.release()

    def wait(self, task: _Task) -> None:
        """Block until `task` has run (interruptible: call again after a KeyboardInterrupt)."""
        while not task.done:
            self._done.acquire()

    def will_run(self, task: _Task) -> bool:
        """False if `task` was never handed over (an interrupt between assigning it and
        releasing `_go`): then nothing will ever run it. Only for an interrupted caller."""
        if task.taken or task.done or not self._go.locked():
            return True  # running, finished, or released and about to be taken
        # `_go` held: never released, or just taken by a worker that has not yet had the GIL
        # back to say so. Give it a moment.
        for _ in range(100):
            time.sleep(0.001)
            if task.taken:
                return True
        return False

    def stop(self) -> None:
        """End the thread once it has finished what it runs (call with _dispatch held)."""
        self._task = None
        if self._go.locked():  # idle (parked on it) or running; else released and not taken
            self._go.release()
        self._thread.join()


def _get_pool(workers: int) -> list:
    """At least `workers` workers (and the pool of the thread count otherwise). Call with
    _dispatch held."""
    global _pool, _pool_pid
    # Threads do not survive fork(): a child starts a pool of its own.
    if _pool is None or _pool_pid != os.getpid():
        _pool, _pool_pid = [], os.getpid()
    want = max(workers, _num_threads - 1)
    while len(_pool) > want:
        _pool.pop().stop()
    while len(_pool) < want:
        _pool.append(_Worker(f"glassllm-{len(_pool) + 1}"))
    return _pool


def _run_in_pool(fn, shares: list) -> None:
    """shares[0] on the calling thread, shares[i] (a list of slices) on worker i - 1, at the
    same time; returns when all have run. The first exception raised, once every thread is
    done (so nothing still writes into the outputs), is re-raised; so is a KeyboardInterrupt
    that lands during the hand-off, after the same wait."""
    low = amp.matmul_dtype(), np.geterr()
    if not _dispatch.acquire(blocking=False):  # another thread of the user's has the pool
        for share in shares:
            _run_as_worker(fn, share, low)
        return
    handed = []  # (worker, task), appended before the hand-off so an interrupt cannot lose one
    error = None
    try:
        try:
            # Sized by the shares, not by _num_threads: set_num_threads from another thread
            # between cutting the shares and here must not leave a share without a worker.
            pool = _get_pool(len(shares) - 1)
            for worker, share in zip(pool, shares[1:]):
                if share:
                    task = _Task(fn, share, low)
                    handed.append((worker, task))
                    worker.start(task)
            _run_as_worker(fn, shares[0], low)
        except BaseException as own:
            error = own
        error = _wait_for_workers(handed, error)
    finally:
        _dispatch.release()
    if error is not None:
        raise error


def _wait_for_workers(handed: list, error: BaseException | None) -> BaseException | None:
    """Wait until every handed task has run, even if Ctrl-C lands meanwhile: a worker still
    writing into the outputs would corrupt whatever runs next (the checkpoint written on
    Ctrl-C). Returns `error`, else the first interrupt or worker error met on the way."""
    for worker, task in handed:
        while True:
            try:
                if task.done or worker.will_run(task):
                    worker.wait(task)
                break
            except KeyboardInterrupt as interrupt:
                error = error or interrupt
        error = error or task.error
    return error


def _run_as_worker(fn, parts, low):
    """fn(part) for each of `parts`, under the caller's autocast dtype and NumPy error state
    `low` (both are per thread: a caller's np.errstate(invalid="ignore") must hold in the
    workers too), set once for the whole share."""
    _in_worker.active = True
    dtype, errors = low
    if errors != np.geterr():
        np.seterr(**errors)
    previous = amp.matmul_dtype()
    amp.set_matmul_dtype(dtype)
    try:
        for part in parts:
            fn(part)
    finally:
        amp.set_matmul_dtype(previous)
        _in_worker.active = False


def row_slices(n_rows: int, row_size: int, n_threads: int = 1) -> list[slice]:
    """Consecutive slices covering range(n_rows): about SLICE_ELEMENTS elements each, and, for
    n_threads > 1, a multiple of n_threads slices of equal size, so every thread gets the
    same share (`for_slices` passes n_threads > 1 only for work it runs on the pool)."""
    if n_rows <= 0:
        return []
    total = n_rows * row_size
    n_slices = max(1, -(-total // SLICE_ELEMENTS))
    if n_threads > 1:
        n_slices = -(-n_slices // n_threads) * n_threads
    n_slices = min(n_slices, max(1, n_rows))
    rows = -(-n_rows // n_slices)
    return [slice(start, min(start + rows, n_rows)) for start in range(0, n_rows, rows)]


def _worth_splitting(total: int, work_bytes: float) -> bool:
    """Whether `total` elements of work (work_bytes each; 0: not said) gain from the pool."""
    if work_bytes:
        return total * work_bytes >= MIN_PARALLEL_BYTES
    return total >= MIN_PARALLEL_ELEMENTS


def for_slices(fn: Callable[[slice], None], n_rows: int, row_size: int,
               balanced: bool = True, work_bytes: float = 0) -> None:
    """Call fn(rows) for row slices covering range(n_rows) (see `row_slices`), in parallel.

    Runs serially when one thread is configured, when the work is small (under
    MIN_PARALLEL_BYTES touched when `work_bytes`, the bytes each of the n_rows x row_size
    elements' work reads and writes, is given; else under MIN_PARALLEL_ELEMENTS elements),
    or when called from inside a worker. Exceptions raised by fn propagate to the caller.
    balanced=False cuts the slices by SLICE_ELEMENTS alone, the same on any thread count and
    whether or not the pool runs them: for per-slice partial sums, whose total must not depend
    on how many threads there are.
    """
    if _first_use is not None:
        _check_first_use()
    if _revisit is not None and _monotonic() >= _revisit_at:
        _maybe_revisit()
    total = n_rows * row_size
    parallel = (_num_threads > 1 and _worth_splitting(total, work_bytes)
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
    # Thread i takes slices i, i + n, i + 2n, ...; the calling thread is thread 0.
    n = _num_threads
    _run_in_pool(fn, [parts[i::n] for i in range(n)])


def even_slices(n_rows: int, n_parts: int) -> list[slice]:
    """n_parts consecutive slices covering range(n_rows), their sizes differing by at most one
    (so none is much smaller than n_rows / n_parts: a product's backend choice in
    `glassllm.engine.blas` depends on its row count)."""
    base, extra = divmod(n_rows, n_parts)
    bounds = [0]
    for i in range(n_parts):
        bounds.append(bounds[-1] + base + (i < extra))
    return [slice(start, stop) for start, stop in zip(bounds[:-1], bounds[1:])]


def for_thread_slices(fn: Callable[[slice], None], n_rows: int) -> None:
    """Call fn(rows) for one contiguous slice of range(n_rows) per thread, in parallel (for
    matrix products, whose BLAS calls want big pieces). Serial on one thread or in a worker.
    """
    if _first_use is not None:
        _check_first_use()
    if _revisit is not None and _monotonic() >= _revisit_at:
        _maybe_revisit()
    n = _num_threads
    if n == 1 or n_rows < 2 or getattr(_in_worker, "active", False):
        if n_rows:
            fn(slice(0, n_rows))
        return
    _run_in_pool(fn, [[part] for part in even_slices(n_rows, min(n, n_rows))])
