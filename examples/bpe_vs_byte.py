"""Bytes or subwords? The same model, the same wall-clock budget, validation bits per byte.

    python examples/bpe_vs_byte.py [--minutes 4] [--vocab 4096] [--corpus PATH] [--work DIR]

1. `glassllm.training.prepare.prepare` (what `glassllm prepare` runs) writes the corpus twice: with the
   byte tokenizer and with a byte-level BPE of `--vocab` ids learned on the train split.
   The split is by bytes (each file's last 10%, from a line start), so both validation
   splits hold exactly the same text.
2. The same model (llama family, d_model 128, 4 layers, 4 heads, 2 KV heads, seq_len 128,
   batch 16; only the embedding table differs: 257 vs `--vocab` rows) trains for the same
   wall-clock budget. Both runs go at once, one process each with single-threaded BLAS, so
   they share whatever else the machine is doing. Learning rate 2e-3: linear warmup over 30
   updates, then a cosine over the *time* left after warmup, down to 10% (the schedule needs
   an end, and here the end is a time, not a step count).
3. Each model is scored on its whole validation split, in consecutive windows of seq_len + 1
   tokens: bits per byte = (sum of nats over the predicted tokens) / (UTF-8 bytes of the
   validation text) / ln 2. For the byte model tokens are bytes; for BPE one token covers
   several bytes, which is what the ratio accounts for.

Writes WORK/{byte,bpe}/history.csv, loss.png and result.json, and prints a table.

Measured once (--minutes 4, tinyshakespeare, 2 CPU cores shared with other jobs, load
average ~5, so few updates; both models are far from converged):

                        byte      bpe-4096
    updates              287       193
    bytes of text seen   588k      1.29M
    val nats/token       1.969     5.175
    val bits/byte        2.841     2.572     (same 111,538 validation bytes)

At equal time BPE wins here: fewer updates, but each covers ~3.3x more text. An earlier run
with a cosine that restarted after warmup gave 2.990 vs 2.703, the same ordering.
"""
from __future__ import annotations

import os

# One BLAS thread per run: the two runs go side by side and must not fight over cores.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from glassllm import Config, GlassLM, no_grad# noqa: E402
from glassllm.formats.token_file import TokenFile  # noqa: E402
from glassllm.training.prepare import prepare  # noqa: E402
from glassllm.optim import AdamW, clip_grad_norm  # noqa: E402
from glassllm.lens.plots import plot_history  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
MODEL = {"family": "llama", "d_model": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2}
SEQ_LEN, BATCH, LR, WARMUP, MIN_RATIO, SEED = 128, 16, 2e-3, 30, 0.1, 0


