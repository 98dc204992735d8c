"""PNG screenshots of a `glassllm inspect` report, one per view (the pictures of docs/looking-inside.md).

    python examples/report_screenshots.py report.html docs/ --prefix stories260k \
        --layer 1 --head 3 --hover 12

Opens the page from disk in Debian's headless Chromium (selenium + the system chromedriver,
the browser test's setup; nothing downloads a browser), clicks each view and saves
PREFIX-VIEW.png. --layer/--head pick the attention map shown, --hover a token to hover in it.
"""
from __future__ import annotations

import argparse
import os
import tempfile

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report")
    p.add_argument("out_dir")
    p.add_argument("--prefix", default="report")
    p.add_argument("--views", default="attention,lens,surprise,attribution,heads,training")
    p.add_argument("--layer", type=int, default=0)
    p.add_argument("--head", type=int, default=0)
    p.add_argument("--hover", type=int, default=None)
    p.add_argument("--size", default="1200,760")
    args = p.parse_args()
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    with tempfile.TemporaryDirectory() as profile:
        for flag in FLAGS + (f"--window-size={args.size}", f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        try:
            driver.get("file://" + os.path.abspath(args.report))
            for view in args.views.split(","):
                buttons = driver.find_elements(By.ID, f"nav-{view}")
                if not buttons:
                    continue  # e.g. no training view without --run
                buttons[0].click()
                if view == "attention":
                    for name, value in (("att-layer", args.layer), ("att-head", args.head)):
                        driver.find_element(
                            By.CSS_SELECTOR, f"#{name} option[value='{value}']").click()
                    if args.hover is not None:
                        token = driver.find_elements(By.CSS_SELECTOR, "#att-tokens .tok")
                        ActionChains(driver).move_to_element(token[args.hover]).perform()
                path = os.path.join(args.out_dir, f"{args.prefix}-{view}.png")
                driver.save_screenshot(path)
                print(path)
        finally:
            driver.quit()


if __name__ == "__main__":
    main()
