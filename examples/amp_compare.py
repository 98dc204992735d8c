"""fp32 vs bf16 vs fp16 training of the same model, seed and batches (issue 3's acceptance run).

Model: Llama family, d_model 128, 4 layers, 4 heads, byte vocabulary (257), T 64, batch 16.
Data: a text file's bytes (default ../shared/data/tinyshakespeare.txt next to the repo), first
90% for training, last 10% for validation. Every precision trains with `safety.TrainStep`
(clip 1.0, AdamW lr 3e-3, warmup 100 + cosine, as `glassllm.train.train()`; in fp32 the run is
bit-identical to `train()`), and the validation loss is `glassllm.train.evaluate` (10 batches,
seed 1234) of the float32 master weights, in float32 and under the run's own autocast.

    python examples/amp_compare.py [--steps 300] [--csv-dir runs/] [--threads 1]

Prints one progress line every 50 steps per run, then a table: val loss, relative difference
to fp32, skipped steps, final loss scale, seconds. Exits 1 if a low-precision val loss is more
than 2% away from fp32's.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from glassllm import Config, GlassLM, amp
from glassllm.optim import AdamW, lr_schedule
from glassllm.training.safety import PRECISIONS, StepCSVLog, TrainStep
from glassllm.tokenizers import ByteTokenizer
from glassllm.train import evaluate, get_batch

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"


def run(precision, train_data, val_data, steps, csv_path=None, seed=0, batch_size=16,
        seq_len=64, lr=3e-3, warmup=100):
    cfg = Config(vocab_size=257, d_model=128, n_layers=4, n_heads=4, max_len=seq_len,
                 family="llama")
    model = GlassLM(cfg, seed=seed)
    train_step = TrainStep(model, AdamW(model.parameters(), lr=lr), precision=precision)
    rng = np.random.default_rng(seed)
    skips, started = 0, time.perf_counter()
    with (StepCSVLog(csv_path) if csv_path else contextlib.nullcontext()) as log:
        for step in range(steps):
            x, y = get_batch(train_data, batch_size, seq_len, rng)
            record = train_step(x, y, lr_schedule(step, steps, lr, warmup), step)
            skips += record.skipped
            if log is not None:
                log.write(record)
            if step % 50 == 0 or step == steps - 1:
                print(f"  {precision} step {step}: loss {record.loss:.4f} scale "
                      f"{record.scaler_scale:g} skips {skips} "
                      f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - started
    val_fp32 = evaluate(model, val_data, batch_size, seq_len)
    with amp.autocast(PRECISIONS[precision]):
        val_own = evaluate(model, val_data, batch_size, seq_len)
    return {"precision": precision, "val_loss": val_fp32, "val_loss_autocast": val_own,
            "skips": skips, "scale": train_step.scaler.get_scale(), "seconds": seconds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "fp16"],
                        choices=sorted(PRECISIONS))
    parser.add_argument("--csv-dir", help="write <dir>/<precision>.csv step logs")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (default 1)")
    args = parser.parse_args(argv)

    text = Path(args.data).read_text(encoding="utf-8")
    ids = ByteTokenizer().encode(text)
    split = int(0.9 * len(ids))
    train_data, val_data = ids[:split], ids[split:]
    if args.csv_dir:
        os.makedirs(args.csv_dir, exist_ok=True)
    results = []
    with threadpool_limits(limits=args.threads):
        for precision in args.precisions:
            csv_path = os.path.join(args.csv_dir, f"{precision}.csv") if args.csv_dir else None
            results.append(run(precision, train_data, val_data, args.steps, csv_path))
    base = next((r["val_loss"] for r in results if r["precision"] == "fp32"), None)
    print(f"{args.steps} steps, {len(train_data)} train / {len(val_data)} val bytes")
    print("precision  val_loss(fp32 eval)  val_loss(autocast eval)  vs_fp32  skips  "
          "final_scale  seconds")
    ok = True
    for r in results:
        rel = (r["val_loss"] - base) / base if base else float("nan")
        ok &= base is None or abs(rel) <= 0.02
        print(f"{r['precision']:9s}  {r['val_loss']:19.4f}  {r['val_loss_autocast']:23.4f}  "
              f"{rel:+7.2%}  {r['skips']:5d}  {r['scale']:11g}  {r['seconds']:7.0f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
