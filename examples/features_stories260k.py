"""A TopK dictionary on stories260K's middle residual stream, trained and measured in the glass.

    python examples/features_stories260k.py [--steps 1500] [--d-sae 512] [--k 16] [--out DIR]

stories260K (llama2.c's 260K-parameter TinyStories model, d_model 64, 5 layers) comes with no
corpus, so the corpus is the model's own stories: `sample_corpus` draws them at temperature 1
(seeded), a TinyStories-like text in the model's own distribution, written as a token file of
`glassllm prepare`'s format. The dictionary reads `blocks.2.residual_out` (the middle block)
and is evaluated on stories drawn with another seed. Printed: the training time and the
`evaluate_dictionary` report (L0, FVU, dead and dense features, CE loss recovered).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, __file__.rsplit("/examples/", 1)[0] + "/src")

from glassllm.formats.llama2c import from_llama2c  # noqa: E402
from glassllm.lens.features import evaluate_dictionary, train_dictionary  # noqa: E402
from glassllm.model import KVCache  # noqa: E402
from glassllm.tensor import no_grad  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data",
                    "llama2c")
BOS = 1  # llama2.c's SentencePiece begin-of-sequence, which starts every story


def sample_corpus(model, n_tokens: int, seed: int, length: int = 256,
                  batch: int = 64) -> np.ndarray:
    """About n_tokens ids of the model's own stories: `batch` sequences at a time, each BOS then
    `length - 1` tokens sampled at temperature 1 through a KV cache, concatenated. (n,) int64."""
    rng = np.random.default_rng(seed)
    rows = []
    while sum(r.size for r in rows) < n_tokens:
        cache = KVCache(model.cfg, batch_size=batch)
        ids = np.full((batch, length), BOS, dtype=np.int64)
        with no_grad():
            for t in range(length - 1):
                logits = model.forward(ids[:, t:t + 1], cache).data[:, -1].astype(np.float64)
                p = np.exp(logits - logits.max(axis=-1, keepdims=True))
                p /= p.sum(axis=-1, keepdims=True)
                draw = rng.random((batch, 1))
                ids[:, t + 1] = np.minimum((p.cumsum(axis=-1) < draw).sum(axis=-1),
                                           p.shape[-1] - 1)
        rows.append(ids.reshape(-1))
    return np.concatenate(rows)[:n_tokens]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--d-sae", type=int, default=512)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--name", default="blocks.2.residual_out")
    parser.add_argument("--corpus-tokens", type=int, default=400_000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model = from_llama2c(os.path.join(DATA, "stories260K.bin"))
    started = time.perf_counter()
    train_ids = sample_corpus(model, args.corpus_tokens, seed=0)
    held_out = sample_corpus(model, 40_000, seed=1)
    print(f"corpus: {len(train_ids)} + {len(held_out)} tokens sampled in "
          f"{time.perf_counter() - started:.0f} s")
    started = time.perf_counter()
    sae = train_dictionary(model, train_ids, args.name, kind="topk", d_sae=args.d_sae,
                           k=args.k, steps=args.steps, out=args.out)
    print(f"trained {sae} for {args.steps} steps in {time.perf_counter() - started:.0f} s")
    print(evaluate_dictionary(model, sae, held_out, out=args.out))


if __name__ == "__main__":
    main()
