"""Training speed: glassllm vs PyTorch eager, same model, same weights, same batches.

    python bench/train_speed.py                       # S, M, L; timing + memory
    python bench/train_speed.py --config S --steps 5 --no-memory   # a cheap check

One training step = forward, mean cross-entropy, zero grads, backward, clip the global grad
norm to 1, AdamW (betas 0.9/0.95, decay 0.1 on matrices only). Both sides float32 on all
cores. Steps are interleaved glassllm/torch/glassllm/torch in one process, so a noisy
machine slows both alike; the ratio is the median glassllm tokens/s over the median torch
tokens/s after warm-up steps. MFU = achieved FLOP/s (common.train_flops_per_token) over the
best float32 matmul GFLOP/s either library reaches on this machine (bench/peak.py), measured
at the start of the run. Peak memory is measured in a fresh subprocess per side and config,
so one side's buffers never count for the other.
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import argparse
import gc
import json
import os
import sys
import time

import numpy as np

from glassllm.model import Config, GlassLM
from glassllm.optim import AdamW, clip_grad_norm

DEFAULT_STEPS = {"S": 7, "M": 7, "L": 5}
DEFAULT_WARMUP = {"S": 2, "M": 2, "L": 1}


def make_batches(cfg: Config, batch: int, seq: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [(lambda t: (t[:, :-1], t[:, 1:]))(rng.integers(0, cfg.vocab_size, (batch, seq + 1)))
            for _ in range(n)]


def glassllm_stepper(model: GlassLM, lr: float = 1e-3):
    params = model.parameters()
    opt = AdamW(params, lr=lr)

    def step(x, y) -> float:
        loss = model.loss(x, y)
        opt.zero_grad()
        loss.backward()
        clip_grad_norm(params, 1.0)
        opt.step()
        return loss.item()

    return step


def torch_stepper(model, lr: float = 1e-3):
    import torch
    import torch.nn.functional as F
    from torch_lm import torch_adamw
    opt = torch_adamw(model, lr)
    params = list(model.parameters())

    def step(x, y) -> float:
        logits = model(torch.from_numpy(x))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                               torch.from_numpy(y).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.item()

    return step


def torch_model_class(impl: str):
    """(class, loader) of the torch side: "sdpa" is bench/torch_lm.py, written as a PyTorch user
    would (fused scaled_dot_product_attention); "reference" is tests/torch_reference.py, the
    parity tests' model (explicit masked softmax, repeat_interleave of KV heads)."""
    if impl == "sdpa":
        from torch_lm import BenchTorchLM, load_glassllm_state
        return BenchTorchLM, load_glassllm_state
    sys.path.insert(0, os.path.join(common.REPO, "tests"))
    from torch_reference import TorchLM, load_glassllm_state
    return TorchLM, load_glassllm_state


def build_pair(cfg: Config, impl: str):
    """glassllm model and a torch model holding the same weights."""
    cls, load = torch_model_class(impl)
    model = GlassLM(cfg, seed=0)
    tmodel = cls(cfg.to_dict())
    load(tmodel, model.state_dict())
    return model, tmodel


def time_config(name: str, steps: int, warmup: int, peak_gflops: float, impl: str,
                clock=time.perf_counter) -> dict:
    spec = common.CONFIGS[name]
    cfg = Config(**spec["model"])
    B, T = spec["batch"], spec["seq"]
    model, tmodel = build_pair(cfg, impl)
    g_step, t_step = glassllm_stepper(model), torch_stepper(tmodel)
    batches = make_batches(cfg, B, T, warmup + steps)
    g_times, t_times, g_losses, t_losses = [], [], [], []
    for i, (x, y) in enumerate(batches):  # A/B/A/B: same batch, same moment, both sides
        gc.collect()
        t0 = clock()
        g_losses.append(g_step(x, y))
        t1 = clock()
        t_losses.append(t_step(x, y))
        t2 = clock()
        if i >= warmup:
            g_times.append(t1 - t0)
            t_times.append(t2 - t1)
    if abs(g_losses[0] - t_losses[0]) > 1e-4 * max(1.0, abs(t_losses[0])):
        raise RuntimeError(f"{name}: first losses differ: glassllm {g_losses[0]} vs "
                           f"torch {t_losses[0]} -- not the same model")
    tokens = B * T
    flops = common.train_flops_per_token(cfg, T) * tokens
    g_med, t_med = common.median(g_times), common.median(t_times)
    return dict(config=name, tokens_per_step=tokens, steps=steps, warmup=warmup,
                glassllm_tok_s=tokens / g_med, torch_tok_s=tokens / t_med,
                ratio=t_med / g_med,
                glassllm_mfu=flops / g_med / 1e9 / peak_gflops,
                torch_mfu=flops / t_med / 1e9 / peak_gflops,
                glassllm_step_s=g_times, torch_step_s=t_times,
                loss_first=(g_losses[0], t_losses[0]), loss_last=(g_losses[-1], t_losses[-1]))


