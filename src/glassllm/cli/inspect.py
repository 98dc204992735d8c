"""`glassllm inspect`: a model on one prompt, as a terminal summary and an HTML report."""
from __future__ import annotations

import os
import sys

from .common import TOKENIZER_HELP, UsageError, add_device_option, model_with_tokenizer

def add_inspect(sub) -> None:
    p = sub.add_parser(
        "inspect", help="look inside a model on one prompt: terminal summary + HTML report",
        description="Run a model on a prompt and show what it computes: tokens coloured by "
                    "surprise, the logit lens per layer, the largest direct logit attributions "
                    "and head types in the terminal, and one self-contained HTML page "
                    "(attention per layer and head, logit lens grid, surprise, attribution "
                    "bars; training curves and health panels with --run).")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="glassllm model file or Hugging Face directory (as generate)")
    p.add_argument("--prompt", required=True, metavar="TEXT", help="text to inspect")
    p.add_argument("--tokenizer", metavar="PATH", help=TOKENIZER_HELP)
    p.add_argument("--out", default="report.html", metavar="FILE",
                   help="HTML report to write (default report.html)")
    p.add_argument("--run", default=None, metavar="DIR",
                   help="training run directory (history.csv, health.jsonl) to add its curves")
    p.add_argument("--top-k", type=int, default=5, metavar="K",
                   help="alternatives shown per position (default 5)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the terminal summary (default: when stdout is a terminal)")
    add_device_option(p)
    p.set_defaults(func=run_inspect)


def run_inspect(args) -> int:
    from ..lens.report import (check_report_path, fit_prompt, inspect_model, summary,
                               write_html)

    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UsageError(f"--prompt is not valid UTF-8 text (undecodable byte(s) at character "
                         f"{e.start})") from None
    if args.top_k < 1:
        raise UsageError(f"--top-k must be >= 1, got {args.top_k}")
    if not args.out.lower().endswith((".html", ".htm")):
        raise UsageError(f"--out {args.out}: the report is HTML; give a .html path")
    check_report_path(args.out)  # before the model runs, not after
    model, tokenizer = model_with_tokenizer(args)
    ids = [int(i) for i in tokenizer.encode(args.prompt)]
    if getattr(tokenizer, "bos_id", None) is not None:  # as generate: BOS starts a context
        ids = [int(tokenizer.bos_id)] + ids
    if len(ids) < 2:
        raise UsageError(f"--prompt is {len(ids)} token(s); inspect needs at least 2 (one to "
                         f"predict)")
    ids, note = fit_prompt(ids, model.cfg.max_len)  # cut, said, never refused
    if note:
        print(f"glassllm inspect: note: {note}", file=sys.stderr, flush=True)
    ins = inspect_model(model, ids, tokenizer, run_dir=args.run, k=args.top_k, note=note,
                        title=f"glassllm inspect: {os.path.basename(args.model.rstrip(os.sep))}")
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    report = write_html(ins, args.out)  # first: a reader that leaves early loses nothing
    try:
        print(summary(ins, color=color), flush=True)
        print(f"report: {report}", flush=True)
    except BrokenPipeError:
        # `glassllm inspect ... | head`: the report is written; stop quietly with success,
        # as Unix tools do (stdout -> devnull: the interpreter's final flush stays quiet)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
