"""PNG screenshots of `glassllm serve`'s Features view (docs/features.md's and docs/serve.md's
pictures).

    glassllm serve --model stories260K.safetensors --features dicts \\
        --features-data stories-val.txt --port 8765
    python examples/features_screenshots.py "http://127.0.0.1:8765/?token=..." docs/ \\
        --dictionary resid2 --features 17 42 99

Opens the URL in Debian's headless Chromium (selenium + the system chromedriver, as
examples/serve_screenshots.py), goes to the Features view, opens the dictionary and saves
serve-features.png (the whole view, its first feature open); then, for each feature given,
opens it and saves features-I.png: its panel alone (histogram, promoted and suppressed tokens,
top activating contexts shaded). Prints each file's path and the values of the feature's
top contexts, so that a test can check a picture against the library.
"""
from __future__ import annotations

import argparse
import os

from headless import chromium, wait
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

PROMPT = "Once upon a time, there was a little girl named Lily. She loved to play outside."


def open_feature(driver, feature: int) -> None:
    field = driver.find_element(By.ID, "feat-index")
    field.clear()
    field.send_keys(str(feature))
    driver.find_element(By.ID, "feat-open").click()
    wait(driver, f"document.getElementById('feat-detail').dataset.feature === '{feature}'")


def shoot(driver, args) -> None:
    driver.get(args.url)
    wait(driver, "document.body.dataset.ready === '1'")
    prompt = driver.find_element(By.ID, "prompt")
    prompt.clear()
    prompt.send_keys(args.prompt)
    driver.find_element(By.ID, "analyze").click()
    wait(driver, "document.body.dataset.ready === '1'")
    driver.find_element(By.ID, "nav-features").click()
    Select(driver.find_element(By.ID, "feat-dict")).select_by_value(args.dictionary)
    wait(driver, "document.getElementById('feat-facts').textContent.includes('dead')")
    wait(driver, "document.querySelectorAll('#feat-contexts .context').length > 0")
    wait(driver, "document.querySelectorAll('#feat-prompt-table .chip').length > 0")
    path = os.path.join(args.out_dir, "serve-features.png")
    driver.save_screenshot(path)
    print(path)
    for feature in args.features:
        open_feature(driver, feature)
        path = os.path.join(args.out_dir, f"features-{feature}.png")
        driver.find_element(By.ID, "feat-detail").screenshot(path)
        values = [e.text for e in driver.find_elements(By.CSS_SELECTOR,
                                                       "#feat-contexts .context .value")]
        print(path, "top contexts:", " ".join(values))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("out_dir")
    p.add_argument("--dictionary", default="", help="its name in the server's list")
    p.add_argument("--features", type=int, nargs="*", default=[])
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--size", default="1300,900")
    args = p.parse_args()
    with chromium(args.size) as driver:
        shoot(driver, args)


if __name__ == "__main__":
    main()
