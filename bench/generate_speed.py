"""Generation speed: greedy decoding with a KV cache, glassllm vs PyTorch, same weights.

    python bench/generate_speed.py                  # S and M (batch 1)
    python bench/generate_speed.py --config M --require-quiet --markdown   # one quiet row
    python bench/generate_speed.py --config S --repeats 1

Each run decodes 200 new tokens greedily from a 16-token prompt: one prefill forward of the
prompt, then one forward of a single position per token against a preallocated KV cache.
glassllm runs its public `glassllm.generate.generate` (temperature 0); torch runs
tests/torch_reference.py's twin (the parity tests' model) with its preallocated cache under
torch.inference_mode(). Runs alternate glassllm/torch; tokens/s = 200 / seconds (prefill
included), median over `--repeats`. Before timing, both sides' logits on a probe batch must
agree within 1e-5 (relative); after it, both must have produced the same tokens; otherwise
the bench exits non-zero. A third side, torch.compile (inductor, dynamic shapes) of the same
twin, is timed in the same rounds, its compile time (the first run) reported apart;
`--no-compile` skips it. Each row records the load of other processes during its runs;
`--require-quiet` refuses to report a figure from a busy machine (see bench/train_speed.py).
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import argparse
import time

import numpy as np

from glassllm.engine import cpu
from glassllm.generate import Sampling, generate
from glassllm.model import Config


def torch_greedy(model, prompt: np.ndarray, n_new: int) -> list[int]:
    import torch
    from torch_reference import TorchKVCache
    cache = TorchKVCache(model.cfg, batch_size=1)
    out = []
    with torch.inference_mode():
        logits = model(torch.from_numpy(prompt[None, :]), cache)
        for _ in range(n_new):
            token = int(torch.argmax(logits[0, -1]))
            out.append(token)
            logits = model(torch.tensor([[token]]), cache)
    return out


def compiled_twin(cfg, prompt, n_new):
    """(the torch twin with forward = torch.compile(forward, inductor, dynamic shapes), compile
    seconds: its first greedy run), or (None, why) where it does not run here."""
    import torch
    try:
        _, tmodel = common.build_pair(cfg)
        tmodel.forward = torch.compile(tmodel.forward, backend="inductor", dynamic=True)
        start = time.perf_counter()
        torch_greedy(tmodel, prompt, n_new)
        return tmodel, time.perf_counter() - start
    except Exception as error:  # no C++ compiler, an op inductor cannot take: say why
        return None, f"{type(error).__name__}: {str(error).splitlines()[0][:80]}"


def bench_config(name: str, n_prompt: int, n_new: int, repeats: int,
                 compile_torch: bool = True) -> dict:
    cfg = Config(**common.CONFIGS[name]["model"])
    if n_prompt + n_new > cfg.max_len:
        raise ValueError(f"{name}: {n_prompt}+{n_new} tokens exceed max_len {cfg.max_len}")
    model, tmodel = common.build_pair(cfg)  # exits unless the logits agree
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, n_prompt)
    greedy = Sampling(temperature=0)
    cmodel, compile_s = compiled_twin(cfg, prompt, n_new) if compile_torch else (None, "off")
    g_times, t_times, c_times = [], [], []
    for i in range(repeats + 1):  # the first round warms both up and is not timed
        t0 = time.perf_counter()
        g_tokens = generate(model, prompt, n_new, greedy)
        t1 = time.perf_counter()
        t_tokens = torch_greedy(tmodel, prompt, n_new)
        t2 = time.perf_counter()
        if cmodel is not None:
            torch_greedy(cmodel, prompt, n_new)
        t3 = time.perf_counter()
        if i:
            g_times.append(t1 - t0)
            t_times.append(t2 - t1)
            c_times.append(t3 - t2)
    differ = next((i for i, (a, b) in enumerate(zip(g_tokens, t_tokens)) if a != b), None)
    if differ is not None or len(g_tokens) != len(t_tokens):
        raise SystemExit(f"{name}: not the same model: the greedy tokens differ from new token "
                         f"#{differ} (glassllm {g_tokens[differ:differ + 5]}, torch "
                         f"{t_tokens[differ:differ + 5]})")
    g_med, t_med = common.median(g_times), common.median(t_times)
    compiled = (dict(compile_tok_s=n_new / common.median(c_times), compile_s=compile_s)
                if cmodel is not None else dict(compile_s=compile_s))
    return dict(config=name, glassllm_tok_s=n_new / g_med, torch_tok_s=n_new / t_med,
                ratio=t_med / g_med, glassllm_s=g_times, torch_s=t_times, **compiled)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", choices=list(common.CONFIGS), default=["S", "M"])
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, help="threads per side (default: all cores)")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip the torch.compile (inductor) column")
    parser.add_argument("--markdown", action="store_true",
                        help="also print the rows as the table rows of docs/performance.md")
    common.add_load_arguments(parser)
    args = parser.parse_args()
    threads = common.set_threads(args.threads)
    print(common.blas_report())
    print(f"at start: {cpu.measure_load(1.0)}")
    print(f"\ngreedy, batch 1, {args.prompt}-token prompt, {args.new} new tokens, "
          f"median of {args.repeats}, {threads} threads; both sides gave the same tokens")
    print(f"{'config':6} {'glassllm tok/s':>14} {'torch tok/s':>12} {'ratio':>6} "
          f"{'other load':>10}")
    rows = []
    for name in args.config:
        r, load = common.measure_quietly(
            lambda: bench_config(name, args.prompt, args.new, args.repeats,
                                 not args.no_compile), args, name)
        r["other_load_cores"] = load.other_cores
        rows.append(r)
        print(f"{name:6} {r['glassllm_tok_s']:14.1f} {r['torch_tok_s']:12.1f} "
              f"{r['ratio']:6.2f} {common.load_text(load):>10}", flush=True)
        if "compile_tok_s" in r:
            print(f"{name:6} torch.compile {r['compile_tok_s']:.1f} tok/s (glassllm / compiled "
                  f"{r['glassllm_tok_s'] / r['compile_tok_s']:.2f}); compile "
                  f"{r['compile_s']:.1f} s", flush=True)
        else:
            print(f"{name:6} torch.compile not run ({r['compile_s']})", flush=True)
    if args.markdown:
        for r in rows:
            load = "unknown" if r["other_load_cores"] is None else f"{r['other_load_cores']:.2f}"
            print(f"| {r['config']}, vs torch | {r['glassllm_tok_s']:.0f} | {r['torch_tok_s']:.0f} | "
                  f"{r['ratio']:.2f} | {load} |")


if __name__ == "__main__":
    main()
