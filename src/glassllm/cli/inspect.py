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
    p.add_argument("--model", metavar="PATH",
                   help="glassllm model file, Hugging Face directory or GGUF file (as "
                        "generate); required unless --compare")
    p.add_argument("--prompt", metavar="TEXT", help="text to inspect (required unless "
                   "--compare; with --compare, the sample of the agreement)")
    p.add_argument("--tokenizer", metavar="PATH", help=TOKENIZER_HELP)
    p.add_argument("--out", default="report.html", metavar="FILE",
                   help="HTML report to write (default report.html)")
    p.add_argument("--run", default=None, metavar="DIR",
                   help="training run directory (history.csv, health.jsonl) to add its curves")
    p.add_argument("--features", default=None, metavar="DIR",
                   help="a dictionary of this model (SAELens directory: cfg.json + "
                        "sae_weights.safetensors): its features on the prompt, per token, "
                        "with the tokens each promotes, as the report's Features view")
    p.add_argument("--top-k", type=int, default=5, metavar="K",
                   help="alternatives shown per position (default 5)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the terminal summary (default: when stdout is a terminal)")
    p.add_argument("--compare", nargs=2, metavar=("A.gguf", "B"),
                   help="what quantization did: GGUF file A against its float original B (a "
                        "model path as --model): per tensor error and, over --prompt or "
                        "--corpus, next-token agreement")
    p.add_argument("--corpus", metavar="FILE",
                   help="with --compare: a UTF-8 text file whose first --tokens tokens are "
                        "the agreement's sample")
    p.add_argument("--tokens", type=int, default=512, metavar="N",
                   help="with --compare --corpus: tokens of the sample (default 512)")
    add_device_option(p)
    p.set_defaults(func=run_inspect)


def run_inspect(args) -> int:
    from ..lens.report import (check_report_path, fit_prompt, inspect_model, summary,
                               write_html)

    _refuse_ignored_flags(args)
    if args.compare is not None:
        return run_compare(args)
    if args.model is None or args.prompt is None:
        raise UsageError("give --model PATH --prompt TEXT, or --compare A.gguf B")
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
                        dictionary=_dictionary(args.features, model),
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


def _dictionary(path, model):
    """--features DIR: the dictionary, checked against the model before anything runs."""
    if path is None:
        return None
    from ..lens.features import browse, load_saelens
    from .common import one_line
    try:
        sae = load_saelens(path)
        browse.check_fits(model, sae)
    except (OSError, ValueError) as e:
        raise UsageError(f"--features {path}: {one_line(e)}") from None
    return sae


def _refuse_ignored_flags(args) -> None:
    """A flag the chosen mode does not read is refused, not ignored (--out or --device given
    with --compare wrote and moved nothing, silently)."""
    if args.compare is not None:
        given = [flag for flag, value, default in (
            ("--model", args.model, None), ("--tokenizer", args.tokenizer, None),
            ("--out", args.out, "report.html"), ("--run", args.run, None),
            ("--features", args.features, None), ("--device", args.device, None))
            if value != default]
        if given:
            raise UsageError(f"{', '.join(given)}: not with --compare (it prints its report "
                             f"and reads the two files it is given)")
    elif args.corpus is not None or args.tokens != 512:
        raise UsageError(f"{'--corpus' if args.corpus is not None else '--tokens'} is for "
                         f"--compare only")


def run_compare(args) -> int:
    """`inspect --compare A.gguf B`: the quantization report (`formats.gguf_compare`)."""
    from ..formats import gguf_compare
    from .common import load_model_and_tokenizer

    from ..formats.lm import is_gguf
    quantized, original = args.compare
    if not is_gguf(quantized):
        raise UsageError(f"--compare {quantized}: the first file is the GGUF to judge")
    if args.tokens < 1:
        raise UsageError(f"--tokens must be >= 1, got {args.tokens}")
    if args.prompt is not None and args.corpus is not None:
        raise UsageError("give --prompt or --corpus as the sample, not both")
    model, tokenizer = load_model_and_tokenizer(original)
    ids = None
    if args.prompt is not None or args.corpus is not None:
        if tokenizer is None:
            tokenizer = load_model_and_tokenizer(quantized)[1]
        if tokenizer is None:
            raise UsageError("neither file holds a tokenizer to encode the sample with")
        text = args.prompt if args.corpus is None else _read_text(args.corpus)
        ids = [int(i) for i in tokenizer.encode(text)][:args.tokens]
        if not ids:  # an empty --prompt or --corpus: no agreement to measure, said
            raise UsageError(f"{'--prompt' if args.corpus is None else '--corpus ' + args.corpus}"
                             f" holds no tokens to compare the models on")
    report = gguf_compare.compare(quantized, model, ids or None)
    print(f"{'tensor':<34} {'type':<6} {'rel RMS':>9} {'max |err|':>10}")
    for t in report.tensors:
        print(f"{t.gguf_name:<34} {t.type:<6} {t.rel_rms:>9.2e} {t.max_abs:>10.2e}")
    print(f"all weights: relative RMS error {report.overall_rel_rms:.2e}")
    a = report.agreement
    if a is not None:
        print(f"next-token agreement {100 * a.top1:.1f}% over {a.positions} positions; mean KL "
              f"{a.mean_kl:.2e} nats; max |logit difference| {a.max_logit_diff:.3g} (largest "
              f"|logit| {a.max_logit:.3g})", flush=True)
    return 0


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(1 << 22)  # 4 MiB: far more than a sample of tokens needs
    except UnicodeDecodeError as e:
        raise UsageError(f"--corpus {path} is not UTF-8 text (byte {e.start})") from None
