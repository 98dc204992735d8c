"""Issue 11's acceptance: the head detector's induction head, checked by ablation, in a tiny
2-layer model trained on repeated random sequences (examples/induction_heads.py; ~1-2 min
on 2 busy cores, hence slow)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import induction_heads as toy  # noqa: E402

from glassllm.lens.interpret import detect_heads  # noqa: E402


@pytest.mark.slow
def test_detected_induction_head_matters_more_than_any_other_head():
    model = toy.train(1500, seed=0)
    seq = toy.repeated()
    induction = detect_heads(model, seq, "induction")
    previous = detect_heads(model, seq, "previous_token")
    layer, head = np.unravel_index(int(np.argmax(induction)), induction.shape)
    assert layer == 1 and induction[layer, head] > 0.25  # 0.5 is perfect: half the rows repeat
    assert previous[0].max() > 0.3  # the previous-token head it composes with
    base = toy.repeated_half_loss(model, seq)
    rise = {(l, h): toy.repeated_half_loss(model, seq, heads=[(l, h)]) - base
            for l in range(2) for h in range(2)}
    assert rise[layer, head] > 1.0, rise
    others = [k for k in rise if k != (layer, head)]
    assert all(rise[k] < rise[layer, head] for k in others), rise
    random_head = others[np.random.default_rng(0).integers(len(others))]
    assert rise[random_head] < rise[layer, head] / 1.5, rise
