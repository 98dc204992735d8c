"""Single-thread SGEMM speed of glassllm's two backends (glassllm.engine.blas), and of torch's `mm`
where torch is installed, on the shapes of the bench configs' products, GFLOP/s by the CPU
clock (which other processes disturb least). Rows marked T are weight gradients, dy^T @ x,
with dy^T passed as the transposed view the backward passes (M's, per thread of two).

    python bench/blas_speed.py
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import time

import numpy as np
from threadpoolctl import threadpool_limits

from glassllm.engine import blas

# (rows, depth, columns): S's projections (2048 = B*T rows, d 128, kv 64, d_ff 352), M's
# (d 384, d_ff 1024), L's (d 768, 3 x 768, the 50304-token head, in four slices)
SHAPES = [(1024, 128, 384), (1024, 128, 352), (1024, 352, 128), (2048, 384, 1024),
          (2048, 1024, 384), (2048, 384, 384), (1024, 768, 2304), (1024, 768, 12576)]
# (output rows, depth, columns) of M's weight gradients, one thread's half: k/v, q/o, gate/up,
# down
GRADIENT_SHAPES = [(64, 2048, 384), (192, 2048, 384), (512, 2048, 384), (192, 2048, 1024)]


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
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
    print(blas.describe())
    print(f"{'rows x depth x cols':>24} {'NumPy GFLOP/s':>14} {'MKL GFLOP/s':>12} "
          f"{'torch GFLOP/s':>14}")
    with threadpool_limits(1, "blas"):
        for (m, k, n), transposed in [(s, False) for s in SHAPES] + \
                [(s, True) for s in GRADIENT_SHAPES]:
            if transposed:  # a (k, m) array read through its transpose
                a = rng.standard_normal((k, m), dtype=np.float32).T
            else:
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
            if torch is not None:
                ta, tb = torch.from_numpy(a.T.copy()).t(), torch.from_numpy(b)
                rates.append(gflops(lambda: ta.mm(tb), 2.0 * m * k * n) if transposed else
                             gflops(lambda: torch.from_numpy(a).mm(tb), 2.0 * m * k * n))
            else:
                rates.append(float("nan"))
            mark = "T" if transposed else " "
            print(f"{mark} {m:>7} x {k:>4} x {n:>5} {rates[0]:14.1f} {rates[1]:12.1f} "
                  f"{rates[2]:14.1f}")
    blas.set_backend("auto")


if __name__ == "__main__":
    main()
