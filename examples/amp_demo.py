"""Mixed precision and the skip path, in 20 steps (the demo of docs/mixed-precision.md).

Trains a small Llama-style byte model for 20 steps under float16 autocast with a GradScaler,
injects an inf into one gradient at step 5, and prints one line per step:

    STEP   4  loss 5.5093  |g| 1.96 -> 1.00  scale 65536
    SKIP   5  loss 5.4802  nonfinite_grad (|g| inf)  scale 32768   <- the scale halves

The skipped step leaves weights and AdamW moments untouched (checked at the end).

    python examples/amp_demo.py [--precision fp16|bf16] [--inject-step 5] [--csv steps.csv]

With --precision bf16 the scaler is off (bfloat16 has float32's range): the injected inf is
still caught and skipped, but there is no scale to halve. Exits 0 when a SKIP was printed and
the skipped step changed nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import sys

import numpy as np

from glassllm import Config, GlassLM, Tensor
from glassllm.optim import AdamW, lr_schedule
from glassllm.training.safety import StepCSVLog, TrainStep
from glassllm.tokenizers import ByteTokenizer
from glassllm.train import get_batch

TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife. However little known the feelings or views of such "
        "a man may be on his first entering a neighbourhood, this truth is so well fixed in the "
        "minds of the surrounding families, that he is considered the rightful property of some "
        "one or other of their daughters. ") * 8


class InjectInfGrad:
    """The model, except that on `inject_step` one weight's gradient comes back as inf.

    The loss value is unchanged (the injected node adds 0); only its backward is poisoned, as a
    float16 overflow in the backward pass would be.
    """

    def __init__(self, model: GlassLM, inject_step: int):
        self.model, self.inject_step, self.calls = model, inject_step, 0

    def loss(self, x, y):
        loss = self.model.loss(x, y)
        if self.calls == self.inject_step:
            w = self.model.blocks[0].mlp.up.weight
            poison = np.zeros_like(w.data)
            poison[0, 0] = np.inf
            loss = loss + Tensor.from_op(np.float32(0.0), (w,), lambda g: (poison,))
        self.calls += 1
        return loss


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=["fp16", "bf16"], default="fp16")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--inject-step", type=int, default=5)
    parser.add_argument("--csv", help="also write the per-step CSV log here")
    args = parser.parse_args(argv)

    data = ByteTokenizer().encode(TEXT)
    cfg = Config(vocab_size=257, d_model=64, n_layers=2, n_heads=4, max_len=64)
    model = GlassLM(cfg, seed=0)
    optimizer = AdamW(model.parameters(), lr=3e-3)
    train_step = TrainStep(InjectInfGrad(model, args.inject_step), optimizer,
                           precision=args.precision, clip=1.0)
    rng = np.random.default_rng(0)
    print(f"{args.precision} autocast, GradScaler "
          f"{'on' if train_step.scaler.is_enabled() else 'off'}, "
          f"scale {train_step.scaler.get_scale():g}; inf injected at step {args.inject_step}")

    skipped_ok = skips = 0
    with (StepCSVLog(args.csv) if args.csv else contextlib.nullcontext()) as log:
        for step in range(args.steps):
            x, y = get_batch(data, 8, 32, rng)
            before = ([p.data.copy() for p in model.parameters()],
                      [m.copy() for m in optimizer.m], list(optimizer.steps))
            scale_before = train_step.scaler.get_scale()
            r = train_step(x, y, lr_schedule(step, args.steps, 3e-3, warmup=2), step)
            if log is not None:
                log.write(r)
            if r.skipped:
                skips += 1
                unchanged = (all(np.array_equal(a, p.data)
                                 for a, p in zip(before[0], model.parameters()))
                             and all(np.array_equal(a, m) for a, m in zip(before[1], optimizer.m))
                             and before[2] == optimizer.steps)
                skipped_ok += unchanged
                print(f"SKIP {step:3d}  loss {r.loss:.4f}  {r.skip_reason} "
                      f"(|g| {r.grad_l2_pre_clip:.3g})  scale {scale_before:g} -> "
                      f"{r.scaler_scale:g}  weights+moments unchanged: {unchanged}")
            else:
                print(f"STEP {step:3d}  loss {r.loss:.4f}  |g| {r.grad_l2_pre_clip:.3g} -> "
                      f"{r.grad_l2_post_clip:.3g}  lr {r.lr:.2e}  scale {r.scaler_scale:g}")
    print(f"{skips} skipped of {args.steps}")
    return 0 if skips >= 1 and skipped_ok == skips else 1


if __name__ == "__main__":
    sys.exit(main())
