"""Data-parallel training speed: 1 process x 2 threads vs 2 MPI ranks x 1 thread, the allreduce's
share of a step, and the efficiency that ring-allreduce predicts for N = 2..64 machines.

    python bench/distributed_speed.py                      # configs M and L (bench/common.py)
    python bench/distributed_speed.py --config M --steps 3 # a cheap check

Each config trains its global batch (common.CONFIGS: M 8 x 256, L 4 x 256 tokens) with the
Trainer's own update (`glassllm.training.safety.TrainStep`, fp32, clip 1, AdamW):

    1 x 2   one process on 2 threads (`glassllm.engine.cpu.use_threads(2)`, as `glassllm train
            --threads 2`: glassllm's own pool for the elementwise passes and the matrix
            products, BLAS on one thread), the whole batch
    2 x 1   `mpiexec -n 2`, each rank 1 thread and half the batch, gradients summed with one
            float32 Allreduce (the Trainer's GradientBuffer)

For 2 x 1 a step is split into compute (forward, backward, the buffer copy, clip, AdamW),
wait (a barrier before the gradient Allreduce: the time the faster rank waits for the
slower) and allreduce (the Allreduce itself after that barrier). Tokens/s count both ranks.

The prediction: N machines, each like this one computing the config's batch in t_compute
(weak scaling: the global batch grows with N). t_compute is the CPU time one rank of the
2 x 1 run spends on its half of the batch outside collectives (process_time; MPI's spinning
in collectives excluded): what a 2-core machine with both cores to itself needs for the
whole batch, and the figure a busy machine disturbs least. Gradients of P float32
parameters, 4P bytes, summed by ring allreduce (Patarasuk & Yuan 2009) with no overlap of
communication and compute (glassllm reduces after the backward pass):

    t_allreduce(N) = 2 (N - 1) / N * 4P / bandwidth          (latency terms ignored)
    efficiency(N)  = t_compute / (t_compute + t_allreduce(N))  speed-up = N * efficiency

Load: printed before and after (os.getloadavg); a figure from a busy machine says so.
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from glassllm.engine import cpu
from glassllm.training import distributed
from glassllm.model import Config, GlassLM
from glassllm.optim import AdamW
from glassllm.training.safety import TrainStep

DEFAULT_STEPS = {"S": 6, "M": 5, "L": 3}
WARMUP = 1
BANDWIDTHS_GBIT = (1, 10, 100)
MACHINES = (2, 4, 8, 16, 32, 64)


class TimedComm:
    """A communicator that times a step's collectives apart from the wait before them: a
    barrier before the first one (the losses) absorbs the faster rank's wait, then the losses'
    and the gradients' Allreduce are timed, in wall time and in this process's CPU time (MPI
    spins while it waits, so CPU time in collectives is not compute)."""

    def __init__(self, comm):
        self.comm, self.rank, self.size = comm, comm.rank, comm.size
        self.reset()

    def reset(self):
        self.wait = self.allreduce = self.cpu_in_collectives = 0.0

    def allreduce_sum(self, array, what=""):
        c0, t0 = time.process_time(), time.perf_counter()
        if what.startswith("losses"):
            self.comm.comm.Barrier()
        t1 = time.perf_counter()
        self.comm.allreduce_sum(array, what)
        self.wait += t1 - t0
        self.allreduce += time.perf_counter() - t1
        self.cpu_in_collectives += time.process_time() - c0

    def allgather(self, obj, what=""):
        return self.comm.allgather(obj, what)


def worker(name: str, threads: int, steps: int) -> None:
    """One process's part on `threads` threads, as `glassllm train --threads` runs them
    (`glassllm.engine.cpu.use_threads`); rank 0 prints one JSON line."""
    with cpu.use_threads(threads):
        _worker(name, threads, steps)


def _worker(name: str, threads: int, steps: int) -> None:
    comm = distributed.from_environment()
    spec = common.CONFIGS[name]
    cfg = Config(**spec["model"])
    batch, seq = spec["batch"], spec["seq"]
    rows = batch // comm.size
    model = GlassLM(cfg, seed=0)
    timed = TimedComm(comm) if comm.size > 1 else comm
    step = TrainStep(model, AdamW(model.parameters(), lr=1e-3), "fp32", 1.0,
                     comm=timed if comm.size > 1 else None)
    rng = np.random.default_rng(0)
    times, waits, reduces, cpus = [], [], [], []
    for i in range(WARMUP + steps):
        ids = rng.integers(0, cfg.vocab_size, (batch, seq + 1))
        mine = ids[comm.rank * rows:(comm.rank + 1) * rows]
        if comm.size > 1:
            comm.comm.Barrier()  # every rank starts the step together
            timed.reset()
        c0, t0 = time.process_time(), time.perf_counter()
        step(mine[:, :-1], mine[:, 1:], 1e-3, i)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        if i >= WARMUP:
            times.append(dt)
            cpus.append(cpu - (timed.cpu_in_collectives if comm.size > 1 else 0.0))
            if comm.size > 1:
                waits.append(timed.wait)
                reduces.append(timed.allreduce)
    if comm.size > 1:  # the slowest rank's step is the step
        times = list(np.max(comm.allgather(times), axis=0))
    if comm.rank == 0:
        t = float(np.median(times))
        n_params = sum(p.size for p in model.parameters())
        result = {"config": name, "ranks": comm.size, "threads": threads, "step_s": t,
                  "tokens_per_s": batch * seq / t, "params": int(n_params),
                  "compute_cpu_s": float(np.median(cpus)),
                  "steps": steps, "all_step_s": [round(x, 4) for x in times]}
        if comm.size > 1:
            result["wait_s"] = float(np.median(waits))
            result["allreduce_s"] = float(np.median(reduces))
            result["allreduce_bytes"] = 4 * int(n_params)
        print(json.dumps(result), flush=True)
    if comm.size > 1:
        comm.close()


def run(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{cmd} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def mpiexec() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return beside if os.path.exists(beside) else "mpiexec"


def ring_allreduce_s(n_params: int, machines: int, gbit: float) -> float:
    """2 (N-1)/N x 4P bytes over `gbit` Gbit/s: each of N ring members sends and receives
    2 (N-1) chunks of 4P/N bytes (reduce-scatter, then all-gather)."""
    return 2 * (machines - 1) / machines * 4 * n_params / (gbit * 1e9 / 8)


def efficiency(compute_s: float, n_params: int, machines: int, gbit: float) -> float:
    return compute_s / (compute_s + ring_allreduce_s(n_params, machines, gbit))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", default=["M", "L"], choices=["S", "M", "L"])
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.config[0], args.threads, args.steps)
        return
    me = [sys.executable, os.path.abspath(__file__)]
    print(f"load average before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores",
          flush=True)
    results = []
    for name in args.config:
        steps = str(args.steps or DEFAULT_STEPS[name])
        single = run([*me, "--worker", "--config", name, "--threads", "2", "--steps", steps])
        print(f"  {name} 1 x 2: {single['step_s']:.3f} s/step (load "
              f"{os.getloadavg()[0]:.2f})", flush=True)
        ranks = run([mpiexec(), "-n", "2", *me, "--worker", "--config", name, "--threads", "1",
                     "--steps", steps])
        print(f"  {name} 2 x 1: {ranks['step_s']:.3f} s/step (load "
              f"{os.getloadavg()[0]:.2f})", flush=True)
        results.append((name, single, ranks))
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")

    print("| config | params | run | s/step | tokens/s | compute CPU s/step | wait for the "
          "slower rank | allreduce (MB) | allreduce share |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, single, ranks in results:
        spec = common.CONFIGS[name]
        tokens = f"{spec['batch']} x {spec['seq']}"
        print(f"| {name} ({tokens}) | {single['params'] / 1e6:.1f} M | 1 process x 2 threads | "
              f"{single['step_s']:.3f} | {single['tokens_per_s']:,.0f} | "
              f"{single['compute_cpu_s']:.3f} (2 threads) | | | |")
        share = ranks["allreduce_s"] / ranks["step_s"]
        print(f"| {name} ({tokens}) | {ranks['params'] / 1e6:.1f} M | 2 ranks x 1 thread | "
              f"{ranks['step_s']:.3f} | {ranks['tokens_per_s']:,.0f} | "
              f"{ranks['compute_cpu_s']:.3f} (rank 0) | {ranks['wait_s']:.3f} s | "
              f"{ranks['allreduce_s']:.3f} s "
              f"({ranks['allreduce_bytes'] / 1e6:.0f}) | {share:.1%} |")
    print("\nPredicted efficiency t_compute / (t_compute + 2(N-1)/N * 4P / bandwidth), "
          "t_compute = a 2 x 1 rank's compute CPU time per step:\n")
    print("| config | t_compute | 4P | bandwidth | " + " | ".join(f"N={n}" for n in MACHINES)
          + " |")
    print("|---|---|---|---|" + "---|" * len(MACHINES))
    for name, _, ranks in results:
        compute = ranks["compute_cpu_s"]
        for gbit in BANDWIDTHS_GBIT:
            cells = [f"{efficiency(compute, ranks['params'], n, gbit):.0%}" for n in MACHINES]
            print(f"| {name} | {compute:.2f} s | {4 * ranks['params'] / 1e6:.0f} MB | {gbit} "
                  f"Gbit/s | " + " | ".join(cells) + " |")
    print()
    for name, single, ranks in results:
        print(json.dumps({"config": name, "single": single, "ranks": ranks}))


if __name__ == "__main__":
    main()
