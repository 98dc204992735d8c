"""Training speed: glassllm vs PyTorch eager, same model, same weights, same batches.

    python bench/train_speed.py                       # S64, S, M, L; timing + memory
    python bench/train_speed.py --config M --require-quiet --markdown   # one quiet table row
    python bench/train_speed.py --config S --steps 5 --no-memory   # a cheap check

Third column: torch.compile (inductor, CPU) of the same torch twin, timed in the same
interleaved loop, its compile time (the first call) reported apart; `--no-compile` skips it.

One training step = forward, mean cross-entropy, zero grads, backward, clip the global grad
norm to 1, AdamW (betas 0.9/0.95, decay 0.1 on matrices only). Both sides float32 on all
cores. The torch side is tests/torch_reference.py, the parity tests' twin, loaded with the
same weights; before timing, both sides' logits on a probe batch must agree within 1e-5
(relative), or the bench exits non-zero. Steps are interleaved glassllm/torch/glassllm/torch
in one process, so a noisy machine slows both alike; the ratio is the median glassllm
tokens/s over the median torch tokens/s after warm-up steps. MFU = achieved FLOP/s
(common.train_flops_per_token) over the best float32 matmul GFLOP/s either library reaches
on this machine (bench/peak.py), measured at the start of the run. Peak memory is measured
in a fresh subprocess per side and config, so one side's buffers never count for the other.

Every row records the load of other processes during its timed steps (`glassllm.engine.cpu`:
/proc/stat busy time of this process's CPUs minus this process's own CPU time), in cores.
`--require-quiet` waits for a quiet machine first, measures again when the run was
disturbed, and exits non-zero instead of reporting a figure from a busy machine.
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import argparse
import gc
import json
import time

import numpy as np

from glassllm.engine import cpu
from glassllm.model import Config, GlassLM
from glassllm.optim import AdamW, clip_grad_norm

DEFAULT_STEPS = {"S64": 7, "S": 7, "M": 7, "L": 5}
DEFAULT_WARMUP = {"S64": 2, "S": 2, "M": 2, "L": 1}


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


def torch_stepper(model, lr: float = 1e-3, device: str = "cpu"):
    """The same step on the torch twin (on `device`: the batch is moved there first; bench/
    gpu_speed.py's CUDA side)."""
    import torch
    import torch.nn.functional as F
    from torch_reference import torch_adamw
    opt = torch_adamw(model, lr)
    params = list(model.parameters())

    def step(x, y) -> float:
        tx, ty = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)  # cpu: itself
        logits = model(tx)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ty.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.item()

    return step


def compiled_stepper(cfg: Config, batch, lr: float = 1e-3):
    """(step, compile seconds) of torch.compile (inductor, CPU) of the torch twin with the same
    weights, or (None, reason) where it does not run here. The compile time is the first
    step's (tracing, inductor's C++ build) minus nothing: reported apart, never timed as a
    step."""
    import torch
    try:
        _, tmodel = common.build_pair(cfg)
        tmodel.forward = torch.compile(tmodel.forward, backend="inductor")
        step = torch_stepper(tmodel, lr)
        start = time.perf_counter()
        step(*batch)
        return step, time.perf_counter() - start
    except Exception as error:  # no C++ compiler, unsupported op: the column says why
        return None, f"{type(error).__name__}: {str(error).splitlines()[0][:80]}"


def time_config(name: str, steps: int, warmup: int, peak_gflops: float,
                clock=time.perf_counter, compile_torch: bool = True) -> dict:
    spec = common.CONFIGS[name]
    cfg = Config(**spec["model"])
    B, T = spec["batch"], spec["seq"]
    model, tmodel = common.build_pair(cfg)  # exits unless the logits agree
    g_step, t_step = glassllm_stepper(model), torch_stepper(tmodel)
    batches = make_batches(cfg, B, T, warmup + steps)
    c_step, compile_s = compiled_stepper(cfg, batches[0]) if compile_torch else (None, "off")
    g_times, t_times, c_times, g_losses, t_losses = [], [], [], [], []
    for i, (x, y) in enumerate(batches):  # A/B/C/A/B/C: same batch, same moment, every side
        gc.collect()
        t0 = clock()
        g_losses.append(g_step(x, y))
        t1 = clock()
        t_losses.append(t_step(x, y))
        t2 = clock()
        if c_step is not None:
            c_step(x, y)
        t3 = clock()
        if i >= warmup:
            g_times.append(t1 - t0)
            t_times.append(t2 - t1)
            c_times.append(t3 - t2)
    tokens = B * T
    flops = common.train_flops_per_token(cfg, T) * tokens
    g_med, t_med = common.median(g_times), common.median(t_times)
    compiled = dict(compile_tok_s=tokens / common.median(c_times), compile_s=compile_s,
                    compile_step_s=c_times) if c_step is not None else dict(compile_s=compile_s)
    return dict(config=name, tokens_per_step=tokens, steps=steps, warmup=warmup, **compiled,
                glassllm_tok_s=tokens / g_med, torch_tok_s=tokens / t_med,
                ratio=t_med / g_med,
                glassllm_mfu=flops / g_med / 1e9 / peak_gflops,
                torch_mfu=flops / t_med / 1e9 / peak_gflops,
                glassllm_step_s=g_times, torch_step_s=t_times,
                loss_first=(g_losses[0], t_losses[0]), loss_last=(g_losses[-1], t_losses[-1]))


