"""What `--health-every N` costs: training steps with and without the health measurement.

    python bench/health_cost.py                 # config M, N = 10, 40 steps
    python bench/health_cost.py --config S --every 10 --steps 40

The real loop's pieces (glassllm.training.safety.TrainStep: forward, backward, clip, AdamW) on random
batches; every N-th step runs under `HealthMonitor.observe` and is followed by its
measurement. Prints the median plain step, the median health step (its traced forward,
weight snapshot and statistics included), and the cost amortised over N steps:
(health - plain) / (N * plain).
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import argparse
import json
import os
import time

import numpy as np

from glassllm.lens.health import HealthMonitor
from glassllm.model import Config, GlassLM
from glassllm.optim import AdamW
from glassllm.training.safety import TrainStep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="M", choices=sorted(common.CONFIGS))
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None,
                        help="threads (default: all cores, as `glassllm train` on an idle "
                             "machine)")
    args = parser.parse_args()
    if args.every < 1 or args.steps <= args.every:
        parser.error(f"need --every >= 1 and --steps > --every (so that a health step follows "
                     f"step 0; got --every {args.every}, --steps {args.steps})")
    common.set_threads(args.threads)
    spec = common.CONFIGS[args.config]
    model = GlassLM(Config(**spec["model"]), seed=0)
    opt = AdamW(model.parameters(), lr=1e-3)
    step = TrainStep(model, opt, "fp32", 1.0)
    monitor = HealthMonitor(model, opt, every=args.every, clip=1.0)
    rng = np.random.default_rng(0)
    load_before = os.getloadavg()[0]
    plain, health = [], []
    for i in range(args.steps + 1):
        tokens = rng.integers(0, model.cfg.vocab_size, (spec["batch"], spec["seq"] + 1))
        t0 = time.perf_counter()
        with monitor.observe(i):
            record = step(tokens[:, :-1], tokens[:, 1:], 1e-3, i)
        monitor.after_step(i, record)
        dt = time.perf_counter() - t0
        if i == 0:
            continue  # warm-up
        (health if monitor.wants(i) else plain).append(dt)
    p, h = common.median(plain), common.median(health)
    result = dict(config=args.config, every=args.every, plain_step_s=p, health_step_s=h,
                  amortised_pct=100 * (h - p) / (args.every * p), n_plain=len(plain),
                  n_health=len(health), load_before=load_before,
                  load_after=os.getloadavg()[0])
    print(f"config {args.config} (B={spec['batch']}, T={spec['seq']}), load "
          f"{result['load_before']:.2f} -> {result['load_after']:.2f}")
    print(f"  plain step {p * 1e3:.0f} ms (median of {len(plain)}), health step {h * 1e3:.0f} ms"
          f" (median of {len(health)}): +{(h - p) * 1e3:.0f} ms, "
          f"{result['amortised_pct']:.1f}% of training time at --health-every {args.every}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
