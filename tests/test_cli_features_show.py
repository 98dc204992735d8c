"""`glassllm features show`: the summary printed equals the library's numbers
(glassllm.lens.features.browse) on the same model, dictionary and corpus."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from glassllm.cli.common import UsageError
from glassllm.cli.features_show import add_show
from glassllm.formats import files
from glassllm.lens.features import SAE, browse, save_saelens
from glassllm.model import Config, GlassLM
from glassllm.tokenizers import ByteTokenizer

TEXT = "the cat sat on the mat; the dog ran in the sun. <script>\x1b[2J</script> " * 40


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("show")
    model = GlassLM(Config(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_len=64), seed=0)
    files.save(model, root / "m.safetensors", ByteTokenizer())
    sae = SAE(32, 64, kind="topk", k=4, hook_name="blocks.1.residual_out", seed=5)
    save_saelens(sae, root / "d")
    (root / "c.txt").write_text(TEXT)
    return root, model, sae


def show(root, *more):
    parser = argparse.ArgumentParser()
    add_show(parser.add_subparsers())
    args = parser.parse_args(["show", str(root / "d"), "--model", str(root / "m.safetensors"),
                              "--data", str(root / "c.txt"), "--seq-len", "32", *more])
    return args.func(args)


def test_overview_and_one_feature(world, capsys):
    root, model, sae = world
    assert show(root) == 0
    out = capsys.readouterr().out
    windows = browse.corpus_windows(ByteTokenizer(), root / "c.txt", 32, 16384)
    scan = browse.scan_features(model, sae, windows)
    dead = int((scan.density == 0).sum())
    assert f"d_sae 64, k 4, over {scan.tokens:,} tokens: L0 4.00, dead {dead}" in out
    first = int(np.argsort(-scan.density, kind="stable")[0])
    assert f"  #{first}: density {scan.density[first]:.3%}" in out
    assert "\x1b" not in out  # a token's control bytes never reach the terminal raw
    assert show(root, "--feature", str(first), "--top", "3") == 0
    out = capsys.readouterr().out
    values = [c["value"] for c in scan.top_contexts(first, 3)]
    for v in values:
        assert f"{v:8.3f}  " in out
    logits = browse.feature_logits(model, sae)
    up, _ = browse.top_logits(logits[first], 3, 256)
    assert "promotes:   " + ", ".join(f"'{browse_text(i)}' {logits[first, i]:+.3f}"
                                      for i in up) in out


def browse_text(i):
    from glassllm.lens.report import _visible
    from glassllm.lens.trace import token_text
    return _visible(token_text(ByteTokenizer(), int(i)))


def test_refusals_name_the_flag(world):
    root, _, _ = world
    with pytest.raises(UsageError, match="--feature must be in \\[0, 64\\)"):
        show(root, "--feature", "64")
    with pytest.raises(UsageError, match="--top must be >= 1"):
        show(root, "--top", "0")


def test_the_command_line_reaches_it(world, capsys):
    from glassllm import cli
    root, _, _ = world
    assert cli.main(["features", "show", str(root / "d"), "--model", str(root / "m.safetensors"),
                     "--data", str(root / "c.txt"), "--seq-len", "32", "--feature", "3"]) == 0
    assert "feature 3: active on" in capsys.readouterr().out
    assert cli.main(["features", "show", str(root / "nothing"), "--model",
                     str(root / "m.safetensors"), "--data", str(root / "c.txt")]) == 2
    assert "nothing" in capsys.readouterr().err
