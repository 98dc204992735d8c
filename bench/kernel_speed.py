"""Where the elementwise time goes: each compiled kernel's memory traffic against the
machine's measured copy bandwidth, the NumPy form beside it, and the M training step's MFU
against the measured GEMM peak.

    python bench/kernel_speed.py                 # every kernel at the M config's shapes
    python bench/kernel_speed.py --json out.json

Copy bandwidth: a 256 MiB float32 copy (far past every cache), counted as read + write bytes,
on the thread count the library computes with (the pool of `glassllm.engine.parallel`, one
slice per thread): the ceiling an elementwise kernel can reach from memory. A kernel's GB/s =
the bytes it must read and write at least (its inputs once, its outputs once) / its best time.
Each kernel, its NumPy form and the copy are timed in turn within each of `--repeats` rounds
(`peak.interleaved_best`), best of the rounds each: on a busy machine a load that comes and goes
slows the three alike, so "% of copy" (the kernel's GB/s over the copy's in the same rounds)
holds where separate runs would not. Shapes are the M config's (d_model 384, 6 heads, T 256,
B 8, d_ff 1024): activations of 2048 rows; the working sets (4-50 MB) partly stay in cache,
so a kernel can pass 100%. MFU: one M training step's FLOPs (common.train_flops_per_token) per
second over bench/peak.py's best float32 GEMM.

Every figure is printed with the load of other processes while it ran.
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import argparse
import json

import numpy as np

from glassllm import functional as F
from glassllm.engine import compiled, cpu, ops, parallel

import peak  # noqa: E402  (bench/: the best-of-n timer)


def best_seconds(fn, repeats: int) -> float:
    fn()  # a first call compiles the kernel; peak's own warm-up then takes the page faults
    return peak.best_seconds(fn, repeats)


def cases(rng):
    """(name, compiled call, NumPy-form call, bytes moved) at the M config's shapes."""
    N, C, FF, V = 8 * 256, 384, 1024, 256
    f32 = np.float32
    x, w, b = (rng.standard_normal((N, C)).astype(f32), rng.standard_normal(C).astype(f32),
               rng.standard_normal(C).astype(f32))
    g, u = rng.standard_normal((2, N, FF)).astype(f32)
    q = rng.standard_normal((8, 256, 6, 64)).astype(f32)
    cos, sin = F.rope_tables(256, 64)
    scores = rng.standard_normal((8, 2, 3 * 64, 256)).astype(f32)  # one query block's rows
    logits, targets = rng.standard_normal((N, V)).astype(f32), rng.integers(0, V, N)
    # each form's backward on what its own forward saved (the compiled form keeps the rows'
    # exps and their scale: the normalizing pass moved into the backward)
    # (its row scales set to 1 here: repeated calls would otherwise shrink the rows towards
    # subnormals; the same work per call)
    exps, checked, _ = compiled.cross_entropy_forward(logits.copy(), targets)[1]
    saved_fast = exps, checked, np.ones(N)
    saved_numpy = ops.cross_entropy_forward(logits, targets)[1]
    scratch = logits.copy()
    n_params = 10_000_000
    p, grad = rng.standard_normal((2, n_params)).astype(f32)
    m, v = np.zeros(n_params, f32), np.zeros(n_params, f32)
    rms = compiled.rms_norm_forward(x, w, 1e-5)[1]
    ln = compiled.layer_norm_forward(x, w, b, 1e-5)[1]
    sw = compiled.swiglu_forward(g, u)[1]
    ge = compiled.gelu_forward(g)[1]
    adam = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, step=3)
    a = x.nbytes  # one (N, C) activation
    h = g.nbytes  # one (N, d_ff) activation
    return [
        ("rms_norm fwd", lambda: compiled.rms_norm_forward(x, w, 1e-5),
         lambda: ops.rms_norm_forward(x, w, 1e-5), 3 * a),  # x in; y, xhat out
        ("rms_norm bwd", lambda: compiled.rms_norm_backward(x, rms),
         lambda: ops.rms_norm_backward(x, rms), 3 * a),  # dy, xhat in; dx out
        ("layer_norm fwd", lambda: compiled.layer_norm_forward(x, w, b, 1e-5),
         lambda: ops.layer_norm_forward(x, w, b, 1e-5), 3 * a),
        ("layer_norm bwd", lambda: compiled.layer_norm_backward(x, ln),
         lambda: ops.layer_norm_backward(x, ln), 3 * a),
        ("swiglu fwd", lambda: compiled.swiglu_forward(g, u),
         lambda: ops.swiglu_forward(g, u), 4 * h),  # gate, up in; s, y out
        ("swiglu bwd", lambda: compiled.swiglu_backward(g, sw),
         lambda: ops.swiglu_backward(g, sw), 6 * h),  # dy, gate, up, s in; 2 out
        ("gelu fwd", lambda: compiled.gelu_forward(g), lambda: ops.gelu_forward(g), 3 * h),
        ("gelu bwd", lambda: compiled.gelu_backward(g, ge),
         lambda: ops.gelu_backward(g, ge), 4 * h),
        ("rope fwd", lambda: compiled.rope_forward(q, cos, sin),
         lambda: ops.rope_forward(q, cos, sin), 2 * q.nbytes),
        ("softmax (attention rows)", lambda: compiled.softmax_rows_inplace(scores),
         lambda: ops.softmax_rows_inplace(scores), 2 * scores.nbytes),
        ("cross_entropy fwd", lambda: compiled.cross_entropy_forward(logits, targets),
         lambda: ops.cross_entropy_forward(logits, targets), 2 * logits.nbytes),  # z in, p out
        # as GlassLM.loss runs it: the probabilities in the logits' own buffer (repeated calls
        # take softmaxes of softmaxes: values in [0, 1], the same work)
        ("cross_entropy fwd in place",
         lambda: compiled.cross_entropy_forward(scratch, targets, True),
         lambda: ops.cross_entropy_forward(scratch, targets, True), 2 * logits.nbytes),
        # in place on the saved buffer (dloss = N: scale 1, the buffer keeps its values in [0, 1])
        ("cross_entropy bwd", lambda: compiled.cross_entropy_backward(float(N), saved_fast),
         lambda: ops.cross_entropy_backward(float(N), saved_numpy), 2 * logits.nbytes),
        ("adamw (10M params)", lambda: compiled.adamw_update(p, grad, m, v, **adam),
         lambda: ops_adamw(p, grad, m, v, adam), 7 * p.nbytes),  # p, g, m, v in; p, m, v out
    ]


