"""glassllm.engine.cpu: the load of other processes, the thread choice, both pools set together."""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import threadpoolctl

from glassllm.engine import cpu, parallel

PROC_STAT = """cpu  300 10 200 5000 40 0 5 7 0 0
cpu0 100 5 100 2500 20 0 3 2 0 0
cpu1 200 5 100 2500 20 0 2 5 0 0
intr 1 2 3
"""


def test_busy_time_is_everything_but_idle_and_iowait_of_our_cpus(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    stat.write_text(PROC_STAT)
    monkeypatch.setattr(cpu, "_PROC_STAT", str(stat))
    ticks = cpu.os.sysconf("SC_CLK_TCK")
    assert cpu._busy_seconds([1]) == pytest.approx((200 + 5 + 100 + 2 + 5) / ticks)
    assert cpu._busy_seconds([0, 1]) == pytest.approx((210 + 312) / ticks)
    assert cpu._busy_seconds([7]) is None  # a CPU /proc/stat does not list
    monkeypatch.setattr(cpu, "_PROC_STAT", str(tmp_path / "missing"))
    assert cpu._busy_seconds([0]) is None


def test_meter_subtracts_this_process_own_cpu_time(monkeypatch):
    clock = {"busy": 100.0, "own": 10.0, "wall": 0.0}
    monkeypatch.setattr(cpu, "_busy_seconds", lambda cpus: clock["busy"])
    monkeypatch.setattr(cpu, "_own_seconds", lambda: clock["own"])
    monkeypatch.setattr(cpu, "_clock", lambda: clock["wall"])
    meter = cpu.LoadMeter()
    # 4 s: the CPUs were busy 7 s in all, 5 s of it ours -> others used 0.5 cores
    clock.update(busy=107.0, own=15.0, wall=4.0)
    load = meter.read()
    assert load.other_cores == pytest.approx(0.5) and load.own_cores == pytest.approx(1.25)
    assert load.busy and "0.50 of" in str(load)
    # tick rounding can make others' share look negative: never below 0
    clock.update(busy=107.0, own=18.0, wall=5.0)
    assert meter.read().other_cores == 0.0


def test_meter_sees_another_process_burn_a_core():
    meter = cpu.LoadMeter()
    if meter.read().other_cores is None:
        pytest.skip("no /proc/stat here")
    # a running child is another process until it is waited for
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nt = time.time()\nwhile time.time() - t < 1.0: pass"])
    time.sleep(1.0)
    load = meter.read()
    child.wait()
    assert load.other_cores >= 0.5, load  # about 1 core (more if the machine is busy)


def test_meter_does_not_count_our_own_work():
    meter = cpu.LoadMeter()
    if meter.read().other_cores is None:
        pytest.skip("no /proc/stat here")
    t = time.perf_counter()
    while time.perf_counter() - t < 0.6:
        pass
    load = meter.read()
    assert load.own_cores > 0.1  # (less than 1 core when others share the machine)
    # other processes can use at most the cores we left them (tick rounding aside)
    assert load.other_cores + load.own_cores <= load.cpus + 0.15, load


@pytest.mark.parametrize("other, cpus, expected", [
    (0.0, 2, 2), (0.2, 2, 2), (0.3, 2, 1), (1.9, 2, 1), (5.0, 2, 1), (2.5, 16, 13),
    (None, 4, 4)])
def test_choose_threads_from_the_load(other, cpus, expected):
    n, why = cpu.choose_threads(load=cpu.Load(other, 0.0, 1.0, cpus))
    assert n == expected
    assert ("busy" in why) == (other is not None and other >= cpu.BUSY_CORES)


def test_choose_threads_honours_a_request_and_refuses_zero():
    assert cpu.choose_threads(3) == (3, "as requested")
    with pytest.raises(ValueError, match="at least 1"):
        cpu.choose_threads(0)


def test_use_threads_runs_everything_on_the_pool_and_restores():
    def blas_threads():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["user_api"] == "blas"]

    before, before_blas = parallel.get_num_threads(), blas_threads()
    for n in (1, 3):
        with cpu.use_threads(n):
            assert parallel.get_num_threads() == n and set(blas_threads()) == {1}
            assert parallel.split_matmuls() == (n > 1)
            np.ones((64, 64), np.float32) @ np.ones((64, 64), np.float32)
        assert parallel.get_num_threads() == before and blas_threads() == before_blas
        assert not parallel.split_matmuls()
    with pytest.raises(ValueError):
        with cpu.use_threads(0):
            pass


def test_wait_until_quiet_waits_then_gives_up(monkeypatch):
    loads = iter([cpu.Load(1.0, 0, 1, 2), cpu.Load(0.5, 0, 1, 2), cpu.Load(0.01, 0, 1, 2)])
    monkeypatch.setattr(cpu, "measure_load", lambda seconds: next(loads))
    seen = []
    assert cpu.wait_until_quiet(0.1, window_s=0.01, on_wait=seen.append).other_cores == 0.01
    assert [load.other_cores for load in seen] == [1.0, 0.5]
    monkeypatch.setattr(cpu, "measure_load", lambda seconds: cpu.Load(1.0, 0, 1, 2))
    assert cpu.wait_until_quiet(0.1, window_s=0.01, timeout_s=0.05) is None
