"""`glassllm prepare`: tokenize text files into train.bin / val.bin (`training.prepare`)."""
from __future__ import annotations

import json
import os
import sys

from .common import UsageError

def add_prepare(sub) -> None:
    p = sub.add_parser("prepare", help="tokenize text files into train.bin / val.bin",
                       description="Tokenize text files (or directories, read in sorted order) "
                       "into OUT/train.bin and OUT/val.bin with JSON sidecars. Each file's last "
                       "VAL_FRACTION of bytes, from a line start, goes to val.")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="text file or directory")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--tokenizer", default="byte",
                   help="byte, bpe:N (learn a byte-level BPE of N ids from the train part), or "
                        "PATH (a tokenizer JSON, or a directory with GPT-2 vocab.json + "
                        "merges.txt); default byte")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="fraction of each file's bytes for validation (default 0.1)")
    p.set_defaults(func=run_prepare)


def run_prepare(args) -> int:
    import math

    from tqdm import tqdm

    from ..training.prepare import bpe_vocab_size, prepare
    from ..tokenizers import load_tokenizer

    if not (math.isfinite(args.val_fraction) and 0.0 <= args.val_fraction < 1.0):
        raise UsageError(f"--val-fraction must be a number in [0, 1), got {args.val_fraction!r}")
    tokenizer = args.tokenizer
    if tokenizer.startswith("bpe:"):
        try:
            bpe_vocab_size(tokenizer)
        except ValueError as e:
            raise UsageError(f"--tokenizer: {e}") from None
    elif tokenizer != "byte":
        try:
            tokenizer = load_tokenizer(tokenizer)
        except FileNotFoundError as e:
            raise UsageError(f"--tokenizer {args.tokenizer}: {e} (expected byte, bpe:N or "
                             f"the path of a tokenizer)") from None
        except (OSError, ValueError) as e:
            raise UsageError(f"--tokenizer {args.tokenizer}: {e}") from None
    bars = {}

    def on_progress(p):
        bar = bars.get(p.stage)
        if bar is None:
            desc = "learning BPE" if p.stage == "tokenizer" else "tokenizing"
            bar = bars[p.stage] = tqdm(total=p.total, desc=desc, unit="B", unit_scale=True,
                                       file=sys.stderr)
        bar.update(p.done - bar.n)

    try:
        result = prepare(args.inputs, args.out, tokenizer, val_fraction=args.val_fraction,
                         on_progress=on_progress)
    finally:
        for bar in bars.values():
            bar.close()
    tok = result["tokenizer"]
    for name in ("train", "val"):
        meta = result[name]
        print(f"{name}: {meta['token_count']:,} tokens from {meta['text_bytes']:,} bytes "
              f"({meta['dtype']}) -> {os.path.join(args.out, name + '.bin')}", flush=True)
    print(f"tokenizer: {json.loads(tok.to_json())['type']}, vocab_size {tok.vocab_size}, "
          f"{len(result['files'])} file(s)", flush=True)
    return 0
