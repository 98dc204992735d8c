"""GPU speed: glassllm on CuPy against PyTorch CUDA eager, same model, same weights, same
batches; training and greedy decoding, interleaved.

    python bench/gpu_speed.py                         # S, M, L on cuda; training + decoding
    python bench/gpu_speed.py --config M --steps 20   # one config, more steps
    python bench/gpu_speed.py --device strict --torch-device cpu --config S --steps 2 \\
        --new-tokens 4                                # the dry run, on a machine without a GPU

One training step = forward, mean cross-entropy, zero grads, backward, clip the global norm
to 1, AdamW (bench/train_speed.py's, float32 on both sides). Steps alternate
glassllm/torch after `--warmup` steps each; tokens/s = B*T / the median step time (a step's
`loss.item()` waits for the GPU on both sides). Decoding: `glassllm.generate.generate` greedy
against the twin's preallocated-cache loop (as bench/generate_speed.py's `torch_greedy`), from a
16-token prompt, alternating, `--new-tokens` / the median time; the tokens of both sides are
compared (float32 on a GPU may break a near tie: counted, not fatal). Before timing, both
sides' logits on a probe batch agree within 1e-5 on the CPU (`common.build_pair`), and the
glass's logits on the device within 1e-4 of its CPU logits.

The twin is tests/torch_reference.py (the parity tests' model) moved to the torch device.
`--json PATH` also writes the rows as JSON (bench/gpu_check.py collects them).
"""
from __future__ import annotations

import common  # noqa: F401  (first: environment fix-up before numpy)

import argparse
import json
import statistics
import time

import numpy as np

from glassllm import devices
from glassllm.generate import Sampling, generate
from glassllm.model import Config
from glassllm.tensor import no_grad

from train_speed import glassllm_stepper, make_batches, torch_stepper

DEFAULT_STEPS = {"S": 10, "M": 10, "L": 5}


def _timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def check_on_device(model, device: str) -> float:
    """The glass's logits on `device` against its own CPU logits (relative); exits past 1e-4."""
    ids = np.random.default_rng(1).integers(0, model.cfg.vocab_size, (2, 64))
    with no_grad():
        want = model(ids).numpy()
        got = model.to(device)(ids).numpy()
    relative = float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30))
    if not relative <= 1e-4:
        raise SystemExit(f"{device}: logits differ from the CPU's by {relative:.2e} (limit 1e-4)")
    return relative


def training_row(name: str, device: str, torch_device: str, steps: int, warmup: int) -> dict:
    spec = common.CONFIGS[name]
    cfg = Config(**spec["model"])
    model, twin = common.build_pair(cfg)
    relative = check_on_device(model, device)
    twin = twin.to(torch_device)
    batches = make_batches(cfg, spec["batch"], spec["seq"], warmup + steps)
    ours, theirs = glassllm_stepper(model), torch_stepper(twin, device=torch_device)
    times = {"glassllm": [], "torch": []}
    for i, (x, y) in enumerate(batches):
        t_ours, t_theirs = _timed(ours, x, y), _timed(theirs, x, y)
        if i >= warmup:
            times["glassllm"].append(t_ours)
            times["torch"].append(t_theirs)
    tokens = spec["batch"] * spec["seq"]
    row = {"config": name, "what": "train", "device": device, "torch_device": torch_device,
           "tokens_per_step": tokens, "logits_vs_cpu": relative}
    for side, ts in times.items():
        row[f"{side}_tok_s"] = tokens / statistics.median(ts)
    row["ratio"] = row["glassllm_tok_s"] / row["torch_tok_s"]
    return row


def decoding_row(name: str, device: str, torch_device: str, n_new: int, repeats: int) -> dict:
    import torch
    from torch_reference import TorchKVCache
    cfg = Config(**common.CONFIGS[name]["model"])
    model, twin = common.build_pair(cfg)
    model.to(device)
    twin = twin.to(torch_device)
    prompt = np.random.default_rng(2).integers(0, cfg.vocab_size, 16)
    n_new = min(n_new, cfg.max_len - len(prompt))

    def theirs():
        cache = TorchKVCache(twin.cfg, batch_size=1)
        cache.k, cache.v = cache.k.to(torch_device), cache.v.to(torch_device)
        out = []
        with torch.inference_mode():
            logits = twin(torch.from_numpy(prompt[None, :]).to(torch_device), cache)
            for _ in range(n_new):
                out.append(int(torch.argmax(logits[0, -1])))
                logits = twin(torch.tensor([[out[-1]]], device=torch_device), cache)
        return out

    ours = lambda: generate(model, prompt, n_new, Sampling(0.0))  # noqa: E731
    got, want = ours(), theirs()  # warm-up, and the tokens compared
    times = {"glassllm": [], "torch": []}
    for _ in range(repeats):
        times["glassllm"].append(_timed(ours))
        times["torch"].append(_timed(theirs))
    row = {"config": name, "what": "decode", "device": device, "torch_device": torch_device,
           "new_tokens": n_new, "tokens_differ": sum(a != b for a, b in zip(got, want))}
    for side, ts in times.items():
        row[f"{side}_tok_s"] = n_new / statistics.median(ts)
    row["ratio"] = row["glassllm_tok_s"] / row["torch_tok_s"]
    return row


def markdown(rows: list[dict]) -> str:
    lines = ["| config | what | glassllm tok/s | torch tok/s | ratio | note |",
             "|---|---|---:|---:|---:|---|"]
    for r in rows:
        note = f"{r['tokens_differ']} tokens differ" if r["what"] == "decode" else \
            f"logits vs cpu {r['logits_vs_cpu']:.1e}"
        lines.append(f"| {r['config']} | {r['what']} ({r['device']} / torch {r['torch_device']})"
                     f" | {r['glassllm_tok_s']:,.0f} | {r['torch_tok_s']:,.0f} | "
                     f"{r['ratio']:.2f} | {note} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", default=["S", "M", "L"], choices=["S", "M", "L"])
    parser.add_argument("--device", default="cuda", help="glassllm's device (default cuda)")
    parser.add_argument("--torch-device", default="cuda", help="the twin's (default cuda)")
    parser.add_argument("--steps", type=int, default=None, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-decode", action="store_true")
    parser.add_argument("--json", default=None, metavar="PATH")
    args = parser.parse_args(argv)
    device = devices.parse(args.device)
    devices.namespace_for(device)  # no CuPy / no GPU: one line, before any work
    rows = []
    for name in args.config:
        steps = args.steps or DEFAULT_STEPS[name]
        rows.append(training_row(name, device, args.torch_device, steps, args.warmup))
        print(markdown(rows[-1:]).splitlines()[-1], flush=True)
        if not args.no_decode:
            rows.append(decoding_row(name, device, args.torch_device, args.new_tokens,
                                     args.repeats))
            print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
