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
a block. `use_threads` still pins a count for its block; `set_default_threads(n)` (or
GLASSLLM_THREADS=n) pins it for the process.
"""
from __future__ import annotations

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
    everything runs on the calling thread. Both pools and the mode are restored on exit.

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
        set_default_threads(pinned or len(available_cpus()))
    before, split_before = parallel.get_num_threads(), parallel.split_matmuls()
    parallel.set_num_threads(n)
    parallel.set_split_matmuls(n > 1)
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            yield
    finally:
        parallel.set_num_threads(before)
        parallel.set_split_matmuls(split_before)


THREADS_ENV = "GLASSLLM_THREADS"
MAX_THREADS = 1024  # as the CLI's --threads: a pool thread per count, past any machine's cores
_default_lock = threading.Lock()
_blas_limit = None  # the process-wide threadpoolctl limit (kept alive: it is the setting)


def set_default_threads(n: int) -> None:
    """Compute on n threads from now on, in the whole process: the pool's n threads, split
    mode for n > 1, NumPy's BLAS on one thread (see `use_threads`).

    Raises:
        ValueError: n < 1.
    """
    from threadpoolctl import threadpool_limits

    global _blas_limit
    if n < 1:
        raise ValueError(f"set_default_threads: need n >= 1, got {n}")
    parallel.on_first_use(None)  # chosen now: no measurement at the first op
    parallel.set_num_threads(n)
    parallel.set_split_matmuls(n > 1)
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


def apply_default_threads() -> tuple[int, str]:
    """The CLI's thread choice for this process (`choose_threads`, with a 0.25 s load
    measurement; GLASSLLM_THREADS=n skips it), applied with `set_default_threads`. The engine
    calls it at its first op; calling it again changes nothing. Returns (threads, reason)."""
    with _default_lock:
        requested, _ = default_threads_from_environment()
        n, why = choose_threads(requested)
        set_default_threads(n)
        return n, why


parallel.on_first_use(apply_default_threads)
