"""`glassllm serve` in a real browser: Debian's headless Chromium driven by Selenium through
the system chromedriver (as tests/test_report_browser.py; nothing here downloads a browser).

The model page on llama2.c's stories260K (a trained model: the views show real structure):
a prompt typed, its tokens and surprise; every view switched; a head ablated by a click and
the loss change equal to `glassllm.lens.interpret.ablate`'s; a patching heat map whose cells
equal `patching_sweep`'s; 20 tokens streamed, identical to `glassllm generate` with the same
seed; the stop button. The training page on a real `glassllm train` running beside it: the
curve gains points as the run writes its files. Both: no console error, no CSP violation, no
request leaving the server.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("aiohttp")

from glassllm.formats import files, llama2c  # noqa: E402
from glassllm.lens import interpret  # noqa: E402
from glassllm.serve.models import Loaded, encode_prompt  # noqa: E402

from conftest import shared_data_path  # noqa: E402
from serve_client import Running  # noqa: E402
from test_report_browser import CHROMEDRIVER, CHROMIUM, _missing  # noqa: E402

MODEL_VIEWS = ["tokens", "attention", "lens", "attribution", "ablate", "patch", "generate"]
PROMPT = "Once upon a time, there was a little girl named Lily. She loved to play outside."
CORRUPTED = "Once upon a time, there was a little boy named Tim. He loved to play outside."


@pytest.fixture
def browser(tmp_path):
    missing = _missing()
    if missing:
        message = f"!!! BROWSER TEST NOT RUN: {missing} is not installed !!!"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (CI=true: this must run)")
        pytest.skip(message)
    import shutil

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    # console messages, and every request the page makes (performance log: Network events)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver_path = CHROMEDRIVER if os.path.exists(CHROMEDRIVER) else shutil.which("chromedriver")
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
        window.__errors = [];
        window.addEventListener('error', e => window.__errors.push(String(e.message)));
        window.addEventListener('unhandledrejection', e => window.__errors.push('rejected ' + e.reason));
        window.addEventListener('securitypolicyviolation',
                                e => window.__errors.push('CSP ' + e.blockedURI));
    """})
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(predicate, timeout: float = 60, what: str = "the page"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def requests_made(browser, base: str) -> list[str]:
    """The URLs of every request our page made (its document is the server's), and of any
    http(s) request at all; the browser's own chrome:// pages (its blank start tab) left out."""
    import json
    urls = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            params = message["params"]
            url = params["request"]["url"]
            if params.get("documentURL", "").startswith(base) or url.startswith("http"):
                urls.append(url)
    return urls


def check_clean(browser, base: str) -> None:
    """No script error, no CSP violation, no console error or warning, every request to
    the server itself (or a data: URL)."""
    errors = browser.execute_script("return window.__errors")
    assert errors == [], errors
    console = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert console == [], console
    made = requests_made(browser, base)
    outside = [u for u in made if not (u.startswith(base + "/") or u.startswith("data:"))]
    assert made and outside == [], outside


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    folder = shared_data_path("llama2c")
    model = llama2c.from_llama2c(folder / "stories260K.bin")
    tokenizer = llama2c.tokenizer_from_llama2c(folder / "tok512.bin")
    path = tmp_path_factory.mktemp("stories") / "stories260K.safetensors"
    files.save(model, path, tokenizer)
    return model, tokenizer, path


def test_model_page_every_view(browser, stories, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    model, tokenizer, path = stories
    ids = np.asarray(encode_prompt(tokenizer, PROMPT))
    assert len(encode_prompt(tokenizer, CORRUPTED)) == len(ids)
    running = Running(Loaded("", path.name, model, tokenizer))
    try:
        find = lambda css: browser.find_elements(By.CSS_SELECTOR, css)  # noqa: E731
        browser.get(running.url)
        wait_for(lambda: browser.execute_script("return document.body.dataset.ready") == "1")
        # type a prompt: its tokens, coloured by surprise
        box = browser.find_element(By.ID, "prompt")
        box.clear()
        box.send_keys(PROMPT)
        browser.find_element(By.ID, "analyze").click()
        spans = wait_for(lambda: len(find("#surprise-tokens .tok")) == len(ids) and
                         find("#surprise-tokens .tok"), what="the tokens")
        assert [s.text for s in spans[1:4]] == [" Once", " upon", " a"]  # as the model cut them
        colours = {s.value_of_css_property("background-color") for s in spans[1:]}
        assert len(colours) > 5
        surprise = interpret.token_surprise(model, ids)
        assert f"{surprise.mean_nats:.3f} nats" in browser.find_element(By.ID, "status").text
        for view in MODEL_VIEWS:  # every view, one at a time
            browser.find_element(By.ID, f"nav-{view}").click()
            for other in MODEL_VIEWS:
                shown = browser.find_element(By.ID, f"view-{other}").is_displayed()
                assert shown == (other == view), (view, other)
            browser.save_screenshot(str(tmp_path / f"{view}.png"))
        # attention: a thumbnail per head with its detector label; hovering lights tokens
        browser.find_element(By.ID, "nav-attention").click()
        cfg = model.cfg
        assert len(find("#att-grid .thumb")) == cfg.n_layers * cfg.n_heads
        find("#att-grid .thumb")[cfg.n_heads + 3].click()  # L1H3
        wait_for(lambda: browser.find_element(By.ID, "att-head").get_attribute("value") == "3")
        tokens = find("#att-tokens .tok")
        ActionChains(browser).move_to_element(tokens[6]).perform()
        lit = [t.value_of_css_property("background-color") for t in tokens]
        assert all(b.startswith("rgba(29, 111, 184") for b in lit[:7])
        # logit lens: L+1 rows below the header
        browser.find_element(By.ID, "nav-lens").click()
        assert len(find("#lens-table tr")) == 1 + cfg.n_layers + 1
        # attribution: the self-check's result shown
        browser.find_element(By.ID, "nav-attribution").click()
        check = wait_for(lambda: browser.find_element(By.ID, "attr-check").text, what="attr")
        assert "self-check passed" in check
        # ablate a head: the loss change is interpret.ablate's
        browser.find_element(By.ID, "nav-ablate").click()
        wait_for(lambda: browser.find_element(By.ID, "abl-loss").get_attribute("data-clean"))
        browser.find_element(By.ID, "abl-L1H2").click()
        loss = browser.find_element(By.ID, "abl-loss")
        wait_for(lambda: "1 part(s)" in loss.text, what="the ablation")
        _, clean = interpret.ablate(model, ids[None, :-1], ids[None, 1:])
        _, ablated = interpret.ablate(model, ids[None, :-1], ids[None, 1:], heads=[(1, 2)])
        assert abs(float(loss.get_attribute("data-change")) - (ablated - clean)) < 2e-6
        assert abs(float(loss.get_attribute("data-ablated")) - ablated) < 1e-6
        # patching: every cell of the heat map is patching_sweep's
        browser.find_element(By.ID, "nav-patch").click()
        field = browser.find_element(By.ID, "patch-corrupted")
        field.clear()
        field.send_keys(CORRUPTED)
        browser.find_element(By.ID, "patch-run").click()
        cells = wait_for(lambda: find("#patch-table td.cell"), 120, "the heat map")
        note = browser.find_element(By.ID, "patch-note")
        correct, wrong = int(note.get_attribute("data-correct")), int(note.get_attribute(
            "data-wrong"))
        sweep = interpret.patching_sweep(model, ids[None], np.asarray(
            encode_prompt(tokenizer, CORRUPTED))[None], interpret.logit_difference(correct, wrong))
        values = np.array([float(c.get_attribute("data-value")) for c in cells])
        assert values.shape == (sweep.values.size,)
        assert np.allclose(values, sweep.values.reshape(-1), atol=1e-5)
        cells[5].click()
        assert "metric after patching" in browser.find_element(By.ID, "patch-detail").text
        browser.save_screenshot(str(tmp_path / "patch.png"))
        # generation: 20 tokens streamed, the same text as `glassllm generate --seed 3`
        browser.find_element(By.ID, "nav-generate").click()
        for field, value in (("gen-max", "20"), ("gen-seed", "3")):
            browser.find_element(By.ID, field).clear()
            browser.find_element(By.ID, field).send_keys(value)
        browser.find_element(By.ID, "gen-run").click()
        wait_for(lambda: browser.find_element(By.ID, "gen-text").get_attribute("data-done"),
                 what="the generation")
        produced = browser.execute_script("return document.getElementById('gen-produced')"
                                          ".textContent")
        assert len(find("#gen-steps .tok")) == 20
        cli = subprocess.run([sys.executable, "-m", "glassllm.cli", "generate", "--model",
                              str(path), "--prompt", PROMPT, "--max-new-tokens", "20",
                              "--seed", "3"], capture_output=True, text=True, timeout=120)
        assert cli.returncode == 0, cli.stderr
        assert PROMPT + produced + "\n" == cli.stdout
        # the stop button ends a long generation
        browser.find_element(By.ID, "gen-max").clear()
        browser.find_element(By.ID, "gen-max").send_keys("1000")
        browser.find_element(By.ID, "gen-run").click()
        wait_for(lambda: len(find("#gen-steps .tok")) > 3, what="tokens")
        browser.find_element(By.ID, "gen-stop").click()
        wait_for(lambda: browser.find_element(By.ID, "gen-status").text == "stopped")
        assert len(find("#gen-steps .tok")) < 1000
        check_clean(browser, running.base)
    finally:
        running.stop()


def test_training_page_gains_points_while_a_run_trains(browser, tmp_path):
    from selenium.webdriver.common.by import By
    data = tmp_path / "data.txt"
    data.write_text("It was the best of times, it was the worst of times. " * 300)
    run = tmp_path / "run"
    running = Running(None, run_dir=run)  # the run does not exist yet
    train = None
    try:
        browser.get(running.url)
        status = browser.find_element(By.ID, "train-status")
        wait_for(lambda: "does not exist yet" in status.text, what="the empty run")
        train = subprocess.Popen(
            [sys.executable, "-m", "glassllm.cli", "train", "--data", str(data), "--out",
             str(run / "model.safetensors"), "--log-csv", str(run / "steps.csv"), "--steps",
             "6000", "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--seq-len", "16",
             "--batch-size", "2", "--eval-every", "3000", "--health-every", "10",
             "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # the page polls every 1.5 s: 6000 steps (~2 ms each here) span several polls on a fast CI
        seen = []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and train.poll() is None:
            points = status.get_attribute("data-points")
            if points is not None and (not seen or int(points) != seen[-1]):
                seen.append(int(points))
            time.sleep(0.2)
        assert train.wait(60) == 0, train.stderr.read()
        assert len(seen) >= 3 and seen == sorted(seen) and seen[-1] > seen[0], seen
        # after the run: its last points, its health panels, its model, a sample from it
        wait_for(lambda: status.get_attribute("data-points") == "6000", what="all 6000 steps")
        chart = browser.find_element(By.CSS_SELECTOR, "#chart-loss svg")
        assert int(chart.get_attribute("data-points")) >= 6000
        assert len(browser.find_elements(By.CSS_SELECTOR, "#health-charts .chart")) >= 6
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#train-models button"),
                 what="the saved model")
        wait_for(lambda: browser.find_element(By.ID, "train-sample").text.strip(),
                 what="a sample")
        browser.save_screenshot(str(tmp_path / "training.png"))
        # a saved model of the run opens in the model views (a prompt within its max_len 16)
        browser.find_element(By.ID, "prompt").clear()
        browser.find_element(By.ID, "prompt").send_keys("It was the best")
        browser.find_element(By.CSS_SELECTOR, "#train-models button[data-model="
                                              "'model.safetensors']").click()
        wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#surprise-tokens .tok")),
                 what="the run's model analysed")
        assert browser.find_element(By.ID, "model").get_attribute("value") == "model.safetensors"
        check_clean(browser, running.base)
    finally:
        if train is not None:
            train.kill()
            train.wait()
        running.stop()
