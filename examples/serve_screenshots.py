"""PNG screenshots of `glassllm serve`, one per view (docs/serve.md's pictures).

    glassllm serve --model stories260K.safetensors --run runs/shakespeare --port 8765
    python examples/serve_screenshots.py "http://127.0.0.1:8765/?token=..." docs/ --prefix serve

Opens the URL `glassllm serve` printed in Debian's headless Chromium (selenium + the system
chromedriver, the browser test's setup; nothing downloads a browser), works each view as a
person would (a prompt typed, a head picked and hovered, two heads ablated, a patching sweep
run and a cell clicked, 40 tokens generated) and saves PREFIX-VIEW.png.
"""
from __future__ import annotations

import argparse
import os
import time

from headless import chromium, wait
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

PROMPT = "Once upon a time, there was a little girl named Lily. She loved to play outside."
CORRUPTED = "Once upon a time, there was a little boy named Tim. He loved to play outside."


def type_into(driver, element_id: str, text: str) -> None:
    field = driver.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(text)


def shoot(driver, args, view: str) -> None:
    path = os.path.join(args.out_dir, f"{args.prefix}-{view}.png")
    driver.save_screenshot(path)
    print(path)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("out_dir")
    p.add_argument("--prefix", default="serve")
    p.add_argument("--layer", type=int, default=1)
    p.add_argument("--head", type=int, default=3)
    p.add_argument("--size", default="1300,860")
    args = p.parse_args()
    with chromium(args.size) as driver:
        run(driver, args)


def run(driver, args) -> None:
    find = driver.find_element
    driver.get(args.url)
    wait(driver, "document.body.dataset.ready")
    type_into(driver, "prompt", PROMPT)
    find(By.ID, "analyze").click()
    wait(driver, "document.getElementById('status').textContent.includes('tokens,')")
    tokens = driver.find_elements(By.CSS_SELECTOR, "#surprise-tokens .tok")
    ActionChains(driver).move_to_element(tokens[min(8, len(tokens) - 1)]).perform()
    shoot(driver, args, "tokens")
    find(By.ID, "nav-attention").click()
    find(By.CSS_SELECTOR, f"#att-grid .thumb[data-layer='{args.layer}']"
                          f"[data-head='{args.head}']").click()
    time.sleep(1)
    ActionChains(driver).move_to_element(
        driver.find_elements(By.CSS_SELECTOR, "#att-tokens .tok")[12]).perform()
    shoot(driver, args, "attention")
    find(By.ID, "nav-lens").click()
    shoot(driver, args, "lens")
    find(By.ID, "nav-attribution").click()
    wait(driver, "document.getElementById('attr-check').textContent")
    shoot(driver, args, "attribution")
    find(By.ID, "nav-ablate").click()
    for head in ("abl-L1H3", "abl-L2H1"):
        find(By.ID, head).click()
        time.sleep(0.5)
    wait(driver, "document.getElementById('abl-loss').textContent.includes('2 part')")
    shoot(driver, args, "ablate")
    find(By.ID, "nav-patch").click()
    type_into(driver, "patch-corrupted", CORRUPTED)
    find(By.ID, "patch-run").click()
    wait(driver, "document.querySelector('#patch-table td.cell')")
    driver.find_elements(By.CSS_SELECTOR, "#patch-table td.cell")[-6].click()
    shoot(driver, args, "patch")
    find(By.ID, "nav-generate").click()
    type_into(driver, "gen-max", "40")
    find(By.ID, "gen-run").click()
    wait(driver, "document.getElementById('gen-text').dataset.done")
    driver.find_elements(By.CSS_SELECTOR, "#gen-steps .tok")[5].click()
    shoot(driver, args, "generate")
    if driver.find_elements(By.ID, "nav-training"):
        find(By.ID, "nav-training").click()
        wait(driver, "document.getElementById('train-sample').textContent")
        shoot(driver, args, "training")


if __name__ == "__main__":
    main()
