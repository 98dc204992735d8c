"""The process default thread count follows the load (glassllm.engine.cpu.ThreadGovernor,
parallel.on_revisit): down at once when another program takes a core, up after two idle
readings in a row; pinned counts are never revisited; no noise from `use_threads` at exit.

The governor's load readings are injected (`read=`), so these tests do not depend on what the
machine is doing while they run.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from glassllm.engine import cpu, parallel

SRC = Path(__file__).resolve().parents[1] / "src"


def loads(*others, cpus=2):
    """A read function that returns Load readings with these other-process loads, in order."""
    readings = iter(others)

    def read():
        other = next(readings)
        return None if other == "fork" else cpu.Load(other, 1.0, 1.0, cpus)

    return read


def governor(threads, *others, cpus=2):
    applied = []
    g = cpu.ThreadGovernor(threads, read=loads(*others, cpus=cpus), apply=applied.append)
    return g, applied


def test_started_busy_it_moves_up_only_after_two_idle_readings():
    # first op during a burst: 1 of 2 threads; the burst ends
    g, applied = governor(1, 0.0, 0.0, 0.0)
    assert g.revisit() == 1 and applied == []  # one idle reading is not enough
    assert g.revisit() == 2 and applied == [2]
    assert g.revisit() == 2 and applied == [2]


def test_started_idle_it_backs_off_at_once_when_another_program_takes_a_core():
    g, applied = governor(2, 0.02, 0.7, 1.0, 0.0, 0.0)
    assert g.revisit() == 2 and applied == []
    assert g.revisit() == 1 and applied == [1]  # the first busy reading
    assert g.revisit() == 1
    assert g.revisit() == 1
    assert g.revisit() == 2 and applied == [1, 2]


def test_a_busy_reading_between_idle_ones_restarts_the_count_towards_more_threads():
    g, applied = governor(1, 0.0, 1.0, 0.0, 0.0)
    assert [g.revisit() for _ in range(4)] == [1, 1, 1, 2]
    assert applied == [2]


def test_up_goes_to_the_smaller_of_the_readings_that_allowed_it():
    # 4 cores: a reading that leaves 3 free, then an idle one: up to 3, not 4
    g, applied = governor(1, 1.0, 0.0, 0.0, cpus=4)
    assert g.revisit() == 1
    assert g.revisit() == 3 and applied == [3]
    assert g.revisit() == 3  # one idle reading after the move: not yet 4


def test_a_reading_of_nothing_changes_nothing():
    g, applied = governor(1, "fork", 0.0, "fork", 0.0)
    assert [g.revisit() for _ in range(4)] == [1, 1, 1, 2]
    assert applied == [2]


def test_the_load_source_skips_the_first_reading_in_a_forked_child(monkeypatch):
    source = cpu._LoadSource()
    assert isinstance(source(), cpu.Load)
    monkeypatch.setattr(os, "getpid", lambda: -1)
    assert source() is None
    assert isinstance(source(), cpu.Load)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def revisit_hook(monkeypatch):
    """parallel's revisit hook on a fake monotonic clock; records each call. Restores the
    hook and the thread settings afterwards."""
    parallel.get_num_threads()  # the first-use default first: it would pin or replace the hook
    clock = FakeClock()
    monkeypatch.setattr(parallel, "_monotonic", clock)
    calls = []
    before = parallel.on_revisit(lambda: calls.append(clock.now), 1.0)
    threads, split = parallel._num_threads, parallel._split_matmuls
    yield clock, calls
    parallel.on_revisit(*before)
    parallel.set_num_threads(threads)
    parallel.set_split_matmuls(split)


def test_ops_revisit_at_most_once_per_interval(revisit_hook):
    clock, calls = revisit_hook
    x = np.zeros(8)

    def op():
        parallel.for_slices(lambda rows: x[rows].sum(), 8, 1)

    op()
    assert calls == []  # the interval starts when the hook is set
    clock.now += 1.0
    op()
    op()
    assert calls == [1001.0]
    clock.now += 0.5
    parallel.for_thread_slices(lambda rows: None, 4)
    assert calls == [1001.0]
    clock.now += 0.5
    parallel.for_thread_slices(lambda rows: None, 4)
    assert calls == [1001.0, 1002.0]


def test_use_threads_pauses_the_revisiting_and_puts_it_back(revisit_hook):
    clock, calls = revisit_hook
    with cpu.use_threads(1):
        clock.now += 5
        parallel.for_slices(lambda rows: None, 8, 1)
        assert calls == [] and parallel._revisit is None
    assert parallel._revisit is not None
    clock.now += 5
    parallel.for_slices(lambda rows: None, 8, 1)
    assert len(calls) == 1


def test_set_default_threads_pins_the_count(revisit_hook):
    clock, calls = revisit_hook
    cpu.set_default_threads(1)
    clock.now += 5
    parallel.for_slices(lambda rows: None, 8, 1)
    assert calls == [] and parallel._revisit is None


def test_the_governor_moves_the_pool_and_split_mode(revisit_hook):
    clock, _ = revisit_hook
    g = cpu.ThreadGovernor(2, read=loads(1.0, 0.0, 0.0))
    parallel.on_revisit(g.revisit, 1.0)
    parallel.set_num_threads(2)
    parallel.set_split_matmuls(True)
    seen = []
    for _ in range(3):
        clock.now += 1.0
        parallel.for_slices(lambda rows: None, 8, 1)
        seen.append((parallel._num_threads, parallel._split_matmuls))
    assert seen == [(1, False), (1, False), (2, True)]


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(SRC), **env}
    if "GLASSLLM_THREADS" not in env:
        environment.pop("GLASSLLM_THREADS", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environment,
                          capture_output=True, text=True, timeout=300)


def test_the_default_from_the_load_is_revisited_and_glassllm_threads_is_not():
    code = """
        from glassllm.engine import cpu, parallel
        n, why = cpu.apply_default_threads()
        print(parallel._revisit is not None, n == parallel._num_threads)
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]
    result = run_python(code, GLASSLLM_THREADS="2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]


def test_a_use_threads_block_left_open_at_exit_says_nothing():
    """A use_threads block still open when the interpreter exits (a bench's ExitStack in a
    module global) is closed during shutdown, when threadpoolctl's globals may already be None:
    it used to print "Exception ignored ... TypeError: 'NoneType' object is not callable"."""
    result = run_python("""
        import atexit, contextlib
        import threadpoolctl
        from glassllm.engine import cpu
        stack = contextlib.ExitStack()
        stack.enter_context(cpu.use_threads(2))

        def clear_globals():  # what shutdown does to a module that outlives its import
            for name in list(vars(threadpoolctl)):
                if not name.startswith("__"):
                    setattr(threadpoolctl, name, None)

        atexit.register(clear_globals)  # (runs before cpu's own exit hook: registered later)
    """)
    assert result.returncode == 0
    assert result.stderr == ""


def test_a_use_threads_block_at_the_first_op_leaves_a_revisited_default_behind():
    result = run_python("""
        from glassllm.engine import cpu, parallel
        with cpu.use_threads(1):
            inside = parallel._revisit is None
        print(inside, parallel._revisit is not None)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]


def test_the_pool_and_the_thread_choice_are_nested_at_most_five_blocks():
    from test_layout import _trainer_functions
    for module in ("engine/parallel.py", "engine/cpu.py"):
        deep = [(name, d) for name, _, d in _trainer_functions(SRC / "glassllm" / module)
                if d > 5]
        assert deep == [], f"{module}: {deep}"


def test_the_busy_start_bench_counts_the_steps_after_the_hog(monkeypatch):
    monkeypatch.syspath_prepend(str(SRC.parent / "bench"))
    import busy_start
    rows = [dict(start=t, seconds=s, threads=n)
            for t, s, n in [(0.0, 2.0, 1), (2.1, 2.0, 1), (4.2, 1.2, 2), (5.4, 1.1, 2)]]
    assert [r["start"] for r in busy_start.after(rows, 4.0)] == [4.2, 5.4]
    assert busy_start.runs([r["threads"] for r in rows]) == "1x2 2x2"


def test_a_process_started_busy_reaches_every_core_once_the_machine_is_idle():
    """The whole path, in a fresh process with /proc/stat and the clocks simulated: the first
    op's 0.25 s sample sees another program on one of two cores (1 thread); after the program
    stops, the ops' revisits read an idle machine twice and move the pool to 2 threads; then
    another program takes a core and the pool drops to 1 at the next reading."""
    result = run_python("""
        import time
        import numpy as np
        from glassllm.engine import cpu, parallel
        now, other = [0.0], [1.0]   # fake seconds; cores other programs use
        busy = [0.0]
        def advance(seconds):
            now[0] += seconds
            busy[0] += other[0] * seconds
        cpu.available_cpus = lambda: [0, 1]
        cpu._clock = lambda: now[0]
        cpu._own_seconds = lambda: 0.0
        cpu._busy_seconds = lambda cpus: busy[0]
        cpu.time.sleep = advance            # measure_load's 0.25 s sample
        parallel._monotonic = lambda: now[0]
        def op():
            parallel.for_slices(lambda rows: None, 8, 1)
            return parallel._num_threads
        seen = [op()]                       # first op during the burst
        other[0] = 0.0                      # the other program stops
        for _ in range(3):
            advance(1.0)
            seen.append(op())
        other[0] = 1.0                      # and another one takes a core
        advance(1.0)
        seen.append(op())
        print(*seen)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "1", "2", "2", "1"]
