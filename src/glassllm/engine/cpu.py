"""The CPUs this process runs on: how busy other processes keep them, and how many threads
to use.

Why it matters: NumPy's BLAS (OpenBLAS) and `glassllm.engine.parallel` split every matrix product
and elementwise pass over n threads that meet at a barrier after each op. On an idle machine
one thread per core is fastest. When other processes hold some of the cores, each op waits
for its slowest thread, which the scheduler may have switched out for a whole time slice (4-8
ms): on the project's 2-core machine a default training step took 1.24 s on 2 threads and
0.10 s on 1 while two other jobs ran.

So the question "how many threads?" is answered by a measurement: `LoadMeter` reads the
kernel's per-CPU busy time (`/proc/stat`, in clock ticks) for the CPUs this process may run
on, and subtracts this process's own CPU time (`resource.getrusage`, this process and its
waited-for children); what remains is the load of *other* processes, in cores.
`choose_threads` turns that into a thread count and `use_threads` runs glassllm on that many
threads (its own pool for everything, BLAS on one thread).

On a system without `/proc/stat` (macOS, Windows) the load is unknown: `LoadMeter.read`
returns `other_cores=None` and `choose_threads` uses every core.

Fast by default: every caller of the library gets the CLI's configuration without asking.
At the engine's first op (`parallel.on_first_use`), `apply_default_threads` measures the load
as the CLI does, sets the pool to `choose_threads()`'s count in split mode and NumPy's BLAS
to one thread for the rest of the process -- what `use_threads(choose_threads()[0])` does for
a block. That count is not kept forever: a 0.25 s sample taken while another program briefly
used a core once made a whole M-sized training run 1.8x slower. Between ops, at most every
REVISIT_SECONDS, a `ThreadGovernor` reads the load again (/proc/stat deltas, as above) and
moves the count: down as soon as another program takes a core, up after UP_READINGS idle
readings in a row. `use_threads` still pins a count for its block; `set_default_threads(n)`
(or GLASSLLM_THREADS=n) pins it for the process. Pinned counts are never revisited: on
OpenBLAS the thread count can change a product's rounding (docs/performance.md), so a run
that must be bit-identical on resume (`glassllm train` records its count) pins it.
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import math
import os
import resource
import threading
import time

from . import parallel

# Other processes using at least this many cores (on average over the measurement) make the
# machine "busy". A quarter of a core already means one of our threads is switched out about
# a quarter of the time, and every op waits for it.
BUSY_CORES = 0.25

_PROC_STAT = "/proc/stat"
_clock = time.perf_counter


def available_cpus() -> list[int]:
    """Ids of the CPUs this process may run on (its affinity mask; all CPUs where unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _busy_seconds(cpus: list[int]) -> float | None:
    """Seconds the given CPUs spent busy since boot (all processes), or None without /proc.

    /proc/stat's cpuN lines count clock ticks in user, nice, system, idle, iowait, irq,
    softirq, steal, ...; busy is everything but idle and iowait. Steal (time the hypervisor
    gave to another machine) counts as busy: it is just as unavailable to us.
    """
    try:
        with open(_PROC_STAT) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    wanted = {f"cpu{i}" for i in cpus}
    ticks = 0
    found = 0
    for line in lines:
        fields = line.split()
        if fields and fields[0] in wanted:
            values = [int(v) for v in fields[1:9]]
            ticks += sum(values) - values[3] - values[4]
            found += 1
    if found == 0:
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    """CPU seconds (user + system) of this process's threads and its waited-for children."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


@dataclasses.dataclass(frozen=True)
class Load:
    """CPU use over a measured interval.

    Fields:
        other_cores: average number of this process's CPUs kept busy by other processes (0 =
            idle, len(cpus) = saturated), or None where the system does not say (no /proc).
        own_cores: average CPU use of this process (and its waited-for children), in cores.
        seconds: wall-clock length of the interval.
        cpus: number of CPUs this process may run on.
    """

    other_cores: float | None
    own_cores: float
    seconds: float
    cpus: int

    @property
    def busy(self) -> bool:
        """Other processes used at least BUSY_CORES cores (False when unknown)."""
        return self.other_cores is not None and self.other_cores >= BUSY_CORES

    def __str__(self) -> str:
        if self.other_cores is None:
            return f"load of other processes unknown (no /proc/stat), {self.cpus} cores"
        return (f"other processes {self.other_cores:.2f} of {self.cpus} cores "
                f"(this process {self.own_cores:.2f}) over {self.seconds:.1f} s")


class LoadMeter:
    """Measures the load of other processes from `start()` (called by the constructor) to
    each `read()`.

    /proc/stat counts in clock ticks (10 ms), so an interval shorter than about 0.2 s gives
    a coarse figure; a long benchmark run gives a precise one.
    """

    def __init__(self):
        self.cpus = available_cpus()
        self.start()

    def start(self) -> None:
        self._t0 = _clock()
        self._busy0 = _busy_seconds(self.cpus)
        self._own0 = _own_seconds()

    def read(self) -> Load:
        seconds = max(_clock() - self._t0, 1e-9)
        own = _own_seconds() - self._own0
        busy = _busy_seconds(self.cpus)
        other = None
        if busy is not None and self._busy0 is not None:
            # tick sampling vs exact rusage: a few ticks of disagreement, never below 0
            other = max(0.0, (busy - self._busy0 - own) / seconds)
        return Load(other, own / seconds, seconds, len(self.cpus))


def measure_load(seconds: float = 0.25) -> Load:
    """The load of other processes over the next `seconds` (this process sleeps meanwhile)."""
    meter = LoadMeter()
    time.sleep(seconds)
    return meter.read()


def wait_until_quiet(max_other_cores: float = 0.1, window_s: float = 2.0,
                     timeout_s: float = 600.0, on_wait=None) -> Load | None:
    """Sleep until other processes use less than `max_other_cores` over a `window_s` window.

    Returns the quiet window's Load, or None if `timeout_s` passed without one (or the load
    cannot be measured here). `on_wait(load)` is called after each busy window (for a
    message).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        load = measure_load(window_s)
        if load.other_cores is None:
            return None
        if load.other_cores < max_other_cores:
            return load
        if on_wait is not None:
            on_wait(load)
        if time.monotonic() + window_s > deadline:
            return None


