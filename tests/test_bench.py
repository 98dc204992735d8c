"""The benchmarks' guards: the same-model check, the greedy-token check, --require-quiet.

A bench ratio compares glassllm with tests/torch_reference.py; these tests make sure the
bench refuses (exits non-zero) when the two are not the same model or the machine was busy.
"""
from __future__ import annotations

import os
import re
import types
from pathlib import Path

import numpy as np
import pytest

from glassllm.engine import cpu
from glassllm.model import Config

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


@pytest.fixture
def bench(monkeypatch, torch):
    # bench/common.py re-executes a script that has OpenBLAS overrides set; not in a test
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.syspath_prepend(BENCH)
    import common
    import generate_speed
    return types.SimpleNamespace(common=common, generate_speed=generate_speed)


def small_s() -> Config:  # the S config's architecture, smaller
    return Config(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_len=96)


def test_same_model_check_accepts_the_twin(bench):
    model, twin = bench.common.build_pair(small_s())
    assert bench.common.check_same_model(model, twin) < 1e-5


def test_same_model_check_exits_for_a_twin_without_rope(bench):
    model, twin = bench.common.build_pair(small_s())
    twin.rope_cos.fill_(1.0)
    twin.rope_sin.zero_()
    with pytest.raises(SystemExit, match="not the same model"):
        bench.common.check_same_model(model, twin)


def test_same_model_check_exits_for_one_slightly_wrong_weight(bench, torch):
    model, twin = bench.common.build_pair(small_s())
    with torch.no_grad():
        twin.blocks[1].mlp.down.weight.mul_(1.01)
    with pytest.raises(SystemExit, match="not the same model"):
        bench.common.check_same_model(model, twin)


def test_twin_decodes_the_same_greedy_tokens_as_glassllm(bench):
    from glassllm.generate import Sampling, generate
    model, twin = bench.common.build_pair(small_s())
    prompt = np.random.default_rng(0).integers(0, 64, 16)
    ours = generate(model, prompt, 40, Sampling(temperature=0))
    assert bench.generate_speed.torch_greedy(twin, prompt, 40) == ours


def test_twin_kv_cache_prefill_in_pieces_equals_one_forward(bench, torch):
    from torch_reference import TorchKVCache
    _, twin = bench.common.build_pair(small_s())
    ids = torch.from_numpy(np.random.default_rng(1).integers(0, 64, (2, 90)))
    cache = TorchKVCache(twin.cfg, batch_size=2)
    with torch.no_grad():
        full = twin(ids)
        pieces = [twin(ids[:, :50], cache), twin(ids[:, 50:51], cache), twin(ids[:, 51:], cache)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)


def test_require_quiet_refuses_a_disturbed_run(bench, monkeypatch):
    common = bench.common
    monkeypatch.setattr(common.cpu, "wait_until_quiet", lambda *a, **k: cpu.Load(0, 0, 2, 2))

    class BusyMeter:
        def read(self):
            return cpu.Load(0.8, 1.0, 2.0, 2)

    monkeypatch.setattr(common.cpu, "LoadMeter", BusyMeter)
    args = types.SimpleNamespace(require_quiet=True, quiet_cores=0.1, quiet_timeout=0.0)
    with pytest.raises(SystemExit, match="refusing to report"):
        common.measure_quietly(lambda: "figure", args, "M")
    args.require_quiet = False  # without the flag: the figure, with its load
    result, load = common.measure_quietly(lambda: "figure", args, "M")
    assert result == "figure" and load.other_cores == 0.8


def test_require_quiet_refuses_when_never_quiet(bench, monkeypatch):
    common = bench.common
    monkeypatch.setattr(common.cpu, "wait_until_quiet", lambda *a, **k: None)
    args = types.SimpleNamespace(require_quiet=True, quiet_cores=0.1, quiet_timeout=0.0)
    ran = []
    with pytest.raises(SystemExit, match="no quiet machine"):
        common.measure_quietly(lambda: ran.append(1), args, "S")
    assert not ran


def test_generate_bench_exits_when_the_tokens_differ(bench, monkeypatch):
    monkeypatch.setattr(bench.generate_speed, "generate", lambda model, prompt, n, s: [0] * n)
    with pytest.raises(SystemExit, match="greedy tokens differ"):
        bench.generate_speed.bench_config("S", 4, 5, repeats=1, compile_torch=False)


def test_the_ring_allreduce_model_gives_the_readmes_prediction_table(monkeypatch):
    """docs/distributed.md "Scaling: measured and modelled": t_allreduce = 2(N-1)/N x 4P / bandwidth and
    efficiency = t_compute / (t_compute + t_allreduce), with the rows the page prints for
    config L (t_compute 4.204 s, 124.5 M parameters) and its "7.8 s at N = 64, 1 Gbit/s"."""
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.syspath_prepend(BENCH)
    import distributed_speed as ds
    params = 124_500_000
    assert ds.ring_allreduce_s(params, 64, 1) == pytest.approx(2 * 63 / 64 * 4 * params / 125e6)
    assert round(ds.ring_allreduce_s(params, 64, 1), 1) == 7.8
    assert ds.ring_allreduce_s(params, 1, 1) == 0.0  # one machine sends nothing
    # the page's prediction rows for L, read from the file: | L | 4.20 s | 498 MB | 1 Gbit/s | ...
    readme = (Path(__file__).resolve().parents[1] / "docs" / "distributed.md").read_text(
        encoding="utf-8")
    rows = re.findall(r"^\| L \| ([\d.]+) s \| 498 MB \| (\d+) Gbit/s \| (.*) \|$", readme,
                      flags=re.M)
    assert sorted(int(gbit) for _, gbit, _ in rows) == [1, 10, 100], rows
    for t_compute, gbit, cells in rows:
        assert float(t_compute) == pytest.approx(4.204, abs=0.005)  # the measured table's
        assert " ".join(f"{ds.efficiency(4.204, params, n, int(gbit)):.0%}"
                        for n in ds.MACHINES) == " ".join(c.strip() for c in cells.split("|"))