def memory_child(side: str, name: str, steps: int) -> None:
    """Run in a fresh process: a few training steps of one side; print peak RSS as JSON."""
    spec = common.CONFIGS[name]
    cfg = Config(**spec["model"])
    if side == "torch":
        import torch  # noqa: F401  (imported before the baseline: library code is not data)
        from torch_reference import TorchLM  # own init: copying weights would add a peak
        common.set_threads()
        torch.ones(64, 64) @ torch.ones(64, 64)  # MKL's thread buffers are library, not data
        base = common.current_rss_mib()
        model = TorchLM(cfg.to_dict())
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
    parser.add_argument("--config", nargs="+", choices=list(common.CONFIGS),
                        default=list(common.CONFIGS))
    parser.add_argument("--steps", type=int, help="timed steps per side (default 7; L 5)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 2; L 1)")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--memory-steps", type=int, default=2)
    parser.add_argument("--peak", type=float, help="matmul peak GFLOP/s (default: measure)")
    parser.add_argument("--threads", type=int,
                        help="threads per side (default: all cores; fewer only for profiling)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time steps with this process's CPU clock instead of the wall "
                             "clock: with --threads 1 a busy machine disturbs it far less")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip the torch.compile (inductor) column (its first compile "
                             "takes minutes)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--markdown", action="store_true",
                        help="also print the rows as the table rows of docs/performance.md")
    common.add_load_arguments(parser)
    parser.add_argument("--memory-child", choices=["glassllm", "torch"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.config[0], args.memory_steps)
        return
    threads = common.set_threads(args.threads)
    print(common.blas_report())
    print(f"at start: {cpu.measure_load(1.0)}")
    if args.peak is None:
        from peak import measure_peak
        args.peak = measure_peak((1024, 2048), repeats=5)
    print(f"torch side: tests/torch_reference.py; clock: {'CPU' if args.cpu_time else 'wall'}")
    print(f"threads {threads}; matmul peak {args.peak:.1f} GFLOP/s (float32, best of both)\n")
    rows = []
    for name in args.config:
        steps = args.steps or DEFAULT_STEPS[name]
        warmup = DEFAULT_WARMUP[name] if args.warmup is None else args.warmup
        clock = time.process_time if args.cpu_time else time.perf_counter
        row, load = common.measure_quietly(
            lambda: time_config(name, steps, warmup, args.peak, clock, not args.no_compile),
            args, name)
        row["other_load_cores"] = load.other_cores
        row["threads"] = threads
        if not args.no_memory:
            for side in ("glassllm", "torch"):
                mem = common.run_child(["--memory-child", side, "--config", name,
                                        "--memory-steps", str(args.memory_steps)])
                row[f"{side}_peak_mib"] = mem["peak_rss_mib"]
                row[f"{side}_working_mib"] = mem["working_mib"]
        rows.append(row)
        print_row(row)
    print_table(rows)
    if args.markdown:
        print_markdown(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(peak_gflops=args.peak, rows=rows), f, indent=1)


def print_row(r):
    g = ", ".join(f"{t:.3f}" for t in r["glassllm_step_s"])
    t = ", ".join(f"{t:.3f}" for t in r["torch_step_s"])
    print(f"[{r['config']}] step seconds glassllm: {g}\n[{r['config']}] step seconds torch:    {t}")
    print(f"[{r['config']}] loss first {r['loss_first'][0]:.5f} / {r['loss_first'][1]:.5f}, "
          f"last {r['loss_last'][0]:.5f} / {r['loss_last'][1]:.5f} (glassllm / torch)")
    print(f"[{r['config']}] other processes used {_load(r)} cores during the timed steps")
    print(f"[{r['config']}] torch.compile: {_compiled(r)}")


def _compiled(r) -> str:
    if "compile_tok_s" not in r:
        return f"not run ({r.get('compile_s')})"
    return (f"{r['compile_tok_s']:.0f} tok/s, glassllm / compiled "
            f"{r['glassllm_tok_s'] / r['compile_tok_s']:.2f}; compile {r['compile_s']:.1f} s")


def _load(r) -> str:
    return "unknown" if r["other_load_cores"] is None else f"{r['other_load_cores']:.2f}"


def _memory_cells(r, missing: str) -> tuple[str, str]:
    """("peak glassllm / torch", "working glassllm / torch") in MiB, or `missing` twice when
    the run measured no memory (--no-memory)."""
    if "glassllm_peak_mib" not in r:
        return missing, missing
    return (f"{r['glassllm_peak_mib']:.0f} / {r['torch_peak_mib']:.0f}",
            f"{r['glassllm_working_mib']:.0f} / {r['torch_working_mib']:.0f}")


def print_table(rows):
    print(f"\n{'config':6} {'glassllm tok/s':>14} {'torch tok/s':>12} {'ratio':>6} "
          f"{'MFU glass':>9} {'MFU torch':>9} {'peak MiB glass/torch':>21} "
          f"{'working MiB glass/torch':>24} {'other load':>10}")
    for r in rows:
        mem, work = _memory_cells(r, missing="")
        print(f"{r['config']:6} {r['glassllm_tok_s']:14.0f} {r['torch_tok_s']:12.0f} "
              f"{r['ratio']:6.2f} {r['glassllm_mfu']:9.1%} {r['torch_mfu']:9.1%} "
              f"{mem:>21} {work:>24} {_load(r):>10}")


def print_markdown(rows):
    """The table rows of docs/performance.md (config | tok/s | ratio | MFU | memory | load of others)."""
    for r in rows:
        mem, work = _memory_cells(r, missing="-")
        print(f"| {r['config']} training | {r['glassllm_tok_s']:.0f} | {r['torch_tok_s']:.0f} | "
              f"{r['ratio']:.2f} | {r['glassllm_mfu']:.0%} | {r['torch_mfu']:.0%} | {mem} | "
              f"{work} | {_load(r)} |")


if __name__ == "__main__":
    main()
