"""Every model opens, and its charts read, in a real browser: Debian's headless Chromium driven
by Selenium through the system chromedriver (as tests/test_serve_browser.py; nothing here
downloads a browser).

- A model of max_len 32 (as `glassllm train --seq-len 32` saves) opens in `glassllm serve` on
  the page's own default prompt (57 bytes): the prompt cut to 32 tokens, a visible note, every
  view drawn, no console error.
- A model whose vocabulary is padded past its tokenizer's, its padded rows on top: the views
  draw, its top-k lists read "(padding id N)".
- The big attention map has a token label beside each row and above each column, lined up
  with its cells (geometry read from the laid-out page).
- The training charts: round tick values (Heckbert's nice numbers, 1-2-5 steps), log axes at
  powers of ten, the last x label inside its SVG, health legends of distinct colours with no
  "+N more".
"""
from __future__ import annotations

import json
import math
import re

import pytest

pytest.importorskip("aiohttp")

from glassllm.formats import files  # noqa: E402
from glassllm.serve.models import Loaded  # noqa: E402
from glassllm.tokenizers import ByteTokenizer  # noqa: E402

from serve_client import Running  # noqa: E402
from test_every_model import padded_model, short_model  # noqa: E402
from test_serve_browser import browser, check_clean, wait_for  # noqa: E402,F401

VIEWS = ["tokens", "attention", "lens", "attribution", "ablate", "patch", "generate"]
MAP_GEOMETRY = """
const box = (e) => { const r = e.getBoundingClientRect();
  return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: r.width,
          height: r.height, text: e.textContent}; };
return {canvas: box(document.getElementById('att-canvas')),
        x: [...document.querySelectorAll('#att-xlabels .att-label')].map(box),
        y: [...document.querySelectorAll('#att-ylabels .att-label')].map(box)};
"""


def _open(browser, running):
    browser.get(running.url)
    wait_for(lambda: browser.execute_script("return document.body.dataset.ready") in
             ("1", "error"), what="the first analysis")
    assert browser.execute_script("return document.body.dataset.ready") == "1", \
        browser.find_element("id", "status").text


def test_a_short_context_model_opens_on_the_default_prompt(browser, tmp_path):
    from selenium.webdriver.common.by import By
    path = tmp_path / "short.safetensors"
    files.save(short_model(), path, ByteTokenizer())  # as `glassllm train --seq-len 32` saves
    model, tokenizer = files.load(path), files.load_tokenizer(path)
    assert model.cfg.max_len == 32
    running = Running(Loaded("", path.name, model, tokenizer))
    try:
        _open(browser, running)  # on the page's own prompt, untouched
        prompt = browser.execute_script("return document.getElementById('prompt').value")
        assert len(prompt.encode()) > 32
        note = browser.find_element(By.ID, "prompt-note")
        assert note.is_displayed()
        assert note.text == (f"Note: the prompt is {len(prompt.encode())} tokens, over this "
                             f"model's max_len 32: only its first 32 are analysed.")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#surprise-tokens .tok")) == 32
        for view in VIEWS:
            browser.find_element(By.ID, f"nav-{view}").click()
            assert browser.find_element(By.ID, f"view-{view}").is_displayed()
        browser.find_element(By.ID, "nav-attribution").click()
        check = wait_for(lambda: browser.find_element(By.ID, "attr-check").text, what="attr")
        assert "self-check passed" in check
        browser.find_element(By.ID, "nav-ablate").click()
        wait_for(lambda: browser.find_element(By.ID, "abl-loss").get_attribute("data-clean"),
                 what="the ablation")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#lens-table tr")) == 1 + 2 + 1
        assert len(browser.find_elements(By.CSS_SELECTOR, "#att-xlabels .att-label")) == 32
        browser.save_screenshot(str(tmp_path / "short.png"))
        check_clean(browser, running.base)
    finally:
        running.stop()


