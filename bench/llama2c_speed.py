"""Generation speed against the C anchor: llama2.c's stories260K, glassllm vs llama2.c's run.c.

    python bench/llama2c_speed.py                                  # glassllm alone
    python bench/llama2c_speed.py --run-c /path/to/run --require-quiet   # with run.c

glassllm loads `../shared/data/llama2c/stories260K.bin` (a real trained model: dim 64,
5 layers, 8 heads, 4 KV heads, vocab 512) with `glassllm.formats.llama2c.from_llama2c` and decodes
`--new` tokens greedily from BOS (id 1) with `glassllm.generate.generate` and a KV cache, on
one thread (run.c without OpenMP is single-threaded too). tokens/s counts the tokens after the
first, as run.c's "achieved tok/s" does. It also prints where glassllm's time per token goes:
the matrix products vs everything else (NumPy and Python overhead per op), from timing every
product.

`--run-c` takes llama2.c's run.c compiled by the user (`gcc -O3 -o run run.c -lm`; nothing of
llama2.c is part of this repository), run as `run MODEL -t 0 -n N -z TOKENIZER` (greedy from
BOS, the story on stdout, "achieved tok/s: X" on stderr). Both sides must tell the same story
(glassllm's tokens decoded with the same tokenizer, whitespace aside), else the bench exits
non-zero.
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import argparse
import os
import re
import subprocess
import time

import numpy as np

from glassllm.engine import cpu
from glassllm import kernels
from glassllm.generate import Sampling, generate
from glassllm.formats.llama2c import from_llama2c, tokenizer_from_llama2c

DATA = os.path.join(common.REPO, "..", "shared", "data", "llama2c")
BOS = 1


def glassllm_run(model, n_new: int) -> tuple[list[int], float, float]:
    """(tokens, seconds for tokens 2..n, seconds of it in matrix products)."""
    gemm = [0.0]

    def timed(a, b, out=None):
        t0 = time.perf_counter()
        result = product(a, b, out=out)
        gemm[0] += time.perf_counter() - t0
        return result

    first = generate(model, [BOS], 1, Sampling(temperature=0))  # the untimed first token
    product = kernels.register_gemm(timed)  # every product of the library, timed
    try:
        t0 = time.perf_counter()
        rest = generate(model, [BOS] + first, n_new - 1, Sampling(temperature=0))
        seconds = time.perf_counter() - t0
    finally:
        kernels.register_gemm(product)
    return first + rest, seconds, gemm[0]


def run_c(binary: str, path: str, tokenizer: str, n_new: int) -> tuple[str, float]:
    """(the story run.c printed, its achieved tok/s)."""
    out = subprocess.run([binary, path, "-t", "0", "-n", str(n_new), "-z", tokenizer],
                         capture_output=True, text=True, check=False)
    found = re.search(r"achieved tok/s: ([0-9.]+)", out.stderr)
    if out.returncode or not found:
        raise SystemExit(f"{binary} failed (exit {out.returncode}): {out.stderr[-500:]}")
    return out.stdout, float(found.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.path.join(DATA, "stories260K.bin"),
                        help="llama2.c checkpoint")
    parser.add_argument("--tokenizer", default=os.path.join(DATA, "tok512.bin"),
                        help="its llama2.c tokenizer.bin")
    parser.add_argument("--new", type=int, default=255, help="tokens to decode (default 255)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--run-c", metavar="BINARY", help="a compiled llama2.c run.c")
    common.add_load_arguments(parser)
    args = parser.parse_args()
    model = from_llama2c(args.model)
    if args.new + 1 > model.cfg.max_len:
        raise SystemExit(f"--new {args.new}: at most {model.cfg.max_len - 1} tokens")
    print(f"at start: {cpu.measure_load(1.0)}")

    def measure():
        rows = []
        with cpu.use_threads(1):
            for _ in range(args.repeats):
                tokens, seconds, gemm = glassllm_run(model, args.new)
                c = run_c(args.run_c, args.model, args.tokenizer, args.new) if args.run_c \
                    else None
                rows.append((tokens, seconds, gemm, c))
        return rows

    rows, load = common.measure_quietly(measure, args, "stories260K")
    tokens = rows[-1][0]
    seconds = float(np.median([r[1] for r in rows]))
    gemm = float(np.median([r[2] for r in rows]))
    per_token = seconds / (args.new - 1)
    ours = 1.0 / per_token
    print(f"stories260K, greedy from BOS, {args.new} tokens, 1 thread, median of "
          f"{args.repeats}; other processes used {common.load_text(load)} cores")
    print(f"glassllm: {ours:,.0f} tok/s = {per_token * 1e6:.0f} us per token, of which "
          f"matrix products {gemm / (args.new - 1) * 1e6:.0f} us, everything else "
          f"{(seconds - gemm) / (args.new - 1) * 1e6:.0f} us (NumPy/Python per op)")
    if args.run_c:
        theirs = float(np.median([r[3][1] for r in rows]))
        ours_text = tokenizer_from_llama2c(args.tokenizer).decode(
            tokens[:tokens.index(BOS)] if BOS in tokens else tokens)
        c_text = rows[-1][3][0]
        if ours_text.split() != c_text.split():  # run.c stops at BOS and ends with a newline
            raise SystemExit(f"not the same story as run.c:\nglassllm: {ours_text[:200]!r}\n"
                             f"run.c:    {c_text[:200]!r}")
        print(f"run.c:    {theirs:,.0f} tok/s; glassllm / run.c = {ours / theirs:.3f} "
              f"(the same story, {len(ours_text.split())} words)")


if __name__ == "__main__":
    main()
