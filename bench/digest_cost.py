"""What checking a file's SHA-256 digests costs: seconds per GB, on this machine.

    python bench/digest_cost.py [--mb 256] [--repeats 3]

Writes one model file of about --mb megabytes (float32 weights) twice: as glassllm writes it
(format version 2, a SHA-256 per tensor) and as a version 1 file (same bytes, no digest), then
times `files.load` of each (best of --repeats, the file in the page cache) and
`integrity.tensor_sha256` alone over the same bytes. Prints the machine's load average before
and after: a figure from a busy machine is labelled as such.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
from glassllm import Config, GlassLM
from glassllm.formats import files, integrity# noqa: E402


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="model size in MB (default 256)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()
    d_model = 512
    n_layers = max(1, round(args.mb * 1e6 / 4 / (12 * d_model * d_model)))
    model = GlassLM(Config(d_model=d_model, n_layers=n_layers, n_heads=8, max_len=64))
    with tempfile.TemporaryDirectory() as tmp:
        signed = os.path.join(tmp, "v2.safetensors")
        files.save(model, signed)
        with safe_open(signed, framework="numpy") as f:
            meta = {k: v for k, v in f.metadata().items() if k not in ("digest", "version")}
            tensors = {n: f.get_tensor(n) for n in f.keys()}
        unsigned = os.path.join(tmp, "v1.safetensors")
        save_file(tensors, unsigned, metadata=meta)
        gb = sum(t.nbytes for t in tensors.values()) / 1e9
        t_v1 = best_of(args.repeats, lambda: files.load(unsigned))
        t_v2 = best_of(args.repeats, lambda: files.load(signed))
        t_hash = best_of(args.repeats, lambda: [integrity.tensor_sha256(t)
                                                for t in tensors.values()])
    load_after = os.getloadavg()
    print(f"model file: {gb * 1e3:.0f} MB of float32 weights ({len(tensors)} tensors)")
    print(f"files.load, version 1 (no digest):  {t_v1 / gb:6.2f} s/GB")
    print(f"files.load, version 2 (SHA-256):    {t_v2 / gb:6.2f} s/GB")
    print(f"checking the digests costs          {(t_v2 - t_v1) / gb:6.2f} s/GB "
          f"(+{(t_v2 / t_v1 - 1) * 100:.0f}% load time)")
    print(f"SHA-256 alone over the tensors:     {t_hash / gb:6.2f} s/GB")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
          f"({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
