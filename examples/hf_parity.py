"""Parity figures of every Hugging Face class against transformers: the table in
docs/architectures.md.

    PYTHONPATH=src python examples/hf_parity.py

For each class, the tiny model of tests/test_hf_archs.py (random weights, every feature
binding) is saved by transformers, read by `glassllm.formats.hf.from_hf`, and compared in
float32 (eager attention): logits (max |ours - theirs| / max |theirs| on a (2, 32) batch),
20 greedy tokens, every parameter's gradient of the loss (the largest per-tensor
max |diff| / max |theirs|), and the logits of `to_hf`'s export reloaded by transformers.
"""
from __future__ import annotations

import pathlib
import sys
import tempfile

import numpy as np
import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
import test_hf_archs as t  # noqa: E402  (the classes and their tiny configs)

from glassllm.formats import hf  # noqa: E402


def relative(ours: np.ndarray, theirs: np.ndarray) -> float:
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def figures(name: str, tmp: pathlib.Path) -> dict:
    model = t.make_hf(name)
    model.save_pretrained(tmp / "in")
    glass = hf.from_hf(tmp / "in")
    idx = t.batch(1)
    theirs = t.hf_logits(model, idx)
    out = {"logits": relative(glass(idx).data, theirs), "max_logit": float(np.abs(theirs).max())}

    prompt = t.batch(2, shape=(2, t.T_PROMPT))
    with torch.no_grad():
        want = model.generate(torch.tensor(prompt), max_new_tokens=t.N_NEW, do_sample=False,
                              min_new_tokens=t.N_NEW, eos_token_id=None, pad_token_id=0)
    idx2 = prompt
    for _ in range(t.N_NEW):
        idx2 = np.concatenate([idx2, glass(idx2).data[:, -1].argmax(-1)[:, None]], axis=1)
    out["greedy"] = bool((idx2 == want.numpy()).all())

    model = t.make_hf(name, seed=5, std=t.grad_std(name))
    model.save_pretrained(tmp / "grad")
    glass = hf.from_hf(tmp / "grad")
    x, y = t.batch(6), t.batch(7)
    glass.loss(x, y).backward()
    ours = hf._state_to_hf(glass.cfg, {n: p.grad for n, p in glass.named_parameters()})
    ours = {n.replace("embed_out.", "lm_head."): g for n, g in ours.items()}
    logits = model(torch.tensor(x)).logits
    torch.nn.functional.cross_entropy(logits.reshape(-1, t.V),
                                      torch.tensor(y).reshape(-1)).backward()
    out["grads"] = max(relative(ours[n], p.grad.numpy()) for n, p in model.named_parameters())

    hf.to_hf(glass, tmp / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(
        tmp / "out", attn_implementation="eager").eval()
    out["to_hf"] = relative(glass(idx).data, t.hf_logits(back, idx))
    out["class"] = type(back).__name__
    return out


def main() -> None:
    print("| test class | transformers class | logits rel. diff | max logit | greedy 20 | "
          "grads rel. diff (worst tensor) | to_hf reload rel. diff |")
    print("|---|---|---|---|---|---|---|")
    for name in t.CLASSES:
        with tempfile.TemporaryDirectory() as tmp:
            f = figures(name, pathlib.Path(tmp))
        print(f"| {name} | {f['class']} | {f['logits']:.1e} | {f['max_logit']:.0f} | "
              f"{'identical' if f['greedy'] else 'DIFFER'} | {f['grads']:.1e} | "
              f"{f['to_hf']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
