"""`glassllm serve` stays responsive, seen in a real browser (Debian's headless Chromium
through the system chromedriver, as tests/test_serve_browser.py; nothing here downloads a
browser): the page loads and analyses within 2 s while eight generation streams are open; a
patching sweep left behind (the page reloaded) frees its model within 2 s; an analysis of a slow
model arriving after that of a fast model picked since is not drawn; with --run and no
--model the header names the run's model; a malformed health row leaves the training page
drawn, the row named among the warnings.
"""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

pytest.importorskip("aiohttp")

from glassllm.formats import files  # noqa: E402
from glassllm.lens import interpret  # noqa: E402
from glassllm.serve.limits import Limits  # noqa: E402
from glassllm.serve.models import Loaded, encode_prompt  # noqa: E402
from glassllm.tokenizers import ByteTokenizer  # noqa: E402

from serve_client import Running  # noqa: E402
from test_serve_browser import browser, check_clean, wait_for  # noqa: E402,F401
from test_serve_live import (LONG_CLEAN, LONG_CORRUPTED, LONG_STREAM, open_stream,  # noqa: E402
                             sweep_model, tiny_model)

PAGE_PROMPT = "Once upon a time there was a little cat. Once upon a time"  # index.html's


def _ready(browser) -> bool:
    return browser.execute_script("return document.body.dataset.ready") == "1"


def test_the_page_loads_and_analyses_while_eight_streams_run(browser):
    running = Running(Loaded("", "tiny", tiny_model(), ByteTokenizer()))
    streams = []
    try:
        streams = [open_stream(running, LONG_STREAM)
                   for i in range(8)]
        wait_for(lambda: all(len(s[1]) > 2 for s in streams), 30, "eight streams")
        started = time.monotonic()
        browser.get(running.url)
        wait_for(lambda: _ready(browser), 20, "the analysis")
        took = time.monotonic() - started
        status = browser.find_element("id", "status").text
        print(f"measured: {took:.2f} s")
        assert took < 2, (took, status)
        assert status.startswith(f"{len(encode_prompt(ByteTokenizer(), PAGE_PROMPT))} tokens")
        assert all(thread.is_alive() for _, _, thread in streams)  # still streaming
        check_clean(browser, running.base)
    finally:
        for response, _, _ in streams:
            response.close()
        running.stop()


def test_a_sweep_left_behind_frees_its_model(browser):
    from selenium.webdriver.common.by import By
    running = Running(Loaded("", "sweep", sweep_model(), ByteTokenizer()),
                      limits=Limits(patch_forwards=1 << 22))
    try:
        browser.get(running.url)
        wait_for(lambda: _ready(browser), 60, "the first analysis")
        browser.find_element(By.ID, "prompt").clear()
        browser.find_element(By.ID, "prompt").send_keys(LONG_CLEAN)
        browser.find_element(By.ID, "nav-patch").click()
        field = browser.find_element(By.ID, "patch-corrupted")
        field.clear()
        field.send_keys(LONG_CORRUPTED)
        browser.find_element(By.ID, "patch-run").click()  # thousands of forwards: long
        time.sleep(1.5)
        assert browser.find_element(By.ID, "patch-note").text == "running the sweep..."
        started = time.monotonic()
        browser.get(running.url)  # the tab reloaded: its sweep's connection is closed
        wait_for(lambda: _ready(browser), 60, "the analysis after the reload")
        took = time.monotonic() - started
        print(f"measured: {took:.2f} s")
        assert took < 2, took
        check_clean(browser, running.base)
    finally:
        running.stop()


def test_only_the_latest_answer_is_drawn_and_the_run_page_survives(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    run = tmp_path / "run"
    run.mkdir()
    slow, fast = tiny_model(1), tiny_model(2)
    files.save(slow, run / "slow.safetensors", ByteTokenizer())
    time.sleep(0.05)
    files.save(fast, run / "fast.safetensors", ByteTokenizer())  # the newest: the default
    (run / "steps.csv").write_text("step,lr,loss\n" + "".join(f"{s},0.001,{5 - s / 100}\n"
                                                             for s in range(50)))
    rows = [{"step": 0, "loss": 5.0, "warnings": ["w0"]}, {"step": 10, "warnings": 5},
            {"step": 20, "loss": 4.9, "warnings": []}]
    (run / "health.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    running = Running(None, run_dir=run)
    get = running.server.store.get

    def slow_get(name):  # the slow model: its answers come 3 s late
        if name == "slow.safetensors":
            time.sleep(3)
        return get(name)
    running.server.store.get = slow_get
    ids = np.asarray(encode_prompt(ByteTokenizer(), PAGE_PROMPT))
    mean = {n: interpret.token_surprise(m, ids).mean_nats for n, m in (("slow", slow),
                                                                      ("fast", fast))}
    try:
        browser.get(running.url)
        wait_for(lambda: _ready(browser), 60, "the first analysis")
        picker = Select(browser.find_element(By.ID, "model"))
        picker.select_by_value("slow.safetensors")
        picker.select_by_value("fast.safetensors")
        time.sleep(4.5)  # the slow analysis would have arrived by now
        status = browser.find_element(By.ID, "status").text
        assert f"{mean['fast']:.3f} nats" in status and f"{mean['slow']:.3f}" not in status, \
            (status, mean)
        assert browser.execute_script("return document.body.dataset.model") == \
            "fast.safetensors"
        meta = browser.find_element(By.ID, "meta").text  # no --model: the run's model named
        assert meta.startswith("fast.safetensors: ") and "2 layers" in meta, meta
        # the training page: drawn, the malformed row skipped and named
        browser.find_element(By.ID, "nav-training").click()
        points = browser.find_element(By.ID, "train-status")
        wait_for(lambda: points.get_attribute("data-points") == "50", 30, "the run's points")
        warnings = browser.find_element(By.ID, "train-warnings").text
        assert "w0" in warnings and "line 2: warnings must be a list of strings" in warnings
        check_clean(browser, running.base)
    finally:
        running.stop()
