"""Validation points appear on the training page's loss chart while the run is going, in a real
browser (Debian's headless Chromium through the system chromedriver, as
tests/test_serve_browser.py; nothing here downloads a browser): the run folder's val.csv gains
rows between polls and the chart gains a dot for each, "val" in its legend, with no console
error. Before, validation losses came to the page only in history.csv, when the run ended."""
from __future__ import annotations

import pytest

pytest.importorskip("aiohttp")

from serve_client import Running  # noqa: E402
from test_serve_browser import browser, check_clean, wait_for  # noqa: E402,F401

VAL_DOTS = "#chart-loss svg circle.dot[data-name='val']"


def _val_dots(browser) -> list[tuple[str, str]]:
    from selenium.webdriver.common.by import By
    return [(d.get_attribute("cx"), d.get_attribute("cy"))
            for d in browser.find_elements(By.CSS_SELECTOR, VAL_DOTS)]


def test_validation_points_appear_on_the_live_chart(browser, tmp_path):
    from selenium.webdriver.common.by import By
    run = tmp_path / "run"
    run.mkdir()
    (run / "steps.csv").write_text("step,lr,loss\n" + "".join(
        f"{s},0.001,{5 - s / 100}\n" for s in range(41)))
    (run / "val.csv").write_text("step,val_loss,train_loss\n0,5.1,5.0\n")  # the first one
    running = Running(None, run_dir=run)
    try:
        browser.get(running.url)
        browser.find_element(By.ID, "nav-training").click()
        status = browser.find_element(By.ID, "train-status")
        wait_for(lambda: status.get_attribute("data-evaluations") == "1", 30, "evaluation 1")
        assert len(_val_dots(browser)) == 1  # one evaluation: a dot, where a line shows nothing
        legend = browser.find_element(By.CSS_SELECTOR, "#chart-loss .legend").text
        assert "val" in legend and "train (per step)" in legend, legend
        with open(run / "val.csv", "a") as f:  # the run evaluates twice more, as it trains
            f.write("20,4.9,4.8\n40,4.7,4.6\n")
        wait_for(lambda: status.get_attribute("data-evaluations") == "3", 30, "evaluation 3")
        dots = _val_dots(browser)
        assert len(dots) == 3
        xs, ys = [float(x) for x, _ in dots], [float(y) for _, y in dots]
        assert xs == sorted(xs) and ys == sorted(ys), dots  # later steps, lower loss: down
        assert "3 evaluations" in status.text
        check_clean(browser, running.base)
    finally:
        running.stop()


def test_a_run_without_a_step_log_draws_its_evaluations(browser, tmp_path):
    """A run trained without --log-csv or --health-every: val.csv is its only live file, and
    the chart draws its train loss (the mean since each evaluation) and val loss from it."""
    from selenium.webdriver.common.by import By
    run = tmp_path / "run"
    run.mkdir()
    (run / "val.csv").write_text("step,val_loss,train_loss\n0,5.1,5.0\n10,4.9,4.8\n")
    running = Running(None, run_dir=run)
    try:
        browser.get(running.url)
        browser.find_element(By.ID, "nav-training").click()
        wait_for(lambda: len(_val_dots(browser)) == 2, 30, "the evaluations")
        legend = browser.find_element(By.CSS_SELECTOR, "#chart-loss .legend").text
        assert "train (mean per evaluation)" in legend and "val" in legend, legend
        check_clean(browser, running.base)
    finally:
        running.stop()
