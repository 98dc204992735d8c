"""The Features view of `glassllm serve` in a real browser (Debian's headless Chromium through
the system chromedriver, as tests/test_serve_browser.py): a dictionary on stories260K's middle
residual opened, its facts and most frequent features; a feature's contexts shaded, equal to
`glassllm.lens.features.browse`'s; a search by token; a feature picked from the prompt's
per-token table; steering; a prompt of markup shown as text. No console error, no CSP
violation, no request leaving the server."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("aiohttp")

from glassllm.formats import llama2c  # noqa: E402
from glassllm.lens.features import SAE, browse, save_saelens  # noqa: E402
from glassllm.lens.trace import token_text  # noqa: E402
from glassllm.serve.features import FeatureStore  # noqa: E402
from glassllm.serve.models import Loaded, encode_prompt  # noqa: E402

from conftest import shared_data_path  # noqa: E402
from serve_client import Running  # noqa: E402
from test_serve_browser import browser, check_clean, wait_for  # noqa: E402,F401

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside "
         "in the park with her dog. One day, Lily saw a big red ball. She ran to the ball "
         "and kicked it. The dog barked and ran after it. Lily laughed and said, \"Come "
         "back!\" ")
HOSTILE = "<img src=x onerror=window.__xss=1> Lily & <b>Tom</b>"


@pytest.fixture(scope="module")
def stories(tmp_path_factory):
    folder = shared_data_path("llama2c")
    model = llama2c.from_llama2c(folder / "stories260K.bin")
    tokenizer = llama2c.tokenizer_from_llama2c(folder / "tok512.bin")
    root = tmp_path_factory.mktemp("features")
    sae = SAE(64, 256, kind="topk", k=8, hook_name="blocks.2.residual_out", seed=0)
    save_saelens(sae, root / "dicts" / "stories-L2")
    (root / "stories.txt").write_text(STORY * 20)
    return model, tokenizer, sae, root


def test_features_view(browser, stories, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By
    model, tokenizer, sae, root = stories
    store = FeatureStore(str(root / "dicts"), str(root / "stories.txt"))
    running = Running(Loaded("", "stories260K", model, tokenizer), features=store)
    find = lambda css: browser.find_elements(By.CSS_SELECTOR, css)  # noqa: E731
    text = lambda i: browser.find_element(By.ID, i).text  # noqa: E731
    try:
        browser.get(running.url)
        wait_for(lambda: browser.execute_script("return document.body.dataset.ready") == "1")
        browser.find_element(By.ID, "nav-features").click()
        wait_for(lambda: "dead" in text("feat-facts"), what="the dictionary's facts")
        assert "topk dictionary of blocks.2.residual_out" in text("feat-facts")
        windows = browse.corpus_windows(tokenizer, root / "stories.txt", 64, 16384)
        scan = browse.scan_features(model, sae, windows, ignore=(tokenizer.bos_id,))
        first = int(np.argsort(-scan.density, kind="stable")[0])
        detail = browser.find_element(By.ID, "feat-detail")
        wait_for(lambda: detail.get_attribute("data-feature") == str(first) and
                 find("#feat-contexts .context"), what="the first feature")
        contexts = scan.top_contexts(first, 10)
        shown = [float(r.find_element(By.CSS_SELECTOR, ".value").text)
                 for r in find("#feat-contexts .context")]
        np.testing.assert_allclose(shown, [c["value"] for c in contexts], atol=6e-4)
        maxima = find("#feat-contexts .context .tok.chosen")
        assert len(maxima) == len(contexts)
        top_token = token_text(tokenizer, contexts[0]["ids"][contexts[0]["at"]])
        assert maxima[0].get_attribute("textContent") == top_token.replace("\n", "\u21b5")
        assert len(find("#feat-hist-bars div")) == 20 and len(find("#feat-promoted .bar-row")) == 10
        browser.save_screenshot(str(tmp_path / "features.png"))
        # search by token: a list of features, each opens on a click
        browser.find_element(By.ID, "feat-token").send_keys("Lily")
        browser.find_element(By.ID, "feat-search").click()
        wait_for(lambda: "Lily" in text("feat-list-title"), what="the search")
        item = find("#feat-list li")[0]
        picked = item.get_attribute("data-feature")
        item.click()
        wait_for(lambda: detail.get_attribute("data-feature") == picked, what="a searched one")
        # the prompt's features per token: a chip opens its feature
        wait_for(lambda: find("#feat-prompt-table .chip"), what="the prompt's features")
        chip = find("#feat-prompt-table .chip")[3]
        chip.click()
        wait_for(lambda: detail.get_attribute("data-feature") == chip.get_attribute("data-feature"))
        browser.find_element(By.ID, "feat-steer").click()
        wait_for(lambda: "steered" in text("feat-steered"), what="the steered generation")
        # markup in the prompt is text, never HTML
        box = browser.find_element(By.ID, "prompt")
        box.clear()
        box.send_keys(HOSTILE)
        browser.find_element(By.ID, "analyze").click()
        rows = "return document.querySelectorAll('#feat-prompt-table tr').length"
        n = len(encode_prompt(tokenizer, HOSTILE))
        wait_for(lambda: browser.execute_script(rows) == n + 1, what="the markup prompt")
        cells = "return [...document.querySelectorAll('#feat-prompt-table tr td:nth-child(2)')]" \
            ".map((td) => td.textContent).join('')"
        assert "<" in browser.execute_script(cells)
        assert browser.execute_script("return window.__xss") is None
        assert find("#view-features img, #view-features b") == []
        check_clean(browser, running.base)
    finally:
        running.stop()


def test_inspect_report_features_view(browser, stories, tmp_path):  # noqa: F811
    """`glassllm inspect --features DIR`'s page: the Features view lists the prompt's
    strongest features, shades the prompt by the one picked, and its per-token table opens
    the others; markup in the prompt stays text."""
    from selenium.webdriver.common.by import By
    from glassllm import cli
    model, tokenizer, sae, root = stories
    folder = shared_data_path("llama2c")
    out = tmp_path / "report.html"
    assert cli.main(["inspect", "--model", str(folder / "stories260K.bin"), "--tokenizer",
                     str(folder / "tok512.bin"), "--prompt", STORY[:120] + HOSTILE, "--features",
                     str(root / "dicts" / "stories-L2"), "--out", str(out)]) == 0
    browser.get(out.as_uri())
    wait_for(lambda: browser.execute_script("return document.body.dataset.ready") == "1")
    browser.find_element(By.ID, "nav-features").click()
    find = lambda css: browser.find_elements(By.CSS_SELECTOR, css)  # noqa: E731
    items = find("#feat-list li")
    assert len(items) == 12
    detail = browser.find_element(By.ID, "feat-detail")
    assert detail.get_attribute("data-feature") == items[0].get_attribute("data-feature")
    chip = find("#feat-table .chip")[7]
    chip.click()
    assert detail.get_attribute("data-feature") == chip.get_attribute("data-feature")
    assert len(find("#feat-tokens .tok")) == len(find("#feat-table tr")) - 1
    browser.save_screenshot(str(tmp_path / "report-features.png"))
    assert browser.execute_script("return window.__xss") is None
    assert find("#view-features img, #view-features b") == []
    errors = browser.execute_script("return window.__errors")
    console = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert errors == [] and console == [], (errors, console)