def choose_threads(requested: int | None = None, load: Load | None = None) -> tuple[int, str]:
    """(threads, reason): how many threads to compute with, and why, in words.

    An explicit `requested` count wins. Otherwise `load` (measured now with `measure_load()`
    if not given) decides: with other processes under BUSY_CORES, one thread per available
    CPU, the fastest choice on an idle machine; on a busy machine, the cores they leave free
    (at least 1), since a thread that shares its core with another process stalls every op.

    Raises:
        ValueError: requested < 1.
    """
    if requested is not None:
        if requested < 1:
            raise ValueError(f"choose_threads: need at least 1 thread, got {requested}")
        return requested, "as requested"
    if load is None:
        load = measure_load()
    cpus = load.cpus
    if load.other_cores is None:
        return cpus, "every core (load of other processes unknown)"
    if not load.busy:
        return cpus, f"every core: machine idle ({load.other_cores:.2f} cores used by others)"
    n = max(1, cpus - math.ceil(load.other_cores - 0.05))
    return n, f"machine busy: {load.other_cores:.2f} of {cpus} cores used by other processes"


@contextlib.contextmanager
def use_threads(n: int):
    """Context: glassllm computes on n threads, all of them its own pool's
    (`glassllm.engine.parallel`): the elementwise passes and, in split mode, the matrix products,
    cut into row slices while NumPy's BLAS runs on one thread (threadpoolctl). With n = 1
    everything runs on the calling thread. The count is pinned for the block: the process
    default's revisiting (`ThreadGovernor`) pauses inside it. Both pools, the mode and the
    revisiting are restored on exit.

    Why not BLAS's threads for the products: OpenBLAS's workers spin after each product, so
    they and the pool's threads take turns on the same cores and every op waits for the
    parked one (see `glassllm.engine.parallel`).

    Raises:
        ValueError: n < 1.
    """
    from threadpoolctl import threadpool_limits

    if n < 1:
        raise ValueError(f"use_threads: need n >= 1, got {n}")
    if parallel.first_use_pending():  # the process default, without the load measurement
        pinned, _ = default_threads_from_environment()  # (the caller pins its own count here)
        _install_default(pinned or len(available_cpus()), pinned is not None)
    before, split_before = parallel.get_num_threads(), parallel.split_matmuls()
    revisit = parallel.on_revisit(None)
    parallel.set_num_threads(n)
    parallel.set_split_matmuls(n > 1)
    # Held in locals, not looked up at exit: a block left open until the interpreter exits
    # (a generator, an ExitStack in a module global) is closed during shutdown, after
    # threadpoolctl's and this module's globals may have been cleared to None.
    exiting, put_back = _EXITING, (parallel.set_num_threads, parallel.set_split_matmuls,
                                   parallel.on_revisit)
    limits = threadpool_limits(limits=1, user_api="blas")
    try:
        yield
    finally:
        if not exiting:  # at exit there is nothing left to restore (see _mark_exiting)
            limits.restore_original_limits()
            put_back[0](before)
            put_back[1](split_before)
            put_back[2](*revisit)


# Non-empty once the interpreter has begun to exit (atexit runs before module teardown): a
# use_threads block still open then is closed without restoring anything, since threadpoolctl
# can no longer be called ("TypeError: 'NoneType' object is not callable" from its globals).
_EXITING: list = []


def _mark_exiting() -> None:
    _EXITING.append(True)


atexit.register(_mark_exiting)


THREADS_ENV = "GLASSLLM_THREADS"
MAX_THREADS = 1024  # as the CLI's --threads: a pool thread per count, past any machine's cores
_default_lock = threading.Lock()
_blas_limit = None  # the process-wide threadpoolctl limit (kept alive: it is the setting)