def test_a_padded_vocabulary_shows_padding_ids(browser, tmp_path):
    from selenium.webdriver.common.by import By
    running = Running(Loaded("", "padded", padded_model(), ByteTokenizer()))
    try:
        _open(browser, running)
        browser.find_element(By.ID, "nav-lens").click()
        cells = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#lens-table td")]
        assert cells and all(re.fullmatch(r"\(padding id \d+\)", c) for c in cells), cells[:5]
        assert all(257 <= int(c[12:-1]) < 300 for c in cells)
        browser.find_element(By.ID, "nav-attribution").click()
        check = wait_for(lambda: browser.find_element(By.ID, "attr-check").text, what="attr")
        assert "self-check passed" in check and "padding" not in check  # a real token's logit
        browser.find_element(By.ID, "nav-ablate").click()
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#abl-table td"),
                 what="the ablation table")
        first = browser.find_elements(By.CSS_SELECTOR, "#abl-table td")[0].text
        assert re.fullmatch(r"\(padding id \d+\)", first), first
        browser.save_screenshot(str(tmp_path / "padded.png"))
        check_clean(browser, running.base)
    finally:
        running.stop()


@pytest.mark.parametrize("n_tokens", [12, 48])
def test_the_attention_map_has_token_labels_lined_up(browser, tmp_path, n_tokens):
    from selenium.webdriver.common.by import By
    from test_report_attention_browser import TEXT
    from glassllm.model import Config, GlassLM
    model = GlassLM(Config(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_len=64), seed=0)
    running = Running(Loaded("", "m", model, ByteTokenizer()))
    try:
        _open(browser, running)
        box = browser.find_element(By.ID, "prompt")
        box.clear()
        box.send_keys(TEXT[:n_tokens])
        browser.find_element(By.ID, "analyze").click()
        wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#surprise-tokens .tok"))
                 == n_tokens, what="the new prompt")
        browser.find_element(By.ID, "nav-attention").click()
        wait_for(lambda: browser.find_element(By.ID, "att-canvas").get_attribute("width") ==
                 str(int(browser.find_element(By.ID, "att-canvas").get_attribute(
                     "data-cell") or 0) * n_tokens), what="the big map")
        g = browser.execute_script(MAP_GEOMETRY)
        canvas, T = g["canvas"], n_tokens
        assert len(g["x"]) == len(g["y"]) == T
        cell = canvas["width"] / T
        assert cell >= 12 and abs(canvas["height"] - canvas["width"]) < 0.5
        tokens = [c.replace(" ", "\u2423") for c in TEXT[:T]]
        for j, label in enumerate(g["x"]):  # keys: column j, above the map
            assert label["text"] == tokens[j]
            assert abs(label["left"] - (canvas["left"] + j * cell)) < 0.5, (j, label, canvas)
            assert abs(label["width"] - cell) < 0.5 and label["bottom"] <= canvas["top"] + 0.5
        for i, label in enumerate(g["y"]):  # queries: row i, left of the map
            assert label["text"] == tokens[i]
            assert abs(label["top"] - (canvas["top"] + i * cell)) < 0.5, (i, label, canvas)
            assert abs(label["height"] - cell) < 0.5 and label["right"] <= canvas["left"] + 0.5
        browser.save_screenshot(str(tmp_path / f"attention-{n_tokens}.png"))
        check_clean(browser, running.base)
    finally:
        running.stop()


# --------------------------------------------------------------------------- the charts
TICKS = """
return arguments[0].map(([lo, hi]) => ({loose: niceTicks(lo, hi, 5, true),
  tight: niceTicks(lo, hi, 5, false), log: logTicks(Math.log10(lo), Math.log10(hi))}));
"""
# the ranges: ticks 5.57, 4.64, 3.7, 2.77, 1.84 and 0.00151, 0.000515 on today's main
RANGES = [[1.84, 5.57], [0.000515, 0.00151], [1, 12000], [0.03, 250.0], [0.31, 0.38],
          [1e-7, 3e-3], [2.2, 19.5]]


def _one_two_five(step: float) -> bool:
    mantissa = step / 10 ** math.floor(math.log10(step) + 1e-9)
    return any(math.isclose(mantissa, m, rel_tol=1e-9) for m in (1, 2, 5, 10))


