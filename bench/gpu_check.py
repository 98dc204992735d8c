"""The device check of the GPU work, in one run: what a lent GPU machine runs once.

    python bench/gpu_check.py                 # on the GPU machine (output also under $OUT)
    python bench/gpu_check.py --dry-run       # here, without a GPU: device="strict" instead

It reports the machine (nvidia-smi, CuPy, torch), then runs
1. tests/test_cuda.py, slow checks included: CUDA vs CPU logits and gradients (1e-4, every
   family's tiny model), 20 greedy tokens equal, 100 training steps of M within 1e-3 of the
   CPU's losses, bf16 autocast training of M;
2. bench/gpu_speed.py: training tokens/s of S, M and L against torch CUDA eager, interleaved,
   and greedy decoding of S and M (torch on the CPU where torch has no CUDA: the row says so).
Each stage has its own time limit, so one that hangs leaves the others their time; every
stage's output goes to stdout and, under $OUT (the device tool's folder) or --out, to a file.
A machine without CuPy or a GPU ends in one line saying which (the device has no network:
CuPy for CUDA 12 and a CUDA torch must be installed there).

--dry-run runs the same stages on device="strict" (tests/test_cuda.py with
GLASSLLM_TEST_GPU=strict, gpu_speed with --device strict --torch-device cpu, small sizes):
the script itself, tested on a machine without a GPU.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)


def _stage(name: str, command: list[str], out_dir: str | None, env: dict, limit_s: int) -> int:
    """Run one stage, its output to stdout and to out_dir/name.log; its exit code (124 when
    it ran past limit_s)."""
    print(f"== {name}: {' '.join(command)}", flush=True)
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=limit_s)
        code, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        code = 124
        text = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
            else (e.stdout or "")
        text += f"\n(stopped after {limit_s} s)"
    text += f"\n== {name}: exit {code}, {time.monotonic() - start:.0f} s\n"
    print(text, flush=True)
    if out_dir:
        with open(os.path.join(out_dir, f"{name}.log"), "w") as f:
            f.write(text)
    return code


def machine() -> tuple[str, bool]:
    """(a report of the machine, whether torch has CUDA)."""
    lines = []
    try:
        lines.append(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                    timeout=30).stdout.strip() or "nvidia-smi: no GPU listed")
    except (OSError, subprocess.TimeoutExpired) as e:
        lines.append(f"nvidia-smi: {e}")
    try:
        import cupy
        lines.append(f"cupy {cupy.__version__}, CUDA runtime "
                     f"{cupy.cuda.runtime.runtimeGetVersion()}")
    except Exception as e:  # ImportError, or CUDA's own errors
        lines.append(f"cupy: {type(e).__name__}: {e}")
    torch_cuda = False
    try:
        import torch
        torch_cuda = torch.cuda.is_available()
        lines.append(f"torch {torch.__version__}, cuda available: {torch_cuda}")
    except ImportError as e:
        lines.append(f"torch: {e}")
    return "\n".join(lines), torch_cuda


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="device strict instead of cuda, small sizes (no GPU needed)")
    parser.add_argument("--out", default=os.environ.get("OUT"), help="folder for the logs")
    parser.add_argument("--test-limit", type=int, default=300, help="seconds for stage 1")
    parser.add_argument("--speed-limit", type=int, default=200, help="seconds for stage 2")
    args = parser.parse_args(argv)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    report, torch_cuda = machine()
    print(report, flush=True)
    env = {**os.environ, "PYTHONPATH": os.path.join(REPO, "src")}
    device, torch_device = ("strict", "cpu") if args.dry_run else \
        ("cuda", "cuda" if torch_cuda else "cpu")
    if args.dry_run:
        env["GLASSLLM_TEST_GPU"] = "strict"
    else:
        sys.path.insert(0, os.path.join(REPO, "src"))
        from glassllm import devices
        try:
            devices.namespace_for("cuda")
        except devices.DeviceUnavailable as e:
            print(f"gpu_check: {e}", flush=True)
            return 2
    tests = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m",
             "slow or not slow", "tests/test_cuda.py"]
    speed = [sys.executable, "bench/gpu_speed.py", "--device", device, "--torch-device",
             torch_device]
    if args.dry_run:
        tests[-1:] = ["-k", "not hundred", "tests/test_cuda.py"]  # M x 100 on the CPU: minutes
        speed += ["--config", "S", "--steps", "2", "--warmup", "1", "--new-tokens", "4",
                  "--repeats", "1"]
    if args.out:
        speed += ["--json", os.path.join(args.out, "gpu_speed.json")]
    codes = [_stage("test_cuda", tests, args.out, env, args.test_limit),
             _stage("gpu_speed", speed, args.out, env, args.speed_limit)]
    print(f"gpu_check: stages exited {codes}", flush=True)
    return max(codes)


if __name__ == "__main__":
    raise SystemExit(main())
