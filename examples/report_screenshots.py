"""PNG screenshots of a `glassllm inspect` report, one per view (the pictures of docs/looking-inside.md).

    python examples/report_screenshots.py report.html docs/ --prefix stories260k \
        --layer 1 --head 3 --hover 12

Opens the page from disk in Debian's headless Chromium (selenium + the system chromedriver,
the browser test's setup; nothing downloads a browser), clicks each view and saves
PREFIX-VIEW.png. --layer/--head pick the attention map shown, --hover a token to hover in it.

The attention map at several prompt lengths (docs/report-attention-10.png and -62.png): with
--model, the reports are made here, one per length in --lengths, from the first N tokens of
--text (BOS first where the tokenizer has one), and each attention view is saved as
PREFIX-attention-N.png:

    python examples/report_screenshots.py --model ../shared/data/llama2c/stories260K.bin \
        --tokenizer ../shared/data/llama2c/tok512.bin --lengths 10,62 --layer 4 --head 3 \
        --hover 9 docs/
"""
from __future__ import annotations

import argparse
import os
import tempfile

from headless import chromium
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

STORY = ("Once upon a time, there was a little girl named Lily. She loved to play outside in "
         "the park with her big red ball. One day, a small dog took the ball and ran away. "
         "Lily was sad, but her mom helped her find it under a tree.")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report", nargs="?", help="the report (not with --model)")
    p.add_argument("out_dir")
    p.add_argument("--model", help="make the reports from this model (glassllm.load)")
    p.add_argument("--tokenizer", help="its tokenizer, when it holds none (llama2.c)")
    p.add_argument("--lengths", default="10,62", help="prompt lengths in tokens, with --model")
    p.add_argument("--text", default=STORY, help="the prompt the lengths are cut from")
    p.add_argument("--prefix", default="report")
    p.add_argument("--views", default="attention,lens,surprise,attribution,heads,training")
    p.add_argument("--layer", type=int, default=0)
    p.add_argument("--head", type=int, default=0)
    p.add_argument("--hover", type=int, default=None)
    p.add_argument("--size", default="1200,760")
    args = p.parse_args()
    if (args.report is None) == (args.model is None):
        p.error("give a report, or --model to make reports of --lengths tokens")
    if args.model is not None:
        attention_at_lengths(args)
        return
    with chromium(args.size) as driver:
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


def attention_at_lengths(args) -> None:
    """One report per length, its attention view (the map with both axes' labels) saved."""
    import glassllm
    from glassllm.lens.report import inspect_model, write_html
    lm = glassllm.load(args.model, tokenizer=args.tokenizer)
    ids = lm.encode(args.text)
    with tempfile.TemporaryDirectory() as work, chromium("1280,1500") as driver:
        for n in (int(x) for x in args.lengths.split(",")):
            if n > len(ids):
                raise SystemExit(f"--text is {len(ids)} tokens, fewer than {n}")
            title = f"glassllm inspect: {os.path.basename(args.model)}, {n} tokens"
            report = write_html(inspect_model(lm.model, ids[:n], lm.tokenizer, title=title),
                                os.path.join(work, f"report-{n}.html"))
            driver.get("file://" + report)
            driver.find_element(By.ID, "nav-attention").click()
            for name, value in (("att-layer", args.layer), ("att-head", args.head)):
                driver.find_element(By.CSS_SELECTOR, f"#{name} option[value='{value}']").click()
            if args.hover is not None:
                rows = driver.find_elements(By.CSS_SELECTOR, "#att-ylabels .att-label")
                ActionChains(driver).move_to_element(rows[min(args.hover, n - 1)]).perform()
            path = os.path.join(args.out_dir, f"{args.prefix}-attention-{n}.png")
            driver.find_element(By.ID, "view-attention").screenshot(path)
            print(path)


if __name__ == "__main__":
    main()
