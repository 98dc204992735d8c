"""What the numba kernels cost a fresh install: the first training steps with an empty
compile cache, a filled one, and numba off.

    NUMBA_CACHE_DIR=$(mktemp -d) python bench/compile_cost.py    # fresh, then run again: warm
    GLASSLLM_NUMBA=0 python bench/compile_cost.py                # the NumPy forms

Prints the time of `import glassllm`, the first three steps of an S-sized llama model and of
its gpt2 twin (T 64, B 16, forward, backward, clipping, AdamW), and this process's CPU
seconds (which a busy machine inflates far less than the wall clock). Set GLASSLLM_THREADS=1
to compare runs on a shared machine.
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import time

t0 = time.perf_counter()
import numpy as np  # noqa: E402

import glassllm  # noqa: E402,F401
from glassllm.model import Config, GlassLM  # noqa: E402
from glassllm.optim import AdamW, clip_grad_norm  # noqa: E402

IMPORT_SECONDS = time.perf_counter() - t0


def first_steps(family: str, n: int = 3) -> list[float]:
    cfg = Config(vocab_size=256, d_model=128, n_layers=4, n_heads=4,
                 n_kv_heads=4 if family == "gpt2" else 2, max_len=128, family=family)
    model = GlassLM(cfg, seed=0)
    params = model.parameters()
    opt = AdamW(params, lr=1e-3)
    ids = np.random.default_rng(0).integers(0, 256, (16, 65))
    times = []
    for _ in range(n):
        start = time.perf_counter()
        loss = model.loss(ids[:, :-1], ids[:, 1:])
        opt.zero_grad()
        loss.backward()
        clip_grad_norm(params, 1.0)
        opt.step()
        times.append(time.perf_counter() - start)
    return times


def main():
    llama, gpt2 = first_steps("llama"), first_steps("gpt2")
    print(f"import glassllm {IMPORT_SECONDS:.2f} s; llama steps "
          f"{', '.join(f'{t:.2f}' for t in llama)} s; gpt2 steps "
          f"{', '.join(f'{t:.2f}' for t in gpt2)} s; process CPU {time.process_time():.1f} s")
    with open("/proc/loadavg") as f:
        print(f"load average: {f.read().split()[0]}")


if __name__ == "__main__":
    main()
