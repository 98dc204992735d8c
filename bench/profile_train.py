"""Where a glassllm training step spends its time: per fused op, or per Python function.

    python bench/profile_train.py --config M --steps 3            # cProfile, all cores
    python bench/profile_train.py --config S --threads 1 --ops    # per-op CPU-time table

`--ops` times each fused op's forward and backward separately with the CPU clock of this
process (time.process_time), which other processes on a shared machine disturb far less than
wall time; with --threads 1 it is close to the single-core cost of each op. `--ops --wall`
uses the wall clock instead (the one that matters with several threads on a quiet machine).
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import argparse
import collections
import functools
import threading
import time

from glassllm.engine import cpu, ops, parallel
from glassllm import functional as F
from glassllm import kernels
from glassllm.model import Config, GlassLM
from train_speed import glassllm_stepper, make_batches

OPS = ("linear", "unembed", "embedding", "rms_norm", "layer_norm", "swiglu", "gelu", "rope",
       "causal_attention", "cross_entropy")


def instrument_ops(totals, clock, gemm_in):
    """Wrap each fused op (and its backward closure) to add clock() seconds to totals[name],
    and the seconds of its matrix products to gemm_in[name]."""
    from glassllm import tensor
    original_from_op = tensor.Tensor.from_op
    current = []

    def timed(name, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t0 = clock()
            current.append(name)
            try:
                return fn(*args, **kwargs)
            finally:
                current.pop()
                totals[name] += clock() - t0
        return wrapper

    def from_op(data, parents, backward, **kwargs):
        if current:
            backward = timed(current[-1] + " backward", backward)
        return original_from_op(data, parents, backward, **kwargs)

    tensor.Tensor.from_op = staticmethod(from_op)
    import glassllm.model as model_module
    import glassllm.nn as nn_module
    for name in OPS:
        if hasattr(F, name):
            wrapped = timed(name, getattr(F, name))
            setattr(F, name, wrapped)
    # model.py and nn.py call F.<op> through the module, so patching F is enough.
    # Every GEMM the calling thread runs: time and FLOPs, counted apart. A product split over
    # the pool (`ops._matmul` in split mode) is timed whole, on the calling thread; attention's
    # products, which then run inside the pool's slices, are not counted (threads' clocks
    # would overlap).
    def timed_gemm(fn):
        def timed_matmul(a, b, out=None):
            if threading.current_thread() is not threading.main_thread() or in_gemm:
                return fn(a, b) if out is None else fn(a, b, out=out)
            in_gemm.append(1)
            t0 = clock()
            try:
                result = fn(a, b) if out is None else fn(a, b, out=out)
            finally:
                in_gemm.pop()
            seconds = clock() - t0
            totals["matrix products"] += seconds
            totals["matrix FLOPs"] += 2.0 * result.size * a.shape[-1]
            gemm_in[current[-1] if current else "?"] += seconds
            return result
        return timed_matmul

    in_gemm = []
    gemm = kernels.register_gemm(None)  # take the library's GEMM out, to put it back timed
    kernels.register_gemm(timed_gemm(gemm))
    ops._matmul = timed_gemm(ops._matmul)
    assert model_module.F is F and nn_module.F is F


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(common.CONFIGS), default="M")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--ops", action="store_true", help="per-op CPU time instead of a tree")
    parser.add_argument("--wall", action="store_true", help="with --ops: wall-clock time")
    args = parser.parse_args()
    spec = common.CONFIGS[args.config]
    cfg = Config(**spec["model"])
    batches = make_batches(cfg, spec["batch"], spec["seq"], args.steps + 1)
    clock = time.perf_counter if args.wall else time.process_time
    with cpu.use_threads(args.threads or len(cpu.available_cpus())):  # as glassllm train
        totals, gemm_in = collections.Counter(), collections.Counter()
        if args.ops:
            instrument_ops(totals, clock, gemm_in)
        model = GlassLM(cfg, seed=0)
        step = glassllm_stepper(model)
        step(*batches[0])  # warm-up
        totals.clear()
        gemm_in.clear()
        if args.ops:
            meter = cpu.LoadMeter()
            t_all = clock()
            for x, y in batches[1:]:
                step(x, y)
            t_all = clock() - t_all
            unit = "wall" if args.wall else "CPU"
            print(f"{args.config}: {t_all / args.steps:.3f} {unit} s per step, "
                  f"{parallel.get_num_threads()} threads; {meter.read()}")
            gemm_s, gemm_flops = totals.pop("matrix products"), totals.pop("matrix FLOPs")
            print(f"  {'op':28s} {'s/step':>8s} {'share':>6s} {'of which GEMM':>14s}")
            for name, t in totals.most_common():
                print(f"  {name:28s} {t / args.steps:8.4f} {t / t_all:6.1%} "
                      f"{gemm_in[name] / args.steps:12.4f} s")
            rest = t_all - sum(totals.values())
            print(f"  {'everything else':28s} {rest / args.steps:8.4f} s  {rest / t_all:6.1%}")
            print(f"  (inside the ops above: matrix products {gemm_s / args.steps:.4f} s, "
                  f"{gemm_s / t_all:.1%}, at {gemm_flops / gemm_s / 1e9:.1f} GFLOP/s)")
            return
        import cProfile
        import pstats
        profiler = cProfile.Profile()
        profiler.enable()
        for x, y in batches[1:]:
            step(x, y)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
