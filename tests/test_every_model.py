"""Every model opens: a model of a short context (max_len 32) on a prompt longer than it, and a
model whose vocabulary is padded past its tokenizer's (as Pythia's 50304 rows for 50277 tokens,
nanoGPT's 50304 for GPT-2's 50257), in `glassllm inspect` (the library and the CLI) and in
`glassllm serve`'s API. A prompt over max_len is cut to its first max_len tokens with a note,
never refused; an id no token has is never a guess the views pick themselves (the rule of
generation, `glassllm.generate.mask_padding`) and reads "(padding id N)" where the model's own
top-k holds it. (In a browser: tests/test_every_model_browser.py.)"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from glassllm.cli import main
from glassllm.formats import files
from glassllm.generate import Generator, mask_padding
from glassllm.lens import interpret
from glassllm.lens.report import fit_prompt, inspect_model, page_data, render_html, summary
from glassllm.lens.trace import token_text
from glassllm.model import Config, GlassLM
from glassllm.tokenizers import ByteTokenizer

LONG = "Once upon a time there was a little cat. Once upon a time"  # the page's default: 57 bytes
PADDED_V = 300  # the byte tokenizer has 257 ids: 43 padded rows


def short_model() -> GlassLM:
    """A model of max_len 32, as `glassllm train --seq-len 32` makes."""
    return GlassLM(Config(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_len=32), seed=1)


def padded_model() -> GlassLM:
    """A model of 300 vocabulary rows for the byte tokenizer's 257, whose padded rows score
    highest everywhere (their head bias is large): every top-k list holds padded ids."""
    model = GlassLM(Config(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_len=64,
                           vocab_size=PADDED_V, tie_embeddings=False, lm_head_bias=True), seed=2)
    model.lm_head.bias.data[ByteTokenizer.vocab_size:] = 9.0
    return model


def test_token_text_names_padded_ids():
    tok = ByteTokenizer()
    assert token_text(tok, 97) == "a"
    assert token_text(tok, 256) == "<|eot|>"
    assert token_text(tok, 257) == "(padding id 257)"
    assert token_text(tok, 299) == "(padding id 299)"


def test_mask_padding_is_generations_rule():
    logits = np.arange(6, dtype=np.float32)
    masked = mask_padding(logits, 4)
    assert masked.tolist() == [0, 1, 2, 3, -np.inf, -np.inf]
    assert logits[5] == 5  # a copy: the model's own logits are left as they were
    assert mask_padding(logits, None) is logits and mask_padding(logits, 6) is logits
    model = padded_model()
    gen = Generator(model, [104, 105], vocab_limit=ByteTokenizer.vocab_size)
    assert int(np.argmax(gen.next_logits())) >= ByteTokenizer.vocab_size  # padded on top
    assert gen.next_token(rng=np.random.default_rng(0)) < ByteTokenizer.vocab_size


def test_fit_prompt_cuts_with_a_note():
    ids, note = fit_prompt(range(57), 32)
    assert ids == list(range(32))
    assert note == "the prompt is 57 tokens, over this model's max_len 32: only its first 32 " \
                   "are analysed"
    assert fit_prompt([5, 6], 32) == ([5, 6], None)


def test_inspect_a_padded_vocabulary():
    model, tok = padded_model(), ByteTokenizer()
    ids = tok.encode("abcabcab")
    ins = inspect_model(model, ids, tok)
    # the model's own distribution: the padded ids on top, each named as such
    assert (ins.lens.top_ids[-1, :, 0] >= tok.vocab_size).all()
    data = page_data(ins)
    first = data["lens"]["top"][-1][0][0][0]
    assert re.fullmatch(r"\(padding id (2[5-9]\d)\)", first) and int(first[12:-1]) >= 257
    assert data["surprise"]["top"][0][0][0].startswith("(padding id ")
    # the attribution target the report picks itself (the last position's top guess) is a
    # real token, as generation would draw: the best of the ids below 257
    last = ins.attributions[-1]
    assert last.token < tok.vocab_size
    z = model(np.asarray(ids)[None]).data[0, -1]
    assert last.token == int(np.argmax(z[:tok.vocab_size]))
    assert "(padding id" in summary(ins)  # the terminal's lens lines name them too
    assert "(padding id" in render_html(ins)


def test_attribution_skips_padded_ids_only_when_asked():
    model, tok = padded_model(), ByteTokenizer()
    ids = tok.encode("abcab")
    assert interpret.logit_attribution(model, ids).token >= tok.vocab_size  # the raw argmax
    a = interpret.logit_attribution(model, ids, vocab_limit=tok.vocab_size)
    assert a.token < tok.vocab_size
    assert interpret.logit_attribution(model, ids, token=270).token == 270  # asked: allowed


def test_cli_inspect_a_padded_vocabulary(tmp_path, capsys):
    path = tmp_path / "padded.safetensors"
    files.save(padded_model(), path, tokenizer=ByteTokenizer())
    out = tmp_path / "r.html"
    assert main(["inspect", "--model", str(path), "--prompt", "abcabcab", "--out", str(out),
                 "--color", "never"]) == 0
    text = capsys.readouterr().out
    assert "(padding id" in text and text.splitlines()[-1] == f"report: {out}"
    data = _report_data(out.read_text(encoding="utf-8"))
    assert data["lens"]["top"][-1][-1][0][0].startswith("(padding id ")
    assert data["note"] is None


def test_cli_inspect_cuts_a_long_prompt_with_a_note(tmp_path, capsys):
    path = tmp_path / "short.safetensors"
    files.save(short_model(), path, tokenizer=ByteTokenizer())
    out = tmp_path / "r.html"
    assert main(["inspect", "--model", str(path), "--prompt", LONG, "--out", str(out),
                 "--color", "never"]) == 0
    captured = capsys.readouterr()
    note = "the prompt is 57 tokens, over this model's max_len 32: only its first 32 are analysed"
    assert f"glassllm inspect: note: {note}" in captured.err
    assert f"note: {note}" in captured.out  # the summary's second line
    assert "32 tokens" in captured.out.splitlines()[0]
    data = _report_data(out.read_text(encoding="utf-8"))
    assert data["note"] == note and len(data["tokens"]) == 32
    assert "".join(data["tokens"]) == LONG[:32]


def _report_data(html: str) -> dict:
    blocks = re.findall(r'<script type="application/json" id="report-data">(.*?)</script>',
                        html, flags=re.S)
    assert len(blocks) == 1
    return json.loads(blocks[0])


# --------------------------------------------------------------------------- serve's API
aiohttp = pytest.importorskip("aiohttp")
from glassllm.serve.models import Loaded  # noqa: E402

from serve_client import Running  # noqa: E402


def test_serve_cuts_a_prompt_over_max_len():
    running = Running(Loaded("", "short", short_model(), ByteTokenizer()))
    try:
        status, r = running.call("/api/analyze", {"prompt": LONG})
        assert status == 200, r
        assert len(r["tokens"]["ids"]) == 32 and "".join(r["tokens"]["texts"]) == LONG[:32]
        assert r["cut"] == ("the prompt is 57 tokens, over this model's max_len 32: only its "
                            "first 32 are analysed")
        status, short = running.call("/api/analyze", {"prompt": LONG[:20]})
        assert status == 200 and short["cut"] is None
        status, t = running.call("/api/tokenize", {"prompt": LONG})
        assert status == 200 and len(t["ids"]) == 32 and t["cut"] == r["cut"]
        # every call cuts alike: the views of one analysis agree on the 32 tokens
        for path, body in (("/api/attention", {"prompt": LONG, "layer": 0}),
                           ("/api/attribution", {"prompt": LONG}),
                           ("/api/ablate", {"prompt": LONG, "heads": [[0, 1]]})):
            status, a = running.call(path, body)
            assert status == 200 and len(a["tokens"]["ids"]) == 32, (path, a)
        status, p = running.call("/api/patch", {"clean": LONG, "corrupted": LONG.replace(
            "cat", "dog")})
        assert status == 200 and len(p["values"][0]) == 32
    finally:
        running.stop()


def test_serve_a_padded_vocabulary():
    model, tok = padded_model(), ByteTokenizer()
    running = Running(Loaded("", "padded", model, tok))
    try:
        status, r = running.call("/api/analyze", {"prompt": "abcabcab", "k": 5})
        assert status == 200, r
        top = r["lens"]["top"][-1][-1]
        assert all(text == f"(padding id {i})" for text, _, i in top if i >= tok.vocab_size)
        assert top[0][2] >= tok.vocab_size and top[0][0].startswith("(padding id ")
        assert r["surprise"]["top"][0][0][0].startswith("(padding id ")
        status, a = running.call("/api/attribution", {"prompt": "abcabcab"})
        assert status == 200 and a["token"] < tok.vocab_size, a  # the top real token
        status, a = running.call("/api/attribution", {"prompt": "abcabcab", "token": 280})
        assert status == 200 and a["token_text"] == "(padding id 280)"
        status, b = running.call("/api/ablate", {"prompt": "abcabcab", "heads": [[0, 0]]})
        assert status == 200 and b["clean_top"][0][0].startswith("(padding id ")
        status, p = running.call("/api/patch", {"clean": "abcabcab", "corrupted": "abdabdab"})
        assert status == 200 and p["correct"] < tok.vocab_size and p["wrong"] < tok.vocab_size
    finally:
        running.stop()
