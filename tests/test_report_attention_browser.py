"""The report's attention map in headless Chromium: a label per token on both axes, each over
(beside) exactly its column (row) of cells, at 10 and 62 tokens; the health panels name their
top tensors in a legend and grey the rest. Geometry is read from the laid-out page
(getBoundingClientRect), not from the code that placed it."""
from __future__ import annotations

import json
import os

import pytest

from glassllm.tokenizers import ByteTokenizer
from glassllm.lens.report import inspect_model, write_html
from glassllm.model import Config, GlassLM

from test_report_browser import browser  # noqa: F401  (the fixture: Chromium or a loud skip)

TEXT = ("Once upon a time, a cat sat on a mat; a dog ran by and barked at it. The end of it "
        "all was a nap.")
GEOMETRY = """
const box = (e) => { const r = e.getBoundingClientRect();
  return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: r.width,
          height: r.height, text: e.textContent, visible: r.width > 0 && r.height > 0}; };
return {canvas: box(document.getElementById('att-canvas')),
        x: [...document.querySelectorAll('#att-xlabels .att-label')].map(box),
        y: [...document.querySelectorAll('#att-ylabels .att-label')].map(box)};
"""


def report_of(tmp_path, n_tokens: int, run_dir=None) -> str:
    model = GlassLM(Config(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_len=64), seed=0)
    ids = ByteTokenizer().encode(TEXT)[:n_tokens]
    assert len(ids) == n_tokens
    ins = inspect_model(model, ids, ByteTokenizer(), run_dir=run_dir)
    return write_html(ins, tmp_path / f"report-{n_tokens}.html")


@pytest.mark.parametrize("n_tokens", [10, 62])
def test_labels_line_up_with_the_cells(browser, tmp_path, n_tokens):  # noqa: F811
    from selenium.webdriver.common.by import By
    browser.get("file://" + os.path.abspath(report_of(tmp_path, n_tokens)))
    browser.find_element(By.ID, "nav-attention").click()
    g = browser.execute_script(GEOMETRY)
    canvas, T = g["canvas"], n_tokens
    assert len(g["x"]) == len(g["y"]) == T
    cell = canvas["width"] / T
    assert cell >= 12 and abs(canvas["height"] - canvas["width"]) < 0.5
    tokens = [chr(b) for b in TEXT.encode()[:T]]
    for j, label in enumerate(g["x"]):  # keys: column j, above the map
        assert label["visible"] and label["text"] == tokens[j].replace(" ", "\u2423")
        assert abs(label["left"] - (canvas["left"] + j * cell)) < 0.5, (j, label, canvas)
        assert abs(label["width"] - cell) < 0.5
        assert label["bottom"] <= canvas["top"] + 0.5 and label["height"] >= 20
    for i, label in enumerate(g["y"]):  # queries: row i, left of the map
        assert label["visible"] and label["text"] == tokens[i].replace(" ", "\u2423")
        assert abs(label["top"] - (canvas["top"] + i * cell)) < 0.5, (i, label, canvas)
        assert abs(label["height"] - cell) < 0.5
        assert label["right"] <= canvas["left"] + 0.5 and label["width"] >= 8
    # hovering a row's label marks it as the query
    from selenium.webdriver.common.action_chains import ActionChains
    rows = browser.find_elements(By.CSS_SELECTOR, "#att-ylabels .att-label")
    ActionChains(browser).move_to_element(rows[T - 1]).perform()
    assert "query" in rows[T - 1].get_attribute("class")
    assert browser.execute_script("return window.__errors") == []


def test_health_panels_name_the_outliers_and_grey_the_rest(browser, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By
    run = tmp_path / "run"
    run.mkdir()
    names = [f"blocks.{i // 7}.t{i % 7}.weight" for i in range(29)]
    outliers = {names[3]: -1.0, names[11]: -5.5, names[17]: -0.5, names[20]: -6.0,
                names[28]: -1.5}  # the five farthest from the others' -3.0
    with open(run / "health.jsonl", "w") as f:
        for step in (10, 20, 30):
            f.write(json.dumps({"step": step, "params": {
                n: {"update_to_data_log10": outliers.get(n, -3.0 + 0.01 * k),
                    "grad_norm": 0.1, "grad_to_data": 0.01, "weight_norm": 1.0}
                for k, n in enumerate(names)}}) + "\n")
    browser.get("file://" + os.path.abspath(report_of(tmp_path, 10, run_dir=str(run))))
    browser.find_element(By.ID, "nav-training").click()
    chart = browser.find_elements(By.CSS_SELECTOR, "#health-charts .chart")[0]
    assert chart.find_element(By.TAG_NAME, "h3").text.startswith("update:data ratio")
    named = chart.find_elements(By.CSS_SELECTOR, "path.named")
    grey = chart.find_elements(By.CSS_SELECTOR, "path.grey")
    assert sorted(p.get_attribute("data-name") for p in named) == sorted(outliers)
    assert len(grey) == 24
    assert {p.value_of_css_property("stroke") for p in grey} == {"rgb(207, 207, 207)"}
    assert len({p.get_attribute("stroke") for p in named}) == 5  # five colours
    legend = [e.text for e in chart.find_elements(By.CSS_SELECTOR, ".legend-item")]
    assert sorted(t.lstrip("\u25a0 ").strip() for t in legend) == sorted(outliers)
    assert chart.find_element(By.CSS_SELECTOR, ".legend-rest").text.startswith(
        "\u25a0 24 others in grey")
    assert browser.execute_script("return window.__errors") == []
