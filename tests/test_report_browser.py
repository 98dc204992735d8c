"""The inspection report in a real browser: Debian's headless Chromium driven by Selenium
through the system chromedriver (nothing here downloads a browser).

`.ci/run` installs chromium + chromium-driver (apt) and selenium (the test extra). Where they
are missing the test is skipped with a loud reason -- except under CI=true, where it fails.
"""
from __future__ import annotations

import io
import json
import os
import shutil

import numpy as np
import pytest

from glassllm.model import Config, GlassLM
from glassllm.lens.report import inspect_model, write_html
from glassllm.tokenizers import ByteTokenizer

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
VIEWS = ["attention", "lens", "surprise", "attribution", "heads", "training"]


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the Python package selenium (pip install -e '.[test]')"
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (os.path.exists(path) or shutil.which(os.path.basename(path))):
            return f"{path} (apt-get install -y {package})"
    return None


@pytest.fixture
def browser(tmp_path):
    missing = _missing()
    if missing:
        message = (f"!!! BROWSER TEST NOT RUN: {missing} is not installed, so the HTML report "
                   f"was NOT checked in a real browser !!!")
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (CI=true: this must run)")
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver_path = CHROMEDRIVER if os.path.exists(CHROMEDRIVER) else shutil.which("chromedriver")
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    # catch every script error and every attempt to reach the network, from the first line
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
        window.__errors = [];
        window.addEventListener('error', e => window.__errors.push(String(e.message)));
        window.addEventListener('securitypolicyviolation',
                                e => window.__errors.push('CSP ' + e.blockedURI));
    """})
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def report(tmp_path):
    cfg = Config(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, max_len=64)
    model = GlassLM(cfg, seed=0)
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "history.csv", "w") as f:
        f.write("step,train_loss,val_loss,lr\n")
        for step in range(0, 50, 5):
            f.write(f"{step},{5 - step / 20},{5.1 - step / 21 if step % 10 == 0 else ''},1e-3\n")
    with open(run / "health.jsonl", "w") as f:
        for step in (10, 20, 30):
            f.write(json.dumps({
                "step": step, "global_grad_norm": 1.0 / step, "clipped": 0, "nonfinite": 0,
                "params": {"blocks.0.attention.query.weight": {
                    "update_to_data_log10": -3.0 + step / 100, "grad_norm": 0.1,
                    "grad_to_data": 0.01, "weight_norm": 1.0}},
                "activations": {"blocks.0.mlp.hidden_post": {"mean": 0.0, "std": 0.5,
                                                             "saturated": 0.01, "dead": 0.1}},
                "attention": {"L0H0": {"entropy": 1.5}}}) + "\n")
    ids = ByteTokenizer().encode("Once upon a time there was a cat. Once upon a time")
    ins = inspect_model(model, ids, ByteTokenizer(), run_dir=str(run))
    return write_html(ins, tmp_path / "report.html")


def test_report_has_no_external_resources(report):
    html = open(report, encoding="utf-8").read()
    lowered = html.lower()
    for bad in ("<link rel=\"stylesheet", "@import", "src=\"http", "href=\"http", "cdn",
                "fetch(", "xmlhttprequest", "<iframe"):
        assert bad not in lowered, bad
    # the only URL in the page is the SVG namespace, a name, never fetched
    urls = lowered.count("http:") + lowered.count("https:")
    assert urls == lowered.count("http://www.w3.org/2000/svg") == 1
    assert "default-src 'none'" in html  # and the page forbids loading anything


def _png_stats(png: bytes):
    from matplotlib import image
    pixels = image.imread(io.BytesIO(png), format="png")[..., :3]
    flat = pixels.reshape(-1, 3)
    return len(np.unique(np.round(flat * 255).astype(int), axis=0)), float(pixels.std())


def test_report_in_headless_chromium(browser, report, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    browser.get("file://" + os.path.abspath(report))
    assert browser.execute_script("return document.body.dataset.ready") == "1"
    for view in VIEWS:
        button = browser.find_element(By.ID, f"nav-{view}")
        button.click()
        for other in VIEWS:
            section = browser.find_element(By.ID, f"view-{other}")
            assert section.is_displayed() == (other == view), (view, other)
        assert "active" in button.get_attribute("class")
    # attention: hovering token 5 colours the tokens it attends to (and none after it)
    browser.find_element(By.ID, "nav-attention").click()
    tokens = browser.find_elements(By.CSS_SELECTOR, "#att-tokens .tok")
    assert len(tokens) == 50
    ActionChains(browser).move_to_element(tokens[5]).perform()
    backgrounds = [t.value_of_css_property("background-color") for t in tokens]
    assert all(b.startswith("rgba(29, 111, 184") for b in backgrounds[:6]), backgrounds[:6]
    assert all(b in ("rgba(0, 0, 0, 0)", "transparent") for b in backgrounds[6:])
    # changing the head redraws; the lens grid has layers+1 rows of 50 cells
    browser.find_element(By.CSS_SELECTOR, "#att-head option[value='3']").click()
    browser.find_element(By.ID, "nav-lens").click()
    rows = browser.find_elements(By.CSS_SELECTOR, "#lens-table tr")
    assert len(rows) == 1 + 3 and len(rows[1].find_elements(By.TAG_NAME, "td")) == 50
    browser.find_element(By.ID, "nav-attribution").click()
    assert len(browser.find_elements(By.CSS_SELECTOR, "#attr-bars .bar-row")) == 1 + 2 * (4 + 1)
    browser.find_element(By.ID, "nav-training").click()
    charts = browser.find_elements(By.CSS_SELECTOR, "#train-charts svg path")
    assert len(charts) >= 3  # train, val, lr curves
    assert len(browser.find_elements(By.CSS_SELECTOR, "#health-charts .chart")) >= 6
    png = browser.get_screenshot_as_png()
    (tmp_path / "training.png").write_bytes(png)
    browser.find_element(By.ID, "nav-attention").click()
    png = browser.get_screenshot_as_png()
    colours, spread = _png_stats(png)
    assert colours > 50 and spread > 0.05, (colours, spread)  # not a blank page
    errors = browser.execute_script("return window.__errors")
    assert errors == [], errors
    console = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert console == [], console


# --------------------------------------------------------------------------- hostile strings
# Each would end or bend the page's inline JSON block if it were inlined as it is: a
# "</script>" ends the element; "<!--" then "<script" makes the parser swallow the page's own
# "</script>" (WHATWG HTML's "script data double escaped" state); U+2028 ended a line of
# JavaScript before ES2019; "&lt;" must stay four characters, not become "<".
HOSTILE = ["</script><script>window.__pwned = 1</script>", "<!--<script>", "\u2028",
           "&lt;"]
HOSTILE_FILE = "<!--<script>&lt;\u2028&amp;>.safetensors"  # no "/": a file name


def _hostile_tokenizer():
    """A SentencePiece vocabulary whose pieces are the hostile strings, reached by merging
    their prefixes left to right (each longer prefix scores higher)."""
    from glassllm.tokenizers import SentencePieceTokenizer
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [" "]
    scores = [0.0] * len(pieces)
    for char in sorted(set("".join(HOSTILE))):
        if char not in pieces:
            pieces.append(char)
            scores.append(-1e10)  # characters never merge into anything by themselves
    for text in HOSTILE:
        for k in range(2, len(text) + 1):
            if text[:k] not in pieces:
                pieces.append(text[:k])
                scores.append(k + len(pieces) * 1e-3)  # distinct scores
    return SentencePieceTokenizer(pieces, scores)


def test_hostile_strings_leave_the_whole_report_in_chromium(browser, tmp_path):
    """Hostile strings as the model's file name, token pieces and health.jsonl names,
    through `glassllm inspect`: the page is whole (its last element there, its script run to
    the end), its JSON parses, and every string shows literally."""
    from selenium.webdriver.common.by import By
    from glassllm.cli import main
    from glassllm.formats import files
    tok = _hostile_tokenizer()
    model = GlassLM(Config(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4,
                           n_kv_heads=2, max_len=64), seed=0)
    model_path = tmp_path / HOSTILE_FILE
    files.save(model, model_path, tokenizer=tok)
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "health.jsonl", "w", encoding="utf-8") as f:
        for step in (10, 20):
            f.write(json.dumps({"step": step, "global_grad_norm": 1.0 / step,
                                "note": "".join(HOSTILE),  # a string value: in the JSON only
                                "params": {h: {"grad_norm": 0.1 * step} for h in HOSTILE},
                                "activations": {HOSTILE[1]: {"std": 0.5}}},
                               ensure_ascii=False) + "\n")  # the raw characters in the file
    out = tmp_path / "report.html"
    prompt = "".join(HOSTILE)
    assert main(["inspect", "--model", str(model_path), "--prompt", prompt, "--run", str(run),
                 "--out", str(out), "--color", "never"]) == 0
    browser.get(out.as_uri())
    page = browser.execute_script("""
        const data = JSON.parse(document.getElementById('report-data').textContent);
        return {ready: document.body.dataset.ready, pwned: window.__pwned === undefined,
                last: document.body.lastElementChild.tagName, tooltip: !!$('tooltip'),
                scripts: document.scripts.length, json_title: data.title, json_tokens: data.tokens,
                json_note: data.run.health[1].note,
                title: document.title, heading: $('title').textContent};""")
    title = f"glassllm inspect: {HOSTILE_FILE}"
    assert page == {"ready": "1", "pwned": True, "last": "SCRIPT", "tooltip": True, "scripts": 2,
                    "json_title": title, "json_tokens": ["<s>", " "] + HOSTILE,
                    "json_note": "".join(HOSTILE), "title": title,
                    "heading": title}
    browser.find_element(By.ID, "nav-attention").click()
    shown = [t.get_attribute("textContent") for t in
             browser.find_elements(By.CSS_SELECTOR, "#att-tokens .tok")]
    assert shown[2:] == HOSTILE, shown
    browser.find_element(By.ID, "nav-training").click()
    legends = " ".join(e.get_attribute("textContent") for e in
                       browser.find_elements(By.CSS_SELECTOR, "#health-charts .legend"))
    for h in HOSTILE:
        assert h in legends, (h, legends)
    errors = browser.execute_script("return window.__errors")
    assert errors == [], errors


def test_a_file_name_that_is_not_utf8_gives_a_whole_report(browser, tmp_path):
    """A model file whose name is not UTF-8 (a valid Linux name; Python holds its byte as a
    lone surrogate, PEP 383) gives a report whose title shows U+FFFD for that byte, and the
    whole page, instead of a UnicodeEncodeError after the analyses."""
    from glassllm.cli import main
    from glassllm.formats import files
    model = GlassLM(Config(d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, max_len=16), seed=0)
    name = os.fsdecode(b"m\xff<!--<script>.safetensors")
    files.save(model, tmp_path / name, tokenizer=ByteTokenizer())
    out = tmp_path / os.fsdecode(b"r\xfe.html")
    assert main(["inspect", "--model", str(tmp_path / name), "--prompt", "hi there",
                 "--out", str(out), "--color", "never"]) == 0
    browser.get(out.as_uri())
    page = browser.execute_script("""
        const data = JSON.parse(document.getElementById('report-data').textContent);
        return {ready: document.body.dataset.ready, title: document.title,
                last: document.body.lastElementChild.tagName,
                json_title: data.title.toWellFormed()};""")  # U+DCFF shown as U+FFFD
    assert page == {"ready": "1", "title": "glassllm inspect: m\ufffd<!--<script>.safetensors",
                    "last": "SCRIPT",
                    "json_title": "glassllm inspect: m\ufffd<!--<script>.safetensors"}
    assert browser.execute_script("return window.__errors") == []
