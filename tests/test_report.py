"""glassllm.lens.report and `glassllm inspect`: the summary and the page's data say what the
analyses computed; one-line errors for bad input. (The page in a browser:
tests/test_report_browser.py.)"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from glassllm import Config, GlassLM
from glassllm.formats import files
from glassllm.cli import main
from glassllm.lens.interpret import AttributionError, logit_attribution, token_surprise
from glassllm.lens.report import inspect_model, page_data, render_html, summary
from glassllm.tokenizers import ByteTokenizer

PROMPT = "abcabcab"


@pytest.fixture
def model():
    model = GlassLM(Config(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_len=32), seed=3)
    model.token_embedding.weight.data *= 6
    return model


def page_json(html: str) -> dict:
    """The page's data block, parsed as the page's script parses it (JSON.parse)."""
    blocks = re.findall(r'<script type="application/json" id="report-data">(.*?)</script>',
                        html, flags=re.S)
    assert len(blocks) == 1
    return json.loads(blocks[0])


def test_page_data_is_the_analyses(model):
    tok = ByteTokenizer()
    ids = tok.encode(PROMPT)
    ins = inspect_model(model, ids, tok)
    data = page_json(render_html(ins))
    assert data == json.loads(json.dumps(page_data(ins)))
    assert data["tokens"] == list(PROMPT)
    s = token_surprise(model, ids)
    np.testing.assert_allclose(data["surprise"]["nats"], s.nats, atol=1e-4)
    L, H, T = 2, 4, len(PROMPT)
    assert len(data["attention"]) == L and len(data["attention"][0]) == H
    rows = data["attention"][1][2]
    assert [len(r) for r in rows] == list(range(1, T + 1))
    np.testing.assert_allclose([sum(r) for r in rows], 1.0, atol=1e-3)
    a = logit_attribution(model, ids, position=3, token=int(ids[4]))
    page = data["attributions"][3]
    assert page["token"] == PROMPT[4] and page["total"] == pytest.approx(a.total, abs=1e-4)
    assert page["labels"][0] == a.top(1)[0][0]
    assert len(data["lens"]["top"]) == L + 1 and len(data["lens"]["top"][0]) == T
    assert data["run"] is None


def test_summary_lines(model):
    tok = ByteTokenizer()
    ins = inspect_model(model, tok.encode(PROMPT), tok)
    plain = summary(ins, color=False)
    assert "\x1b[" not in plain
    assert f"{ins.surprise.mean_nats:.3f} nats" in plain
    assert "a[" in plain and "embeddings:" in plain and "block 1:" in plain
    assert "strongest induction head: L" in plain
    heads = ins.attributions[-1].heads()
    layer, head = np.unravel_index(np.argmax(np.abs(heads)), heads.shape)
    assert f"  heads: L{layer}H{head} {heads[layer, head]:+.3f}" in plain
    coloured = summary(ins, color=True)
    assert coloured.count("\x1b[0m") == len(PROMPT) - 1


def test_title_and_data_cannot_break_out_of_the_page(model):
    tok = ByteTokenizer()
    ins = inspect_model(model, tok.encode("</script><b>"), tok, title="<script>x</script>")
    html = render_html(ins)
    assert html.count("</script>") == 2  # only the page's own: the data block, the script
    assert html.count("<script") == 2 and "<!--<" not in html
    assert "<title>&lt;script&gt;x&lt;/script&gt;</title>" in html
    assert page_json(html)["tokens"][:2] == ["<", "/"]
    assert page_json(html)["title"] == "<script>x</script>"
    # a slot's name in the data is text: one pass fills the slots
    sneaky = inspect_model(model, tok.encode("__TITLE__ <!--<script>"), tok, title="__DATA__")
    html = render_html(sneaky)
    assert "<title>__DATA__</title>" in html
    assert "".join(page_json(html)["tokens"]) == "__TITLE__ <!--<script>"


def test_the_page_is_package_data_with_its_slots():
    """The three files ship with the package (pyproject.toml); each slot is filled once."""
    from importlib import resources

    from glassllm.lens.report import PAGE_FILES, page_template
    folder = resources.files("glassllm.lens") / "page"
    assert all((folder / name).is_file() for name in PAGE_FILES)
    page = page_template()
    script = (folder / "report.js").read_text(encoding="utf-8")
    css = (folder / "report.css").read_text(encoding="utf-8")
    assert script in page and css in page and "__SCRIPT__" not in page
    assert "default-src 'none'" in page


def test_cli_inspect(model, tmp_path, capsys):
    path = tmp_path / "m.safetensors"
    files.save(model, path, tokenizer=ByteTokenizer())
    out = tmp_path / "r.html"
    run = tmp_path / "run"
    run.mkdir()
    (run / "history.csv").write_text("step,train_loss,val_loss,lr\n0,5.5,5.4,0.001\n10,4,,0.001\n")
    assert main(["inspect", "--model", str(path), "--prompt", PROMPT, "--out", str(out),
                 "--run", str(run), "--color", "never"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[-1] == f"report: {out}"
    assert "logit lens at the last position" in text
    data = page_json(out.read_text())
    assert data["run"]["history"]["train_loss"] == [5.5, 4.0]
    assert data["run"]["history"]["val_loss"][1] is None  # missing value, not NaN in JSON


@pytest.mark.parametrize("args, message", [
    (["--prompt", "a"], "at least 2"),
    (["--prompt", "ab", "--out", "r.png"], ".html"),
    (["--prompt", "ab", "--top-k", "0"], "--top-k"),
    (["--prompt", "ab", "--run", "/nonexistent/run"], "/nonexistent/run"),
    (["--prompt", "ab", "--tokenizer", "nope.json"], "nope.json"),
])
def test_cli_inspect_errors(model, tmp_path, capsys, args, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    files.save(model, tmp_path / "m.safetensors", tokenizer=ByteTokenizer())
    files.save(model, tmp_path / "weights.safetensors")
    assert main(["inspect", "--model", "m.safetensors", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("glassllm inspect: error:") and message in err
    assert len(err.strip().splitlines()) == 1


def test_cli_inspect_weights_only_needs_a_tokenizer(model, tmp_path, capsys):
    files.save(model, tmp_path / "w.safetensors")
    args = ["inspect", "--model", str(tmp_path / "w.safetensors"), "--prompt", "ab",
            "--out", str(tmp_path / "r.html")]
    assert main(args) == 2
    assert "--tokenizer" in capsys.readouterr().err
    assert main(args + ["--tokenizer", "byte"]) == 0


def test_inspect_a_gpt2_model():
    model = GlassLM(Config(family="gpt2", d_model=32, n_layers=2, n_heads=4, max_len=16))
    tok = ByteTokenizer()
    ins = inspect_model(model, tok.encode(PROMPT), tok)
    assert "final_norm bias" in ins.attributions[0].labels
    assert ins.patterns.shape == (2, 4, len(PROMPT), len(PROMPT))
    assert page_json(render_html(ins))["model"]["family"] == "gpt2"


@pytest.mark.parametrize("lines, message", [
    ([b'{"step": 0}', b"null", b'{"step": 2}'], "health.jsonl:2: not a health row"),
    ([b'{"step": 0}', b'[1, 2]', b'{"step": 2}'], "health.jsonl:2: not a health row"),
    ([b'{"step": 0}', b'{"step": "x"}', b'{"step": 2}'], "health.jsonl:2: not a health row"),
    ([b'{"step": 0}', b'{"st', b'{"step": 2}'], "health.jsonl:2: not a JSON line"),
    ([b'\xfb\xfe\x00garbage', b'{"step": 2}'], "health.jsonl:1: not a UTF-8 text"),
])
def test_cli_inspect_and_plot_name_a_damaged_health_file(model, tmp_path, capsys, lines,
                                                          message):
    # breakit11: a `null` row reached the page (a TypeError in the browser, no view drawn),
    # bad middle lines were dropped without a word, and binary garbage gave "'utf-8' codec
    # can't decode byte 0xfb" naming no file
    files.save(model, tmp_path / "m.safetensors", tokenizer=ByteTokenizer())
    run = tmp_path / "run"
    run.mkdir()
    (run / "history.csv").write_text("step,train_loss,val_loss,lr\n0,5.5,5.4,0.001\n")
    (run / "health.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "r.html"
    assert main(["inspect", "--model", str(tmp_path / "m.safetensors"), "--prompt", PROMPT,
                 "--run", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("glassllm inspect: error:") and message in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    assert main(["plot", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("glassllm plot: error:") and message in err, err


def test_health_rows_torn_last_line_and_non_finite_values(model, tmp_path):
    # a run killed mid-write leaves a torn last line (cut inside a UTF-8 character, even);
    # NaN/Infinity from another writer read as None: the page's JSON cannot hold them
    run = tmp_path / "run"
    run.mkdir()
    (run / "health.jsonl").write_bytes(b'{"step": 0, "loss": NaN}\n{"step": 5, '
                                       b'"global_grad_norm": Infinity}\n{"step": 10, "x": "\xc3')
    tok = ByteTokenizer()
    ins = inspect_model(model, tok.encode(PROMPT), tok, run_dir=str(run))
    rows = page_json(render_html(ins))["run"]["health"]
    assert rows == [{"step": 0, "loss": None}, {"step": 5, "global_grad_norm": None}]


def test_summary_escapes_control_characters(model):
    # breakit11: a prompt (or a predicted token) holding ESC, CR or DEL reached the terminal
    # raw: "\x1b[2J" cleared the screen, "\r" overwrote the line
    tok = ByteTokenizer()
    ins = inspect_model(model, tok.encode("a\x1b[2Jb\rc\x7fd\u0085"), tok)
    for color in (False, True):
        text = summary(ins, color=color)
        shown = text.replace("\x1b[0m", "")
        shown = re.sub(r"\x1b\[[34]8;2;\d+;\d+;\d+m", "", shown)  # the summary's own colours
        assert not any(ord(c) < 32 and c != "\n" or 127 <= ord(c) < 160 for c in shown), shown
        assert "a\\x1b" in shown and "\\x0d" in shown and "\\x7f" in shown


def test_cli_inspect_refuses_an_unwritable_out_before_running(model, tmp_path, capsys,
                                                              monkeypatch):
    # breakit11: --out in a missing directory ran every analysis and printed the whole
    # summary before failing on the write
    files.save(model, tmp_path / "m.safetensors", tokenizer=ByteTokenizer())
    import glassllm.lens.report as report

    def analyses_ran(*args, **kwargs):
        raise AssertionError("the analyses ran before --out was checked")

    monkeypatch.setattr(report, "inspect_model", analyses_ran)
    for out, message in ((tmp_path / "missing" / "r.html", "does not exist"),
                         (tmp_path / "m.safetensors" / "r.html", "is a file")):
        assert main(["inspect", "--model", str(tmp_path / "m.safetensors"), "--prompt", PROMPT,
                     "--out", str(out)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and message in captured.err and str(out) in captured.err


def test_a_model_whose_float32_forward_breaks_gets_a_page_or_one_line(tmp_path, capsys):
    # breakit11: a NaN inside the forward made render_html fail with "Out of range float
    # values are not JSON compliant"; finite weights of 1e30 (float32 overflow in the norm)
    # made the attribution self-check raise through `glassllm inspect` as a traceback
    tok = ByteTokenizer()
    broken = GlassLM(Config(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_len=32))
    broken.blocks[1].mlp.down.weight.data[0, 0] = np.nan
    # (later: NaN compared False in the self-checks, so such a model passed them; a forward
    # that is not finite is now named as such, since nothing about it can be checked)
    with pytest.raises(AttributionError, match="not finite"):
        inspect_model(broken, tok.encode("hello hello"), tok)
    huge = GlassLM(Config(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_len=32))
    huge.token_embedding.weight.data *= 1e30
    files.save(huge, tmp_path / "huge.safetensors", tokenizer=tok)
    assert main(["inspect", "--model", str(tmp_path / "huge.safetensors"), "--prompt", "hello",
                 "--out", str(tmp_path / "r.html")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("glassllm inspect: error: self-check failed: attribution parts")
    assert len(err.strip().splitlines()) == 1