def _round_linear(values: list[float]) -> bool:
    """Evenly spaced by a 1-2-5 step, every value a whole multiple of it."""
    if len(values) < 2:
        return False
    steps = [b - a for a, b in zip(values, values[1:])]
    step = steps[0]
    return _one_two_five(step) and \
        all(math.isclose(s, step, rel_tol=1e-6) for s in steps) and \
        all(abs(v / step - round(v / step)) < 1e-6 for v in values)


def _power_125(value: float) -> bool:
    return value > 0 and _one_two_five(value)


def test_tick_values_are_round(browser, tmp_path):
    running = Running(None, run_dir=tmp_path / "empty")
    try:
        browser.get(running.url)
        wait_for(lambda: browser.execute_script("return document.body.dataset.ready") == "1")
        got = browser.execute_script(TICKS, RANGES)
    finally:
        running.stop()
    for (lo, hi), ticks in zip(RANGES, got):
        loose = [v for v, _ in ticks["loose"]["ticks"]]
        assert _round_linear(loose) and 3 <= len(loose) <= 8, (lo, hi, loose)
        assert loose[0] <= lo and loose[-1] >= hi  # the axis grows to round ends
        assert ticks["loose"]["lo"] == loose[0] and ticks["loose"]["hi"] == loose[-1]
        tight = [v for v, _ in ticks["tight"]["ticks"]]
        assert _round_linear(tight) and lo <= tight[0] and tight[-1] <= hi, (lo, hi, tight)
        for v, text in ticks["loose"]["ticks"] + ticks["tight"]["ticks"]:
            assert math.isclose(float(text), v, rel_tol=1e-9, abs_tol=1e-12), (v, text)
            assert len(text) <= 8, text  # never 0.30000000000000004
        logs = [(10 ** p, text) for p, text in ticks["log"]]
        assert len(logs) >= 2, (lo, hi, logs)
        for v, text in logs:
            assert "e-1." not in text and math.isclose(float(text), v, rel_tol=1e-9)
            assert lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9)
        # 1, 2, 5 times powers of ten; where fewer than two fall inside (a range of less
        # than a factor of ~4), round values of the plain scale
        assert all(_power_125(v) for v, _ in logs) or \
            _round_linear([v for v, _ in logs]), (lo, hi, logs)
    assert [t for _, t in got[0]["loose"]["ticks"]] == ["1", "2", "3", "4", "5", "6"]
    assert [t for _, t in got[0]["log"]] == ["2", "5"]
    assert [t for _, t in got[2]["log"]] == ["1", "10", "100", "1000", "10000"]
    assert [t for _, t in got[5]["log"]] == ["1e-7", "1e-6", "1e-5", "1e-4", "0.001"]


def _write_run(run):
    run.mkdir()
    steps = list(range(0, 10001, 250))  # the last step a tick, at the axis' right end
    with open(run / "history.csv", "w") as f:
        f.write("step,train_loss,val_loss,lr\n")
        for s in steps:
            loss, lr = 1.84 + 3.73 * math.exp(-s / 2500), 0.00151 * (1 - s / 11000)
            f.write(f"{s},{loss:.4f},,{lr:.6g}\n")
    names = [f"blocks.{i // 7}.t{i % 7}.weight" for i in range(29)]
    with open(run / "health.jsonl", "w") as f:
        for s in steps[::4]:
            f.write(json.dumps({"step": s, "global_grad_norm": 10 ** (-1.4 + s / 10000), "params": {
                n: {"update_to_data_log10": -3.0 + 0.05 * k - s / 20000,
                    "grad_norm": 10 ** (-4 + k / 6 - s / 10000), "grad_to_data": 0.01 + k * 1e-4,
                    "weight_norm": 1.0 + 0.01 * k + s / 1e5}
                for k, n in enumerate(names)}}) + "\n")


