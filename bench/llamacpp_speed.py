"""Decoding speed against llama.cpp: glassllm vs llama.cpp (llama-cpp-python) on the same GGUF.

    python bench/llamacpp_speed.py                      # stories260K, S, M; f32 and q8_0; 1 and all threads
    python bench/llamacpp_speed.py --models stories260K --new 100 --repeats 1
    python bench/llamacpp_speed.py --profile            # + where glassllm's time per token goes

Models: stories260K (`../shared/data/llama2c/stories260K.bin`, a real trained model) and the
bench's S and M shapes (bench/common.py CONFIGS, llama family, random weights, ids only). Each
is written with `glassllm.formats.gguf_write.write_gguf` as f32 and q8_0; llama.cpp runs the
file, glassllm runs what it reads back from the same file (`gguf_read.read_gguf`: q8_0
dequantized to float32, so glassllm's q8_0 row measures float32 work on quantized values).

Both decode greedily from BOS (id 1): glassllm with `generate` and its KV cache, llama.cpp
with `Llama.eval` one token at a time and the argmax of its logits (float32 KV cache, as the
parity tests). tokens/s counts the tokens after the first. Threads: 1, and every available
core (glassllm inside `engine.cpu.use_threads(n)`, llama.cpp with n_threads=n). The sides run
interleaved, each cell `--repeats` times after an untimed warm-up of both, median reported,
with the load other processes put on the machine meanwhile. With --require-quiet (bench/common.py) a disturbed cell is repeated.
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import argparse
import cProfile
import io
import os
import pstats
import tempfile
import time

import numpy as np

from glassllm import Config, GlassLM
from glassllm.engine import cpu
from glassllm.formats import gguf_write, llama2c
from glassllm.formats.gguf_read import read_gguf
from glassllm.generate import Sampling, generate

DATA = os.path.join(common.REPO, "..", "shared", "data", "llama2c")
BOS = 1


def build(name: str):
    """(GlassLM, tokenizer or None) of a bench model."""
    if name == "stories260K":
        return (llama2c.from_llama2c(os.path.join(DATA, "stories260K.bin")),
                llama2c.tokenizer_from_llama2c(os.path.join(DATA, "tok512.bin")))
    cfg = dict(common.CONFIGS[name]["model"])
    model = GlassLM(Config.preset(cfg.pop("family"), **cfg), seed=0)
    return model, None


def glassllm_decode(model, n_new: int) -> tuple[list[int], float]:
    """(tokens, seconds for tokens 2..n_new) greedy from BOS."""
    first = generate(model, [BOS], 1, Sampling(temperature=0))
    t0 = time.perf_counter()
    rest = generate(model, [BOS] + first, n_new - 1, Sampling(temperature=0))
    return first + rest, time.perf_counter() - t0


def llamacpp_decode(llm, n_new: int) -> tuple[list[int], float]:
    """The same with llama.cpp: eval one token, argmax of its logits, repeat."""
    llm.reset()
    llm.eval([BOS])
    tokens = [int(np.argmax(llm.scores[llm.n_tokens - 1]))]
    t0 = time.perf_counter()
    for _ in range(n_new - 1):
        llm.eval([tokens[-1]])
        tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
    return tokens, time.perf_counter() - t0


def open_llama(path: str, threads: int, n_ctx: int):
    import llama_cpp
    # logits_all: llama-cpp-python 0.3 copies a token's logits into `scores` only then (it
    # samples inside llama.cpp otherwise); one row per one-token eval, as glassllm computes
    return llama_cpp.Llama(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                           type_k=0, type_v=0, logits_all=True, verbose=False)


def profile(model, n_new: int, top: int = 14) -> str:
    """cProfile of one glassllm decode on 1 thread: the functions with most own time."""
    with cpu.use_threads(1):
        prof = cProfile.Profile()
        prof.enable()
        glassllm_decode(model, n_new)
        prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def measure_cell(model, path: str, threads: int, args) -> dict:
    """One cell (model, type, threads): both sides, interleaved, `args.repeats` times."""
    llm = open_llama(path, threads, model.cfg.max_len)
    ours, theirs, same = [], [], True
    with cpu.use_threads(threads):
        glassllm_decode(model, 8)  # warm-up: numba's first calls, the allocator, the caches
        llamacpp_decode(llm, 8)
        for _ in range(args.repeats):
            a, seconds = glassllm_decode(model, args.new)
            ours.append((args.new - 1) / seconds)
            b, seconds = llamacpp_decode(llm, args.new)
            theirs.append((args.new - 1) / seconds)
            same = same and a == b
    return dict(ours=float(np.median(ours)), theirs=float(np.median(theirs)), same=same)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["stories260K", "S", "M"])
    parser.add_argument("--types", nargs="+", default=["f32", "q8_0"])
    parser.add_argument("--threads", nargs="+", type=int,
                        default=sorted({1, len(cpu.available_cpus())}))
    parser.add_argument("--new", type=int, default=200, help="tokens to decode (default 200)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true",
                        help="also print a cProfile of one glassllm decode per model")
    common.add_load_arguments(parser)
    args = parser.parse_args()
    print(f"at start: {cpu.measure_load(1.0)}; uptime: {os.getloadavg()}")
    print(f"{'model':12} {'type':5} {'thr':>3} {'glassllm tok/s':>15} {'llama.cpp tok/s':>16} "
          f"{'glassllm/llama.cpp':>19}  same tokens  load (other cores)")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model, tok = build(name)
            if args.new + 1 > model.cfg.max_len:
                raise SystemExit(f"--new {args.new}: {name} holds at most "
                                 f"{model.cfg.max_len - 1} new tokens")
            for kind in args.types:
                path = os.path.join(tmp, f"{name}-{kind}.gguf")
                gguf_write.write_gguf(model, path, tok, type=kind)
                ours_model = read_gguf(path)[0]
                for threads in args.threads:
                    cell, load = common.measure_quietly(
                        lambda: measure_cell(ours_model, path, threads, args), args,
                        f"{name} {kind} {threads}")
                    print(f"{name:12} {kind:5} {threads:3d} {cell['ours']:15,.0f} "
                          f"{cell['theirs']:16,.0f} {cell['ours'] / cell['theirs']:19.3f}  "
                          f"{'yes' if cell['same'] else 'no':11}  {common.load_text(load)}",
                          flush=True)
            if args.profile:
                print(profile(model, args.new))
    print(f"at end: uptime {os.getloadavg()}")


if __name__ == "__main__":
    main()