def set_default_threads(n: int) -> None:
    """Compute on n threads from now on, in the whole process: the pool's n threads, split
    mode for n > 1, NumPy's BLAS on one thread (see `use_threads`). The count is pinned: the
    load is not revisited.

    Raises:
        ValueError: n < 1.
    """
    if n < 1:
        raise ValueError(f"set_default_threads: need n >= 1, got {n}")
    _set_threads(n)
    parallel.on_revisit(None)


def _set_threads(n: int, blas: bool = True) -> None:
    """The process-wide setting for n threads (nothing about revisiting); blas=False leaves
    NumPy's BLAS limit as it is (a revisit: BLAS is on one thread already, and threadpoolctl
    takes milliseconds to find the libraries)."""
    from threadpoolctl import threadpool_limits

    global _blas_limit
    parallel.on_first_use(None)  # chosen now: no measurement at the first op
    parallel.set_num_threads(n)
    parallel.set_split_matmuls(n > 1)
    if blas:
        _blas_limit = threadpool_limits(limits=1, user_api="blas")


def default_threads_from_environment() -> tuple[int | None, str]:
    """(n, source): GLASSLLM_THREADS as a count, or (None, "") when unset.

    Raises:
        ValueError: GLASSLLM_THREADS set to something other than an integer in
            [1, MAX_THREADS].
    """
    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return None, ""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_THREADS:  # (a huge count once hung the first op, starting threads)
        raise ValueError(f"{THREADS_ENV}: expected an integer from 1 to {MAX_THREADS}, "
                         f"got {text!r}")
    return n, THREADS_ENV


# How the process default follows the load (see ThreadGovernor): a reading at most every
# REVISIT_SECONDS, taken between ops; more threads only after UP_READINGS readings in a row
# allowed them. /proc/stat counts 10 ms ticks, so a 1 s reading is within about 0.02 cores.
REVISIT_SECONDS = 1.0
UP_READINGS = 2


class ThreadGovernor:
    """Revisits the process default thread count while the process runs.

    Each `revisit()` takes one load reading (by default a `LoadMeter` over the time since the
    previous reading) and turns it into a count with `choose_threads`. Fewer threads at once,
    when another program has taken a core (every op would wait for the thread it parks);
    more only when the last `up_after` readings all allowed more (the smallest of them), so
    that a burst between two busy moments does not make the count flap. A change is applied
    with `apply(n)` (default: the pool's count and split mode).

    `parallel.on_revisit` calls it between ops; a pinned count (GLASSLLM_THREADS,
    `set_default_threads`, `use_threads`, the CLI's --threads) is never revisited.
    """

    def __init__(self, threads: int, read=None, apply=None, up_after: int = UP_READINGS):
        self.threads = threads
        self.up_after = up_after
        self._read = read if read is not None else _LoadSource()
        self._apply = apply if apply is not None else \
            (lambda n: _set_threads(n, blas=False))
        self._ups: list[int] = []

    def revisit(self) -> int:
        """Take one reading; returns the thread count now in force."""
        load = self._read()
        if load is None:  # no reading this time (the first after a fork)
            return self.threads
        target, _ = choose_threads(load=load)
        if target > self.threads:
            self._ups = (self._ups + [target])[-self.up_after:]
            if len(self._ups) < self.up_after:
                return self.threads
            target = min(self._ups)
        self._ups = []  # a move, or a reading that allows no more: the run starts again
        if target != self.threads:
            self.threads = target
            self._apply(target)
        return self.threads


class _LoadSource:
    """The load of other processes since the previous call (a `LoadMeter` restarted at each
    reading); None for the first call in a forked child, whose own CPU time starts at 0 while
    the meter's start was the parent's."""

    def __init__(self):
        self._meter, self._pid = LoadMeter(), os.getpid()

    def __call__(self) -> Load | None:
        if os.getpid() != self._pid:
            self._meter, self._pid = LoadMeter(), os.getpid()
            return None
        load = self._meter.read()
        self._meter.start()
        return load


def apply_default_threads() -> tuple[int, str]:
    """The CLI's thread choice for this process (`choose_threads`, with a 0.25 s load
    measurement; GLASSLLM_THREADS=n skips it and pins the count), applied process-wide. The
    engine calls it at its first op; calling it again changes nothing. Returns (threads,
    reason).

    A count chosen from the load is not kept for the life of the process: a `ThreadGovernor`
    reads the load again between ops, at most every REVISIT_SECONDS, so a process started
    during a busy moment reaches full speed once the machine is idle, and one started idle
    backs off when another program takes a core.
    """
    with _default_lock:
        requested, _ = default_threads_from_environment()
        n, why = choose_threads(requested)
        _install_default(n, pinned=requested is not None)
        return n, why if requested is not None else why + "; revisited as the load changes"


def _install_default(n: int, pinned: bool) -> None:
    """The process default: n threads, pinned or followed by a ThreadGovernor."""
    _set_threads(n)
    parallel.on_revisit(None if pinned else ThreadGovernor(n).revisit, REVISIT_SECONDS)


parallel.on_first_use(apply_default_threads)