def time_lr(step: int, elapsed: float, warmup_end: float, budget: float) -> float:
    """Warmup by steps, then cosine over the time left after warmup (warmup_end seconds)."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = min(1.0, (elapsed - warmup_end) / max(budget - warmup_end, 1e-9))
    return LR * (MIN_RATIO + (1 - MIN_RATIO) * 0.5 * (1 + math.cos(math.pi * progress)))


def val_bits_per_byte(model: GlassLM, val: TokenFile) -> tuple[float, float]:
    """(nats per token, bits per byte) over the whole validation split, consecutive windows."""
    ids = np.asarray(val.tokens, dtype=np.int64)
    n_windows = (len(ids) - 1) // SEQ_LEN
    total_nats, total_tokens = 0.0, 0
    with no_grad():
        for start in range(0, n_windows, BATCH):
            rows = range(start, min(start + BATCH, n_windows))
            x = np.stack([ids[r * SEQ_LEN:(r + 1) * SEQ_LEN] for r in rows])
            y = np.stack([ids[r * SEQ_LEN + 1:(r + 1) * SEQ_LEN + 1] for r in rows])
            total_nats += float(model.loss(x, y).item()) * y.size
            total_tokens += y.size
        rest = len(ids) - 1 - n_windows * SEQ_LEN  # the last, shorter window
        if rest > 0:
            x = ids[n_windows * SEQ_LEN:-1][None]
            y = ids[n_windows * SEQ_LEN + 1:][None]
            total_nats += float(model.loss(x, y).item()) * y.size
            total_tokens += y.size
    return total_nats / total_tokens, total_nats / val.text_bytes / math.log(2)


def train_one(data_dir: pathlib.Path, budget_s: float) -> dict:
    """Train the model on data_dir/train.bin for budget_s seconds; score it; write files."""
    train, val = TokenFile(data_dir / "train.bin"), TokenFile(data_dir / "val.bin")
    cfg = Config(vocab_size=train.vocab_size, max_len=SEQ_LEN, **MODEL)
    model = GlassLM(cfg, seed=SEED)
    params = model.parameters()
    optimizer = AdamW(params, lr=LR)
    rng = np.random.default_rng(SEED)
    history, step, warmup_end = [], 0, 0.0
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < budget_s:
        if step == WARMUP:
            warmup_end = elapsed
        x, y = train.batch(rng, BATCH, SEQ_LEN)
        loss = model.loss(x, y)
        optimizer.zero_grad()
        loss.backward()
        clip_grad_norm(params, 1.0)
        lr = time_lr(step, elapsed, warmup_end, budget_s)
        optimizer.step(lr)
        history.append({"step": step, "train_loss": float(loss.item()), "lr": lr,
                        "elapsed_s": time.monotonic() - started})
        step += 1
    train_seconds = time.monotonic() - started
    nats, bpb = val_bits_per_byte(model, val)
    history[-1]["val_loss"] = nats
    with open(data_dir / "history.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["step", "train_loss", "val_loss", "lr", "elapsed_s"])
        writer.writeheader()
        writer.writerows(history)
    plot_history(data_dir / "history.csv", data_dir / "loss.png")
    tail = [h["train_loss"] for h in history[-20:]]
    result = {
        "tokenizer": train.meta["tokenizer"]["type"], "vocab_size": train.vocab_size,
        "parameters": int(sum(p.data.size for p in params)), "steps": step,
        "train_seconds": round(train_seconds, 1),
        "tokens_seen": step * BATCH * SEQ_LEN,
        "bytes_seen": round(step * BATCH * SEQ_LEN * train.text_bytes / train.token_count()),
        "train_loss_last20": round(float(np.mean(tail)), 4),
        "val_tokens": val.token_count(), "val_bytes": val.text_bytes,
        "val_nats_per_token": round(nats, 4), "val_bits_per_byte": round(bpb, 4),
    }
    (data_dir / "result.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=4.0, help="training budget per model")
    ap.add_argument("--vocab", type=int, default=4096, help="BPE vocabulary size")
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--work", default=str(REPO / "runs" / "bpe_vs_byte"))
    ap.add_argument("--train-only", metavar="DATA_DIR", help=argparse.SUPPRESS)  # child mode
    args = ap.parse_args()
    budget = args.minutes * 60
    if args.train_only:
        train_one(pathlib.Path(args.train_only), budget)
        return

    work = pathlib.Path(args.work)
    dirs = {"byte": work / "byte", "bpe": work / "bpe"}
    for name, tok in (("byte", "byte"), ("bpe", f"bpe:{args.vocab}")):
        t = time.monotonic()
        prepare([args.corpus], dirs[name], tok, val_fraction=0.1)
        print(f"prepared {name}: {time.monotonic() - t:.1f} s", flush=True)
    print(f"training both for {args.minutes:g} min, side by side ...", flush=True)
    children = [subprocess.Popen([sys.executable, __file__, "--minutes", str(args.minutes),
                                  "--train-only", str(d)]) for d in dirs.values()]
    if any(c.wait() for c in children):
        sys.exit("a training run failed")
    results = {n: json.loads((d / "result.json").read_text()) for n, d in dirs.items()}
    keys = ["vocab_size", "parameters", "steps", "train_seconds", "tokens_seen", "bytes_seen",
            "train_loss_last20", "val_tokens", "val_bytes", "val_nats_per_token",
            "val_bits_per_byte"]
    print(f"{'':20s}{'byte':>14s}{'bpe':>14s}")
    for k in keys:
        print(f"{k:20s}{results['byte'][k]:>14}{results['bpe'][k]:>14}")
    (work / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
