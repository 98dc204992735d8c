"""Single-thread SGEMM speed of glassllm's two backends (glassllm.blas) on the shapes of the
bench configs' products, GFLOP/s by the CPU clock (which other processes disturb least).

    python bench/blas_speed.py
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import time

import numpy as np
from threadpoolctl import threadpool_limits

from glassllm import blas

# (rows, depth, columns): S's projections (2048 = B*T rows, d 128, kv 64, d_ff 352), M's
# (d 384, d_ff 1024), L's (d 768, 3 x 768, the 50304-token head, in four slices)
SHAPES = [(1024, 128, 384), (1024, 128, 352), (1024, 352, 128), (2048, 384, 1024),
          (2048, 1024, 384), (2048, 384, 384), (1024, 768, 2304), (1024, 768, 12576)]


def gflops(fn, flops: float, repeats: int = 5) -> float:
    fn()
    per_call = max(1, int(2e8 / flops))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(per_call):
            fn()
        best = min(best, (time.process_time() - t0) / per_call)
    return flops / best / 1e9


def main():
    rng = np.random.default_rng(0)
    print(blas.describe())
    print(f"{'rows x depth x cols':>22} {'NumPy GFLOP/s':>14} {'MKL GFLOP/s':>12}")
    with threadpool_limits(1, "blas"):
        for m, k, n in SHAPES:
            a = rng.standard_normal((m, k), dtype=np.float32)
            b = rng.standard_normal((k, n), dtype=np.float32)
            rates = []
            for name in ("numpy", "mkl"):
                try:
                    blas.set_backend(name)
                except blas.BlasError as error:
                    rates.append(float("nan"))
                    print(f"  ({error})")
                    continue
                rates.append(gflops(lambda: blas.matmul(a, b), 2.0 * m * k * n))
            print(f"{m:>8} x {k:>4} x {n:>5} {rates[0]:14.1f} {rates[1]:12.1f}")
    blas.set_backend("auto")


if __name__ == "__main__":
    main()
