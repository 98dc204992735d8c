"""docs/features.md's worked example, run again: the commands of the page (a corpus of
stories260K's own stories, a TopK dictionary of 512 features on blocks.2.residual_out trained
for 1,500 steps), then the page's table of figures and each pictured feature's strongest
context re-measured. Slow (about 3 minutes on two cores)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, shared_data_path

PAGE = REPO / "docs" / "features.md"
# feature -> (its strongest context's activation, the token there), as the page says
PICTURED = {454: (2.58, " there"), 511: (2.57, "ily"), 159: (2.88, ".")}


def cli(*args, stdout=None):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    subprocess.run([sys.executable, "-m", "glassllm.cli", *args], check=True, env=env,
                   stdout=stdout, timeout=900)


def page_figures() -> dict:
    text = PAGE.read_text(encoding="utf-8")
    table = text.split("<!-- figures of the worked example")[1].split("<!-- end of")[0]
    rows = dict(re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|", table, re.M))
    return dict(fvu=float(rows["fraction of variance unexplained"]),
                recovered=float(rows["cross-entropy loss recovered"].rstrip("%")) / 100,
                dead=int(rows["dead features"].split()[0]))


@pytest.mark.slow
def test_the_worked_example(tmp_path):
    from glassllm.formats import files
    from glassllm.lens.features import browse, evaluate_dictionary, train_dictionary
    from glassllm.lens.trace import token_text
    folder = shared_data_path("llama2c")
    os.chdir(tmp_path)
    cli("convert", "--from-llama2c", str(folder / "stories260K.bin"), "--tokenizer",
        str(folder / "tok512.bin"), "--out", "stories260K.safetensors")
    for name, n, seed in (("stories.txt", "600", "0"), ("stories-val.txt", "80", "1")):
        with open(name, "w") as f:
            cli("generate", "--model", "stories260K.safetensors", "--prompt", "",
                "--num-samples", n, "--max-new-tokens", "255", "--temperature", "1",
                "--seed", seed, stdout=f)
        assert f"--num-samples {n} \\\n    --max-new-tokens 255 --temperature 1 --seed {seed} " \
               f"> {name}" in PAGE.read_text()
    model = files.load("stories260K.safetensors")
    tokenizer = files.load_tokenizer("stories260K.safetensors")
    sae = train_dictionary(model, "stories.txt", "blocks.2.residual_out", kind="topk", d_sae=512,
                           k=16, steps=1500, tokenizer=tokenizer, out="dicts/resid2", seed=0)
    report = evaluate_dictionary(model, sae, "stories-val.txt", tokenizer=tokenizer,
                                 out="dicts/resid2")
    said = page_figures()
    recovered = (report.ce_zero - report.ce_spliced) / (report.ce_zero - report.ce_clean)
    assert report.fvu <= 0.15 and recovered >= 0.85 and report.dead <= 0.1 * 512  # targets
    assert abs(report.fvu - said["fvu"]) < 0.01 and abs(recovered - said["recovered"]) < 0.01
    assert abs(report.dead - said["dead"]) <= 3
    windows = browse.corpus_windows(tokenizer, "stories-val.txt", 64, 16384)
    scan = browse.scan_features(model, sae, windows, ignore=(tokenizer.bos_id,))
    for feature, (value, token) in PICTURED.items():
        top = scan.top_contexts(feature, 1)[0]
        assert abs(top["value"] - value) < 0.05, (feature, top["value"])
        assert token_text(tokenizer, top["ids"][top["at"]]) == token, feature
        assert f"features-{feature}.png" in PAGE.read_text() and \
            (REPO / "docs" / f"features-{feature}.png").exists()
