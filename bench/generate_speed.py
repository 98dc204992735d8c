"""Generation speed: greedy decoding with a KV cache, glassllm vs PyTorch, same weights.

    python bench/generate_speed.py                  # S and M (batch 1)
    python bench/generate_speed.py --config S --repeats 1

Each run decodes 200 new tokens greedily from a 16-token prompt: one prefill forward of the
prompt, then one forward of a single position per token against a preallocated KV cache.
glassllm runs its public `glassllm.generate.generate` (temperature 0); torch runs
bench/torch_lm.py's model with its simple preallocated cache under torch.inference_mode().
Runs alternate glassllm/torch; tokens/s = 200 / seconds (prefill included), median over
`--repeats`. Both sides must produce the same tokens.
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import argparse
import time

import numpy as np

from glassllm.generate import Sampling, generate
from glassllm.model import Config, GlassLM


def torch_greedy(model, prompt: np.ndarray, n_new: int) -> list[int]:
    import torch
    from torch_lm import TorchKVCache
    cache = TorchKVCache(model.cfg, batch_size=1)
    out = []
    with torch.inference_mode():
        logits = model(torch.from_numpy(prompt[None, :]), cache)
        for _ in range(n_new):
            token = int(torch.argmax(logits[0, -1]))
            out.append(token)
            logits = model(torch.tensor([[token]]), cache)
    return out


def bench_config(name: str, n_prompt: int, n_new: int, repeats: int) -> dict:
    from torch_lm import BenchTorchLM, load_glassllm_state
    cfg = Config(**common.CONFIGS[name]["model"])
    if n_prompt + n_new > cfg.max_len:
        raise ValueError(f"{name}: {n_prompt}+{n_new} tokens exceed max_len {cfg.max_len}")
    model = GlassLM(cfg, seed=0)
    tmodel = BenchTorchLM(cfg.to_dict())
    load_glassllm_state(tmodel, model.state_dict())
    tmodel.eval()
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, n_prompt)
    greedy = Sampling(temperature=0)
    g_times, t_times = [], []
    for i in range(repeats + 1):  # the first round warms both up and is not timed
        t0 = time.perf_counter()
        g_tokens = generate(model, prompt, n_new, greedy)
        t1 = time.perf_counter()
        t_tokens = torch_greedy(tmodel, prompt, n_new)
        t2 = time.perf_counter()
        if i:
            g_times.append(t1 - t0)
            t_times.append(t2 - t1)
    agree = next((i for i, (a, b) in enumerate(zip(g_tokens, t_tokens)) if a != b), None)
    g_med, t_med = common.median(g_times), common.median(t_times)
    return dict(config=name, glassllm_tok_s=n_new / g_med, torch_tok_s=n_new / t_med,
                ratio=t_med / g_med, first_difference=agree, glassllm_s=g_times, torch_s=t_times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", choices=sorted(common.CONFIGS), default=["S", "M"])
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, help="threads per side (default: all cores)")
    args = parser.parse_args()
    common.set_threads(args.threads)
    print(common.blas_report())
    print(f"\ngreedy, batch 1, {args.prompt}-token prompt, {args.new} new tokens, "
          f"median of {args.repeats}")
    print(f"{'config':6} {'glassllm tok/s':>14} {'torch tok/s':>12} {'ratio':>6}  same tokens")
    for name in args.config:
        r = bench_config(name, args.prompt, args.new, args.repeats)
        same = "yes" if r["first_difference"] is None else f"no (from #{r['first_difference']})"
        print(f"{name:6} {r['glassllm_tok_s']:14.1f} {r['torch_tok_s']:12.1f} "
              f"{r['ratio']:6.2f}  {same}")


if __name__ == "__main__":
    main()
