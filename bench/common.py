"""Shared pieces of the benchmarks: environment, configs, BLAS report, FLOP count, memory.

Import this module FIRST in a bench script: it re-executes the script without
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE before NumPy is imported, because OpenBLAS reads them
once at load time and a user's machine does not set them (tests and CI keep them).
"""
from __future__ import annotations

import os
import sys

_OPENBLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def _reexec_without_openblas_overrides() -> None:
    if not any(name in os.environ for name in _OPENBLAS_OVERRIDES):
        return
    if "numpy" in sys.modules:
        raise RuntimeError("import bench/common.py before numpy: OpenBLAS reads its "
                           "environment when it is loaded")
    env = {k: v for k, v in os.environ.items() if k not in _OPENBLAS_OVERRIDES}
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


_reexec_without_openblas_overrides()

import json  # noqa: E402  (after the re-exec on purpose)
import re  # noqa: E402
import subprocess  # noqa: E402

import numpy as np  # noqa: E402

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)
sys.path.insert(0, os.path.join(REPO, "src"))

# The configs. S and M are llama-family (GQA: 2 KV heads); L is GPT-2 small's shape,
# so it runs the gpt2 family (LayerNorm, learned positions, GELU, biases, tied head).
CONFIGS = {
    "S": dict(model=dict(vocab_size=256, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2,
                         max_len=256, family="llama"), batch=16, seq=128),
    "M": dict(model=dict(vocab_size=256, d_model=384, n_layers=6, n_heads=6, n_kv_heads=2,
                         max_len=256, family="llama"), batch=8, seq=256),
    "L": dict(model=dict(vocab_size=50304, d_model=768, n_layers=12, n_heads=12,
                         n_kv_heads=12, max_len=1024, family="gpt2"), batch=4, seq=256),
}


def set_threads(n: int | None = None) -> int:
    """Both sides on n threads, by default all cores (torch.set_num_threads(os.cpu_count())).

    A number below the core count is for profiling on a busy machine only."""
    import threadpoolctl
    import torch

    from glassllm import parallel
    n = n or os.cpu_count() or 1
    torch.set_num_threads(n)
    threadpoolctl.threadpool_limits(n, user_api="blas")
    parallel.set_num_threads(n)  # glassllm's elementwise passes
    return n


def blas_report() -> str:
    """Which BLAS each side uses, with its thread count."""
    import threadpoolctl
    import torch
    lines = [f"numpy {np.__version__}:"]
    for info in threadpoolctl.threadpool_info():
        if info["user_api"] == "blas":
            lines.append(f"  {info['internal_api']} {info.get('version')} "
                         f"({info.get('architecture')}), {info['num_threads']} threads, "
                         f"{os.path.basename(info['filepath'])}")
    from glassllm import parallel
    lines.append(f"glassllm elementwise passes: {parallel.get_num_threads()} threads")
    lines.append(f"torch {torch.__version__}: {torch.get_num_threads()} threads")
    config = torch.__config__.show()
    wanted = re.findall(r"\b(?:BLAS_INFO|LAPACK_INFO|USE_MKLDNN)=\w+", config)
    lines.append("  " + ", ".join(wanted))
    lines += ["  " + ln.strip() for ln in torch.__config__.parallel_info().splitlines()
              if ln.startswith(("Intel", "ATen parallel", "OpenMP"))]
    overrides = [n for n in _OPENBLAS_OVERRIDES if n in os.environ]
    lines.append(f"OPENBLAS overrides in effect: {overrides or 'none'}")
    return "\n".join(lines)


def matmul_params(cfg) -> int:
    """Parameters that take part in a matrix product per token: every Linear weight plus the
    output head (the tied embedding counts once, as the head; lookups are not FLOPs)."""
    C, F, L = cfg.d_model, cfg.d_ff, cfg.n_layers
    kv = cfg.n_kv_heads * cfg.head_dim
    attention = C * C + 2 * C * kv + C * C
    mlp = (3 if cfg.family == "llama" else 2) * C * F
    return L * (attention + mlp) + C * cfg.vocab_size


def train_flops_per_token(cfg, T: int) -> float:
    """PaLM's MFU count (Chowdhery et al. 2022, appendix B), as nanoGPT's estimate_mfu:
    6 N for the weight matmuls forward + backward, plus 12 L C T for attention scores and
    values (counted over the full T x T square, as that formula does)."""
    return 6.0 * matmul_params(cfg) + 12.0 * cfg.n_layers * cfg.d_model * T


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0  # the kernel reports kB
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB (VmHWM). Not getrusage's ru_maxrss:
    after fork + exec that one still holds the parent's peak."""
    return _status_mib("VmHWM")


def current_rss_mib() -> float:
    return _status_mib("VmRSS")


def run_child(args: list[str]) -> dict:
    """Run this bench script again with `args`; it must print one JSON line last."""
    out = subprocess.run([sys.executable, sys.argv[0], *args], capture_output=True,
                         text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"child {args} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median(xs):
    return float(np.median(np.asarray(xs)))