def memory_child(side: str, name: str, steps: int, impl: str) -> None:
    """Run in a fresh process: a few training steps of one side; print peak RSS as JSON."""
    spec = common.CONFIGS[name]
    cfg = Config(**spec["model"])
    if side == "torch":
        import torch  # noqa: F401  (imported before the baseline: library code is not data)
        cls, _ = torch_model_class(impl)  # own init: copying weights would add a peak
        common.set_threads()
        torch.ones(64, 64) @ torch.ones(64, 64)  # MKL's thread buffers are library, not data
        base = common.current_rss_mib()
        model = cls(cfg.to_dict())
        step = torch_stepper(model)
    else:
        np.ones((64, 64), np.float32) @ np.ones((64, 64), np.float32)  # OpenBLAS buffers
        base = common.current_rss_mib()
        model = GlassLM(cfg, seed=0)
        step = glassllm_stepper(model)
    for x, y in make_batches(cfg, spec["batch"], spec["seq"], steps):
        step(x, y)
    peak = common.peak_rss_mib()
    print(json.dumps(dict(side=side, config=name, peak_rss_mib=peak, base_rss_mib=base,
                          working_mib=peak - base)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", choices=sorted(common.CONFIGS),
                        default=["S", "M", "L"])
    parser.add_argument("--steps", type=int, help="timed steps per side (default S,M 7; L 5)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default S,M 2; L 1)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--memory-steps", type=int, default=2)
    parser.add_argument("--peak", type=float, help="matmul peak GFLOP/s (default: measure)")
    parser.add_argument("--torch-impl", choices=["sdpa", "reference"], default="sdpa",
                        help="torch side: bench/torch_lm.py (default) or tests/torch_reference.py")
    parser.add_argument("--threads", type=int,
                        help="threads per side (default: all cores; fewer only for profiling)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time steps with this process's CPU clock instead of the wall "
                             "clock: with --threads 1 a busy machine disturbs it far less")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--memory-child", choices=["glassllm", "torch"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.config[0], args.memory_steps, args.torch_impl)
        return
    threads = common.set_threads(args.threads)
    print(common.blas_report())
    if args.peak is None:
        from peak import measure_peak
        args.peak = measure_peak((1024, 2048), repeats=5)
    print(f"torch side: {args.torch_impl}; clock: {'CPU' if args.cpu_time else 'wall'}")
    print(f"threads {threads}; matmul peak {args.peak:.1f} GFLOP/s (float32, best of both)\n")
    rows = []
    for name in args.config:
        steps = args.steps or DEFAULT_STEPS[name]
        warmup = DEFAULT_WARMUP[name] if args.warmup is None else args.warmup
        clock = time.process_time if args.cpu_time else time.perf_counter
        row = time_config(name, steps, warmup, args.peak, args.torch_impl, clock)
        if not args.no_memory:
            for side in ("glassllm", "torch"):
                mem = common.run_child(["--memory-child", side, "--config", name,
                                        "--torch-impl", args.torch_impl,
                                        "--memory-steps", str(args.memory_steps)])
                row[f"{side}_peak_mib"] = mem["peak_rss_mib"]
                row[f"{side}_working_mib"] = mem["working_mib"]
        rows.append(row)
        print_row(row)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(peak_gflops=args.peak, rows=rows), f, indent=1)


def print_row(r):
    g = ", ".join(f"{t:.3f}" for t in r["glassllm_step_s"])
    t = ", ".join(f"{t:.3f}" for t in r["torch_step_s"])
    print(f"[{r['config']}] step seconds glassllm: {g}\n[{r['config']}] step seconds torch:    {t}")
    print(f"[{r['config']}] loss first {r['loss_first'][0]:.5f} / {r['loss_first'][1]:.5f}, "
          f"last {r['loss_last'][0]:.5f} / {r['loss_last'][1]:.5f} (glassllm / torch)")


def print_table(rows):
    print(f"\n{'config':6} {'glassllm tok/s':>14} {'torch tok/s':>12} {'ratio':>6} "
          f"{'MFU glass':>9} {'MFU torch':>9} {'peak MiB glass/torch':>21} "
          f"{'working MiB glass/torch':>24}")
    for r in rows:
        mem = work = ""
        if "glassllm_peak_mib" in r:
            mem = f"{r['glassllm_peak_mib']:.0f} / {r['torch_peak_mib']:.0f}"
            work = f"{r['glassllm_working_mib']:.0f} / {r['torch_working_mib']:.0f}"
        print(f"{r['config']:6} {r['glassllm_tok_s']:14.0f} {r['torch_tok_s']:12.0f} "
              f"{r['ratio']:6.2f} {r['glassllm_mfu']:9.1%} {r['torch_mfu']:9.1%} "
              f"{mem:>21} {work:>24}")


if __name__ == "__main__":
    main()
