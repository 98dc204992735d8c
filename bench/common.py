"""Shared pieces of the benchmarks: environment, configs, the PyTorch twin and the same-model
check, the load of other processes, BLAS report, FLOP count, memory.

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

import contextlib  # noqa: E402  (after the re-exec on purpose)
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)
sys.path.insert(0, os.path.join(REPO, "src"))
sys.path.insert(1, os.path.join(REPO, "tests"))  # the PyTorch twin: tests/torch_reference.py

from glassllm.engine import cpu# noqa: E402

# The configs. S64, S and M are llama-family (GQA: 2 KV heads); S64 is S at the
# shape `glassllm train` uses by default (T 64, B 16). L is GPT-2 small's shape, so it runs
# the gpt2 family (LayerNorm, learned positions, GELU, biases, tied head).
_S_MODEL = dict(vocab_size=256, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2,
                max_len=256, family="llama")
CONFIGS = {
    "S64": dict(model=_S_MODEL, batch=16, seq=64),
    "S": dict(model=_S_MODEL, batch=16, seq=128),
    "M": dict(model=dict(vocab_size=256, d_model=384, n_layers=6, n_heads=6, n_kv_heads=2,
                         max_len=256, family="llama"), batch=8, seq=256),
    "L": dict(model=dict(vocab_size=50304, d_model=768, n_layers=12, n_heads=12,
                         n_kv_heads=12, max_len=1024, family="gpt2"), batch=4, seq=256),
}


_THREADS = contextlib.ExitStack()


def set_threads(n: int | None = None) -> int:
    """Both sides on n threads, by default one per available core (as torch's default):
    torch.set_num_threads(n), and glassllm inside `glassllm.engine.cpu.use_threads(n)` for the rest
    of the process (its own pool for every pass and product, BLAS on one thread), the way
    `glassllm train` runs.

    A number below the core count is for profiling on a busy machine only."""
    import torch
    n = n or len(cpu.available_cpus())
    torch.set_num_threads(n)
    _THREADS.close()
    _THREADS.enter_context(cpu.use_threads(n))
    return n


# --------------------------------------------------------------------------- same model
SAME_LOGITS_RTOL = 1e-5


def build_pair(cfg, seed: int = 0):
    """(glassllm model, PyTorch twin) holding the same weights, checked by `check_same_model`.

    The twin is tests/torch_reference.py, the one the parity tests use."""
    from torch_reference import TorchLM, load_glassllm_state

    from glassllm.model import GlassLM
    model = GlassLM(cfg, seed=seed)
    twin = TorchLM(cfg.to_dict())
    load_glassllm_state(twin, model.state_dict())
    check_same_model(model, twin)
    return model, twin


def check_same_model(model, twin, seq: int = 64, rtol: float = SAME_LOGITS_RTOL) -> float:
    """Logits of both sides on a probe batch (2 x seq random ids) must agree within rtol,
    relative to the largest logit; returns the relative difference.

    Raises:
        SystemExit: they do not (the bench then exits non-zero: its ratios would compare two
            different models).
    """
    import torch

    from glassllm.tensor import no_grad
    cfg = model.cfg
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, min(seq, cfg.max_len)))
    with no_grad():
        ours = model(ids).data
    with torch.no_grad():
        theirs = twin(torch.from_numpy(ids)).numpy()
    relative = float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-30))
    if not relative <= rtol:
        raise SystemExit(f"not the same model: logits on the probe batch differ by {relative:.2e} "
                         f"of their largest value (limit {rtol:g})")
    return relative


# --------------------------------------------------------------------------- load
def add_load_arguments(parser) -> None:
    parser.add_argument("--require-quiet", action="store_true",
                        help="wait for a quiet machine before each measurement, repeat one "
                             "that other processes disturbed, and exit non-zero rather than "
                             "report a figure measured while the machine was busy")
    parser.add_argument("--quiet-cores", type=float, default=0.1, metavar="CORES",
                        help="quiet means other processes use fewer cores than this on "
                             "average (default 0.1)")
    parser.add_argument("--quiet-timeout", type=float, default=1800.0, metavar="SECONDS",
                        help="with --require-quiet: give up after this long (default 1800)")


def measure_quietly(fn, args, label: str):
    """(fn(), Load): fn run under a `glassllm.engine.cpu.LoadMeter`, which records how many cores
    other processes used meanwhile (this process and its waited-for children excluded).

    With args.require_quiet: first wait for a quiet window (other processes under
    args.quiet_cores), run, and run again while the run itself was not quiet, until
    args.quiet_timeout seconds have passed.

    Raises:
        SystemExit: with --require-quiet, no quiet run within the timeout, or the load
            cannot be measured on this system.
    """
    deadline = time.monotonic() + args.quiet_timeout
    while True:
        if args.require_quiet:
            quiet = cpu.wait_until_quiet(
                args.quiet_cores, timeout_s=max(0.0, deadline - time.monotonic()),
                on_wait=lambda load: print(f"[{label}] waiting for a quiet machine: {load}",
                                           file=sys.stderr, flush=True))
            if quiet is None:
                raise SystemExit(f"[{label}] refusing to report: no quiet machine within "
                                 f"{args.quiet_timeout:.0f} s (or its load is unknown here)")
        meter = cpu.LoadMeter()
        result = fn()
        load = meter.read()
        if not args.require_quiet or load.other_cores < args.quiet_cores:
            return result, load
        print(f"[{label}] other processes disturbed the run ({load}); measuring again",
              file=sys.stderr, flush=True)
        if time.monotonic() > deadline:
            raise SystemExit(f"[{label}] refusing to report: every run within "
                             f"{args.quiet_timeout:.0f} s was disturbed (last: {load})")


def load_text(load) -> str:
    return "unknown" if load.other_cores is None else f"{load.other_cores:.2f}"


# --------------------------------------------------------------------------- report
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
    from glassllm.engine import blas, parallel
    lines.append(f"glassllm {blas.describe()}")
    lines.append(f"glassllm: {parallel.get_num_threads()} threads in its own pool, matrix "
                 f"products {'split over it' if parallel.split_matmuls() else 'on BLAS threads'}")
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