CHART_GEOMETRY = """
return [...document.querySelectorAll('#view-training .chart')].map((chart) => {
  const svg = chart.querySelector('svg'), s = svg.getBoundingClientRect();
  const texts = (cls) => [...svg.querySelectorAll('text.' + cls)].map((t) => {
    const r = t.getBoundingClientRect(); return {text: t.textContent, left: r.left, right: r.right,
      top: r.top, bottom: r.bottom}; });
  return {id: chart.id, title: chart.querySelector('h3').textContent,
          svg: {left: s.left, right: s.right, top: s.top, bottom: s.bottom},
          x: texts('xtick'), y: texts('ytick'), legend: chart.querySelector('.legend').textContent,
          named: [...svg.querySelectorAll('path.named')].map((p) => p.getAttribute('stroke')),
          grey: svg.querySelectorAll('path.grey').length};
});
"""


def test_training_charts_read(browser, tmp_path):
    from selenium.webdriver.common.by import By
    run = tmp_path / "run"
    _write_run(run)
    running = Running(None, run_dir=run)
    try:
        browser.get(running.url)
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#health-charts .chart"),
                 what="the charts")
        charts = browser.execute_script(CHART_GEOMETRY)
        browser.save_screenshot(str(tmp_path / "charts.png"))
        check_clean(browser, running.base)
    finally:
        running.stop()
    by_id = {c["id"]: c for c in charts}
    assert {"chart-loss", "chart-lr", "health-grad_norm", "health-global_grad_norm"} <= set(by_id)
    for c in charts:
        assert c["x"] and c["y"], c["title"]
        for t in c["x"] + c["y"]:  # every tick's text whole, inside its SVG
            assert t["left"] >= c["svg"]["left"] - 0.5 and t["right"] <= c["svg"]["right"] + 0.5, \
                (c["title"], t, c["svg"])
            assert t["top"] >= c["svg"]["top"] - 0.5 and t["bottom"] <= c["svg"]["bottom"] + 0.5
        assert _round_linear([float(t["text"]) for t in c["x"]]), (c["title"], c["x"])
        assert "more" not in c["legend"]
        assert len(set(c["named"])) == len(c["named"]) <= 5, c  # distinct colours
        log = c["id"] in ("health-grad_norm", "health-grad_to_data", "health-global_grad_norm")
        ys = [float(t["text"]) for t in c["y"]]
        if log:
            assert all(_power_125(v) for v in ys) or _round_linear(ys), (c["title"], ys)
        else:
            assert _round_linear(ys), (c["title"], ys)
    assert [t["text"] for t in by_id["chart-loss"]["x"]] == ["0", "2000", "4000", "6000", "8000",
                                                             "10000"]
    assert [t["text"] for t in by_id["chart-loss"]["y"]] == ["1", "2", "3", "4", "5", "6"]
    grad = by_id["health-grad_norm"]
    assert [t["text"] for t in grad["y"]] == ["1e-5", "1e-4", "0.001", "0.01", "0.1", "1"]
    assert [t["text"] for t in by_id["health-global_grad_norm"]["y"]] == ["0.05", "0.1", "0.2"]
    assert len(grad["named"]) == 5 and grad["grey"] == 24
    assert "24 others in grey" in grad["legend"]


def test_the_report_of_a_cut_prompt_and_a_padded_vocabulary(browser, tmp_path):
    """`glassllm inspect`'s page: the note over its views, "(padding id N)" in its lens."""
    from selenium.webdriver.common.by import By

    from glassllm.lens.report import fit_prompt, inspect_model, write_html
    tok = ByteTokenizer()
    model = padded_model()
    ids, note = fit_prompt(tok.encode("abcabcab" * 10), model.cfg.max_len)
    assert note and len(ids) == 64
    path = write_html(inspect_model(model, ids, tok, note=note), tmp_path / "report.html")
    browser.get("file://" + str(path))
    wait_for(lambda: browser.execute_script("return document.body.dataset.ready") == "1")
    shown = browser.find_element(By.ID, "prompt-note")
    assert shown.is_displayed() and shown.text == f"Note: {note}."
    browser.find_element(By.ID, "nav-lens").click()
    cells = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#lens-table td")]
    assert len(cells) == 3 * 64 and all(re.fullmatch(r"\(padding id \d+\)", c) for c in cells)
    browser.find_element(By.ID, "nav-attribution").click()
    assert "padding" not in browser.find_element(By.ID, "attr-note").text
    assert browser.execute_script("return window.__errors") == []
