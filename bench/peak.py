"""The machine's float32 matrix-multiply speed, for NumPy and for torch, in GFLOP/s.

    python bench/peak.py                 # square sizes 512..4096 plus the M config's shapes
    python bench/peak.py --sizes 2048    # one size

It also prints the machine's copy bandwidth (`copy_pass`), the ceiling of the elementwise
kernels that bench/kernel_speed.py times against it (`interleaved_best`).

A GEMM of (m, k) @ (k, n) is 2 m k n FLOPs. Each timing is the best of `--repeats` calls
(the best, not the median: this is the ceiling the training benches are compared with).
The peak used for MFU is the best number either side reaches.
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import argparse
import time

import numpy as np


def best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: thread pools, page faults
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def interleaved_best(fns, repeats: int) -> list[float]:
    """Best seconds of each of `fns` over `repeats` rounds, the functions run in turn within
    each round: on a busy machine a load that comes and goes then slows every function alike,
    so their ratio holds where separate best-of-n runs (minutes apart) would not."""
    for fn in fns:
        fn()  # warm-up: compilation, thread pools, page faults
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def copy_pass(mib: float = 256):
    """(a function copying a `mib` MiB float32 array on the engine's pool, bytes it moves:
    read + write). 256 MiB is far past every cache: the memory bandwidth an elementwise
    kernel's bytes are compared with."""
    from glassllm.engine import parallel
    src = np.ones(max(1 << 16, int(mib * (1 << 20) // 4) >> 16 << 16), np.float32)
    dst = np.empty_like(src)
    rows, out = src.reshape(-1, 1 << 16), dst.reshape(-1, 1 << 16)

    def copy():
        parallel.for_slices(lambda r: np.copyto(out[r], rows[r]), *rows.shape)

    return copy, 2 * src.nbytes


def gemm_gflops(m: int, k: int, n: int, repeats: int = 5) -> dict:
    """GFLOP/s of float32 (m,k)@(k,n) for numpy and torch."""
    import torch
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    out = np.empty((m, n), dtype=np.float32)
    ta, tb, tout = torch.from_numpy(a.copy()), torch.from_numpy(b.copy()), torch.empty(m, n)
    flops = 2.0 * m * k * n
    t_np = best_seconds(lambda: np.matmul(a, b, out=out), repeats)
    t_torch = best_seconds(lambda: torch.matmul(ta, tb, out=tout), repeats)
    return {"numpy": flops / t_np / 1e9, "torch": flops / t_torch / 1e9}


def measure_peak(sizes=(2048,), repeats: int = 5) -> float:
    """Best GFLOP/s of either side over square GEMMs of `sizes`."""
    return max(max(gemm_gflops(s, s, s, repeats).values()) for s in sizes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    common.set_threads()
    print(common.blas_report())
    shapes = [(s, s, s) for s in args.sizes]
    # The M config's training GEMMs (N = B*T = 2048 rows): MLP up/down, attention q.
    shapes += [(2048, 384, 1024), (2048, 1024, 384), (2048, 384, 384)]
    print(f"\n{'m x k x n':>20} {'numpy GFLOP/s':>14} {'torch GFLOP/s':>14}")
    best = 0.0
    for m, k, n in shapes:
        r = gemm_gflops(m, k, n, args.repeats)
        best = max(best, r["numpy"], r["torch"])
        print(f"{f'{m}x{k}x{n}':>20} {r['numpy']:14.1f} {r['torch']:14.1f}")
    print(f"\npeak float32 matmul: {best:.1f} GFLOP/s (best of both sides)")
    copy, nbytes = copy_pass()
    print(f"copy bandwidth (256 MiB float32, read + write, the engine's threads): "
          f"{nbytes / best_seconds(copy, args.repeats) / 1e9:.1f} GB/s "
          f"(each kernel against it: bench/kernel_speed.py)")


if __name__ == "__main__":
    main()
