"""What the screenshot examples share: Debian's headless Chromium driven by selenium through
the system chromedriver (the browser tests' setup; nothing downloads a browser), and a wait
for a condition of the page."""
from __future__ import annotations

import contextlib
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

# No network beyond the page, no first-run screens: the same picture on every machine
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")


@contextlib.contextmanager
def chromium(size: str):
    """A headless Chromium window of `size` ("WIDTH,HEIGHT" pixels) on a throwaway profile,
    quit on exit."""
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    with tempfile.TemporaryDirectory() as profile:
        for flag in FLAGS + (f"--window-size={size}", f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            yield driver
        finally:
            driver.quit()


def wait(driver, script: str, timeout: float = 300) -> None:
    """Until the JavaScript expression `script` is truthy in the page; SystemExit naming it
    after `timeout` seconds (long enough for a dictionary's first scan of a corpus)."""
    deadline = time.monotonic() + timeout
    while not driver.execute_script("return " + script):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {script}")
        time.sleep(0.2)
