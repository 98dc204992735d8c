"""`glassllm features show`: a dictionary's features over a corpus, in the terminal."""
from __future__ import annotations

import sys

from .common import TOKENIZER_HELP, UsageError, model_with_tokenizer, one_line, path_arg

BAR = 40  # characters of the histogram's longest bar


def add_show(sub) -> None:
    """The `show` subcommand, under `glassllm features`."""
    p = sub.add_parser(
        "show", help="a dictionary's features: top contexts, histogram, logit weights",
        description="Run a model and a dictionary (a SAELens directory: cfg.json + "
                    "sae_weights.safetensors) over a corpus and print what its features do: "
                    "without --feature an overview (dead and dense features, L0, the most "
                    "frequent features with their top context and promoted tokens); with "
                    "--feature i that feature's density, activation histogram, top "
                    "activating contexts ([the token] of the maximum, each token's activation "
                    "after it) and the tokens its decoder direction promotes and suppresses "
                    "through the unembedding (docs/features.md).")
    p.add_argument("dictionary", metavar="F", type=path_arg, help="the dictionary's directory")
    p.add_argument("--model", required=True, type=path_arg, metavar="PATH",
                   help="the model it reads")
    p.add_argument("--data", required=True, type=path_arg, metavar="D",
                   help="corpus: a UTF-8 text file (encoded with the model's tokenizer), or a "
                        "token file / directory of `glassllm prepare`")
    p.add_argument("--tokenizer", metavar="PATH", type=path_arg, help=TOKENIZER_HELP)
    p.add_argument("--feature", type=int, metavar="I", help="the feature to show in full")
    p.add_argument("--seq-len", type=int, default=64, metavar="T",
                   help="tokens per window of the corpus (default 64)")
    p.add_argument("--max-tokens", type=int, default=16384, metavar="N",
                   help="tokens of the corpus read, from its start (default 16384)")
    p.add_argument("--top", type=int, default=10, metavar="K",
                   help="contexts, tokens and features listed (default 10)")
    p.set_defaults(func=run_show)


def run_show(args) -> int:
    from ..lens.features import browse, load_saelens
    from ..lens.report import TokenTexts
    for flag, value, low in (("--seq-len", args.seq_len, 2), ("--max-tokens", args.max_tokens, 2),
                             ("--top", args.top, 1)):
        if value < low:
            raise UsageError(f"{flag} must be >= {low}, got {value}")
    try:
        sae = load_saelens(args.dictionary)
    except (OSError, ValueError) as e:
        raise UsageError(one_line(e)) from None  # load_saelens names the file
    model, tokenizer = model_with_tokenizer(args)
    if args.feature is not None and not 0 <= args.feature < sae.d_sae:
        raise UsageError(f"--feature must be in [0, {sae.d_sae}), got {args.feature}")
    try:
        browse.check_fits(model, sae)
        windows = browse.corpus_windows(tokenizer, args.data, min(args.seq_len,
                                        model.cfg.max_len), args.max_tokens)
    except (OSError, ValueError) as e:
        raise UsageError(f"{one_line(e)}") from None
    bos = getattr(tokenizer, "bos_id", None)  # its outlier residual would top every feature
    scan = browse.scan_features(model, sae, windows, ignore=() if bos is None else (int(bos),))
    logits = browse.feature_logits(model, sae)
    texts, limit = TokenTexts(tokenizer), int(tokenizer.vocab_size)
    facts = browse.dictionary_facts(sae, scan)
    print(_facts_line(args.dictionary, facts))
    if args.feature is None:
        lines = _overview(scan, logits, texts, args.top, limit)
    else:
        lines = _feature_lines(browse.feature_view(scan, logits, args.feature, texts, args.top,
                                                   args.top, vocab_limit=limit))
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _facts_line(path, f: dict) -> str:
    reads = f["hook_name"] + (f" -> {f['out_name']}" if f.get("out_name") else "")
    k = f" k {f['k']}," if f.get("k") else ""
    return (f"{path}: {f['kind']} dictionary of {reads}, d_in {f['d_in']}, d_sae {f['d_sae']},"
            f"{k} over {f['tokens']:,} tokens: L0 {f['l0']:.2f}, dead {f['dead']} "
            f"({f['dead'] / f['d_sae']:.1%}), dense (> {f['dense_above']:.0%} of tokens) "
            f"{f['dense']}")


def _visible(text: str) -> str:
    from ..lens.report import _visible as visible
    return visible(text)


def _tokens(rows) -> str:
    return ", ".join(f"'{_visible(t)}' {v:+.3f}" for t, v, _ in rows)


def _context(c: dict) -> str:
    """A context as one line: the maximum's token in [brackets], activations after the others
    that fire (terminal colours would be lost in a pipe)."""
    parts = []
    for i, (t, a) in enumerate(zip(c["texts"], c["activations"])):
        t = _visible(t)
        parts.append(f"[{t}]" if i == c["at"] else f"{t}({a:.1f})" if a > 0 else t)
    return "".join(parts)


def _overview(scan, logits, texts, top: int, limit: int) -> list[str]:
    from ..lens.features import browse
    density = scan.density
    order = [int(f) for f in density.argsort(kind="stable")[::-1][:top] if density[f] > 0]
    lines = [f"the {len(order)} most frequent features (--feature I shows one in full):"]
    for f in order:
        view = browse.feature_view(scan, logits, f, texts, 5, 1, vocab_limit=limit)
        lines.append(f"  #{f}: density {view['density']:.3%}, max {view['max']:.3f}")
        if view["contexts"]:
            lines.append(f"      top context: {_context(view['contexts'][0])}")
        if view["promoted"]:
            lines.append(f"      promotes: {_tokens(view['promoted'])}")
    return lines


def _feature_lines(view: dict) -> list[str]:
    lines = [f"feature {view['feature']}: active on {view['density']:.3%} of the tokens, "
             f"max activation {view['max']:.4f}"]
    counts, edges = view["histogram"]["counts"], view["histogram"]["edges"]
    most = max(counts) or 1
    lines.append("activation histogram (non-zero activations):")
    for c, lo, hi in zip(counts, edges, edges[1:]):
        lines.append(f"  {lo:8.3f} .. {hi:8.3f} {c:7d} {'#' * round(BAR * c / most)}")
    lines.append("top activating contexts ([the maximum], activations after the others):")
    for c in view["contexts"]:
        lines.append(f"  {c['value']:8.3f}  {_context(c)}")
    if not view["contexts"]:
        lines.append("  (none: the feature never fires on this corpus)")
    if view["promoted"] is None:
        lines.append("logit weights: none (the decoder does not write a residual direction)")
    else:
        lines.append(f"promotes:   {_tokens(view['promoted'])}")
        lines.append(f"suppresses: {_tokens(view['suppressed'])}")
    return lines