def kernel_table(repeats: int) -> list[dict]:
    """Each case's compiled form, NumPy form and the 256 MiB copy timed in turn (interleaved,
    best of `repeats` rounds); prints and returns one row per kernel."""
    copy, copy_bytes = peak.copy_pass()
    print(f"{'kernel':26} {'MB':>6} {'numba GB/s':>10} {'% of copy':>9} {'NumPy GB/s':>10} "
          f"{'% of copy':>9} {'copy GB/s':>9} {'numba ms':>9} {'NumPy ms':>9}")
    rows = []
    for name, fast, numpy_form, nbytes in cases(np.random.default_rng(0)):
        t_fast, t_numpy, t_copy = peak.interleaved_best([fast, numpy_form, copy], repeats)
        row = dict(kernel=name, bytes=nbytes, numba_s=t_fast, numpy_s=t_numpy,
                   numba_gbs=nbytes / t_fast / 1e9, numpy_gbs=nbytes / t_numpy / 1e9,
                   copy_gbs=copy_bytes / t_copy / 1e9)
        rows.append(row)
        print(f"{name:26} {nbytes / 1e6:6.1f} {row['numba_gbs']:10.1f} "
              f"{row['numba_gbs'] / row['copy_gbs']:9.0%} {row['numpy_gbs']:10.1f} "
              f"{row['numpy_gbs'] / row['copy_gbs']:9.0%} {row['copy_gbs']:9.1f} "
              f"{t_fast * 1e3:9.2f} {t_numpy * 1e3:9.2f}")
    return rows


def ops_adamw(p, g, m, v, settings):
    from glassllm.engine import optimizer
    optimizer.adamw_update(p, g, m, v, **settings)


def m_step_mfu(peak_gflops: float, repeats: int) -> tuple[float, float]:
    """(seconds per M training step, MFU) through the plain Python API."""
    from glassllm.model import Config, GlassLM
    from glassllm.optim import AdamW, clip_grad_norm
    spec = common.CONFIGS["M"]
    cfg = Config(**spec["model"])
    B, T = spec["batch"], spec["seq"]
    model = GlassLM(cfg, seed=0)
    params = model.parameters()
    opt = AdamW(params, lr=1e-3)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (B, T + 1))

    def step():
        loss = model.loss(ids[:, :-1], ids[:, 1:])
        opt.zero_grad()
        loss.backward()
        clip_grad_norm(params, 1.0)
        opt.step()

    seconds = best_seconds(step, repeats)
    flops = common.train_flops_per_token(cfg, T) * B * T
    return seconds, flops / seconds / 1e9 / peak_gflops


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, help="default: as the library chooses")
    parser.add_argument("--no-mfu", action="store_true", help="skip the M step and GEMM peak")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if args.threads:
        cpu.set_default_threads(args.threads)
    threads, why = (args.threads, "as requested") if args.threads else cpu.apply_default_threads()
    print(common.blas_report())
    print(f"threads: {threads} ({why})")
    meter = cpu.LoadMeter()
    rows = kernel_table(args.repeats)
    print(f"\nat >= 50% of copy: {sum(r['numba_gbs'] >= r['copy_gbs'] / 2 for r in rows)} "
          f"of {len(rows)}")
    result = dict(threads=threads, kernels=rows)
    if not args.no_mfu:
        gflops = peak.measure_peak((1024, 2048), repeats=5)
        seconds, mfu = m_step_mfu(gflops, max(3, args.repeats // 3))
        result.update(gemm_peak_gflops=gflops, m_step_s=seconds, m_mfu=mfu)
        print(f"\nM training step {seconds:.3f} s; GEMM peak {gflops:.1f} GFLOP/s; MFU {mfu:.1%}")
    load = meter.read()
    result["other_load_cores"] = load.other_cores
    print(f"\n{load}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
